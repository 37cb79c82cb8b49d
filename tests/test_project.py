"""`project`: profile of the A100 DDP corpus trace, the collective-wait simulation, the CLI."""

from __future__ import annotations

import gzip
import itertools
import math
import re
import statistics
from dataclasses import replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pytest

from conftest import GLOO_DDP, TP_GLOO, corpus, gloo_ddp_raw, gloo_wait_ns
from perfswarm.analyze.ops import kernel_category
from perfswarm.cli.main import main
from perfswarm.errors import ParameterError, PerfswarmError
from perfswarm.model.collective_fit import link_of_profile
from perfswarm.model.collectives import RING, CollectiveConfig, collective_time
from perfswarm.model.parallelism import Blocks
from perfswarm.model.predict import Change, predict
from perfswarm.model.topology import Topology, interconnect
from perfswarm.optimize.layouts import run_model
from perfswarm.optimize.project import (
    MEMORY_BOUND,
    Call,
    Choice,
    StepProfile,
    on_device,
    profile,
    project,
    recommend,
    simulate_step,
)
from perfswarm.trace.ingest import ImportOptions, import_traces
from perfswarm.trace.schema import STEPS
from perfswarm.trace.store import Run

NVS, IB = interconnect("nvswitch-a100"), interconnect("ib-ndr")


@pytest.fixture(scope="module")
def nccl(tmp_path_factory: pytest.TempPathFactory) -> Run:
    out = tmp_path_factory.mktemp("project") / "nccl.run"
    return import_traces([corpus("nccl")], out, ImportOptions(), ["test"])


def test_profile_of_ddp_trace(nccl: Run) -> None:
    prof = profile(nccl)
    d = prof.to_dict()
    assert (d["ranks"], d["steps"], d["world"]) == ([0], 3, 2)
    # 2 broadcasts (DDP's buffer sync) and 5 gradient buckets per step
    assert d["collectives_per_step"] == 7
    assert [c.op for c in prof.steps[1].calls] == ["broadcast"] * 2 + ["all_reduce"] * 5
    assert [c.nbytes for c in prof.steps[1].calls][2:] == [8196000, 31502336, 26255360,
                                                           26550272, 9724160]
    assert (d["grad_bytes"], d["grad_bytes_source"]) == (102228128, "collective kernels")
    assert [s.compute_ns for s in prof.steps] == [39391994, 39296837, 39620514]
    assert d["compute_ms"] == pytest.approx(39.391994)
    assert d["overlap_fraction"] == pytest.approx(0.163959, abs=1e-6)
    assert all(0 < c.ready_ns <= s.compute_ns for s in prof.steps for c in s.calls)
    link = prof.measured_link()
    assert link is not None and link.bandwidth_gbps > 0


def test_projection_of_ddp_trace(nccl: Run) -> None:
    result = project(nccl, [1, 2, 8, 16, 256])
    points = result.points
    assert [p.devices for p in points] == [1, 2, 8, 16, 256]
    # one device: its device work (39.4 ms in step 4) and the time its device waited on the
    # host (device idle, checked against the raw trace in test_layouts_of_the_ddp_trace)
    steps = result.profile.steps
    alone = statistics.median(s.compute_ns + s.idle_ns for s in steps) * 1e-9
    assert points[0].step_s == pytest.approx(alone) and points[0].comm_s == 0
    assert 0.2 < alone < statistics.median(s.wall_ns for s in steps) * 1e-9
    assert all(a.efficiency >= b.efficiency for a, b in itertools.pairwise(points))
    assert result.intra.name == "nvswitch-a100"   # from the Run's A100s
    assert len(result.options) == 12
    ps = [c for c in result.options if c.scheme == "ps"]
    # one server cannot feed 256 workers: its NIC carries every worker's 102 MB of gradients
    # both ways, seconds a step against the 209 ms one
    assert all(c.efficiency < 0.2 for c in ps)
    assert result.recommended.efficiency >= 0.9
    slow = project(nccl, [1, 256], bandwidth_gbps=0.1)
    assert slow.points[-1].efficiency < 0.5 < result.points[-1].efficiency
    assert slow.inter.name == "ib-ndr@0.1GB/s"


def test_collective_waits_for_the_last_rank() -> None:
    call = Call("all_reduce", 100_000_000, 10_000_000, 0, 2)
    late = Call("all_reduce", 100_000_000, 30_000_000, 0, 2)
    fast = StepProfile(0, 1, 0, 40_000_000, 5_000_000, 0, (call,))
    slow = StepProfile(1, 1, 0, 40_000_000, 5_000_000, 0, (late,))
    top = Topology(2, 8, NVS, IB)
    t = collective_time("all_reduce", 100_000_000, top, RING)
    step, comm = simulate_step([fast, slow], top, RING)
    assert comm == pytest.approx(t)
    assert step == pytest.approx(max(0.035, 0.030 + t) + 0.005)
    assert simulate_step([fast], top, RING)[0] == pytest.approx(max(0.035, 0.010 + t) + 0.005)
    assert simulate_step([fast], Topology(1, 8, NVS, IB), CollectiveConfig())[0] == 0.04
    # a step whose device also waited 20 ms on the host keeps that time, on one device or two
    waited = replace(fast, idle_ns=20_000_000)
    assert simulate_step([waited], Topology(1, 8, NVS, IB), RING)[0] == pytest.approx(0.06)
    assert simulate_step([waited], top, RING)[0] == pytest.approx(
        max(0.035, 0.010 + t) + 0.005 + 0.020)


def test_recommend_takes_the_slowest_good_network() -> None:
    options = [Choice("eth-100g", "ring", 0.5), Choice("ib-hdr", "ps", 0.2),
               Choice("ib-hdr", "tree", 0.95), Choice("ib-ndr", "ring", 0.99)]
    assert recommend(options) == Choice("ib-hdr", "tree", 0.95)
    assert recommend(options[:2]) == Choice("eth-100g", "ring", 0.5)


def test_run_without_collectives_needs_grad_bytes(tmp_path: Path) -> None:
    run = import_traces([corpus("amd")], tmp_path / "a.run", ImportOptions(), ["t"])
    with pytest.raises(ParameterError, match=r"give their size with grad_bytes$"):
        profile(run)
    prof = profile(run, grad_bytes=1 << 20)
    assert prof.grad_bytes_source == "--grad-bytes"
    assert len(prof.steps) == 1   # one of the three steps ran kernels
    assert all(s.calls[0].ready_ns == s.compute_ns for s in prof.steps)
    assert project(run, [1, 2], grad_bytes=1 << 20).points[1].comm_s > 0


def test_cli_json_and_errors(nccl: Run, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["project", str(nccl.path), "--devices", "1,4", "--scheme", "tree", "--json"]) == 0
    data = orjson.loads(capsys.readouterr().out)
    assert set(data) == {"profile", "measured_link", "intra", "inter", "devices_per_node",
                         "per_node_source", "rank_unit", "rank_units", "scheme", "points",
                         "options", "recommended", "layouts", "layouts_note"}
    assert data["scheme"] == "tree" and [p["devices"] for p in data["points"]] == [1, 4]
    page = nccl.path.parent / "projection.html"
    assert main(["project", str(nccl.path), "--devices", "1,8", "--html", str(page)]) == 0
    out = capsys.readouterr().out
    assert "choose" in out and f"plots: {page}" in out
    text = page.read_text()
    assert text.startswith("<!DOCTYPE html>") and 'id="chart-scaling"' in text
    assert "<tr><td>8</td>" in text and "<strong>choose</strong>" in text
    assert main(["project", str(nccl.path), "--devices", "0"]) == 2
    assert main(["project", str(nccl.path), "--bandwidth", "-1"]) == 2
    assert main(["project", str(nccl.path), "--devices", "1,x"]) == 2


def test_run_without_step_markers_is_one_iteration(tmp_path: Path) -> None:
    run = import_traces([corpus("old_format")], tmp_path / "o.run", ImportOptions(), ["t"])
    prof = profile(run, grad_bytes=1000)
    assert (prof.whole_run, prof.ranks) == (True, (1,))
    assert [(s.step, s.compute_ns) for s in prof.steps] == [(-1, 30000)]
    # a CPU Run: each marked step's span is its compute (ProfilerStep#551, 210,109.162 us),
    # less the time its loop waited for gloo (it runs no op in the step)
    cpu = import_traces([corpus("cpu_only")], tmp_path / "c.run", ImportOptions(), ["t"])
    prof = profile(cpu, grad_bytes=1000)
    assert prof.compute_source == "step spans (no device work)"
    (lo, hi), waited = gloo_wait_ns(corpus("cpu_only"))
    assert hi - lo == 210_109_162 and waited == 178_777_427
    assert [(s.rank, s.compute_ns, s.wall_ns) for s in prof.steps] == [
        (34, hi - lo - waited, hi - lo)]
    bare = import_traces([Path(__file__).parent / "data" / "cnn_cpu_trace.json"],
                         tmp_path / "b.run", ImportOptions(), ["t"])
    with pytest.raises(PerfswarmError, match="no device kernels or marked steps"):
        profile(bare, grad_bytes=1000)


def test_intra_link_from_a_collectives_profile(nccl: Run, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    profile = {"sweep": {"backend": "gloo", "world_size": 2},
               "models": {"all_reduce": {"latency_us": 40.0, "regimes": [
                   {"up_to_bytes": 1 << 20, "bandwidth_gbps": 6.0},
                   {"up_to_bytes": None, "bandwidth_gbps": 2.5}]}}}
    path = tmp_path / "collectives.json"
    path.write_bytes(orjson.dumps(profile))
    assert main(["project", str(nccl.path), "--devices", "1,2,8", "--intra-profile", str(path),
                 "--json"]) == 0
    intra = orjson.loads(capsys.readouterr().out)["intra"]
    # the largest messages' bandwidth: gradient buckets are megabytes
    assert intra["name"] == "measured gloo x2" and intra["latency_us"] == pytest.approx(40.0)
    assert intra["bandwidth_gbps"] == pytest.approx(2.5)
    path.write_text('{"models": {}}')
    assert main(["project", str(nccl.path), "--intra-profile", str(path)]) == 2
    assert "not a collectives profile" in capsys.readouterr().err


def test_compute_predicted_on_another_gpu(nccl: Run) -> None:
    measured = profile(nccl)
    on_h100 = on_device(nccl, measured, "H100-SXM")
    prediction = predict(nccl, Change(device="H100-SXM"))
    ratio = prediction.median_active("predicted") / prediction.median_active("measured")
    assert on_h100.compute_source == "predicted on H100-SXM" and 0.3 < ratio < 0.9
    for before, after in zip(measured.steps, on_h100.steps, strict=True):
        assert after.compute_ns == round(before.compute_ns * ratio)
        assert [c.ready_ns for c in after.calls] == [round(c.ready_ns * ratio)
                                                     for c in before.calls]
    assert project(nccl, [8], device="H100-SXM").to_dict()["profile"]["compute_source"] == \
        "predicted on H100-SXM"


def _raw_events(path: Path) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = orjson.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    return events


def _raw_device_idle_us(raw: list[dict[str, Any]], step_name: str) -> float:
    """The time of the CPU-side step marker `step_name` that no device work covers, from the
    raw trace (µs)."""
    step = next(e for e in raw if e.get("name") == step_name
                and e.get("cat") == "user_annotation")
    lo, hi = float(step["ts"]), float(step["ts"]) + float(step["dur"])
    spans = sorted((max(lo, float(e["ts"])), min(hi, float(e["ts"]) + float(e["dur"])))
                   for e in raw if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
                   and float(e["ts"]) < hi and float(e["ts"]) + float(e["dur"]) > lo)
    busy, end = 0.0, lo
    for a, b in spans:
        busy += max(0.0, b - max(a, end))
        end = max(end, b)
    return hi - lo - busy


def _raw_memory_bound_us(raw: list[dict[str, Any]], step_name: str) -> float:
    """The union of the copies, memsets and memory-bound kernels (by analyze.ops's name
    categories; NCCL's kernels, which carry a collective's name, are communication) launched
    inside the step marker `step_name`, from the raw trace (µs)."""
    step = next(e for e in raw if e.get("name") == step_name
                and e.get("cat") == "user_annotation")
    lo, hi = float(step["ts"]), float(step["ts"]) + float(step["dur"])
    launched = {e["args"]["correlation"] for e in raw if e.get("cat") == "cuda_runtime"
                and lo <= float(e["ts"]) < hi}
    spans = sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in raw
                   if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
                   and e["args"].get("correlation") in launched
                   and "Collective name" not in e["args"]
                   and (e["cat"] != "kernel" or kernel_category(e["name"]) in MEMORY_BOUND))
    busy, end = 0.0, float("-inf")
    for a, b in spans:
        busy += max(0.0, b - max(a, end))
        end = max(end, b)
    return busy


def test_memory_bound_share_of_the_ddp_trace(nccl: Run) -> None:
    """Half of ResNet-50's device time under DDP is memory-bound (batch norms, ReLUs, adds,
    copies): each step's share, as the raw trace gives it, goes to the layouts."""
    raw = _raw_events(corpus("nccl"))
    prof = profile(nccl)
    shares = []
    for s in prof.steps:
        us = _raw_memory_bound_us(raw, f"ProfilerStep#{s.step}")
        assert s.memory_bound_ns == pytest.approx(us * 1000, abs=2000)
        shares.append(s.memory_bound_ns / s.compute_ns)
    assert 0.45 < statistics.median(shares) < 0.55
    lay = project(nccl, [1, 8]).layouts
    assert lay is not None and lay.memory_s == pytest.approx(
        lay.work_s * statistics.median(shares))
    assert lay.to_dict()["memory_s"] == lay.memory_s


def test_gradient_size_keeps_the_host_bound_time(tmp_path: Path) -> None:
    """A Run without collectives, given its gradient size, gets one all-reduce after its backward
    and keeps each step's device-idle time (that had been dropped with the step's other fields)."""
    run = import_traces([corpus("compare_base")], tmp_path / "b.run", ImportOptions(), ["t"])
    raw = _raw_events(corpus("compare_base"))
    prof = profile(run, grad_bytes=1 << 20)
    assert prof.steps and all(len(s.calls) == 1 for s in prof.steps)
    for s in prof.steps:
        idle_us = _raw_device_idle_us(raw, f"ProfilerStep#{s.step}")
        assert idle_us > 0 and s.idle_ns == pytest.approx(idle_us * 1000, abs=1000)


def test_layouts_of_the_ddp_trace(nccl: Run) -> None:
    """ResNet-50 under DDP on 2 A100s: the parameters are the elements its gradient
    all-reduces carry in a step (read here from the raw trace), torchvision's ResNet-50 count."""
    raw = _raw_events(corpus("nccl"))
    buckets = [e for e in raw if e.get("cat") == "kernel"
               and e["args"].get("Collective name") == "allreduce"]
    per_step = len(buckets) // 3
    elems = sum(int(e["args"]["In msg nelems"]) for e in buckets[:per_step])
    assert elems == 25_557_032
    result = project(nccl, [1, 8])
    lay = result.layouts
    assert lay is not None and result.layouts_note == ""
    assert (lay.source.params, lay.source.params_source) == (elems, "gradient all-reduce")
    assert lay.source.value_bytes == 4 and lay.source.blocks is None
    assert lay.memory_bytes == 42_297_524_224   # the trace's deviceProperties
    # no linear layers: data parallel only, each of the 8 devices doing the Run's step
    assert {(e.layout.dp, e.layout.tp, e.layout.pp) for e in lay.every} == {(8, 1, 1)}
    assert lay.work_s == pytest.approx(8 * 0.039391994)
    assert lay.best is not None and lay.best.compute_s == pytest.approx(0.039391994)
    zero0 = next(e for e in lay.every if e.layout.zero == 0)
    assert zero0.state_bytes == 16 * elems and zero0.comm_bytes["dp"] == 2 * 4 * elems
    # the GPU idles most of each step (host-bound): that time stays in every layout's step;
    # the first step's, from the raw trace: ProfilerStep#4 less the union of its device work
    assert result.profile.steps[0].idle_ns == pytest.approx(
        _raw_device_idle_us(raw, "ProfilerStep#4") * 1000, abs=1000)
    idle = statistics.median(s.idle_ns for s in result.profile.steps) * 1e-9
    assert all(e.host_s == idle for e in lay.every) and idle > 0.16


TRANSFORMER = Path(__file__).parent / "data" / "transformer_cpu.pt.trace.json.gz"
_WEIGHT_OPS = {"aten::linear": (1, 2), "aten::embedding": (0, None),
               "aten::layer_norm": (2, 3)}


def test_layouts_of_a_recorded_cpu_transformer(tmp_path: Path) -> None:
    """The bundled encoder (2 layers, d_model 64, 4 heads, batch 4 x 32 tokens) recorded on
    this CPU: its model from the shapes, its compute from the step spans."""
    raw = _raw_events(TRANSFORMER)
    steps = sorted((e for e in raw if str(e.get("name", "")).startswith("ProfilerStep#")),
                   key=lambda e: float(e["ts"]))
    first = steps[0]
    lo, hi = float(first["ts"]), float(first["ts"]) + float(first["dur"])
    params = 0
    for e in raw:
        if e.get("cat") == "cpu_op" and e["name"] in _WEIGHT_OPS and lo <= float(e["ts"]) < hi:
            w, b = _WEIGHT_OPS[e["name"]]
            dims = e["args"]["Input Dims"]
            params += math.prod(dims[w]) + (math.prod(dims[b]) if b and dims[b] else 0)
    # torch's own count of Encoder(500, 64, 4, 2, 32) is 166,516: the positional
    # nn.Parameter (32 x 64) is used outside any layer, so the shapes miss it
    assert params == 166_516 - 32 * 64
    run = import_traces([TRANSFORMER], tmp_path / "t.run", ImportOptions(), ["t"])
    result = project(run, [1, 8])
    prof = result.profile
    assert prof.compute_source == "step spans (no device work)"
    assert [s.compute_ns for s in prof.steps] == [round(float(s["dur"]) * 1000) for s in steps]
    assert (prof.grad_bytes, prof.grad_bytes_source) == (4 * params, "parameter shapes")
    lay = result.layouts
    assert lay is not None and lay.memory_bytes is None
    src = lay.source
    assert (src.params, src.params_source, src.batch) == (params, "layer shapes", 4)
    assert src.blocks == Blocks(layers=2, hidden=64, heads=4, seq=32)
    # tp 1/2/4 (dividing the 4 heads) x pp 1/2 of 8 devices, ZeRO 0-3 where dp > 1
    assert {(e.layout.dp, e.layout.tp, e.layout.pp) for e in lay.every} == {
        (8, 1, 1), (4, 2, 1), (2, 4, 1), (4, 1, 2), (2, 2, 2), (1, 4, 2)}
    compute = statistics.median(s.compute_ns for s in prof.steps) * 1e-9
    assert lay.work_s == pytest.approx(8 * compute)
    best = lay.best
    assert best is not None and best.layout.tp * best.layout.pp == 1   # tiny: data parallel
    # its fp32 activations (the paper's bytes are of 16-bit values and 1-byte dropout masks:
    # 10 = 8 + 2 masks, 24, 5as/h = 4as/h + a 1-byte as/h mask) with the values' terms doubled
    assert src.value_bytes == 4
    assert best.activation_bytes == 32 * 4 * 64 * (18 + 48 + 9 * 4 * 32 / 64) * 2


def test_cli_layouts(nccl: Run, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["project", str(nccl.path), "--devices", "1,8", "--json",
                 "--memory-gb", "0.1"]) == 0
    data = orjson.loads(capsys.readouterr().out)
    assert data["layouts_note"] == "" and data["layouts"]["memory_gb"] == 0.1
    # 25.6M fp32 parameters need 0.41 GB of state without ZeRO; only ZeRO-3 on 8 fits 0.1 GB
    assert data["layouts"]["best"]["layout"] == "dp8 x tp1 x pp1, ZeRO-3"
    assert main(["project", str(nccl.path), "--devices", "1,8"]) == 0
    # with memory to spare plain data parallel wins: its all-reduce hides under the backward
    # pass, where ZeRO-1/2 gather the updated parameters after the optimizer step, exposed
    assert "best layout dp8 x tp1 x pp1, ZeRO-0" in " ".join(capsys.readouterr().out.split())
    assert main(["project", str(nccl.path), "--memory-gb", "-1"]) == 2
    assert capsys.readouterr().err.strip() == \
        "perfswarm: error: --memory-gb -1.0: must be above 0 and at most 1,000,000,000"
    # named by the flag project now documents (--gpus-per-node its alias)
    assert main(["project", str(nccl.path), "--per-node", "0"]) == 2
    assert capsys.readouterr().err.strip() == \
        "perfswarm: error: --per-node 0: must be above 0 and at most 65,536"


def test_an_lstms_weights_are_counted(tmp_path: Path) -> None:
    """A word-level LSTM language model recorded on an H200: its two LSTM layers' weights
    (nn.LSTM passes them to aten::lstm as one tensor list, its third input) are most of its
    parameters: 264,192 of 392,692, which the layer shapes had left out (the gradients'
    all-reduce priced at a third of its bytes)."""
    trace = Path(__file__).parent / "data" / "lstm_h200.pt.trace.json.gz"
    raw = _raw_events(trace)
    first = min((e for e in raw if str(e.get("name", "")).startswith("ProfilerStep#")),
                key=lambda e: float(e["ts"]))
    lo, hi = float(first["ts"]), float(first["ts"]) + float(first["dur"])
    rnn = [e for e in raw if e.get("name") == "aten::lstm" and lo <= float(e["ts"]) < hi]
    weights = sum(math.prod(d) for e in rnn for d in e["args"]["Input Dims"][2])
    assert len(rnn) == 1 and weights == 264_192
    run = import_traces([trace], tmp_path / "l.run", ImportOptions(), ["t"])
    model = run_model(run, 0)
    assert (model.params, model.value_bytes) == (392_692, 4)


def test_profile_of_a_cpu_ddp_run(tmp_path: Path) -> None:
    """A CPU DDP run on gloo (tests/data/ddp_gloo.py): a step's compute is its marked span less
    the time its loop sat idle while gloo's thread ran the all-reduce, from the raw JSON (it
    had been the whole span, the wait for the other rank counted as compute)."""
    run = import_traces(GLOO_DDP, tmp_path / "g.run", ImportOptions(ranks=(0, 1)), ["test"])
    prof = profile(run, grad_bytes=4 * 17_226)
    assert prof.compute_source == "step spans (no device work)"
    raw = gloo_ddp_raw()
    expected = {}
    for rank, mine in enumerate(raw):
        for i, (lo, hi) in enumerate(mine.markers):
            waited = 0
            for start, end, _ in mine.gloo:
                gs, ge = max(start, lo), min(end, hi)
                if ge > gs:
                    waited += ge - gs - mine.work_in(gs, ge)
            expected[rank, i] = (hi - lo, hi - lo - waited)
    got = sorted((st.rank, st.wall_ns, st.compute_ns) for st in prof.steps)
    assert got == sorted((r, span, compute) for (r, _), (span, compute) in expected.items())
    assert all(compute < span for span, compute in expected.values())
    # the steps a recorder timed outside its window (no events; an export among them) are no
    # marked step's compute (they had counted, the export's 183-245 ms too)
    steps = run.table("steps").to_pylist()
    end = max(s["end"] for s in steps)
    steps += [{"rank": r, "step": 100 + i, "start": end + i * 10**9, "end": end + (i + 1) * 10**9,
               "source": source} for r in (0, 1) for i, source in enumerate(("export", "detected"))]
    run.write_table("steps", pa.Table.from_pylist(steps, schema=STEPS))
    again = profile(run, grad_bytes=4 * 17_226)
    assert sorted((st.rank, st.wall_ns, st.compute_ns) for st in again.steps) == got


def test_no_gradients_to_project_for_inference(tmp_path: Path) -> None:
    """The bundled encoder's trace without its backward and optimizer (an inference server's
    forwards): its layers' shapes hold parameters, but no gradients go between replicas; the
    projection says so (it had priced a 5 MiB all-reduce for a server under inference_mode)."""
    from perfswarm.errors import NotApplicable

    trace = orjson.loads(gzip.decompress(TRANSFORMER.read_bytes()))
    training = re.compile(r"Backward|^autograd::|^Optimizer\.|AccumulateGrad")
    trace["traceEvents"] = [e for e in trace["traceEvents"]
                            if not training.search(str(e.get("name", "")))]
    path = tmp_path / "infer.json"
    path.write_bytes(orjson.dumps(trace))
    run = import_traces([path], tmp_path / "i.run", ImportOptions(), ["t"])
    with pytest.raises(NotApplicable, match="no gradients to exchange"):
        project(run, [1, 8])
    trained = import_traces([TRANSFORMER], tmp_path / "t.run", ImportOptions(), ["t"])
    assert project(trained, [1, 8]).profile.grad_bytes_source == "parameter shapes"


def test_profile_reads_a_cpu_runs_collectives_on_host_threads(tmp_path: Path) -> None:
    """A tensor-parallel MLP on gloo, two CPU ranks, two profiled steps (the twenty-second
    pass's recording, /tmp/p22/dt22/cut.py): each step's calls are gloo's all-reduces that
    began in it, their bytes their recorded shape's, their time gloo's ranges, from the raw
    JSON (the profile had read no collective and priced one invented all-reduce of the
    parameters' 6,306,816 bytes as if measured)."""
    run = import_traces(TP_GLOO, tmp_path / "tp.run", ImportOptions(ranks=(0, 1)), ["test"])
    prof = profile(run, shaped_grad_bytes=6_306_816)
    expected = {}
    for rank, path in enumerate(TP_GLOO):
        trace = orjson.loads(gzip.decompress(path.read_bytes()))
        x = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
        for mark in sorted((e for e in x if e["name"].startswith("ProfilerStep#")),
                           key=lambda e: e["ts"]):
            lo, hi = mark["ts"], mark["ts"] + mark["dur"]
            expected[rank, int(mark["name"].split("#")[1])] = [
                ("all_reduce", 4 * math.prod(e["args"]["Input Dims"][0]),
                 round(Decimal(str(e["dur"])) * 1000)) for e in sorted(x, key=lambda e: e["ts"])
                if e["name"] == "gloo:all_reduce" and lo <= e["ts"] < hi]
    got = {(st.rank, st.step): [(c.op, c.nbytes, c.dur_ns) for c in st.calls]
           for st in prof.steps}
    assert got == expected and all(len(v) == 5 for v in got.values())
    assert {c.nbytes for st in prof.steps for c in st.calls} == {4 * 32 * 256}
    d = prof.to_dict()
    assert (d["collectives_per_step"], d["unpriced_collectives_per_step"]) == (5, 0)
    # a tensor-parallel layer's all-reduces carry activations (3 a step, issued in the
    # forward) and input gradients (2, in _FromTorchTensorBackward's node), none a
    # parameter's (none in AccumulateGrad's): the gradients stay the shapes'
    for path in TP_GLOO:
        x = [e for e in orjson.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
             if e.get("ph") == "X"]
        found = [_autograd_nodes_around(x, c) for c in x if c["name"] == "c10d::allreduce_"]
        assert sorted(found) == [()] * 6 + [("_FromTorchTensorBackward",)] * 4
    assert not any(c.gradient for st in prof.steps for c in st.calls)
    assert (prof.grad_bytes, prof.grad_bytes_source, prof.grad_elems) == (
        6_306_816, "parameter shapes", 0)


def _autograd_nodes_around(x: list[dict[str, Any]], call: dict[str, Any]) -> tuple[str, ...]:
    """The autograd nodes (`autograd::engine::evaluate_function: NAME`) around a raw event on
    its thread, by NAME."""
    return tuple(n["name"].split(": ", 1)[1] for n in x
                 if n["name"].startswith("autograd::engine::evaluate_function: ")
                 and n["tid"] == call["tid"] and n["ts"] <= call["ts"]
                 and call["ts"] + call["dur"] <= n["ts"] + n["dur"])


DDP_NOSYNC = [Path(__file__).parent / "data" / f"ddp_nosync_rank{r}.pt.trace.json.gz"
              for r in (0, 1)]


def test_a_cpu_ddp_runs_gradients_are_its_gradient_all_reduces(tmp_path: Path) -> None:
    """DDP on two gloo ranks, 4 micro-batches a step under no_sync() but the last (the
    twenty-first pass's ddp_nosync, its first two profiled steps, /tmp/p23/onedef17/cut.py):
    a Linear(256, 512), Linear(512, 512), Linear(512, 10) MLP, 399,370 parameters. Its
    all-reduces, each issued in AccumulateGrad's node (DDP's reducer hook), carry the
    gradients: their bytes a step, from the raw JSON, are the parameters' 4 x 399,370; the
    layers' shapes had been read instead, each weight once a micro-batch (6,389,920)."""
    run = import_traces(DDP_NOSYNC, tmp_path / "d.run", ImportOptions(ranks=(0, 1)), ["test"])
    per_step = set()
    for path in DDP_NOSYNC:
        x = [e for e in orjson.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
             if e.get("ph") == "X"]
        for mark in (e for e in x if e["name"].startswith("ProfilerStep#")):
            lo, hi = mark["ts"], mark["ts"] + mark["dur"]
            calls = [e for e in x if e["name"] == "c10d::allreduce_" and lo <= e["ts"] < hi]
            assert calls and {_autograd_nodes_around(x, c) for c in calls} == {
                ("torch::autograd::AccumulateGrad",)}
            per_step.add(sum(4 * math.prod(e["args"]["Input Dims"][0]) for e in x
                             if e["name"] == "gloo:all_reduce" and lo <= e["ts"] < hi))
    params = 256 * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10
    assert per_step == {4 * params} and params == 399_370
    prof = project(run, [1, 8]).profile
    assert (prof.grad_bytes, prof.grad_bytes_source, prof.grad_elems) == (
        4 * params, "collectives on host threads", params)
    assert all(c.gradient for st in prof.steps for c in st.calls)


def _device_trace(path: Path) -> Path:
    """One step of a device Run (hand-made Kineto JSON, us): a forward all-reduce issued
    inside the forward (a tensor-parallel layer's output: 1 MiB of activations) and one
    issued in AccumulateGrad's node (DDP's bucket: 4 MiB of gradients), each an NCCL kernel
    launched from its c10d call, a GEMM in between."""
    def op(name: str, ts: float, dur: float, cat: str = "cpu_op") -> dict[str, Any]:
        return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
                "args": {}}

    def launch(ts: float, corr: int, name: str, kts: float, args: dict[str, Any]
               ) -> list[dict[str, Any]]:
        return [{**op("cudaLaunchKernel", ts, 5, "cuda_runtime"), "args": {"correlation": corr}},
                {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": kts,
                 "dur": 100, "args": {"correlation": corr, "device": 0, "stream": 7, **args}}]

    def nccl(nelems: int) -> dict[str, Any]:
        return {"Collective name": "allreduce", "In msg nelems": nelems,
                "Out msg nelems": nelems, "Group size": 2, "dtype": "Float"}

    events = [op("ProfilerStep#1", 0, 2000, "user_annotation"),
              op("c10d::allreduce_", 100, 50), *launch(110, 1, "ncclDevKernel_AllReduce",
                                                       200, nccl(1 << 18)),
              op("aten::mm", 400, 50), *launch(410, 2, "ampere_sgemm_128x64_nn", 420, {}),
              op("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad",
                 800, 300),
              op("c10d::allreduce_", 900, 50), *launch(910, 3, "ncclDevKernel_AllReduce",
                                                       1000, nccl(1 << 20))]
    path.write_bytes(orjson.dumps({"traceEvents": events, "distributedInfo": {
        "backend": "nccl", "rank": 0, "world_size": 2}}))
    return path


def test_a_device_runs_tensor_parallel_all_reduce_is_no_gradient(tmp_path: Path) -> None:
    """The gradient bytes are the bucket's 4 MiB, not the forward's all-reduce beside it
    (both had been summed: 5 MiB)."""
    run = import_traces([_device_trace(tmp_path / "t.json")], tmp_path / "t.run",
                        ImportOptions(), ["test"])
    prof = profile(run)
    assert (prof.grad_bytes, prof.grad_bytes_source, prof.grad_elems) == (
        4 << 20, "collective kernels", 1 << 20)
    assert [(c.nbytes, c.gradient) for st in prof.steps for c in st.calls] == [
        (1 << 20, False), (4 << 20, True)]


GLOO_LOOPBACK = Path(__file__).parent / "data" / "gloo_loopback_profile.json"


def test_host_loopback_is_the_measured_gloo_all_reduce() -> None:
    """interconnects.yaml's host-loopback is the link `calibrate --collectives` fitted to gloo
    all-reduces between 2 processes of this project's VM (the profile kept in tests/data),
    as `project --intra-profile` takes one: its latency and largest-message bandwidth."""
    measured = link_of_profile(orjson.loads(GLOO_LOOPBACK.read_bytes()), "profile")
    bundled = interconnect("host-loopback")
    assert measured.name == "measured gloo x2"
    assert bundled.alpha_s == pytest.approx(measured.alpha_s, rel=1e-3)
    assert bundled.bandwidth_gbps == pytest.approx(measured.bandwidth_gbps, rel=1e-3)


def test_a_cpu_runs_projection_is_in_processes_on_hosts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A CPU DDP run on gloo (tests/data/ddp_gloo.py): its ranks are processes; a host holds
    its cores over each rank's threads (8 cores, 2 threads a rank: 4), joined by gloo over
    the host's loopback (it had been 8 devices a node on PCIe 4); an imported trace, whose
    host is unknown, 1 a host; --per-node wins; the words say processes."""
    run = import_traces(GLOO_DDP, tmp_path / "g.run", ImportOptions(ranks=(0, 1)), ["test"])
    grads = 4 * 17_226
    unknown = project(run, [1, 2, 8], grad_bytes=grads)
    assert (unknown.per_node, unknown.rank_unit, unknown.intra.name) == (
        1, "process", "host-loopback")
    manifest = run.manifest()
    manifest["host"] = {"cores": 8}
    manifest["extra"] = {"record": {"threads": [2, 2]}}
    run.write_manifest(manifest)
    got = project(run, [1, 2, 4, 8], grad_bytes=grads)
    assert (got.per_node, got.per_node_source) == (
        4, "8 cores on the host, 2 intra-op thread(s) a rank")
    assert got.intra == interconnect("host-loopback")
    # 4 processes on one host: each all-reduce over the loopback alone, as the model prices it
    given = project(run, [1, 2, 4, 8], grad_bytes=grads, per_node=4, intra="host-loopback")
    assert [p.to_dict() for p in got.points] == [p.to_dict() for p in given.points]
    assert given.per_node_source == "given"
    assert project(run, [1, 8], grad_bytes=grads, per_node=3).per_node == 3
    data = got.to_dict()
    assert (data["devices_per_node"], data["rank_unit"], data["rank_units"]) == (
        4, "process", "processes")
    page = tmp_path / "p.html"
    assert main(["project", str(run.path), "--grad-bytes", str(grads), "--devices", "1,2,8",
                 "--html", str(page)]) == 0
    out = capsys.readouterr().out
    assert "processes a node: 4 (8 cores on the host, 2 intra-op thread(s) a rank)" in out
    assert "devices" not in out.replace(str(run.path), "")
    text = page.read_text()
    assert "<th>processes</th>" in text and "per-process batch" in text
    assert "processes a node: 4 (8 cores on the host" in text
    assert "at 8 processes (the slowest network" in text and "at 8 devices" not in text
    assert main(["project", str(run.path), "--grad-bytes", str(grads), "--per-node", "2",
                 "--json"]) == 0
    assert orjson.loads(capsys.readouterr().out)["devices_per_node"] == 2


def test_a_gpu_runs_projection_keeps_its_devices(nccl: Run) -> None:
    """The corpus's A100 DDP trace: 8 devices a node on NVSwitch, as before."""
    got = project(nccl, [1, 8, 16])
    assert (got.per_node, got.rank_unit, got.intra.name) == (8, "device", "nvswitch-a100")
    assert got.per_node_source == "an HGX/DGX board's"
    given = project(nccl, [1, 8, 16], per_node=8, intra="nvswitch-a100")
    assert [p.to_dict() for p in got.points] == [p.to_dict() for p in given.points]
