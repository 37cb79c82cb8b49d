"""bf16 on a CPU recorded for real (docs/benchmarks.md, the thirtieth pass's bf16 section):
torch.autocast("cpu", dtype=torch.bfloat16) around one MLP, the same MLP's twin in float32 beside
it. predict says which ops its float32 profile prices in bf16; advise's reduced_precision_cpu
compares their rate with the Run's own float32 ops of the same shapes."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from perfswarm.model.kernels import REDUCED_SLOW, ProfileScaler
from perfswarm.model.opcost import OpCost, Shapes, data_cost
from perfswarm.model.predict import Change, predict
from perfswarm.model.profile import FamilyModel, Profile
from perfswarm.optimize.rules import precision
from perfswarm.optimize.rules.facts import Facts
from perfswarm.optimize.rules.precision import reduced_precision_ops
from perfswarm.recorder.session import RecordOptions, record
from perfswarm.trace.store import REDUCED_PRECISION_UNITS, Run, host_info

# one thread, batch 16: the bf16 MLP's forward and backward under autocast, then the float32
# twin's (the same shapes, its own weights) outside it; --alone: the bf16 MLP's alone
MIXED = """
import sys
import torch
from torch import nn

torch.set_num_threads(1)
torch.manual_seed(0)
def mlp():
    return nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                         nn.Linear(512, 10))
bf16, fp32 = mlp(), mlp()
opt = torch.optim.SGD([*bf16.parameters(), *fp32.parameters()], lr=0.01)
for step in range(10):
    x = torch.randn(16, 256)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = bf16(x).float().square().mean()
    if sys.argv[1:] != ["--alone"]:
        loss = loss + fp32(x).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""
# a profile's float32 model: a GEMM 20 us plus its FLOPs at 100 GFLOP/s (the rate rising with its
# size, as calibrate's does), everything else constant
FIXED_S, FLOP_S = 2e-5, 1e-11
RISING = Profile("cpu", 1, {"gemm": FamilyModel((FIXED_S, 0.0, FLOP_S)),
                            "elementwise": FamilyModel((1e-6, 0.0, 0.0))}, {})
# GEMMs at a constant 100 GFLOP/s: their time in proportion to their FLOPs
LINEAR = Profile("cpu", 1, {"gemm": FamilyModel((0.0, 0.0, FLOP_S)),
                            "elementwise": FamilyModel((1e-6, 0.0, 0.0))}, {})
# float32 GEMMs at 0.1 GFLOP/s: slower than the Run's bf16 ones ran, as if on bf16 units
UNITS = Profile("cpu", 1, {"gemm": FamilyModel((0.0, 0.0, 1e-8)),
                           "elementwise": FamilyModel((1e-6, 0.0, 0.0))}, {})

# the tests that time bf16 slower than float32 hold on a CPU that converts (this VM's AVX2);
# one with bf16 or fp16 units runs them at float32's rate or faster
CONVERTS = pytest.mark.skipif(bool(host_info()["reduced_precision_units"]),
                              reason="this CPU computes bf16/fp16 natively")

def _recorded(folder: Path, *args: str) -> Run:
    script = folder / "mixed.py"
    script.write_text(MIXED)
    result = record([sys.executable, str(script), *args], folder / "mixed.run",
                    RecordOptions(collectors=("torch",), skip=3, steps=4))
    assert result.exit_code == 0
    return result.run


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return _recorded(tmp_path_factory.mktemp("bf16"))


def test_predict_says_the_ops_its_float32_profile_prices_in_bf16(mixed: Run) -> None:
    """At batch x2 by a calibrate profile (float32 sweeps) slower than they ran (as on bf16
    units), the bf16 GEMMs' prediction is a float32 model's: a note names them (not the float32
    twin's) and their compute time a step, a share of it, and no GEMM is priced by its work;
    at the recorded configuration nothing is priced anew, and no note."""
    notes = predict(mixed, Change(batch_size=32), profile=UNITS).notes
    assert not any("priced at the rate they ran" in n for n in notes)
    (note,) = [n for n in notes if "compute in bf16" in n]
    found = re.match(r"(.+) compute in bf16, ([\d.]+) ms a step \(([\d.]+)% of the steady "
                     r"median\): the profile swept fp32 alone", note)
    assert found is not None
    names = found.group(1).split(", ")
    assert {"aten::mm", "aten::addmm"} <= set(names)
    assert float(found.group(2)) > 0 and 0 < float(found.group(3)) < 100
    assert not any("compute in bf16" in n for n in predict(mixed, profile=UNITS).notes)


@CONVERTS
def test_bf16_gemms_on_a_slower_path_scale_by_their_work(tmp_path: Path) -> None:
    """The bf16 MLP alone (this CPU's conversion path where it has no bf16 units) at batch x2
    by a float32 profile whose rate rises with size: the GEMMs that ran REDUCED_SLOW times its
    time or more take twice their time (their FLOPs doubled: the rate they ran, held), as a
    profile of a constant rate (LINEAR) has them, and their note names them; the float32
    model had grown them about 0.75x as much (x1.39-1.43 where x2.04 was measured on the
    styles pass's MLP)."""
    run = _recorded(tmp_path, "--alone")
    rising = predict(run, Change(batch_size=32), profile=RISING)
    (note,) = [n for n in rising.notes if "priced at the rate they ran" in n]
    found = re.match(r"(.+) compute in bf16, [\d.]+ ms a step \([\d.]+% of the steady "
                     rf"median\), at {REDUCED_SLOW:.0f}x the profile's fp32 time", note)
    assert found is not None and {"aten::mm", "aten::addmm"} <= set(found.group(1).split(", "))
    linear = predict(run, Change(batch_size=32), profile=LINEAR)
    assert linear.measured_steady_ns == rising.measured_steady_ns
    grown = rising.predicted_steady_ns - rising.measured_steady_ns
    assert grown > 0
    assert grown == pytest.approx(linear.predicted_steady_ns - linear.measured_steady_ns,
                                  rel=0.03)


def test_a_reduced_precision_gemm_as_fast_as_float32_keeps_its_model() -> None:
    """by_work asks the op's own time: a bf16 GEMM within REDUCED_SLOW of the float32 model
    (units for bf16) and a float32 one scale by the model's ratio; a slow bf16 one by FLOPs."""
    scaler = ProfileScaler(RISING)

    def cost(rows: int, dtype: str) -> tuple[OpCost, tuple[tuple[int, ...], ...]]:
        dims = ((rows, 512), (512, 512))
        found = data_cost("aten::mm", Shapes(dims, (dtype, dtype)))
        assert found is not None
        return found, dims

    (old, dims16), (new, dims32) = cost(16, "float"), cost(32, "float")
    model_ratio = (FIXED_S + FLOP_S * new.flops) / (FIXED_S + FLOP_S * old.flops)
    for dtype, took_ns, grown in (("c10::BFloat16", 6_000_000, 2.0),
                                  ("c10::BFloat16", 150_000, model_ratio),
                                  ("float", 6_000_000, model_ratio)):
        (old, dims16), (new, dims32) = cost(16, dtype), cost(32, dtype)
        assert scaler.scaled(took_ns, old, new, dims16, dims32) == pytest.approx(
            took_ns * grown, rel=1e-6)


@CONVERTS
def test_bf16_matrix_work_slower_than_the_runs_float32_is_said(mixed: Run) -> None:
    """The bf16 GEMMs (forward and backward) against the float32 twin's, whose FLOPs match:
    the rate compared with is the Run's own, the gain their time less their FLOPs at it,
    never more than their time; the host's bf16 units said as recorded."""
    a = reduced_precision_ops(Facts.of(mixed))
    assert a is not None and a.rule == "reduced_precision_cpu"
    e = a.evidence
    assert e["dtypes"] == "bf16" and e["judged_ops"] == e["reduced_ops"] > 0
    assert e["fp32_sources"] == ["the Run's own float32 ops of the family and similar FLOPs"]
    assert e["gflops_reduced"] < e["gflops_fp32"]
    assert a.gain_ns == e["reduced_ns"] - e["fp32_estimate_ns"]
    assert 0 < e["fp32_estimate_ns"] < e["reduced_ns"]
    assert e["cpu_units"] == host_info()["reduced_precision_units"]
    assert "drop torch.autocast" in a.change


@CONVERTS
def test_without_a_float32_gemm_in_the_run_its_shapes_are_timed_here(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bf16 MLP alone holds no float32 GEMM: float32 GEMMs of its ops' shapes, timed on
    this host (the one that recorded it), give the rate; recorded on another host, nothing
    measures one, and no advice guesses it."""
    run = _recorded(tmp_path, "--alone")
    a = reduced_precision_ops(Facts.of(run))
    assert a is not None
    e = a.evidence
    assert e["fp32_sources"] == ["float32 GEMMs of the ops' shapes timed on this host (numpy's "
                                 "BLAS, 1 thread(s))"]
    assert e["gflops_reduced"] < e["gflops_fp32"]
    assert 0 < a.gain_ns < e["reduced_ns"]
    elsewhere = {**host_info(), "hostname": "another-host"}
    monkeypatch.setattr(precision, "host_info", lambda: elsewhere)
    assert reduced_precision_ops(Facts.of(run)) is None


def test_the_hosts_reduced_precision_units_are_kept() -> None:
    """The manifest's host holds the CPU's bf16/fp16 flags from /proc/cpuinfo."""
    flags: set[str] = set()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        flags = next((set(line.split(":", 1)[1].split())
                      for line in cpuinfo.read_text().splitlines()
                      if line.startswith(("flags", "Features"))), set())
    assert host_info()["reduced_precision_units"] == sorted(flags & REDUCED_PRECISION_UNITS)
