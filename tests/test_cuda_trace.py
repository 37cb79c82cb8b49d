"""A real CUDA trace: nanoGPT on an NVIDIA H200, recorded by `perfswarm record` (see
tests/data/nanogpt_h200.txt). Steps, the critical path's hand-overs to the autograd thread and
the profiler's late annotation, each checked against plain loops over the raw JSON."""

from __future__ import annotations

import gzip
import itertools
import statistics
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import pytest

from perfswarm.analyze.frame import Events
from perfswarm.analyze.iterations import iterations
from perfswarm.analyze.summary import analyze
from perfswarm.model.opstats import op_costs
from perfswarm.model.predict import predict
from perfswarm.report.data import report_data
from perfswarm.trace.ingest import ImportOptions, import_traces
from perfswarm.trace.store import Run

TRACE = Path(__file__).parent / "data" / "nanogpt_h200.pt.trace.json.gz"
WORK = ("cpu_op", "cuda_runtime", "cuda_driver")  # what a thread does when it works


@pytest.fixture(scope="module")
def raw() -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = orjson.loads(gzip.decompress(TRACE.read_bytes()))[
        "traceEvents"]
    return [e for e in events if e.get("ph") == "X"]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return import_traces([TRACE], tmp_path_factory.mktemp("h200") / "h200.run",
                         ImportOptions(), ["test"])


def us(value: Any) -> Decimal:
    return Decimal(str(value))


def markers(raw: list[dict[str, Any]], cat: str = "user_annotation") -> list[dict[str, Any]]:
    return sorted((e for e in raw if e["name"].startswith("ProfilerStep#") and e["cat"] == cat),
                  key=lambda e: us(e["ts"]))


def test_steps_are_the_host_markers(run: Run, raw: list[dict[str, Any]]) -> None:
    """Five ProfilerStep spans on the host; Kineto's copy of the first on the GPU's timeline
    (131 ms, to the window's end) is no step."""
    host = markers(raw)
    assert [e["name"] for e in host] == [f"ProfilerStep#{i}" for i in range(10, 15)]
    (copy,) = markers(raw, "gpu_user_annotation")
    assert copy["name"] == "ProfilerStep#10" and us(copy["dur"]) > 130_000
    steps = run.table("steps").to_pylist()
    assert [(s["step"], s["end"] - s["start"]) for s in steps] == [
        (int(e["name"].split("#")[1]), int(us(e["dur"]) * 1000)) for e in host]


def test_backward_hands_over_to_the_autograd_thread(run: Run, raw: list[dict[str, Any]]) -> None:
    """In each steady step the main thread calls backward and waits while the autograd thread
    runs every backward op; the path moves to that thread at its first op and back to the main
    thread at the main thread's first op after the autograd thread's last (clip_grad_norm_'s
    _foreach_norm, 0.6 ms later: the main thread's Python after it woke)."""
    main = markers(raw)[0]["tid"]
    (autograd,) = {e["tid"] for e in raw if e["name"].startswith("autograd::engine::")}
    assert autograd != main
    path = analyze(run).critical_path
    assert path is not None
    by_step = {s.step: s for s in path.steps}
    for mark in markers(raw)[1:4]:  # steps 11-13 (10 holds the profiler's start, 14 its stop)
        lo, hi = us(mark["ts"]), us(mark["ts"]) + us(mark["dur"])
        back = [e for e in raw if e["tid"] == autograd and e["cat"] in WORK
                and lo <= us(e["ts"]) < hi]
        first = min(us(e["ts"]) for e in back)
        last = max(us(e["ts"]) + us(e["dur"]) for e in back)
        resumed = min(us(e["ts"]) for e in raw if e["tid"] == main and e["cat"] in WORK
                      and us(e["ts"]) >= last)
        step = by_step[int(mark["name"].split("#")[1])]
        origin = run.table("steps").to_pylist()[0]["start"] - int(us(markers(raw)[0]["ts"])
                                                                  * 1000)
        assert [(h.from_tid, h.to_tid, h.at - origin) for h in step.handovers] == [
            (main, autograd, int(first * 1000)), (autograd, main, int(resumed * 1000))]
        assert resumed - last > 500  # us: over the old 5%-of-the-wait bound
        assert sum(step.ns.values()) == step.length_ns


def test_annotation_ends_with_the_trace(run: Run, raw: list[dict[str, Any]]) -> None:
    """The profiler stopped inside the last step's optimizer step (the recorder's hook runs in
    its range), and Kineto closed that range 31.6 ms after its own trace window ended: the
    event frame ends it with the window, so the last step's path is the step and the profiler's
    final sync, not the export."""
    (window,) = [e for e in raw if e["cat"] == "Trace"]
    stop = us(window["ts"]) + us(window["dur"])
    last = max((e for e in raw if e["name"].startswith("Optimizer.step#")
                and e["cat"] == "user_annotation"), key=lambda e: us(e["ts"]))
    assert us(last["ts"]) + us(last["dur"]) - stop > 30_000
    ev = Events.load(run)
    rows = [i for i in range(len(ev)) if ev.name_of(i) == last["name"]]
    origin = run.table("steps").to_pylist()[0]["start"] - int(us(markers(raw)[0]["ts"]) * 1000)
    assert int(ev.end[rows].max()) - origin == int(stop * 1000)
    path = analyze(run).critical_path
    assert path is not None
    (step,) = [s for s in path.steps if s.step == 14]
    assert step.end - origin == int(stop * 1000)


def test_tf32_gemms_are_costed_as_tf32(run: Run, raw: list[dict[str, Any]]) -> None:
    """nanoGPT allows TF32 matmuls, and each of its FP32 aten::mm launched a TF32 tensor-core
    kernel on the H200 (the raw JSON's kernel names): the op cost table prices them against
    the TF32 peak, and the report's MFU is of that peak."""
    kernels = {e["name"] for e in raw if e["cat"] == "kernel" and "gemm" in e["name"]}
    assert kernels and all("tf32" in k or "tensorop" in k for k in kernels)
    mms = [o for o in op_costs(run, [0]).ops if o.name == "aten::mm"]
    assert mms and {o.dtype for o in mms} == {"tf32"}
    flops = report_data(run)["flops"]
    assert flops["dtype"] == "tf32" and flops["peak_flops_per_s"] == 494.7e12


def test_only_device_reads_are_host_syncs(run: Run, raw: list[dict[str, Any]]) -> None:
    """Of the 245 .item() reads in the window, 240 read CPU tensors and wait for nothing (no
    runtime call inside them); 5, nanoGPT's loss.item() once a step, copy from the device:
    one sync a step, under host_syncs' three, so it does not fire (it counted all 245)."""
    reads = [e for e in raw if e["name"] == "aten::_local_scalar_dense"]
    calls = [e for e in raw if e["cat"] == "cuda_runtime"]

    def holds_call(r: dict[str, Any]) -> bool:
        lo, hi = us(r["ts"]), us(r["ts"]) + us(r["dur"])
        return any(c["tid"] == r["tid"] and lo <= us(c["ts"]) and us(c["ts"]) + us(c["dur"])
                   <= hi for c in calls)

    device_reads = [r for r in reads if holds_call(r)]
    assert (len(reads), len(device_reads)) == (245, 5)
    from perfswarm.optimize.advise import advise

    assert "host_syncs" not in {a.rule for a in advise(run).advice}


def test_launch_bound_on_the_h200(run: Run, raw: list[dict[str, Any]]) -> None:
    """nanoGPT small on an H200: 748 kernels in the 4 usual profiled steps, 719 under 10 µs,
    the device busy 2.3% of the time: launch-bound, and the device idle (a larger batch pays
    about as much as a CUDA graph: the host's time per sample halves either way). The first
    profiled step, over twice the others, starts the profiler: advice measures the other four
    (it had counted 935 kernels, 898 small, in all five)."""
    from perfswarm.optimize.advise import advise

    steps = markers(raw)
    durations = [us(e["dur"]) for e in steps]
    assert durations[0] > 2 * statistics.median(durations[1:])  # the profiler's start
    steps = steps[1:]
    lo, hi = min(us(e["ts"]) for e in steps), max(us(e["ts"]) + us(e["dur"]) for e in steps)
    kernels = [e for e in raw if e["cat"] == "kernel" and lo <= us(e["ts"]) < hi]
    found = {a.rule: a for a in advise(run).advice}
    assert set(found) == {"launch_bound", "low_utilization"}
    bound = found["launch_bound"]
    assert bound.title == "many small kernels: launch overhead dominates"
    assert (bound.evidence["kernels"], bound.evidence["small_kernels"]) == (
        len(kernels), sum(us(e["dur"]) < 10 for e in kernels)) == (748, 719)
    # 50.5 µs of host a kernel of 3.4 µs (76.8 µs had counted the profiler's start's host work)
    assert bound.evidence["host_per_kernel_ns"] > 10 * bound.evidence["kernel_mean_ns"]


def test_predict_reads_typical_times_off_two_steady_steps(tmp_path: Path) -> None:
    """A second H200 round of the same command (nanogpt_h200.txt): its profiled steps ran 45,
    11.5, 9.0, 9.1 and 8.8 ms. Two are steady (the first starts the profiler, the second ran
    slow, the last holds the profiler's stop); the ops' typical times come from those two, and
    predict at the recorded configuration lands within 2% of their median (the trimmed mean of
    all five steps' instances put it 39% long)."""
    trace = TRACE.with_name("nanogpt_h200_b.pt.trace.json.gz")
    raw = [e for e in orjson.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
           if e.get("ph") == "X"]
    lengths = {int(e["name"].split("#")[1]): int(us(e["dur"]) * 1000) for e in markers(raw)}
    assert sorted(lengths) == list(range(10, 15))
    run = import_traces([trace], tmp_path / "b.run", ImportOptions(), ["test"])
    found = predict(run)
    assert found.steady == {(0, 12), (0, 13)}
    assert found.measured_steady_ns == (lengths[12] + lengths[13]) // 2
    error = found.predicted_error
    assert error is not None and error < 0.02


def test_first_marker_opens_before_anything_is_traced(tmp_path: Path) -> None:
    """A 1-d conv net on an H200 (tests/data/conv1d_h200.txt): its first ProfilerStep opens
    well before the first op the trace holds (the profiler starting: nothing ran that it
    saw). Detected iterations begin at the first op; that boundary agrees with the marker
    anywhere in the untraced gap, and then every boundary lies within 1% of the mean step
    (the gap alone was 41% of it)."""
    trace = TRACE.with_name("conv1d_h200.pt.trace.json.gz")
    raw = [e for e in orjson.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
           if e.get("ph") == "X"]
    (first, *rest) = markers(raw)
    ops = [us(e["ts"]) for e in raw if e["cat"] in ("cpu_op", "user_annotation")
           and not e["name"].startswith("ProfilerStep#") and us(e["dur"]) > 0]
    gap = (min(ops) - us(first["ts"])) * 1000
    mean = sum(us(e["dur"]) for e in (first, *rest)) * 1000 / (1 + len(rest))
    assert gap > Decimal("0.3") * mean
    run = import_traces([trace], tmp_path / "c.run", ImportOptions(), ["test"])
    (agree,) = iterations(run, Events.load(run)).agreement
    assert agree.count_matches and agree.marker_count == 5
    assert agree.max_error_pct < 1.0


def test_backward_on_the_autograd_thread_ends_its_step(tmp_path: Path) -> None:
    """A manual-SGD LSTM on an H200 (tests/data/lstm_h200.txt): backward() hands its work to
    the autograd thread and the main thread waits, untraced, until the next step. A detected
    step ends with the autograd thread's last work in that wait, not with the main thread's
    last op before it (which cut every step 8 ms early: 129% of the mean step). What is left
    is backward()'s untraced return before the recorder's marker."""
    trace = TRACE.with_name("lstm_h200.pt.trace.json.gz")
    raw = [e for e in orjson.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
           if e.get("ph") == "X"]
    marks = markers(raw)
    main = marks[0]["tid"]
    t0 = us(marks[0]["ts"])

    def ns(t: Decimal) -> int:
        return int((t - t0) * 1000)

    own = sorted((us(e["ts"]), us(e["ts"]) + us(e["dur"])) for e in raw
                 if e["tid"] == main and e["cat"] == "cpu_op")
    other = [us(e["ts"]) + us(e["dur"]) for e in raw if e["tid"] != main and e["cat"] in WORK]
    # each step's end: the last work another thread ended while the main thread waited
    # around the marker's end (its last op before it ended, its next op had not begun)
    ends = []
    for m in marks:
        end = us(m["ts"]) + us(m["dur"])
        before = max(b for a, b in own if b <= end)
        after = min((a for a, _ in own if a >= end), default=Decimal("Infinity"))
        ends.append(max(t for t in other if before < t < after))
    run = import_traces([trace], tmp_path / "l.run", ImportOptions(), ["test"])
    found = iterations(run, Events.load(run))
    (agree,) = found.agreement
    detected = found.detected[0]
    start = found.markers[0][0].start
    assert len(detected) == len(marks) == 5
    assert [w.end - start for w in detected] == [ns(t) for t in ends]
    assert [w.start - start for w in detected[1:]] == [ns(t) for t in ends[:-1]]
    gaps = [(us(a["ts"]) + us(a["dur"]), us(b["ts"])) for a, b in itertools.pairwise(marks)]
    off = [max(lo - t, t - hi, Decimal(0)) for t, (lo, hi) in zip(ends, gaps, strict=False)]
    off.append(abs(us(marks[-1]["ts"]) + us(marks[-1]["dur"]) - ends[-1]))
    assert agree.max_boundary_error_ns == int(max(off) * 1000)
    assert agree.max_error_pct < 6.0
