"""float64_ops: a model computing in float64, recorded here, against its raw trace; the same
model in float32 gets nothing; on a GPU the device's own FP64 rate prices the change."""

from __future__ import annotations

import statistics
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import pytest

from perfswarm.model.opcost import OpCost, shapes_cost, shapes_from_args
from perfswarm.optimize.advise import advise
from perfswarm.optimize.rules import precision
from perfswarm.optimize.rules.facts import Facts
from perfswarm.recorder.session import RecordOptions, record
from perfswarm.trace.ingest import ImportOptions, import_traces
from perfswarm.trace.store import Run

MLP = """
import sys
import torch
from torch import nn

dtype = getattr(torch, sys.argv[1])
torch.set_num_threads(1)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 10)).to(dtype)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(64, 256, dtype=dtype), torch.randint(0, 10, (64,))
for _ in range(8):
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
"""
_VIEWS = {"aten::view", "aten::_reshape_alias", "aten::as_strided", "aten::alias", "aten::detach",
          "aten::t", "aten::transpose", "aten::permute", "aten::expand", "aten::unsqueeze",
          "aten::squeeze", "aten::slice", "aten::select", "aten::empty", "aten::empty_strided",
          "aten::empty_like", "aten::resize_", "aten::_unsafe_view", "aten::lift_fresh"}


def _recorded(tmp_path: Path, dtype: str) -> Run:
    script = tmp_path / "mlp.py"
    script.write_text(MLP)
    result = record([sys.executable, str(script), dtype], tmp_path / f"{dtype}.run",
                    RecordOptions(collectors=("torch",), skip=2, steps=3))
    assert result.exit_code == 0
    return result.run


def _raw_ops(run: Run) -> tuple[list[dict[str, Any]], dict[int, int]]:
    """The raw trace's ops that start in a ProfilerStep that advice measures (a first one the
    profiler's start slowed is set aside: Facts.set_aside, tested in test_advise.py), and each
    one's own time in ns (its duration less its direct children's: ops, annotations), from the
    JSON alone."""
    aside = {step for _, step in Facts.of(run).set_aside}
    trace = orjson.loads(next((run.path / "raw").glob("torch-*.json")).read_bytes())

    def ns(us: Any) -> int:
        return int(Decimal(str(us)) * 1000)

    host = [e for e in trace["traceEvents"] if e.get("ph") == "X"
            and e.get("cat") in ("cpu_op", "user_annotation", "python_function")]
    steps = [(ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])) for e in host
             if e["name"].startswith("ProfilerStep#")
             and int(e["name"].removeprefix("ProfilerStep#")) not in aside]
    calls = sorted((e for e in host if not e["name"].startswith("ProfilerStep#")),
                   key=lambda e: (e["tid"], ns(e["ts"]), -ns(e["dur"])))
    own = {id(e): ns(e["dur"]) for e in calls}
    stack: list[dict[str, Any]] = []
    for e in calls:  # each call's innermost enclosing call on its thread
        start = ns(e["ts"])
        while stack and (stack[-1]["tid"] != e["tid"]
                         or ns(stack[-1]["ts"]) + ns(stack[-1]["dur"]) <= start):
            stack.pop()
        if stack:
            own[id(stack[-1])] -= ns(e["dur"])
        stack.append(e)
    ops = [e for e in calls if e["cat"] == "cpu_op"
           and any(lo <= ns(e["ts"]) < hi for lo, hi in steps)]
    return ops, {id(e): max(0, own[id(e)]) for e in ops}


def _double(e: dict[str, Any]) -> bool:
    args = e.get("args", {})
    return next((t == "double" for d, t in zip(args.get("Input Dims", []),
                                                args.get("Input type", []), strict=False)
                 if d and t in ("float", "double", "c10::Half", "c10::BFloat16")), False)


def _innermost(ops: list[dict[str, Any]]) -> dict[int, OpCost]:
    """The ops' cost models (from their raw args), but of an op with one of its family inside
    it on its thread (aten::linear around addmm)."""
    cost = {id(e): c for e in ops if (sh := shapes_from_args(orjson.dumps(e["args"]).decode()))
            and (c := shapes_cost(e["name"], sh)) is not None}
    costed = sorted((e for e in ops if id(e) in cost),
                    key=lambda e: (e["tid"], e["ts"], -e["dur"]))
    outer: set[int] = set()
    for i, e in enumerate(costed):
        end = e["ts"] + e["dur"]
        for f in costed[i + 1:]:
            if f["tid"] != e["tid"] or f["ts"] >= end:
                break
            if f["ts"] + f["dur"] <= end and cost[id(f)].family == cost[id(e)].family:
                outer.add(id(e))
    return {k: v for k, v in cost.items() if k not in outer}


_CEILINGS = (200e9, 40e9, 80e9)  # this host's as the test sets them (above any rate reached)


def _expected_gain(ops: list[dict[str, Any]], own: dict[int, int]) -> tuple[float, float]:
    """(gain, work) of the float64 ops: each modelled call's work at the ceilings (float64 GEMMs
    at half _CEILINGS' float32 rate, bytes at its memory rate); under 5% of its own time, that
    is its work, else its own time less the median own time of its name's calls of the first
    kind (of all names' without one), no less than that work."""
    fp64 = [e for e in ops if _double(e) and e["name"] not in _VIEWS]
    cost = _innermost(ops)
    roof = {id(e): 1e9 * max(cost[id(e)].flops / (_CEILINGS[0] / 2e9),
                             cost[id(e)].bytes / (_CEILINGS[1] / 1e9)) / 1e9
            for e in fp64 if id(e) in cost}
    tiny = [e for e in fp64 if id(e) in roof and roof[id(e)] < 0.05 * own[id(e)]]
    usual = statistics.median(own[id(e)] for e in tiny) if tiny else 0.0
    fixed = {n: statistics.median(own[id(e)] for e in tiny if e["name"] == n)
             for n in {e["name"] for e in tiny}}
    work = 0.0
    for e in fp64:
        if id(e) in roof:
            r = roof[id(e)]
            w = r if e in tiny else min(max(own[id(e)] - fixed.get(e["name"], usual), r),
                                         own[id(e)])
            work += min(w, own[id(e)])
    return work / 2, work


def test_float64_model_recorded_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An MLP cast with .to(torch.float64) (80 of the audit's 80 GEMMs took doubles, and
    `advise` said nothing; float32 ran it 1.9x faster): of its ops with a double input, views
    aside, the part their work takes at this host's ceilings halves, all from the raw JSON;
    the float32 model of the same script gets no advice."""
    monkeypatch.setattr(precision, "_measured", lambda threads: _CEILINGS, raising=False)
    run = _recorded(tmp_path, "float64")
    a = next(x for x in advise(run).advice if x.rule == "float64_ops")
    ops, own = _raw_ops(run)
    fp64 = [e for e in ops if _double(e) and e["name"] not in _VIEWS]
    assert a.evidence["fp64_ops"] == len(fp64) > 0
    assert a.evidence["fp64_ns"] == sum(own[id(e)] for e in fp64)
    gain, work = _expected_gain(ops, own)
    assert abs(a.gain_ns - gain) <= 1 and abs(a.evidence["work_ns"] - work) <= 1  # summed apart
    assert a.evidence["gflops_fp64"] == _CEILINGS[0] / 2e9 and a.evidence["bandwidth_gbs"] == 40
    assert a.evidence["parameters_fp64"] is True  # SGD's add_ updates doubles
    by_name: dict[str, int] = {}
    for e in fp64:
        by_name[e["name"]] = by_name.get(e["name"], 0) + own[id(e)]
    top = min(by_name, key=lambda n: (-by_name[n], n))
    assert a.evidence["top_ops"][0] == f"{top} {by_name[top] / 1e6:,.3f} ms"
    assert a.gain_ns <= a.evidence["fp64_ns"] / 2 <= a.gain_of_ns / 2
    assert a.evidence["fp64_share_pct"] >= 10 and "model.float()" in a.change
    assert "float64 is intended" in a.change
    assert precision.float64_ops(Facts.of(_recorded(tmp_path, "float32"))) is None


TINY = """
import torch
from torch import nn

torch.set_num_threads(1)
torch.manual_seed(0)
model = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(30)]).double()
opt = torch.optim.SGD(model.parameters(), lr=0.001)
x, y = torch.randn(4, 8, dtype=torch.float64), torch.randn(4, 8, dtype=torch.float64)
for _ in range(8):
    opt.zero_grad()
    ((model(x) - y) ** 2).mean().backward()
    opt.step()
"""


def test_float64_of_tiny_layers_is_their_fixed_cost(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """30 float64 layers of 8 (batch 4), whose time is each call's fixed cost: float32 ran
    them as fast (1.20 ms a step both, interleaved), where the old model, each op's own time
    less the median own time of the views (1 us), promised 9.75%. Every modelled call's work
    at the ceilings is under 5% of its own time: its work alone halves."""
    monkeypatch.setattr(precision, "_measured", lambda threads: _CEILINGS, raising=False)
    script = tmp_path / "tiny.py"
    script.write_text(TINY)
    result = record([sys.executable, str(script)], tmp_path / "tiny.run",
                    RecordOptions(collectors=("torch",), skip=2, steps=3))
    assert result.exit_code == 0
    a = precision.float64_ops(Facts.of(result.run))
    assert a is not None
    ops, own = _raw_ops(result.run)
    gain, work = _expected_gain(ops, own)
    assert abs(a.gain_ns - gain) <= 1 and abs(a.evidence["work_ns"] - work) <= 1  # summed apart
    addmm = [own[id(e)] for e in ops if e["name"] == "aten::addmm"]  # each call its fixed cost
    assert a.evidence["fixed_ns"]["aten::addmm"] == round(statistics.median(addmm))
    assert a.gain_ns < 0.02 * a.evidence["fp64_ns"]


A100 = {"id": 0, "name": "NVIDIA A100-SXM4-40GB", "computeMajor": 8, "computeMinor": 0,
        "totalGlobalMem": 42_297_524_224, "numSms": 108}
T4 = {"id": 0, "name": "Tesla T4", "computeMajor": 7, "computeMinor": 5,
      "totalGlobalMem": 15_843_721_216, "numSms": 40}


def _gpu_run(tmp: Path, name: str, device: dict[str, Any]) -> Run:
    """A double GEMM of 4096^3 (10 ms kernel) and a double add of 2^24 elements (1 ms) on
    `device`, each launched by its op with recorded shapes, in one 20 ms step."""
    def op(name: str, ts: float, dims: list[list[int]], corr: int, kernel: str,
           us: float) -> list[dict[str, Any]]:
        return [{"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts,
                 "dur": 20, "args": {"Input Dims": dims, "Input type": ["double"] * len(dims)}},
                {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1,
                 "tid": 1, "ts": ts + 1, "dur": 2, "args": {"correlation": corr}},
                {"ph": "X", "cat": "kernel", "name": kernel, "pid": 0, "tid": 7, "ts": ts + 5,
                 "dur": us, "args": {"correlation": corr, "device": 0, "stream": 7}}]

    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 1,
               "tid": 1, "ts": 0, "dur": 20_000, "args": {}},
              *op("aten::mm", 10, [[4096, 4096], [4096, 4096]], 1, "ampere_dgemm_64x64_nn",
                  10_000),
              *op("aten::add", 50, [[1 << 24], [1 << 24]], 2,
                  "void at::native::vectorized_elementwise_kernel<2, AddFunctor<double>>",
                  1_000)]
    path = tmp / f"{name}.json"
    path.write_bytes(orjson.dumps({"traceEvents": events, "deviceProperties": [device]}))
    return import_traces([path], tmp / f"{name}.run", ImportOptions(), ["test"])


def test_float64_on_a_gpu_is_priced_at_its_own_fp64_rate(tmp_path: Path) -> None:
    """The same kernels on two devices: a T4's FP64 runs at a 32nd of its FP32 (0.25 vs
    8.1 TFLOP/s), so the compute-bound DGEMM (137 GFLOP) would take 1/32.4 of its time in
    float32; an A100 runs DGEMMs on FP64 tensor cores at its SGEMM rate (19.5 TFLOP/s both),
    so float32 saves it nothing. The add is memory-bound on both: half its bytes, half its
    time."""
    t4 = precision.float64_ops(Facts.of(_gpu_run(tmp_path, "t4", T4)))
    a100 = precision.float64_ops(Facts.of(_gpu_run(tmp_path, "a100", A100)))
    assert t4 is not None and a100 is not None
    assert t4.evidence["fp64_kernels"] == a100.evidence["fp64_kernels"] == 2
    assert t4.evidence["modelled_kernels"] == 2
    assert t4.evidence["peak_tflops"]["fp64"] == pytest.approx(0.25)
    assert t4.gain_ns == round(10_000_000 * (1 - 0.25 / 8.1) + 1_000_000 / 2)
    assert a100.evidence["peak_tflops"]["fp64_gemm"] == pytest.approx(19.5)
    assert a100.gain_ns == 1_000_000 / 2
    assert "T4" in t4.gain_basis and t4.gain_basis.startswith("roofline model")
