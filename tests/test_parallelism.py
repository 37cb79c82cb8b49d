"""Parallel layouts: ZeRO memory against the ZeRO paper's own figures, the pipeline bubble,
tensor-parallel traffic, and the layout search."""

from __future__ import annotations

import orjson
import pytest

from perfswarm.cli.main import main
from perfswarm.errors import PerfswarmError
from perfswarm.model.collectives import collective_time
from perfswarm.model.parallelism import (
    Layout,
    Model,
    best_layout,
    estimate,
    layouts,
    memory_bound_s,
    model_state_bytes,
    transformer,
)
from perfswarm.model.topology import Topology, interconnect

NVS, IB = interconnect("nvswitch-a100"), interconnect("ib-hdr")
GPT3 = transformer(175e9, 96, 12288, 96, 2048, 1536, 1)


def work(model: Model, peak: float = 312e12) -> float:
    return model.training_flops() / (peak * 0.5)


def test_zero_memory_is_the_papers() -> None:
    """ZeRO (Rajbhandari et al., SC'20), Figure 1: a 7.5B-parameter model on 64 data-parallel
    devices needs 120 GB per device, 31.4 with P_os, 16.6 with P_os+g, 1.9 with P_os+g+p."""
    got = [round(model_state_bytes(7.5e9, 64, z) / 1e9, 1) for z in (0, 1, 2, 3)]
    assert got == [120.0, 31.4, 16.6, 1.9]


def test_training_flops_count_attention() -> None:
    """Narayanan et al. eq. 3 without recomputation (72 B s l h^2 (1 + s/6h + V/12lh)) is 6 x
    params x tokens plus 12 s h per token and layer, with params = 12 l h^2 + V h."""
    layers, h, s, b, vocab = 96, 12288, 2048, 1536, 51200
    params = 12 * layers * h * h + vocab * h
    model = transformer(params, layers, h, 96, s, b)
    paper = 72 * b * s * layers * h * h * (1 + s / (6 * h) + vocab / (12 * layers * h))
    assert model.training_flops() == pytest.approx(paper, rel=1e-12)
    assert Model(1e6, 8).training_flops() == 6 * 1e6 * 8  # no layers known: 6 x params


def test_bubble_traffic_and_activations() -> None:
    e = estimate(GPT3, Layout(8, 8, 16, 1), per_node=8, intra=NVS, inter=IB,
                 work_s=work(GPT3))
    m = 1536 // 8
    assert e.micro_batches == m and e.bubble == 15 / m  # (p - 1) / m
    bsh = 2 * 2048 * 12288  # fp16 activations of one micro-batch
    grads = 2 * 175e9 / 128  # fp16 gradients of one of 8 x 16 model-parallel slices
    # ZeRO's accounting: an all-reduce of n bytes moves 2n; 4 all-reduces a layer (6 layers a
    # stage) per micro-batch; activations forward and gradients back across the 15 stage
    # boundaries, 15/16 of them a device
    assert e.comm_bytes == {"dp": 2 * grads, "tp": 2 * 4 * bsh * 6 * m,
                            "pp": 2 * bsh * m * 15 / 16}
    # Korthikanti et al. eq. 2, t = 8: sbh (10 + 24/8 + 5 a s / (h t)) = sbh x 23 per layer,
    # 6 layers a stage, 16 micro-batches in flight on the first stage under 1F1B
    assert e.activation_bytes == 2048 * 12288 * 23 * 6 * 16
    assert e.state_bytes == model_state_bytes(175e9 / 128, 8, 1)
    # stage 2 reduce-scatters the gradients every micro-batch, stage 3 also gathers every
    # layer's parameters twice a micro-batch: 1.5x plain data parallel at m = 1 (ZeRO 7.2.2)
    z = {k: estimate(GPT3, Layout(8, 8, 16, k), per_node=8, intra=NVS, inter=IB,
                     work_s=work(GPT3)).comm_bytes["dp"] for k in (0, 2, 3)}
    assert z == {0: 2 * grads, 2: (m + 1) * grads, 3: 3 * m * grads}
    one = transformer(175e9, 96, 12288, 96, 2048, 8, 1)  # one micro-batch a step
    z0, z3 = (estimate(one, Layout(8, 8, 16, k), per_node=8, intra=NVS, inter=IB,
                       work_s=work(one)) for k in (0, 3))
    assert z3.comm_bytes["dp"] == 1.5 * z0.comm_bytes["dp"]
    # stage 3 holds two layers' parameters and one layer's gradients whole (a layer: 1/6 of
    # the stage's slice) beside its state and activations
    assert z3.memory_bytes - z3.state_bytes - (z3.activation_bytes or 0) == pytest.approx(
        3 * 2 * 175e9 / 128 / 6)


def test_zero3_gathers_hide_behind_long_layers_only() -> None:
    """Stage 3 on 16 devices (two nodes): each micro-batch exposes its first layer's gather
    when layers compute long enough to hide the rest; with no compute, every gather and
    gradient scatter of every layer, twice for the gathers (forward and backward)."""
    small = transformer(1e9, 4, 1024, 16, 512, 64)
    group = Topology(16, 8, NVS, IB)
    shard = 2 * 1e9 / 4  # fp16 bytes of one layer
    gather = collective_time("all_gather", shard, group)
    scatter = collective_time("reduce_scatter", shard, group)
    m = 64 // 16
    slow = estimate(small, Layout(16, 1, 1, 3), per_node=8, intra=NVS, inter=IB, work_s=1e4)
    assert slow.exposed_comm_s == pytest.approx(m * gather)
    idle = estimate(small, Layout(16, 1, 1, 3), per_node=8, intra=NVS, inter=IB, work_s=1e-12)
    assert idle.exposed_comm_s == pytest.approx(m * 4 * (2 * gather + scatter))


def test_gradient_all_reduce_waits_for_the_last_micro_batch() -> None:
    """Without ZeRO the step's all-reduce can hide only under the last micro-batch's backward
    pass (the earlier ones accumulate): 2/3 of that micro-batch's share of the compute."""
    small = transformer(1e9, 4, 1024, 16, 512, 64)
    reduce = collective_time("all_reduce", 2e9, Topology(16, 8, NVS, IB))
    work_s = 16 * reduce  # compute a device: reduce; one micro-batch's backward: reduce / 6
    e = estimate(small, Layout(16, 1, 1, 0), per_node=8, intra=NVS, inter=IB, work_s=work_s)
    assert e.micro_batches == 4 and e.compute_s == pytest.approx(reduce)
    assert e.exposed_comm_s == pytest.approx(reduce - reduce / 4 * 2 / 3)


def test_tensor_parallel_splits_memory_bound_ops_in_part() -> None:
    """Korthikanti et al. eq. 2: at t = 8 a rank keeps 10 + 24/8 + 5 a s / (h 8) = 23 of the
    34 + 5 a s / h = 114 s b h bytes GPT-3's layer keeps without tensor parallelism: its
    memory-bound ops (memory_bound_s: 4 passes over them) split 114/23 ways, the GEMMs 8."""
    memory = memory_bound_s(GPT3, 2e12)
    assert memory == 4 * 2048 * 12288 * 114 * 96 * 1536 / 2e12
    e = estimate(GPT3, Layout(8, 8, 16, 1), per_node=8, intra=NVS, inter=IB,
                 work_s=work(GPT3) + memory, memory_s=memory)
    assert e.compute_s == pytest.approx(work(GPT3) / 1024 + memory * 23 / 114 / 128)
    with pytest.raises(PerfswarmError, match="memory-bound"):
        estimate(GPT3, Layout(8, 8, 16, 1), per_node=8, intra=NVS, inter=IB, work_s=1.0,
                 memory_s=2.0)


def test_interleaving_shrinks_the_bubble_for_traffic_and_memory() -> None:
    """Narayanan et al. 2.2.2: v chunks a device cut the bubble to (p-1)/(v m), and each
    micro-batch crosses p*v - 1 boundaries; Megatron-LM's warm-up holds (v+1)p - 1 chunks of
    l/(p v) layers on the first stage rather than p micro-batches of l/p."""
    plain = estimate(GPT3, Layout(8, 8, 16, 1), per_node=8, intra=NVS, inter=IB,
                     work_s=work(GPT3))
    two = estimate(GPT3, Layout(8, 8, 16, 1, chunks=2), per_node=8, intra=NVS, inter=IB,
                   work_s=work(GPT3))
    m = 192
    assert two.bubble == 15 / (2 * m) and two.to_dict()["chunks"] == 2
    assert two.comm_bytes["pp"] == 2 * 2 * 2048 * 12288 * m * 31 / 16
    assert two.activation_bytes == 2048 * 12288 * 23 * 3 * 47
    assert plain.activation_bytes == 2048 * 12288 * 23 * 6 * 16
    assert two.exposed_comm_s > plain.exposed_comm_s and two.step_s < plain.step_s
    assert two.to_dict()["layout"] == "dp8 x tp8 x pp16, ZeRO-1, interleaved x2"
    # 6 layers a stage: 1, 2, 3 or 6 chunks; none without a pipeline
    assert {lay.chunks for lay in layouts(GPT3, 1024, 8) if (lay.tp, lay.pp) == (8, 16)} == {
        1, 2, 3, 6}
    assert {lay.chunks for lay in layouts(GPT3, 1024, 8) if lay.pp == 1} == {1}
    with pytest.raises(PerfswarmError, match="do not divide"):
        estimate(GPT3, Layout(8, 8, 16, 1, chunks=4), per_node=8, intra=NVS, inter=IB,
                 work_s=1.0)


def test_stage_boundary_between_nodes_scatters_over_every_nic() -> None:
    """tp 8 x pp 2 on two 8-GPU nodes: each micro-batch's activations (and their gradients) cross
    the node boundary as 8 slices, one per rank's NIC, then are all-gathered over NVSwitch
    (Narayanan et al. 4.1), beside 4 all-reduces a layer inside the node."""
    small = transformer(1e9, 4, 1024, 16, 512, 8)
    bsh = 2 * 512 * 1024
    node = Topology(8, 8, NVS, IB)
    e = estimate(small, Layout(1, 8, 2, 0), per_node=8, intra=NVS, inter=IB, work_s=1.0)
    sends = 2 * 8 * (2 - 1) / 2  # 8 micro-batches, one boundary each way, half of it a device
    send = (IB.alpha_s + bsh / 8 * IB.beta_s_per_byte
            + collective_time("all_gather", bsh, node))
    tensor = 4 * 2 * 8 * collective_time("all_reduce", bsh, node)  # 2 layers a stage
    assert e.exposed_comm_s == pytest.approx(sends * send + tensor)
    # across whole nodes a tensor-parallel all-reduce leaves the node every layer
    wide = estimate(small, Layout(1, 16, 1, 0), per_node=8, intra=NVS, inter=IB, work_s=1.0)
    assert wide.exposed_comm_s == pytest.approx(
        4 * 4 * 8 * collective_time("all_reduce", bsh, Topology(16, 8, NVS, IB)))


def test_sequence_parallel_and_selective_recomputation() -> None:
    """Korthikanti et al.: at t = 8 GPT-3's layer keeps 10 + 24/8 + 10 = 23 s b h bytes (eq. 2),
    34/8 + 10 with sequence parallelism (eq. 4), 10 + 24/8 with selective recomputation and
    34/8 with both (eq. 6); sequence parallelism splits the memory-bound ops 8 ways like the
    GEMMs, and selective recomputation redoes the attention core's forward: a third of the
    attention's 12 s h FLOPs per token and layer, and one of PASSES over its 5as/h bytes."""
    sbh, per_stage = 2048 * 12288, 6 * 16
    memory = memory_bound_s(GPT3, 2e12)
    kw = {"per_node": 8, "intra": NVS, "inter": IB, "work_s": work(GPT3) + memory,
          "memory_s": memory}
    plain, sp, sel, both = (
        estimate(GPT3, Layout(8, 8, 16, 1, sequence_parallel=q, selective=r), **kw)
        for q, r in ((False, False), (True, False), (False, True), (True, True)))
    assert plain.activation_bytes == sbh * 23 * per_stage
    assert sp.activation_bytes == pytest.approx(sbh * (34 / 8 + 10) * per_stage)
    assert sel.activation_bytes == pytest.approx(sbh * (10 + 3) * per_stage)
    assert both.activation_bytes == pytest.approx(sbh * 34 / 8 * per_stage)
    assert sp.compute_s == pytest.approx((work(GPT3) + memory) / 1024)
    assert sp.comm_bytes == plain.comm_bytes  # reduce-scatter + all-gather: an all-reduce
    attention = 12 * 2048 * 12288 / (6 * 175e9 / 96 + 12 * 2048 * 12288)  # of the FLOPs
    core = 80 / 114  # 5as/h of 34 + 5as/h
    assert sel.compute_s - plain.compute_s == pytest.approx(
        (work(GPT3) * attention / 3 + memory * core / 4) / 1024)
    assert both.to_dict()["layout"] == ("dp8 x tp8 x pp16, ZeRO-1, sequence parallel, "
                                        "selective recompute")
    assert both.to_dict()["sequence_parallel"] and both.to_dict()["selective_recompute"]


def test_recomputation_trades_memory_for_a_forward_pass() -> None:
    plain = estimate(GPT3, Layout(8, 8, 16, 1), per_node=8, intra=NVS, inter=IB,
                     work_s=work(GPT3))
    again = estimate(GPT3, Layout(8, 8, 16, 1, True), per_node=8, intra=NVS, inter=IB,
                     work_s=work(GPT3))
    # each of a stage's 6 layers keeps its 2 s b h input for 16 micro-batches in flight, and
    # one layer holds its full activations (23 s b h at t = 8) while recomputed
    sbh = 2048 * 12288
    assert again.activation_bytes == 2 * sbh * 6 * 16 + 23 * sbh
    assert again.compute_s == pytest.approx(plain.compute_s * 4 / 3)
    assert again.state_bytes == plain.state_bytes
    # the recomputed forward all-reduces its activations again: 6 tensor-parallel all-reduces
    assert again.comm_bytes == {**plain.comm_bytes, "tp": plain.comm_bytes["tp"] * 6 / 4}
    assert again.to_dict()["layout"] == "dp8 x tp8 x pp16, ZeRO-1, recompute"


def test_best_layout_for_gpt3_on_dgx_a100() -> None:
    """1024 A100-80GB in DGX A100 nodes over HDR InfiniBand: with the techniques of 2021 (ZeRO
    up to stage 2, no sequence parallelism or selective recomputation) GPT-3's fastest layout
    that fits splits the model 8 ways inside each node (the tensor-parallel degree Megatron-LM
    used there)."""
    best, every = best_layout(GPT3, 1024, per_node=8, intra=NVS, inter=IB, work_s=work(GPT3),
                              memory_bytes=80e9)
    assert best is not None and best.memory_bytes <= 80e9
    then = next(e for e in every if e.memory_bytes <= 80e9 and e.layout.zero < 3
                and not (e.layout.sequence_parallel or e.layout.selective))
    assert then.layout.tp == 8
    assert all(e.layout.devices == 1024 for e in every)
    assert [e.step_s for e in every] == sorted(e.step_s for e in every)
    faster = [e for e in every if e.step_s < best.step_s]
    assert faster and all(e.memory_bytes > 80e9 for e in faster)
    none, _ = best_layout(GPT3, 1024, per_node=8, intra=NVS, inter=IB, work_s=work(GPT3),
                          memory_bytes=1e9)
    assert none is None


def test_small_model_stays_data_parallel() -> None:
    small = transformer(1.3e9, 24, 2048, 16, 2048, 512, 1)
    best, _ = best_layout(small, 64, per_node=8, intra=NVS, inter=IB, work_s=work(small),
                          memory_bytes=80e9)
    assert best is not None and (best.layout.tp, best.layout.pp) == (1, 1)


def test_layouts_and_bad_input() -> None:
    lays = layouts(GPT3, 16, 8)
    assert {(lay.dp, lay.tp, lay.pp) for lay in lays} >= {(16, 1, 1), (2, 8, 1), (1, 8, 2)}
    # tensor parallel within a node or over whole nodes (8 or 16 of 16 devices), never 12
    assert {lay.tp for lay in lays} == {1, 2, 4, 8, 16}
    with pytest.raises(PerfswarmError, match="do not divide"):
        estimate(GPT3, Layout(1, 12, 1, 0), per_node=8, intra=NVS, inter=IB, work_s=1.0)
    # a tensor-parallel rank computes whole heads: 12 heads split 1, 2 or 4 ways, not 8
    twelve = transformer(1e9, 4, 768, 12, 512, 64)
    assert {lay.tp for lay in layouts(twelve, 16, 8)} == {1, 2, 4}
    with pytest.raises(PerfswarmError, match="heads"):
        estimate(twelve, Layout(2, 8, 1, 0), per_node=8, intra=NVS, inter=IB, work_s=1.0)
    assert all(lay.devices == 16 and 96 % lay.pp == 0 for lay in lays)
    assert {lay.zero for lay in lays if lay.dp == 1} == {0}
    with pytest.raises(PerfswarmError, match="do not divide"):
        estimate(GPT3, Layout(7, 1, 1, 0), per_node=8, intra=NVS, inter=IB, work_s=1.0)
    with pytest.raises(PerfswarmError, match="positive"):
        transformer(0, 1, 1, 1, 1, 1)
    # without its layers a model gets data-parallel layouts only, its activations unknown
    flat = Model(25_557_032, 8, value_bytes=4)
    assert {(lay.dp, lay.tp, lay.pp) for lay in layouts(flat, 8, 8)} == {(8, 1, 1)}
    e = estimate(flat, Layout(8, 1, 1, 3), per_node=8, intra=NVS, inter=IB, work_s=0.8)
    assert e.activation_bytes is None and e.to_dict()["activation_gb"] is None
    # fp32 Adam: 4 + 4 + 8 bytes a parameter, all three sharded under stage 3
    assert e.memory_bytes == e.state_bytes == 16 * 25_557_032 / 8
    assert e.comm_bytes == {"dp": 3 * 4 * 25_557_032, "tp": 0.0, "pp": 0.0}
    assert e.compute_s == 0.1
    with pytest.raises(PerfswarmError, match="do not divide"):
        estimate(flat, Layout(4, 2, 1, 0), per_node=8, intra=NVS, inter=IB, work_s=1.0)


def test_layouts_command(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["layouts", "--params", "175e9", "--layers", "96", "--hidden", "12288", "--heads",
            "96", "--seq", "2048", "--batch", "1536", "--devices", "1024"]
    assert main([*argv, "--json"]) == 0
    out = orjson.loads(capsys.readouterr().out)
    # the GEMMs at --efficiency (0.5) of the fp16 peak, the memory-bound ops at the HBM's rate
    memory = memory_bound_s(GPT3, 2039e9)
    best, every = best_layout(GPT3, 1024, per_node=8, intra=NVS, inter=IB,
                              work_s=work(GPT3) + memory, memory_s=memory, memory_bytes=80e9)
    assert out["device"] == "A100-80GB" and best is not None
    assert out["best"] == orjson.loads(orjson.dumps(best.to_dict()))
    assert len(out["layouts"]) == len(every)
    assert main([*argv[:-1], "1000"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("perfswarm: error: no layout of 1000 devices divides 96 layers and a batch "
                   "of 1536 (micro-batch 1)")
