"""The overview's rates: samples and tokens a second (and where the batch came from), MFU beside
HFU from the FLOPs of each pass, and each kernel's share of its ops' roofline; exact numbers
from the raw JSON of the corpus's MI250 training step and of traces written here."""

from __future__ import annotations

import gzip
import json
import shlex
import tracemalloc
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import markupsafe
import numpy as np
import orjson
import polars as pl
import pyarrow as pa
import pytest

from conftest import corpus
from perfswarm.analyze.frame import Events
from perfswarm.analyze.phases import PHASES, phases
from perfswarm.model.opcost import roofline, shapes_cost, shapes_from_args
from perfswarm.model.opstats import costed_ops, op_costs
from perfswarm.model.specs import spec_of_devices
from perfswarm.report import html, overview
from perfswarm.report.data import report_data
from perfswarm.report.overview import CATEGORIES
from perfswarm.report.timeline import run_origin, spans, timeline
from perfswarm.report.views import memory_view
from perfswarm.trace import synthetic
from perfswarm.trace.ingest import ImportOptions, import_traces
from perfswarm.trace.store import Run


def raw_events(name: str) -> list[dict[str, Any]]:
    with gzip.open(corpus(name), "rt") as f:
        events: list[dict[str, Any]] = json.load(f)["traceEvents"]
    return events


def host_steps(raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ProfilerStep spans on the host (the GPU's copies of them are not steps)."""
    return [e for e in raw if e["name"].startswith("ProfilerStep#")
            and e.get("cat") == "user_annotation"]


def held_steps(raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The host's ProfilerStep spans that hold any other event (the MI250 trace's second, 49
    us, holds none: its loop ended inside the profiler's window)."""
    return [s for s in host_steps(raw) if any(
        e is not s and s["ts"] <= e["ts"] < s["ts"] + s["dur"] for e in raw)]


def test_phases_of_the_mi250_step(corpus_runs: dict[str, Run]) -> None:
    """An op inside an autograd node's span on its thread is backward, inside the optimizer's
    step optimizer, else forward: checked against the raw spans with plain loops."""
    raw = [e for e in raw_events("amd") if e.get("ph") == "X"]
    scopes = {"backward": [e for e in raw if e["name"].startswith(
                  "autograd::engine::evaluate_function: ") or e["name"].endswith("Backward0")],
              "optimizer": [e for e in raw if e["name"].startswith("Optimizer.")]}

    def phase(e: dict[str, Any]) -> str:
        for name in ("backward", "optimizer"):
            if any(s["tid"] == e["tid"] and s["ts"] <= e["ts"] < s["ts"] + s["dur"]
                   for s in scopes[name]):
                return name
        return "forward"

    expected = Counter((e["name"], phase(e)) for e in raw if e.get("cat") == "cpu_op")
    ev = Events.load(corpus_runs["amd"])
    rows = np.flatnonzero(ev.of_kind("cpu_op"))
    got = Counter((ev.name_of(r), PHASES[p]) for r, p in zip(
        rows.tolist(), phases(ev, rows).tolist(), strict=True))
    assert got == expected
    assert got[("aten::addmm", "forward")] == 1 and got[("aten::mm", "backward")] == 1
    assert got[("aten::_foreach_add_", "optimizer")] == 1


def test_mfu_hfu_and_kernel_roofline_of_the_mi250_step(corpus_runs: dict[str, Run]) -> None:
    """The forward's GEMM (addmm 5x128 @ 128x128) and the backward's weight gradient (mm
    128x5 @ 5x128) price the pass FLOPs; MFU takes 3x the forward but once the ops autograd
    made no node for (the input's and the target's randn), HFU what ran. The addmm's cost
    splits over its two kernels by their raw durations."""
    run = corpus_runs["amd"]
    data = report_data(run)
    flops, phase = data["flops"], data["op_cost"]["phase_flops"]
    gemm = 2 * 5 * 128 * 128
    assert phase["backward"] >= gemm and phase["forward"] >= gemm
    assert flops["flops"] == sum(phase.values())
    noise = 2 * 5 * 128  # two normal_ over 5x128, a FLOP an element
    assert data["op_cost"]["no_grad_flops"] == noise
    model = 3 * (phase["forward"] - noise) + noise
    assert flops["model_flops"] == model
    raw = raw_events("amd")
    step_s = sum(e["dur"] for e in held_steps(raw)) / 1e6
    spec = spec_of_devices(run.manifest()["devices"])
    assert spec is not None and flops["device"] == spec.name
    assert flops["mfu"] == pytest.approx(model / step_s / spec.peak_for("fp32"), rel=1e-6)
    assert flops["hfu"] == pytest.approx(flops["flops"] / step_s / spec.peak_for("fp32"),
                                         rel=1e-6)
    labels = [c["label"] for c in data["cards"]]
    assert "MFU (per rank)" in labels and "HFU (per rank)" in labels
    # The addmm (External id 13) launched a copy of its bias and the GEMM: the GEMM kernel
    # carries its share of the addmm's FLOPs, bytes and roofline time.
    addmm = next(e for e in raw if e["name"] == "aten::addmm")
    launched = [e for e in raw if e.get("cat") == "kernel"
                and e["args"].get("External id") == addmm["args"]["External id"]]
    assert len(launched) == 2
    gemm_kernel = next(e for e in launched if e["name"].startswith("Cijk_"))
    share = gemm_kernel["dur"] / sum(e["dur"] for e in launched)
    cost = shapes_cost("aten::addmm", shapes_from_args(json.dumps(addmm["args"])))  # type: ignore[arg-type]
    assert cost is not None and cost.flops == gemm
    (row,) = [k for k in data["op_cost"]["kernels"] if k["name"] == gemm_kernel["name"]]
    assert row["ops"] == ["aten::addmm"] and row["count"] == 1
    assert row["flops"] == pytest.approx(gemm * share, rel=1e-3)
    assert row["roofline_ns"] == pytest.approx(roofline(cost, spec).time_s * 1e9 * share,
                                               rel=1e-3)
    assert row["efficiency"] == pytest.approx(row["roofline_ns"] / (gemm_kernel["dur"] * 1e3),
                                              rel=1e-3)
    # Every FLOP of an op that launched device work is on one of its kernels.
    costs = op_costs(run, [0], top=100).to_dict()
    on_device = sum(o["flops"] * o["count"] for o in costs["ops"] if o["time_ns"] > 0)
    assert sum(k["flops"] for k in costs["kernels"]) == pytest.approx(on_device)


def test_a_scripted_blocks_ops_made_autograd_nodes(tmp_path: Path) -> None:
    """tests/data/jit_block.py: a torch.jit.script'ed block trained in 3 steps; its ops run
    inside TorchScript's `<forward op>`, whose DifferentiableGraphBackward node no fwdbwd flow
    links to. They made a node: no forward FLOP counts once (the block's two GEMMs and GELU
    a step had read as an evaluation's, model FLOPs counting them once, not 3 times)."""
    trace = tmp_path / "jit_block.json"
    trace.write_bytes(gzip.decompress(
        (Path(__file__).parent / "data" / "jit_block_cpu.pt.trace.json.gz").read_bytes()))
    raw = json.loads(trace.read_text())["traceEvents"]
    assert sum(e["name"] == "<forward op>" for e in raw) == 3
    run = import_traces([trace], tmp_path / "j.run", ImportOptions(), ["t"])
    costs = op_costs(run, [0])
    assert costs.no_grad_flops == 0.0
    data = report_data(run)
    forward = data["op_cost"]["phase_flops"]["forward"]
    # the block's two GEMMs and GELU (789,504 FLOPs had been no-grad), and the head's GEMM
    block = 3 * (2 * 2 * 16 * 64 * 64 + 16 * 64)
    assert block == 789_504 and forward >= block + 3 * 2 * 16 * 64 * 10
    assert data["flops"]["model_flops"] == 3 * forward


def test_an_evaluation_inside_the_steps_counts_once_in_model_flops(tmp_path: Path) -> None:
    """tests/data/eval_every2.py: 12 Adam steps of an MLP (128 -> 128 -> 10, batch 32), a
    no_grad evaluation forward after every second. Autograd made no node for the
    evaluation's ops (no fwdbwd flow starts in them), so model FLOPs count them once and the
    training forward's 3 times: 3x every forward FLOP had counted the 6 evaluations 3 times
    (a Trainer's eval_steps inside the window put its model FLOP/s 40% high)."""
    trace = tmp_path / "eval_every2.json"
    trace.write_bytes(gzip.decompress(
        (Path(__file__).parent / "data" / "eval_every2_cpu.pt.trace.json.gz").read_bytes()))
    run = import_traces([trace], tmp_path / "e.run", ImportOptions(), ["t"])
    # an evaluation: linear 32x128 @ 128x128, relu, linear 32x128 @ 128x10, argmax over 10
    evaluation = 2 * 32 * 128 * 128 + 32 * 128 + 2 * 32 * 128 * 10 + 32 * 10
    costs = op_costs(run, [0])
    assert costs.no_grad_flops == 6 * evaluation
    data = report_data(run)
    forward = data["op_cost"]["phase_flops"]["forward"]
    assert forward > 6 * evaluation  # the training forwards too
    assert data["flops"]["model_flops"] == 3 * (forward - 6 * evaluation) + 6 * evaluation
    (card,) = [c for c in data["cards"] if c["label"] == "model FLOP/s (per rank)"]
    share = 6 * evaluation / forward
    assert f"(an evaluation's: {100 * share:.1f}% of the forward's)" in card["detail"]


def _synthetic_run(tmp_path: Path) -> Path:
    """A Run of a 20k-event synthetic trace (11,476 events imported)."""
    return import_traces([synthetic.write(tmp_path / "t.json", 20_000)], tmp_path / "t.run",
                         ImportOptions(), ["t"]).path


def test_the_op_costs_peak_a_costed_op(tmp_path: Path) -> None:
    """The op table runs at a report's peak: each costed op's owner and kernel time as arrays,
    no dict of ints per op. Traced at its highest on a 20k-event synthetic trace's 3,066
    costed ops (the costed ops held already, as the advice leaves them in a report): 555
    bytes an op, where it had been 730."""
    path = _synthetic_run(tmp_path)
    op_costs(Run(path), [0])  # (what any first one loads once)
    run = Run(path)
    n = len(costed_ops(run, Events.load(run)))
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        costs = op_costs(run, [0])
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert n == 3066
    assert sum(o.count for o in costs.ops) <= n
    assert peak < 620 * n


def test_the_timelines_spans_peak_a_span(tmp_path: Path) -> None:
    """The timeline's spans copy of the drawn rows only the columns read of them, and their
    lanes' keys are compared in order a column at a time: traced at its highest (the Run's
    columns read already, as the analysis leaves them in a report) 104 bytes a span on a
    20k-event synthetic trace, where it had been 138."""
    path = _synthetic_run(tmp_path)
    run = Run(path)
    spans(run)  # (what any first one loads once)
    run = Run(path)
    Events.load(run)
    table = run.table("events", ["ts", "dur", "kind", "name", "rank", "pid", "tid", "device",
                                 "stream"])
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        drawn = spans(run)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    kinds = table.column("kind").cast(pa.string()).to_pylist()
    expected = [i for i, (k, d) in enumerate(zip(kinds, table.column("dur").to_pylist(),
                                                 strict=True))
                if d > 0 and k not in {"trace_span", "instant", "profiler_range"}]
    assert drawn.rows.tolist() == expected and len(expected) == 11_476
    assert drawn.table.column_names == ["ts", "dur", "kind", "name"]
    assert peak < 120 * len(expected)


def test_the_timeline_holds_its_spans_in_arrays(tmp_path: Path) -> None:
    """The drawn timeline is held to the end of a report: its spans' columns are int64
    arrays, not lists of Python ints (6.3 MB at 50k spans), and JSON writes them as the same
    lists: 49 bytes a span held in all on a 20k-event synthetic trace, where it had been
    113."""
    run = Run(_synthetic_run(tmp_path))
    drawn = spans(run)
    origin = run_origin(run)
    timeline(run, drawn, origin)  # (what any first one loads once)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        line = timeline(run, drawn, origin)
        held = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    ts = np.asarray(drawn.table.column("ts").to_numpy(), np.int64)
    assert line["shown"] == len(drawn.rows) == 11_476
    assert sorted(np.asarray(line["spans"]["start"]).tolist()) == sorted((ts - origin).tolist())
    assert held < 80 * line["shown"]
    assert orjson.loads(html.safe_json(line["spans"])) == {
        k: np.asarray(v).tolist() for k, v in line["spans"].items()}


def test_the_page_is_written_as_it_is_made(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """html.write hands the file its parts as the template makes them: the page is never held
    whole, as text or bytes (at 200k events 2.7 MB, 5.4 MB as text of two bytes a
    character); its largest part is plotly.js, the same bytes as render's page."""
    data = report_data(Run(_synthetic_run(tmp_path)))
    parts: list[bytes] = []
    real = html.write_output

    def kept(path: Path, written: bytes | Iterable[bytes]) -> None:
        parts.extend([written] if isinstance(written, bytes) else written)
        real(path, b"".join(parts))

    monkeypatch.setattr(html, "write_output", kept)
    out = html.write(data, tmp_path / "r.html")
    page = html.render(data).encode()
    assert out.read_bytes() == page and len(parts) > 1
    assert max(len(p) for p in parts) == len(html.plotly_js().encode()) < len(page)


def test_samples_per_second_from_the_first_op(corpus_runs: dict[str, Run]) -> None:
    """No embedding and no --batch-size: the first GEMM's input (aten::linear 5x128) says 5
    samples, in the one ProfilerStep that ran the model (the other, 49 us, holds nothing: the
    import marks it the tail)."""
    rates = report_data(corpus_runs["amd"])["throughput"]
    raw = raw_events("amd")
    assert [e["name"] for e in host_steps(raw)] == ["ProfilerStep#1", "ProfilerStep#2"]
    (step,) = held_steps(raw)
    assert rates["samples_per_step"] == 5 and rates["tokens_per_s"] is None
    assert rates["steps"] == 1
    assert rates["samples_per_s"] == pytest.approx(5 / (step["dur"] / 1e6), rel=1e-6)
    assert rates["source"] == ("the activation input of each step's first GEMM or convolution "
                               "(aten::linear 5x128 in the first), in 1 of 1 steps")


def test_samples_per_second_under_vmap(tmp_path: Path) -> None:
    """torch.func.vmap's per-sample gradients (tests/data/vmap_grads.py): the first GEMM of a
    step is the logical op of one sample (addmm 1x64), and the op it batches to, inside it,
    holds the vmapped batch in front (matmul 128x1x64): 128 samples a step, had been 1."""
    src = Path(__file__).with_name("data") / "vmap_grads.json.gz"
    with gzip.open(src, "rt") as f:
        raw = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    steps = sorted((e for e in raw if e["name"].startswith("ProfilerStep#")),
                   key=lambda e: e["ts"])
    first = min((e for e in raw if e["name"] == "aten::addmm" and steps[0]["ts"] <= e["ts"]),
                key=lambda e: e["ts"])
    inner = [e for e in raw if e["name"] == "aten::matmul"
             and first["ts"] <= e["ts"] <= first["ts"] + first["dur"]]
    assert first["args"]["Input Dims"][1] == [1, 64] and inner[0]["args"]["Input Dims"][0] == [
        128, 1, 64]
    run = import_traces([src], tmp_path / "v.run", ImportOptions(), ["train.py"])
    rates = report_data(run)["throughput"]
    assert rates["samples_per_step"] == 128 and rates["steps"] == 2
    assert rates["source"].startswith("the activation input of each step's first GEMM or "
                                      "convolution (aten::matmul 128x1x64 in the first)")


def test_samples_per_second_under_torch_compile(tmp_path: Path) -> None:
    """torch.compile (tests/data/compiled_lm.py): the embedding inside the graph leaves no
    op and the first product runs on [8 x 16, 32], which had said 128 samples a step; the
    compiled forward's token indices say 8 samples and 128 tokens."""
    src = Path(__file__).with_name("data") / "compiled_lm.json.gz"
    run = import_traces([src], tmp_path / "c.run", ImportOptions(), ["train.py"])
    rates = report_data(run)["throughput"]
    assert (rates["samples_per_step"], rates["tokens_per_step"], rates["steps"]) == (8, 128, 2)
    assert rates["source"].startswith("the token indices 8x16 (batch x sequence) of "
                                      "torch.compile's compiled forwards, 2 in 2 of 2 steps")


def test_samples_per_second_of_a_compiled_cnn(tmp_path: Path) -> None:
    """torch.compile of a CNN (tests/data/compiled_cnn.py): the compiled forward's inputs are
    the weights [8, 3, 3, 3] and [8, 8, 3, 3], the linear's [4, 8], the biases, and the image
    batch [6, 3, 16, 16]: the first shaped like none of the tensors SGD updated gives 6 a step
    (no card at all before)."""
    src = Path(__file__).with_name("data") / "compiled_cnn.json.gz"
    with gzip.open(src, "rt") as f:
        raw = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    (first, *_) = [e for e in raw if e["name"] == "CompiledFunction"]
    assert first["args"]["Input Dims"][:3] == [[8, 3, 3, 3], [8], [6, 3, 16, 16]]
    run = import_traces([src], tmp_path / "c.run", ImportOptions(), ["train.py"])
    rates = report_data(run)["throughput"]
    assert (rates["samples_per_step"], rates["tokens_per_step"], rates["steps"]) == (6, None, 2)
    assert rates["source"].startswith("the activation input 6x3x16x16 (the first not shaped "
                                      "like a parameter) of torch.compile's compiled forwards")


def _trace(tmp_path: Path, events: list[dict[str, Any]], command: list[str]) -> Run:
    src = tmp_path / "trace.json"
    src.write_text(json.dumps({"traceEvents": events, "baseTimeNanoseconds": 10**18}))
    return import_traces([src], tmp_path / "t.run", ImportOptions(), command)


def _op(name: str, ts: float, dur: float, dims: list[list[int]] | None = None,
        cat: str = "cpu_op") -> dict[str, Any]:
    args = {} if dims is None else {"Input Dims": dims, "Input type": ["float"] * len(dims)}
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
            "args": args}


def _steps(shapes: bool) -> list[dict[str, Any]]:
    """Two ProfilerSteps (1 ms, 2 ms); the second accumulates gradients over two forwards.
    Each forward looks 4x16 token ids up in a 1000x32 table and 16 positions in a 64x32 one,
    then runs two layers at one shape."""
    def forward(t: float) -> list[dict[str, Any]]:
        return [_op("aten::embedding", t, 10, [[1000, 32], [4, 16]] if shapes else None),
                _op("aten::embedding", t + 20, 10, [[64, 32], [16]] if shapes else None),
                _op("aten::linear", t + 40, 10, [[4, 16, 32], [32, 32], [32]] if shapes else None),
                _op("aten::linear", t + 60, 10, [[4, 16, 32], [32, 32], [32]] if shapes else None)]

    return [_op("ProfilerStep#1", 0, 1000, cat="user_annotation"), *forward(100),
            _op("ProfilerStep#2", 1000, 2000, cat="user_annotation"), *forward(1100),
            *forward(2100)]


def test_samples_and_tokens_from_the_token_embedding(tmp_path: Path) -> None:
    """Every lookup into the first lookup's table counts (three forwards in two steps); the
    positions' 1-d lookups do not; the command's --batch-size gives way to the shapes."""
    rates = report_data(_trace(tmp_path, _steps(True), ["train.py", "--batch-size", "99"]))[
        "throughput"]
    assert rates["samples_per_step"] == 6 and rates["tokens_per_step"] == 96
    assert rates["samples_per_s"] == pytest.approx(12 / 3e-3)
    assert rates["tokens_per_s"] == pytest.approx(192 / 3e-3)
    assert rates["source"] == ("aten::embedding's indices 4x16 (batch x sequence) into the "
                               "1000x32 table, 3 lookups in 2 of 2 steps; the steps' batches "
                               "differ: every sample over the steps' whole time")


def _with_args(event: dict[str, Any], **args: Any) -> dict[str, Any]:
    return {**event, "args": {**event["args"], **args}}


def test_samples_of_a_time_major_rnn_and_of_trained_passes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Token ids [35, 8] into an nn.LSTM (batch_first=False: its last argument) are sequence x
    batch: 8 samples a pass, not 35. A step whose embedding has a backward counts its trained
    passes: the no-grad evaluation of 32 ids in step 2 trains nothing; the inference step 3
    (no backward) counts its lookup. Each step 1 ms: 8, 8 and 32 samples. Each step trains the
    table once: its passes are not swept for lookups to merge (0.37 s of a 190k-event GRU
    Run's report)."""
    def lookup(t: float, ids: list[int]) -> dict[str, Any]:
        return _op("aten::embedding", t, 10, [[500, 40], ids])

    def lstm(t: float, ids: list[int]) -> dict[str, Any]:
        return _with_args(_op("aten::lstm", t, 50, None), **{
            "Input Dims": [[*ids, 40], [[2, ids[1], 40], [2, ids[1], 40]], [[160, 40]], [], [], [],
                           [], [], []],
            "Concrete Inputs": ["", "", "", "True", "2", "0.", "True", "False", "False"]})

    def backward(t: float, ids: list[int]) -> dict[str, Any]:
        return _with_args(_op("aten::embedding_dense_backward", t, 10, None), **{
            "Input Dims": [[*ids, 40], ids, [], [], []],
            "Concrete Inputs": ["", "", "500", "-1", "False"]})

    events = [_op("ProfilerStep#1", 0, 1000, cat="user_annotation"), lookup(10, [35, 8]),
              lstm(30, [35, 8]), backward(200, [35, 8]),
              _op("ProfilerStep#2", 1000, 1000, cat="user_annotation"), lookup(1010, [35, 8]),
              lstm(1030, [35, 8]), backward(1200, [35, 8]), lookup(1400, [35, 32]),
              lstm(1430, [35, 32]),
              _op("ProfilerStep#3", 2000, 1000, cat="user_annotation"), lookup(2010, [35, 32]),
              lstm(2030, [35, 32])]
    run = _trace(tmp_path, events, ["lm.py"])
    swept: list[int] = []
    sweep = overview._pass_of
    monkeypatch.setattr(overview, "_pass_of", lambda *a: swept.append(1) or sweep(*a))
    rates = report_data(run)["throughput"]
    assert swept == []
    assert rates["samples_per_step"] == (8 + 8 + 32) / 3
    assert rates["tokens_per_step"] == 35 * (8 + 8 + 32) / 3
    assert rates["source"].startswith(
        "aten::embedding's indices 35x8 (sequence x batch, an RNN running time-major) into the "
        "500x40 table, 2 backward passes in 3 of 3 steps")


def test_samples_not_from_an_unbatched_call_or_a_weight(tmp_path: Path) -> None:
    """A policy run on one observation ([8], then its [64, 8] weight) is not a batch of 64:
    the step's batch is its update's input [32, 8]."""
    events = [_op("ProfilerStep#1", 0, 1000, cat="user_annotation"),
              _op("aten::linear", 10, 10, [[8], [64, 8], [64]]),
              _op("aten::linear", 30, 10, [[8], [64, 8], [64]]),
              _op("aten::linear", 500, 10, [[32, 8], [64, 8], [64]])]
    rates = report_data(_trace(tmp_path, events, ["rl.py"]))["throughput"]
    assert rates["samples_per_step"] == 32


def test_samples_under_gradient_accumulation(tmp_path: Path) -> None:
    """A step that runs three forward and backward passes (micro-batches of 8) before its
    optimizer step has 24 samples, the step with one pass 8, from the shapes or from the
    command's --batch-size; a pin-memory thread's op during a backward pass splits no pass
    (not a thread of the loop's)."""
    def steps(shaped: bool) -> list[dict[str, Any]]:
        def micro(t: float) -> list[dict[str, Any]]:
            def dims(*d: list[int]) -> list[list[int]] | None:
                return list(d) if shaped else None
            return [_op("aten::linear", t, 10, dims([8, 32], [32, 32], [32])),
                    _op("aten::relu", t + 20, 5, dims([8, 32])),
                    _op("autograd::engine::evaluate_function: AddmmBackward0", t + 30, 10),
                    _op("AddmmBackward0", t + 31, 8),
                    _op("aten::mm", t + 32, 6, dims([8, 32], [32, 32])),
                    {**_op("aten::pin_memory", t + 41, 2, dims([8, 32])), "tid": 2},
                    _op("autograd::engine::evaluate_function: ReluBackward0", t + 44, 10)]

        return [_op("ProfilerStep#1", 0, 1000, cat="user_annotation"), *micro(100),
                _op("ProfilerStep#2", 1000, 2000, cat="user_annotation"),
                _op("Optimizer.zero_grad#SGD.zero_grad", 1050, 10, cat="user_annotation"),
                *micro(1100), *micro(1300), *micro(1500),
                _op("Optimizer.step#SGD.step", 1700, 20, cat="user_annotation")]

    rates = report_data(_trace(tmp_path, steps(True), ["train.py"]))["throughput"]
    assert rates["samples_per_step"] == (8 + 24) / 2
    assert rates["samples_per_s"] == pytest.approx(32 / 3e-3)
    assert rates["source"] == ("the activation input of each step's first GEMM or convolution "
                               "(aten::linear 8x32 in the first), in 2 of 2 steps; the steps' "
                               "batches differ: every sample over the steps' whole time")
    # LBFGS evaluates its closure (forward and backward) again on the same batch inside one
    # optimizer call: the passes of one call are one
    lbfgs = [e for e in steps(True) if not e["name"].startswith("ProfilerStep#2")]
    lbfgs += [_op("ProfilerStep#2", 1000, 2000, cat="user_annotation"),
              _op("Optimizer.step#LBFGS.step", 1050, 800, cat="user_annotation")]
    (tmp_path / "lbfgs").mkdir()
    rates = report_data(_trace(tmp_path / "lbfgs", lbfgs, ["train.py"]))["throughput"]
    assert rates["samples_per_step"] == (8 + 8) / 2
    # a GAN: a forward and backward for the discriminator's optimizer, then the generator's,
    # on one batch: two passes, two optimizers, one batch a step
    gan = [e for e in steps(True) if e["ts"] < 1300] + [
        _op("Optimizer.step#Adam.step", 1200, 20, cat="user_annotation"),
        *[{**e, "ts": e["ts"] - 1300 + 1250} for e in steps(True) if 1300 <= e["ts"] < 1500],
        _op("Optimizer.step#Adam.step", 1400, 20, cat="user_annotation")]
    (tmp_path / "gan").mkdir()
    rates = report_data(_trace(tmp_path / "gan", gan, ["train.py"]))["throughput"]
    assert rates["samples_per_step"] == (8 + 8) / 2
    (tmp_path / "flag").mkdir()
    flagged = report_data(_trace(tmp_path / "flag", steps(False), ["t.py", "--batch-size=8"]))
    assert flagged["throughput"]["samples_per_step"] == 16
    assert flagged["throughput"]["source"] == (
        "the command's --batch-size 8, x the forward and backward passes of each step; the "
        "steps' batches differ: every sample over the steps' whole time")


def test_samples_of_differing_batches_leave_the_profilers_start_out(tmp_path: Path) -> None:
    """Four profiled steps of a graph network whose batches differ (8, 8, 16, 8 nodes): the
    first, 10 ms, times the profiler's start (steps of 1 ms after it, none as slow again);
    every sample over the whole time is of the other three, 32 samples in 3 ms (it had been
    40 in 13 ms: 3,077 a second), and the source counts those three (it had said "in 4 of 4
    steps" of a figure over 3)."""
    events = []
    for i, (start, dur, batch) in enumerate([(0, 10_000, 8), (10_000, 1000, 8),
                                             (11_000, 1000, 16), (12_000, 1000, 8)], 1):
        events += [_op(f"ProfilerStep#{i}", start, dur, cat="user_annotation"),
                   _op("aten::linear", start + dur - 500, 10, [[batch, 32], [64, 32], [64]])]
    rates = report_data(_trace(tmp_path, events, ["gnn.py"]))["throughput"]
    assert (rates["samples_per_step"], rates["steps"], rates["same_batch"]) == (32 / 3, 3, False)
    assert rates["samples_per_s"] == pytest.approx(32 / 3e-3)
    assert rates["source"] == (
        "the activation input of each step's first GEMM or convolution (aten::linear 8x32 in "
        "the first), in 3 of 3 steps; step 1 left out: it times the recorder, not the program; "
        "the steps' batches differ: every sample over the steps' whole time")


def test_samples_of_lbfgs_closure_evaluations(tmp_path: Path) -> None:
    """Full-batch L-BFGS (tests/data/lbfgs_closure.py) evaluates its closure three times a step
    inside its one optimizer call, on the same 256 samples: the first layer's weight gradient
    (aten::mm [32, 256] x [256, 24]) sums them three times a step (counted from the raw
    JSON), but the step trained 256 samples, not 768."""
    trace = Path(__file__).parent / "data" / "lbfgs_closure_cpu.pt.trace.json.gz"
    raw = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    marks = [e for e in raw if e.get("name", "").startswith("ProfilerStep#")]
    assert [sum(1 for e in raw if e.get("name") == "aten::mm"
                and m["ts"] <= e["ts"] < m["ts"] + m["dur"]
                and e["args"].get("Input Dims") == [[32, 256], [256, 24]]) for m in marks
            ] == [3, 3, 3]
    rates = report_data(import_traces([trace], tmp_path / "l.run", ImportOptions(),
                                      ["lbfgs.py"]))["throughput"]
    assert rates["samples_per_step"] == 256 and rates["steps"] == 3
    # said of every model, not only a policy's (a diffusion U-Net's card had read "a
    # policy's forwards of one observation each, or one batched update")
    assert rates["source"] == ("the samples the first layer's weight gradient summed in each "
                               "step's backward (aten::mm over the batch, 32x24 weights: every "
                               "row its forwards gave it, one at a time or batched), in 3 of 3 "
                               "steps")


def test_samples_of_torch_func_grad(tmp_path: Path) -> None:
    """torch.func.grad (tests/data/func_grad.py, batches of 16) dispatches each op again at
    each level its transform wraps it in: the first layer's weight gradient (aten::mm
    [32, 16] x [16, 24]) is three nested calls a step (counted from the raw JSON, the
    innermost with its inputs listed twice), one product: 16 samples a step, not 48."""
    trace = Path(__file__).parent / "data" / "func_grad_cpu.pt.trace.json.gz"
    raw = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    marks = [e for e in raw if e.get("name", "").startswith("ProfilerStep#")]
    mms = [[e for e in raw if e.get("name") == "aten::mm"
            and m["ts"] <= e["ts"] < m["ts"] + m["dur"]
            and e["args"].get("Input Dims", [])[:2] == [[32, 16], [16, 24]]] for m in marks]
    assert [len(m) for m in mms] == [3, 3, 3]
    assert all(a["ts"] <= b["ts"] and b["ts"] + b["dur"] <= a["ts"] + a["dur"]
               for a, b in (m[:2] for m in mms))
    rates = report_data(import_traces([trace], tmp_path / "f.run", ImportOptions(),
                                      ["func_grad.py"]))["throughput"]
    assert rates["samples_per_step"] == 16 and rates["steps"] == 3


def test_samples_of_batch_first_attention(tmp_path: Path) -> None:
    """nn.TransformerEncoderLayer(batch_first=True) on batches of 8 sequences of 16 or 128
    tokens (tests/data/bucketed_eval.py): its attention transposes the [8, T, 64] input to a
    [T, 8, 64] view (strides [64, T x 64, 1], from the raw JSON) before its packed input
    projection (weight [192, 64]), the step's first product. 8 samples a step, not T."""
    trace = Path(__file__).parent / "data" / "bucketed_eval_cpu.pt.trace.json.gz"
    raw = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    marks = [e for e in raw if e.get("name", "").startswith("ProfilerStep#")]
    firsts = [min((e for e in raw if e.get("name") == "aten::linear"
                   and m["ts"] <= e["ts"] < m["ts"] + m["dur"]), key=lambda e: e["ts"])["args"]
              for m in marks]
    assert {(a["Input Dims"][0][0], tuple(a["Input Strides"][0])) for a in firsts} == {
        (t, (64, t * 64, 1)) for t in (16, 64, 128)}  # 64: the evaluation's
    assert {tuple(a["Input Dims"][0][1:]) for a in firsts} == {(8, 64)}
    assert {tuple(a["Input Dims"][1]) for a in firsts} == {(192, 64)}
    rates = report_data(import_traces([trace], tmp_path / "b.run", ImportOptions(),
                                      ["bucketed_eval.py"]))["throughput"]
    assert rates["samples_per_step"] == 8 and rates["steps"] == 9 and rates["same_batch"]


def test_samples_of_twin_models_stepped_by_several_optimizers(tmp_path: Path) -> None:
    """Twin GANs (tests/data/gan_adam.py `twins d2 wide`: generator and discriminator both
    32 -> 48 -> 32, batches of 16) step the discriminator twice, then the generator, each after
    a pass of its own: the first layer's [48, 32] weight gradient (aten::mm [48, 16] x
    [16, 32]) is summed 6 times a step (counted from the raw JSON: the discriminator's passes
    over their real and fake rows, the generator's through both models), into 4 gradients of
    that shape (one a discriminator pass, two the generator's). Each pass is one batch of 16:
    the step's samples are 16, not 32 + 32 + 16 = 80."""
    trace = Path(__file__).parent / "data" / "twin_gan_d2_wide_cpu.pt.trace.json.gz"
    raw = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    assert sum(e.get("name") == "aten::mm" and e["args"].get("Input Dims") == [[48, 16], [16, 32]]
               for e in raw) == 6 * 4
    assert sum(e.get("name") == "torch::autograd::AccumulateGrad"
               and e["args"].get("Input Dims") == [[48, 32]] for e in raw) == 4 * 4
    rates = report_data(import_traces([trace], tmp_path / "t.run", ImportOptions(),
                                      ["gan.py"]))["throughput"]
    assert rates["samples_per_step"] == 16 and rates["steps"] == 4


def test_samples_of_blocks_whose_first_layer_is_the_first_layers_shape(tmp_path: Path) -> None:
    """Three residual blocks (tests/data/stacked_blocks.py), each expanding 16 -> 48 -> 16 with
    no input layer before them: the first layer's weight shape [48, 16] is each block's, so
    each step's backward sums 8 samples in three gradients of that shape ([48, 8] x [8, 16])
    and accumulates three parameters of it (both counted from the raw JSON): 8 samples a
    step, not 24."""
    trace = Path(__file__).parent / "data" / "stacked_blocks_cpu.pt.trace.json.gz"
    raw = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    for m in (e for e in raw if e.get("name", "").startswith("ProfilerStep#")):
        inside = [e for e in raw if m["ts"] <= e.get("ts", -1) < m["ts"] + m["dur"]]
        assert sum(1 for e in inside if e["name"] == "aten::mm"
                   and e["args"].get("Input Dims") == [[48, 8], [8, 16]]) == 3
        assert sum(1 for e in inside if e["name"] == "torch::autograd::AccumulateGrad"
                   and e["args"].get("Input Dims", [[]])[0] == [48, 16]) == 3
    rates = report_data(import_traces([trace], tmp_path / "s.run", ImportOptions(),
                                      ["blocks.py"]))["throughput"]
    assert rates["samples_per_step"] == 8 and rates["steps"] == 3


def test_samples_of_a_table_two_lookups_of_a_pass_share(tmp_path: Path) -> None:
    """A sequence-to-sequence model whose encoder and decoder share one token table
    (tests/data/shared_embedding.py, as T5's): each step's one backward pass trains two lookups
    of the 300x32 table, the sources' [4, 12] and the targets' [4, 5], [4, 7], [4, 9] (from the
    raw JSON): 4 samples a step, not 8; the tokens are both lookups'."""
    trace = Path(__file__).parent / "data" / "shared_embedding_cpu.pt.trace.json.gz"
    raw = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    marks = [e for e in raw if e.get("name", "").startswith("ProfilerStep#")]
    trained = [[e["args"]["Input Dims"][1] for e in raw
                if e.get("name") == "aten::embedding_dense_backward"
                and m["ts"] <= e["ts"] < m["ts"] + m["dur"]] for m in marks]
    assert trained == [[[4, length], [4, 12]] for length in (5, 7, 9)]
    rates = report_data(import_traces([trace], tmp_path / "s.run", ImportOptions(),
                                      ["seq2seq.py"]))["throughput"]
    assert rates["samples_per_step"] == 4 and rates["steps"] == 3
    assert rates["tokens_per_step"] == 4 * 12 + 4 * (5 + 7 + 9) / 3
    assert rates["source"] == ("aten::embedding's indices 4x12 (batch x sequence) into the "
                               "300x32 table, 3 backward passes (6 lookups trained) in 3 of 3 "
                               "steps")


def test_samples_of_the_transformer_fast_path(tmp_path: Path) -> None:
    """nn.TransformerEncoder under inference_mode (tests/data/encoder_fastpath.py) runs torch's
    fused fast path: each step's first product, aten::mm [30, 32], multiplies the tokens of
    aten::_native_multi_head_attention's [3, 10, 32] as rows (both from the raw JSON): 3
    samples a step, not 30."""
    trace = Path(__file__).parent / "data" / "encoder_fastpath_cpu.pt.trace.json.gz"
    raw = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    marks = [e for e in raw if e.get("name", "").startswith("ProfilerStep#")]
    for m in marks:
        inside = sorted((e for e in raw if e.get("cat") == "cpu_op"
                         and m["ts"] <= e["ts"] < m["ts"] + m["dur"]), key=lambda e: e["ts"])
        attention = next(e for e in inside if e["name"] == "aten::_native_multi_head_attention")
        product = next(e for e in inside if e["name"] in ("aten::mm", "aten::addmm"))
        assert attention["args"]["Input Dims"][0] == [3, 10, 32]
        assert product["args"]["Input Dims"][0] == [30, 32]
        assert attention["ts"] <= product["ts"] <= attention["ts"] + attention["dur"]
    rates = report_data(import_traces([trace], tmp_path / "f.run", ImportOptions(),
                                      ["serve.py"]))["throughput"]
    assert rates["samples_per_step"] == 3 and rates["steps"] == len(marks) == 3
    assert rates["source"] == (
        "the activation input of each step's first GEMM or convolution (aten::mm 30x32: the "
        "rows of aten::_native_multi_head_attention's 3x10x32 in the first), in 3 of 3 steps")


def test_samples_of_the_transformer_fast_path_under_a_padding_mask(tmp_path: Path) -> None:
    """The same encoder with a src_key_padding_mask (tests/data/encoder_padmask.py): the fast
    path packs each request's valid tokens into a nested tensor, whose shape the trace leaves
    empty, so each step's first product, aten::mm, multiplies only those (15 of the 3 x 10
    padded tokens, 26 of 5 x 10, 9 of 2 x 10, from the raw JSON): the batch is the padded
    input aten::_nested_tensor_from_mask took (3, 5 and 2 samples), not the tokens. The
    first step, which timed the profiler's start (970 ms of the three's 988), is left out of
    the samples' time where the batches differ, and the source reads the two steps the figure
    counts (it had said "in 3 of 3 steps" and named the left-out step's input as the first)."""
    trace = Path(__file__).parent / "data" / "encoder_padmask_cpu.pt.trace.json.gz"
    raw = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    marks = [e for e in raw if e.get("name", "").startswith("ProfilerStep#")]
    batches = []
    for m in marks:
        inside = sorted((e for e in raw if e.get("cat") == "cpu_op"
                         and m["ts"] <= e["ts"] < m["ts"] + m["dur"]), key=lambda e: e["ts"])
        packs = next(e for e in inside if e["name"] == "aten::_nested_tensor_from_mask")
        product = next(e for e in inside if e["name"] in ("aten::mm", "aten::addmm"))
        (b, length, width), rows = packs["args"]["Input Dims"][0], product["args"]["Input Dims"][0]
        assert rows[1] == width and rows[0] < b * length and packs["ts"] < product["ts"]
        batches.append(b)
    assert batches == [3, 5, 2]
    rates = report_data(import_traces([trace], tmp_path / "m.run", ImportOptions(),
                                      ["serve.py"]))["throughput"]
    assert marks[0]["dur"] > 2 * max(m["dur"] for m in marks[1:])
    assert rates["samples_per_step"] == (5 + 2) / 2 and rates["steps"] == 2
    assert rates["samples_per_s"] == pytest.approx(
        (5 + 2) / (sum(m["dur"] for m in marks[1:]) / 1e6), rel=1e-4)
    assert rates["source"] == (
        "the activation input of each step's first GEMM or convolution (aten::mm 26x32: the "
        "valid tokens of aten::_nested_tensor_from_mask's 5x10x32 (its padding masked out) in "
        "the first), in 2 of 2 steps; step 3 left out: it times the recorder, not the program; "
        "the steps' batches differ: every sample over the steps' whole time")


def test_samples_of_a_quantized_forward_loop_from_the_recorders_step_batch(tmp_path: Path
                                                                          ) -> None:
    """quantize_dynamic's MLP (tests/data/qdyn_mlp.py) multiplies in quantized::linear_dynamic,
    which no cost model prices: no first product says the batch, and there had been no
    samples card. The recorder's step batch of each request (here at each marked step's
    start, valued as the raw JSON's first quantized::linear_dynamic input's rows: 16, 8 and
    1) is."""
    from perfswarm.trace.schema import COUNTERS, STEP_BATCH

    trace = Path(__file__).parent / "data" / "qdyn_mlp_cpu.pt.trace.json.gz"
    raw = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    marks = sorted((e for e in raw if e.get("name", "").startswith("ProfilerStep#")),
                   key=lambda e: e["ts"])
    batches = [next(e for e in sorted(raw, key=lambda e: e.get("ts", 0))
                    if e.get("name") == "quantized::linear_dynamic"
                    and m["ts"] <= e["ts"] < m["ts"] + m["dur"])["args"]["Input Dims"][0][0]
               for m in marks]
    assert batches == [16, 8, 1]
    run = import_traces([trace], tmp_path / "q.run", ImportOptions(), ["serve.py"])
    assert report_data(run)["throughput"] is None  # without the recorder's counter
    starts = [s["start"] for s in run.table("steps").to_pylist()]
    run.write_table("counters", pa.table({
        "rank": [0] * 3, "ts": [t + 1000 for t in starts], "name": [STEP_BATCH] * 3,
        "device": [-1] * 3, "value": [float(b) for b in batches]}).cast(COUNTERS))
    rates = report_data(Run.open(run.path))["throughput"]
    assert rates["samples_per_step"] == (16 + 8 + 1) / 3 and rates["steps"] == 3
    assert rates["source"] == (
        "the recorder's step batch (the leading dimension of the top-level module's first "
        "input as each step began), in 3 of 3 steps; the steps' batches differ: every sample "
        "over the steps' whole time")


def test_samples_per_second_over_the_median_step(tmp_path: Path) -> None:
    """The profiler's first step runs slow (5 ms, then 1 ms and 1 ms): samples per second are
    per the median step, as the steps/s card's are (over all three: 12 in 7 ms)."""
    events = []
    for i, (t, dur) in enumerate(((0, 5000), (5000, 1000), (6000, 1000))):
        events += [_op(f"ProfilerStep#{i}", t, dur, cat="user_annotation"),
                   _op("aten::linear", t + 10, 10, [[4, 32], [32, 32], [32]])]
    rates = report_data(_trace(tmp_path, events, ["train.py"]))["throughput"]
    assert rates["samples_per_step"] == 4 and rates["samples_per_s"] == pytest.approx(4 / 1e-3)


def test_samples_from_the_command_when_no_shapes(tmp_path: Path) -> None:
    data = report_data(_trace(tmp_path, _steps(False), ["train.py", "--batch-size=99"]))
    rates = data["throughput"]
    assert rates["samples_per_s"] == pytest.approx(2 * 99 / 3e-3)
    assert rates["tokens_per_s"] is None and rates["source"] == "the command's --batch-size 99"
    card = next(c for c in data["cards"] if c["label"] == "samples/s (rank 0)")
    assert card["value"] == "66,000.0" and "the command's --batch-size 99" in card["detail"]


def test_addmm_counts_its_flops_beside_the_bias_copy_inside_it(trainer_run: Run) -> None:
    """On CPU an addmm copies its bias into the output (a copy_ inside it): the addmm is still
    the op counted, every call, with the GEMM's FLOPs; the copy_ is a detail of it."""
    table = trainer_run.table("events", ["name", "kind", "args"]).to_pylist()
    calls = Counter(json.dumps(shapes_from_args(r["args"]).dims)  # type: ignore[union-attr]
                    for r in table if r["name"] == "aten::addmm" and r["kind"] == "cpu_op")
    assert calls
    costs = op_costs(trainer_run, [0], top=1000).to_dict()
    counted = {o["shapes"]: o for o in costs["ops"] if o["name"] == "aten::addmm"}
    assert sum(o["count"] for o in counted.values()) == sum(calls.values())
    for o in counted.values():
        assert o["family"] == "gemm" and o["flops"] > 0


def memory_run(tmp_path: Path, device_type: int = 1) -> Run:
    """A step with profile_memory's instants in its forward, backward and optimizer (on a
    CUDA device, or with `device_type` 0 the CPU)."""
    def mem(ts: float, addr: int, nbytes: int, total: int) -> dict[str, Any]:
        return {"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1,
                "tid": 1, "ts": ts, "args": {"Device Type": device_type, "Device Id": 0,
                                             "Bytes": nbytes,
                                             "Total Allocated": total, "Total Reserved": 1 << 20,
                                             "Addr": addr}}

    events = [_op("ProfilerStep#1", 0, 1000, cat="user_annotation"),
              mem(10, 1, 4096, 14_096),  # forward: 10,000 bytes were there before
              mem(50, 99, -1000, 13_096),  # one of those freed
              _op("autograd::engine::evaluate_function: MmBackward0", 100, 100),
              mem(120, 2, 8192, 21_288), mem(150, 1, -4096, 17_192),
              _op("Optimizer.step#SGD.step", 300, 100, cat="user_annotation"),
              mem(320, 3, 20_000, 37_192),  # the peak
              mem(500, 3, -20_000, 17_192)]
    return _trace(tmp_path, events, ["test"])


def test_memory_peak_by_category(tmp_path: Path) -> None:
    """The bytes live at the peak by the pass that allocated them; what was live before the
    trace less what of it was freed since; together the peak."""
    data = report_data(memory_run(tmp_path))
    (memory,) = data["memory"]
    assert memory["peak_allocated"] == 37_192
    assert memory["peak_ms"] == (10**18 + 320_000 - data["run"]["origin_ns"]) / 1e6
    assert memory["peak_by_category"] == {"before the trace": 9000, "forward": 0,
                                          "backward": 8192, "optimizer": 20_000}
    assert sum(memory["peak_by_category"].values()) == memory["peak_allocated"]
    assert not memory["since_profiling"]
    assert "counts from the profiler's start" not in html.render(data)
    # torch's CPU allocator counts from the profiler's start: the page says its peak leaves
    # out what was made before (a CPU MLP's 26.4 MB of parameters had been missing unsaid)
    (tmp_path / "cpu").mkdir()
    (cpu,) = (cpu_data := report_data(memory_run(tmp_path / "cpu", 0)))["memory"]
    assert cpu["device"] == "cpu" and cpu["since_profiling"]
    assert "counts from the profiler's start" in html.render(cpu_data)


def test_trace_view_says_how_to_open_the_run_in_perfetto(tmp_path: Path) -> None:
    """The export command for this run's absolute path quoted for a shell, as text (a hostile
    directory name stays text; pasted as shown, a name with `$(...)` had run it)."""
    hostile = tmp_path / "<b id=\"x\"> $(touch pwn) 'y'"
    hostile.mkdir()
    run = memory_run(hostile)
    data = report_data(run)
    assert shlex.split(data["run"]["shell_path"]) == [str(run.path.resolve())]
    page = html.render(data)
    assert (f"perfswarm export {markupsafe.escape(data['run']['shell_path'])} --format perfetto"
            in page)
    assert '<b id="x">' not in page


def test_many_steps_stack_as_areas() -> None:
    """Past MAX_BARS steps the breakdown is one stacked area a category (one path each, not a
    bar a step and category), with the same values."""
    def rows(n: int) -> list[dict[str, Any]]:
        return [{"rank": 0, "step": i, "dur_ns": 3_000_000,
                 "ns": {**dict.fromkeys(CATEGORIES, 0), "host compute": 2_000_000,
                        "idle": 1_000_000}} for i in range(n)]

    few, many = html.breakdown_figure(rows(html.MAX_BARS)), html.breakdown_figure(
        rows(html.MAX_BARS + 1))
    assert [t["type"] for t in few["data"]] == ["bar", "bar"]
    assert [(t["type"], t["stackgroup"], t["name"]) for t in many["data"]] == [
        ("scatter", "one", "host compute"), ("scatter", "one", "idle")]
    assert many["data"][0]["y"] == [2.0] * (html.MAX_BARS + 1)
    assert many["data"][0]["line"]["color"] == few["data"][0]["marker"]["color"]


def test_memory_peak_by_category_of_a_real_profile(tmp_path: Path) -> None:
    """torch.profiler with profile_memory=True on a small MLP's training steps: the peak and
    its categories as the report gives them, against a walk over the raw JSON's `[memory]`
    instants and the autograd and optimizer spans around them on their thread."""
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
    trace = tmp_path / "trace.json"
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                profile_memory=True) as prof:
        for _ in range(2):
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
    prof.export_chrome_trace(str(trace))
    raw = json.loads(trace.read_text())["traceEvents"]
    spans = [e for e in raw if e.get("ph") == "X"]
    mems = [e for e in raw if e.get("name") == "[memory]"
            and e["args"].get("Device Type") == 0]
    assert mems

    def phase(e: dict[str, Any]) -> str:
        for name, test in (("backward", lambda n: n.startswith(
                               "autograd::engine::evaluate_function: ") or n.endswith(
                               ("Backward0", "Backward1"))),
                           ("optimizer", lambda n: n.startswith("Optimizer."))):
            if any(s["tid"] == e["tid"] and s["ts"] <= e["ts"] < s["ts"] + s["dur"]
                   and test(s["name"]) for s in spans):
                return name
        return "forward"

    mems.sort(key=lambda e: e["ts"])
    totals = [e["args"]["Total Allocated"] for e in mems]
    peak = totals.index(max(totals))
    live: dict[int, tuple[int, str]] = {}
    before = totals[0] - mems[0]["args"]["Bytes"]
    for e in mems[:peak + 1]:
        addr, change = e["args"]["Addr"], e["args"]["Bytes"]
        if change > 0:
            live[addr] = (change, phase(e))
        elif addr in live:
            del live[addr]
        else:
            before += change
    expected = {"before the trace": before, "forward": 0, "backward": 0, "optimizer": 0}
    for change, name in live.values():
        expected[name] += change
    run = _trace(tmp_path, raw, ["test"])
    (memory,) = [m for m in memory_view(run, run_origin(run), 1000) if m["device"] == "cpu"]
    assert memory["peak_allocated"] == max(totals)
    assert memory["peak_by_category"] == expected
    assert sum(expected.values()) == max(totals) and expected["forward"] > 0


def test_samples_per_second_at_the_unprofiled_step() -> None:
    """Where the recorder timed steps after its window, samples/s are at their median step
    (the profiler slowed the window's); not where the window's batches differ (the batches
    after it are unknown)."""
    from perfswarm.analyze.iterations import StepTime
    from perfswarm.report.data import _unprofiled

    rates = {"samples_per_s": 20 / 0.030, "samples_per_step": 20.0, "tokens_per_s": None,
             "tokens_per_step": None, "same_batch": True, "source": "x", "steps": 10,
             "rank": 0}
    after = StepTime(0.024e9, 134, True, 0.030e9)
    got = _unprofiled(rates, after)
    assert got is not None and got["samples_per_s"] == pytest.approx(20 / 0.024)
    assert got["source"] == "x; per the median of the 134 steps after the profiler's window"
    # a forward-driven loop's (a server's steps wait for requests): over their whole time
    served = _unprofiled(rates, StepTime(0.024e9, 134, True, 0.030e9, busy_ns=0.002e9,
                                         mean_ns=0.040e9))
    assert served is not None and served["samples_per_s"] == pytest.approx(20 / 0.040)
    assert served["source"] == ("x; per the whole time, waits included, of the 134 steps after "
                                "the profiler's window")
    assert _unprofiled({**rates, "same_batch": False}, after) == {**rates, "same_batch": False}
    assert _unprofiled(rates, StepTime(0.030e9, 10, False, 0.030e9)) == rates


def test_decode_steps_count_tokens_not_samples(tmp_path: Path) -> None:
    """A KV-cache decode loop: step 1 prefills 4 prompts of 16 tokens, steps 2 and 3 each
    decode one token for the 4 sequences (indices 4x1, no backward). Those start no sequence:
    4 samples over the 3 ms, 72 tokens; a loop that only decodes has tokens/s and no samples."""
    def lookup(t: float, ids: list[int]) -> dict[str, Any]:
        return _op("aten::embedding", t, 10, [[1000, 32], ids])

    events = [_op("ProfilerStep#1", 0, 1000, cat="user_annotation"), lookup(10, [4, 16]),
              _op("ProfilerStep#2", 1000, 1000, cat="user_annotation"), lookup(1010, [4, 1]),
              _op("ProfilerStep#3", 2000, 1000, cat="user_annotation"), lookup(2010, [4, 1])]
    rates = report_data(_trace(tmp_path, events, ["serve.py"]))["throughput"]
    assert rates["samples_per_s"] == pytest.approx(4 / 3e-3)
    assert rates["tokens_per_s"] == pytest.approx((64 + 4 + 4) / 3e-3)
    assert rates["source"].endswith("; 2 of them decode one token for each of their sequences, "
                                    "which they do not start: no sample; the steps' batches "
                                    "differ: every sample over the steps' whole time")
    (tmp_path / "d").mkdir()
    decoding = report_data(_trace(tmp_path / "d", events[2:], ["serve.py"]))
    rates = decoding["throughput"]
    assert rates["samples_per_s"] is None and rates["tokens_per_step"] == 4
    assert rates["tokens_per_s"] == pytest.approx(4 / 1e-3)
    labels = [c["label"] for c in decoding["cards"]]
    assert "tokens/s (rank 0)" in labels and "samples/s (rank 0)" not in labels


def test_samples_of_a_policy_trained_on_its_rollout(tmp_path: Path) -> None:
    """REINFORCE: each step runs the policy on one observation at a time (addmm [1, 4] x
    [4, 64], six of them), then one backward through all six: the first layer's weight
    gradient, [64, 1] x [1, 4] six times in its autograd nodes, sums 6 samples a step (the
    first product's one observation had said 1: 4.8 samples/s for 1,248). A layer of the
    transposed shape ([4, 64] weights, [4, 1] x [1, 64]) is no sample of the first's."""
    events = []
    for i in range(2):
        t = i * 1000
        events.append(_op(f"ProfilerStep#{i}", t, 1000, cat="user_annotation"))
        events += [_op("aten::addmm", t + 10 + 20 * j, 10, [[64], [1, 4], [4, 64]])
                   for j in range(6)]
        for j in range(6):
            at = t + 500 + 60 * j
            events += [_op("autograd::engine::evaluate_function: AddmmBackward0", at, 50),
                       _op("aten::mm", at + 5, 10, [[64, 1], [1, 4]]),
                       _op("aten::mm", at + 20, 10, [[4, 1], [1, 64]])]
    rates = report_data(_trace(tmp_path, events, ["rl.py"]))["throughput"]
    assert rates["samples_per_step"] == 6 and rates["steps"] == 2
    assert rates["source"].startswith("the samples the first layer's weight gradient summed")


def test_flops_per_s_is_at_the_step_time_card(trainer_run: Run) -> None:
    """The FLOP/s cards are a step's FLOPs (the profiled steps' over their count) at the
    median step the step-time card shows: over the profiled steps' sum, with the profiler's
    slow first step in it, a loop's had read 23% under its own."""
    data = report_data(trainer_run)
    flops = data["flops"]
    steps = pl.from_arrow(trainer_run.table("steps")).with_columns(
        pl.col("source").cast(pl.String))
    assert isinstance(steps, pl.DataFrame)
    profiled = steps.filter(pl.col("source") == "marker")
    after = steps.filter((pl.col("source") == "detected")
                         & (pl.col("start") >= profiled["end"].max()))
    # too few steps after the window (3 needed) for the program's own time: the profiled
    # steps' median, as the card says
    assert after.height < 3
    [card] = [c for c in data["cards"] if c["label"] == "step time"]
    assert card["detail"] == f"median of {profiled.height} steps (marker)"
    median_s = float(np.median((profiled["end"] - profiled["start"]).to_numpy())) / 1e9
    per_step = flops["model_flops"] / profiled.height
    assert flops["model_flops_per_s"] == pytest.approx(per_step / median_s, rel=1e-9)
