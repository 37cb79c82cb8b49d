"""Op graphs written as Kineto traces (trace/opgraph.py) and forecast by `predict --device`, as
recorded on a CPU and on a GPU; the GPU forecast's bad inputs."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import orjson
import pytest

from conftest import events
from perfswarm.analyze.frame import Events
from perfswarm.cli.main import main
from perfswarm.model.gpu.aten import op_kernels
from perfswarm.model.gpu.forecast import ABSOLUTE, LearnedScaler, multi_tensor_seconds, op_seconds
from perfswarm.model.gpu.hardware import Hardware
from perfswarm.model.gpu.learned import bundled
from perfswarm.model.gpu.opgraph import (
    HOST_OP_NS,
    Precision,
    innermost_ops,
    multi_tensor_groups,
    unforecast,
)
from perfswarm.model.kernels import GPU_FLOOR_NS
from perfswarm.model.opcost import Shapes, op_cost
from perfswarm.model.predict import Change, predict
from perfswarm.model.specs import DeviceSpec, load_spec
from perfswarm.trace import opgraph
from perfswarm.trace.ingest import ImportOptions, import_traces
from perfswarm.trace.store import Run
from test_model_gpu import _small_dataset

F = "float"
# one training iteration of a 512 -> 1024 linear layer and a GELU on 64 rows
X, W, B, Y = (64, 512), (1024, 512), (1024,), (64, 1024)
FORWARD = [("aten::linear", (X, W, B)), ("aten::gelu", (Y,))]
BACKWARD = [("aten::gelu_backward", (Y, Y), "GeluBackward0"),
            ("aten::mm", (Y, W), "AddmmBackward0"), ("aten::mm", ((1024, 64), X), "AddmmBackward0"),
            ("aten::sum", (Y,), "AddmmBackward0")]
OPS = [(n, Shapes(d, (F,) * len(d))) for n, d in FORWARD] + [
    (n, Shapes(d, (F,) * len(d))) for n, d, _ in BACKWARD]


def _ops(kernel_ns: int = 0) -> list[opgraph.TraceOp]:
    fw = [opgraph.TraceOp(n, d, (F,) * len(d)) for n, d in FORWARD]
    bw = [opgraph.TraceOp(n, d, (F,) * len(d), grad) for n, d, grad in BACKWARD]
    if kernel_ns:  # a GPU run: every op one kernel of that length
        return [opgraph.TraceOp(o.name, o.dims, o.types, o.grad_fn, (("sgemm_128x64_nn"
                                if "mm" in o.name or "linear" in o.name else
                                "vectorized_elementwise_kernel", kernel_ns),)) for o in fw + bw]
    return fw + bw


def _run(tmp: Path, ops: list[opgraph.TraceOp], device: dict[str, object] | None) -> Run:
    path = opgraph.write(tmp / "graph.json", [ops, ops, ops], device)
    return import_traces([path], tmp / "graph.run", ImportOptions(), ["test"])


def _moved_ns(name: str, shapes: Shapes, ns: int, source: DeviceSpec, target: DeviceSpec
              ) -> int:
    """A kernel of `ns` on `source` on `target`: beyond the launch floor, scaled by the
    bundled model's ratio of its op's kernels, or, a layer norm's, the model's time on `target`
    whatever it took."""
    works = op_kernels(name, shapes) or []
    model = bundled()
    after = model.seconds(works, Hardware.of_spec(target)).sum()
    if all(w.family in ABSOLUTE for w in works):
        return GPU_FLOOR_NS + round(float(after * 1e9))
    ratio = after / model.seconds(works, Hardware.of_spec(source)).sum()
    return GPU_FLOOR_NS + round(float((ns - GPU_FLOOR_NS) * ratio))


def test_cpu_recorded_op_graph_forecast_on_a_gpu(tmp_path: Path) -> None:
    """Forward and backward ops with shapes, as the profiler records them on a CPU, become
    the GPU kernels they launch: the device time per iteration is the model's price of
    exactly those ops; the host launches them at the GPU host's time per op."""
    run = _run(tmp_path, _ops(), None)
    raw = orjson.loads((tmp_path / "graph.json").read_bytes())["traceEvents"]
    assert sum(e.get("name", "").startswith("ProfilerStep#") for e in raw) == 3
    assert [e["name"] for e in raw if e.get("cat") == "cpu_op"][:8] == [
        "aten::linear", "aten::gelu", "autograd::engine::evaluate_function: GeluBackward0",
        "GeluBackward0", "aten::gelu_backward",
        "autograd::engine::evaluate_function: AddmmBackward0", "AddmmBackward0", "aten::mm"]
    a100 = load_spec("A100-PCIE-40GB")
    p = predict(run, Change(device=a100.name))
    priced = op_seconds([(n, s, False) for n, s in OPS], a100)
    device_ns = sum(round(found[0] * 1e9) for found in priced if found is not None)
    assert all(found is not None for found in priced) and len(p.steps) == 3
    for step in p.steps:
        assert step.device_active_ns["predicted"] == pytest.approx(device_ns, abs=len(OPS))
        assert step.predicted_ns >= len(OPS) * HOST_OP_NS
    assert p.kernels == {"priced": 3, "unpriced": 0}


def test_gpu_recorded_op_graph_reproduced_and_moved(tmp_path: Path) -> None:
    """Recorded on an A100 (every op one 200 us kernel): predict reproduces the iterations at
    the recorded configuration, and on a T4 every kernel is its time on the A100 scaled by the
    model's ratio of its op's kernels (beyond the launch floor)."""
    a100, t4 = load_spec("A100-PCIE-40GB"), load_spec("T4")
    ns = 200_000
    run = _run(tmp_path, _ops(ns), {"name": a100.names[0], "totalGlobalMem":
                                    int(a100.memory_bytes), "numSms": a100.compute_units})
    ev = Events.load(run)
    assert int(ev.of_kind("kernel").sum()) == 3 * len(OPS)
    same = predict(run)
    assert same.source_device == a100.name
    for step in same.steps:
        assert abs(step.predicted_ns / step.measured_ns - 1) < 0.02
    moved = predict(run, Change(device="T4"))
    expected = sum(_moved_ns(name, shapes, ns, a100, t4) for name, shapes in OPS)
    for step in moved.steps:
        assert step.device_active_ns["predicted"] == pytest.approx(expected, rel=1e-3)
        assert step.predicted_ns > step.measured_ns  # the T4 is the slower GPU


def test_a_full_launch_queue_paces_the_host(tmp_path: Path) -> None:
    """Recorded on an A100 without a sync per iteration: 600 adds of 16M floats a step, each
    launched in 20 us of host time and run in 19 us, so the device keeps up and the steps are
    the host's. On a P4 (192 vs 1,555 GB/s) each add takes several times longer: the host
    runs ahead until 1,024 launches wait, and from then on each launch waits for an add to
    finish, so the last step lasts as long as its adds on the device, not the host's 12 ms."""
    a100 = load_spec("A100-PCIE-40GB")
    size = (4096, 4096)
    add = opgraph.TraceOp("aten::add", (size, size), (F, F), "",
                          (("vectorized_elementwise_kernel", 19_000),))
    path = opgraph.write(tmp_path / "adds.json", [[add] * 600] * 3,
                         {"name": a100.names[0], "totalGlobalMem": int(a100.memory_bytes),
                          "numSms": a100.compute_units}, sync=False)
    run = import_traces([path], tmp_path / "adds.run", ImportOptions(), ["test"])
    same = predict(run)
    assert [round(s.measured_ns / 1e6, 1) for s in same.steps] == [12.0, 12.0, 12.0]
    assert all(abs(s.predicted_ns / s.measured_ns - 1) < 0.02 for s in same.steps)
    p4 = predict(run, Change(device="P4"))
    kernel_ns = _moved_ns("aten::add", Shapes((size, size), (F, F)), 19_000, a100,
                          load_spec("P4"))
    assert kernel_ns > 5 * 19_000  # the P4's add, several times the A100's
    assert p4.steps[0].predicted_ns < 1.1 * p4.steps[0].measured_ns  # the queue fills
    assert p4.steps[-1].predicted_ns == pytest.approx(600 * kernel_ns, rel=0.02)


def test_forecast_bad_inputs(corpus_runs: dict[str, Run], tmp_path: Path,
                             capsys: pytest.CaptureFixture[str]) -> None:
    """One line naming the file or flag and the problem, exit 2, nothing written."""
    run = corpus_runs["cpu_only"]  # recorded without shapes
    assert main(["predict", str(run.path), "--device", "A100-PCIe-40GB"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(run.path) in err and "record_shapes=True" in err
    # "A100" names four devices: the error lists them first
    assert main(["predict", str(run.path), "--device", "a100"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and ("--device a100: unknown device; closest known: A100-40GB, "
                                     "A100-PCIe-40GB, A100-80GB, A100-PCIe-80GB") in err
    folder = _small_dataset(tmp_path, 5)
    out = tmp_path / "model.npz"
    sweep = folder / "train" / "ln" / "Tesla_T4.csv.gz"
    lines = gzip.decompress(sweep.read_bytes()).decode().splitlines()
    sweep.write_bytes(gzip.compress("\n".join([lines[0], lines[1].replace(",", ",x", 1),
                                               *lines[2:]]).encode()))
    assert main(["calibrate", "--dataset", str(folder), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{sweep}: line 2: missing or malformed column" in err
    sweep.write_bytes(gzip.compress("\n".join(lines).encode())[:40])  # cut short
    assert main(["calibrate", "--dataset", str(folder), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{sweep}: not a readable gzip CSV" in err
    shutil.rmtree(folder / "train")  # the measurements missing
    assert main(["calibrate", "--dataset", str(folder), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{folder / 'train'}: no measurements" in err
    assert not out.exists()


def test_ops_that_zero_their_output_keep_their_own_kernel() -> None:
    """A CPU trace's op tree: linear around addmm is one GEMM (the addmm), and the copy of
    the bias into the addmm's output that the CPU records inside it (CUDA runs it too) a
    kernel before it; a max-pool backward around the zero_ (around fill_) of its gradient is
    two kernels, the fill and its own; a clone around its copy_ is the copy alone."""
    pool = ((8, 16, 16, 16), (8, 16, 32, 32), (8, 16, 16, 16))
    out = (X[0], 1024)
    rows = [(0, 0, 100, "cpu_op", "aten::max_pool2d_with_indices_backward", 1, -1, -1, -1),
            (0, 10, 20, "cpu_op", "aten::zero_", 1, -1, -1, -1),
            (0, 12, 16, "cpu_op", "aten::fill_", 1, -1, -1, -1),
            (0, 200, 100, "cpu_op", "aten::linear", 1, -1, -1, -1),
            (0, 205, 5, "cpu_op", "aten::t", 1, -1, -1, -1),
            (0, 220, 70, "cpu_op", "aten::addmm", 1, -1, -1, -1),
            (0, 222, 6, "cpu_op", "aten::copy_", 1, -1, -1, -1),
            (0, 400, 50, "cpu_op", "aten::clone", 1, -1, -1, -1),
            (0, 410, 30, "cpu_op", "aten::copy_", 1, -1, -1, -1)]
    shapes = [Shapes(pool, (F,) * 3), Shapes((pool[1],), (F,)), Shapes((pool[1], ()), (F, F)),
              Shapes((X, W, B), (F,) * 3), Shapes((W,), (F,)), Shapes((B, X, (512, 1024)),
                                                                   (F,) * 3),
              Shapes((out, out), (F, F)), Shapes((out,), (F,)), Shapes((out, out), (F, F))]
    ev = events(rows)
    found = innermost_ops(ev, lambda r: shapes[r], 0, 1_000)
    assert [ev.name_of(r) for r in found] == [
        "aten::max_pool2d_with_indices_backward", "aten::fill_", "aten::addmm", "aten::copy_",
        "aten::copy_"]
    assert [int(ev.ts[r]) for r in found][-3:] == [220, 222, 410]


def test_ops_that_copy_their_inputs_keep_their_own_kernel() -> None:
    """A convolution backward around the contiguous (clone, copy_) of its output gradient is
    its own two kernels and the copy (it had been the copy alone: 4 of 9 of a ResNet's), a
    clamp around the to() of its bounds its own kernel, an LSTM layer around its bias sum
    stays (it has no kernel model, and is said so); a to() around its _to_copy and copy_
    passes the copy on, as linear around addmm does."""
    grad, x, w = (8, 16, 32, 32), (8, 16, 32, 32), (16, 16, 3, 3)
    seq, gates = (5, 4, 8), (64,)
    rows = [(0, 0, 100, "cpu_op", "aten::convolution_backward", 1, -1, -1, -1),
            (0, 5, 20, "cpu_op", "aten::contiguous", 1, -1, -1, -1),
            (0, 6, 18, "cpu_op", "aten::clone", 1, -1, -1, -1),
            (0, 8, 14, "cpu_op", "aten::copy_", 1, -1, -1, -1),
            (0, 200, 50, "cpu_op", "aten::clamp", 1, -1, -1, -1),
            (0, 205, 5, "cpu_op", "aten::to", 1, -1, -1, -1),
            (0, 300, 90, "cpu_op", "aten::mkldnn_rnn_layer", 1, -1, -1, -1),
            (0, 305, 5, "cpu_op", "aten::add", 1, -1, -1, -1),
            (0, 400, 40, "cpu_op", "aten::to", 1, -1, -1, -1),
            (0, 402, 30, "cpu_op", "aten::_to_copy", 1, -1, -1, -1),
            (0, 404, 20, "cpu_op", "aten::copy_", 1, -1, -1, -1)]
    conv = Shapes((grad, x, w), (F,) * 3)
    lstm = Shapes((seq, (32, 8), (32, 8), gates, gates, (4, 8), (4, 8)), (F,) * 7)
    shapes = [conv, Shapes((grad,), (F,)), Shapes((grad,), (F,)), Shapes((grad, grad), (F, F)),
              Shapes((x, (), ()), (F, F, F)), Shapes(((1,),), (F,)), lstm,
              Shapes((gates, gates), (F, F)), Shapes((x,), (F,)), Shapes((x,), (F,)),
              Shapes((x, x), (F, F))]
    ev = events(rows)
    found = [(ev.name_of(r), int(ev.ts[r]))
             for r in innermost_ops(ev, lambda r: shapes[r], 0, 1_000)]
    assert found == [("aten::convolution_backward", 0), ("aten::copy_", 8),
                     ("aten::clamp", 200), ("aten::to", 205), ("aten::mkldnn_rnn_layer", 300),
                     ("aten::add", 305), ("aten::copy_", 404)]


def test_ops_without_a_gpu_model_are_named() -> None:
    """An int8 dynamic-quantized linear (no cost model, no costed op inside) is what a CPU
    Run's forecast on a GPU leaves out, and says so; a costed op, a view, an autograd node
    around nothing costed are not."""
    out = (X[0], 1024)
    rows = [(0, 0, 700, "cpu_op", "quantized::linear_dynamic", 1, -1, -1, -1),
            (0, 10, 5, "cpu_op", "aten::empty", 1, -1, -1, -1),
            (0, 800, 100, "cpu_op", "aten::relu", 1, -1, -1, -1),
            (0, 950, 20, "cpu_op", "aten::view", 1, -1, -1, -1),
            (0, 980, 15, "cpu_op", "autograd::engine::evaluate_function: ViewBackward0", 1,
             -1, -1, -1)]
    shapes = [Shapes((X, W), (F, F)), None, Shapes((out,), (F,)), Shapes((out,), (F,)), None]
    ev = events(rows)
    costed = set(innermost_ops(ev, lambda r: shapes[r], 0, 1_000))
    assert unforecast(ev, costed, 0, 1_000) == {"quantized::linear_dynamic": 700}


def test_layer_norm_kernels_move_at_the_models_own_time() -> None:
    """Moved to another GPU, a layer norm kernel takes the model's time there (the
    decomposition of benchmarks/gpu_label_runs.py finds it closer than the ratio), whatever it
    measured; a GEMM or an add keeps the ratio; on the recorded GPU (a changed batch) a layer
    norm too."""
    v100, t4 = load_spec("V100"), load_spec("T4")
    moved, kept = LearnedScaler.of(v100, t4), LearnedScaler.of(v100, v100)
    dims: tuple[tuple[int, ...], ...] = ((4096, 1024),)
    shapes = Shapes(dims, (F,))
    norm = op_cost("aten::native_layer_norm", dims, shapes.types)
    assert norm is not None
    [(on_t4, family)] = op_seconds([("aten::native_layer_norm", shapes, False)], t4)  # type: ignore[misc]
    assert family == "norm"
    for measured in (50_000, 500_000):
        assert moved.scaled(measured, norm, norm, dims, dims) == pytest.approx(on_t4 * 1e9, abs=1)
    assert kept.scaled(500_000, norm, norm, dims, dims) == 500_000
    for name, dims in (("aten::mm", ((4096, 1024), (1024, 1024))),
                       ("aten::add", ((4096, 1024), (4096, 1024)))):
        cost = op_cost(name, dims, (F, F))
        assert cost is not None
        ten, one = (moved.scaled(GPU_FLOOR_NS + n, cost, cost, dims, dims) - GPU_FLOOR_NS
                    for n in (480_000, 48_000))
        assert ten == pytest.approx(10 * one, abs=10)


def test_per_parameter_ops_as_multi_tensor_launches() -> None:
    """An optimizer's per-parameter ops on a GPU are multi-tensor ops: torch's
    multi_tensor_apply takes at most 64 tensors of two tensor lists (lerp_(exp_avg, grad)) and
    320 chunks of 65,536 elements per launch; the launches stream the tensors' elements."""
    h200 = load_spec("H200")
    small = [("aten::lerp_", Shapes(((256, 256), (256, 256), ()), (F, F, "Scalar")))] * 100
    found = multi_tensor_seconds(small, h200)
    assert found is not None and found.launches == 2  # ceil(100 / 64)
    one = op_seconds([(*small[0], False)], h200)[0]
    assert one is not None and found.seconds < 100 * one[0]  # not a hundred launch floors
    huge = [("aten::mul_", Shapes(((8192, 8192), ()), (F, "Scalar")))] * 3
    found = multi_tensor_seconds(huge, h200)
    assert found is not None and found.launches == 10  # 3 x 2^26 elements / 2^24.3 a launch
    assert multi_tensor_seconds([("aten::view", Shapes(((4, 4),), (F,)))], h200) is None


def test_tf32_as_the_recording_set_it() -> None:
    """An FP32 GEMM runs on TF32 tensor cores where the recorded process allowed it
    (torch.backends.cuda.matmul.allow_tf32): faster on an H200, the same on a V100 (no TF32);
    without the record, torch's defaults: GEMMs in FP32, convolutions on TF32."""
    assert Precision.of_record({}) == Precision(False, True, False)
    allowed = Precision.of_record({"fp32_matmul": "tf32", "fp32_conv": "ieee"})
    assert allowed.tensor_cores("gemm") and not allowed.tensor_cores("conv")
    gemm = ("aten::mm", Shapes(((4096, 4096), (4096, 4096)), (F, F)))
    for gpu, faster in (("H200", True), ("V100", False)):
        spec = load_spec(gpu)
        (fp32, _), (tf32, _) = (op_seconds([(*gemm, tc)], spec)[0] or (0.0, "")
                                for tc in (False, True))
        assert (tf32 < fp32 / 2) if faster else tf32 == fp32


def test_backward_ops_of_a_cpu_trace_are_priced() -> None:
    """torch's CPU attention backward (five matrix products and the softmax's gradient) and an
    embedding's backward over a [B, T, C] gradient are GPU kernels the model prices."""
    q = (12, 4, 64, 32)
    attention = op_kernels("aten::_scaled_dot_product_flash_attention_for_cpu_backward",
                           Shapes((q, q, q, q, q, (12, 4, 64), (), (), (), ()),
                                  (F,) * 6 + ("Scalar",) * 2 + ("", "")))
    assert attention is not None
    assert sorted(w.family for w in attention) == ["gemm"] * 5 + ["softmax"]
    assert sum(w.flops for w in attention if w.family == "gemm") == 5 * 2 * 48 * 64 * 64 * 32
    grad = op_kernels("aten::embedding_dense_backward",
                      Shapes(((12, 64, 128), (12, 64), (), (), ()),
                             (F, "long int", "Scalar", "Scalar", "Scalar")))
    assert grad is not None and grad[0].m * grad[0].n >= 12 * 64 * 128


def test_loops_over_the_parameters_are_multi_tensor_ops() -> None:
    """clip_grad_norm_ on a CPU: a norm per gradient (10, of the parameters' shapes), then the
    norm of the stacked norms, then a scaling per gradient: on CUDA two foreach ops and the
    total's norm. A manual SGD loop's ops alternate (runs of one): each launches alone."""
    params = {(64, 32), (32,)}
    dims = [(64, 32), (32,)] * 5
    rows: list[tuple[int, int, int, str, str, int, int, int, int]] = []
    shapes: list[Shapes] = []

    def op(name: str, d: tuple[int, ...], *more: tuple[int, ...]) -> None:
        rows.append((0, 10 * len(rows), 5, "cpu_op", name, 1, -1, -1, -1))
        shapes.append(Shapes((d, *more), (F,) * (1 + len(more))))

    for d in dims:
        op("aten::linalg_vector_norm", d)
    op("aten::linalg_vector_norm", (10,))
    for d in dims:
        op("aten::mul_", d, ())
    for d in dims[:3]:  # manual SGD: p -= lr * p.grad
        op("aten::mul", d, ())
        op("aten::sub_", d, d)
    ev = events(rows)
    kept, groups = multi_tensor_groups(ev, list(range(len(rows))), lambda r: shapes[r], params)
    assert [(ev.name_of(g[0]), len(g)) for g in groups] == [
        ("aten::linalg_vector_norm", 10), ("aten::mul_", 10)]
    assert [ev.name_of(r) for r in kept] == ["aten::linalg_vector_norm"] + [
        "aten::mul", "aten::sub_"] * 3
