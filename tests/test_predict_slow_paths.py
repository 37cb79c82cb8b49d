"""Reductions on a slower path than their family's sweep, recorded for real (docs/benchmarks.md,
the thirty-first pass's diffusion U-Net section): a diffusion U-Net's RMSNorm norm, over the
channels (linalg_vector_norm on a strided dimension, tens of times the contiguous reduction the
profile swept). Its time is per element: at twice the batch it takes twice its time, less the
fixed part per call."""

from __future__ import annotations

import sys

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from perfswarm.model.kernels import ProfileScaler
from perfswarm.model.opcost import op_cost, scale_batch
from perfswarm.model.predict import Change, predict
from perfswarm.model.profile import FamilyModel, Profile
from perfswarm.recorder.session import RecordOptions, record
from perfswarm.trace.store import Run

# one thread: the RMSNorm's norm on [B, 16, 16, 16] (no autograd: the op alone),
# and a one-element parameter's step to open the recorder's window
NORMS = """
import sys
import torch

torch.set_num_threads(1)
batch = int(sys.argv[sys.argv.index("--batch-size") + 1])
x = torch.rand(batch, 16, 16, 16)
p = torch.zeros(1, requires_grad=True)
opt = torch.optim.SGD([p], lr=0.1)
for step in range(10):
    with torch.no_grad():
        for _ in range(4):
            torch.linalg.vector_norm(x, 2, dim=1, keepdim=True)
    (p * 2).sum().backward()
    opt.step()
    opt.zero_grad()
"""
# this VM's calibrate fits (cpu-profile.json of the thirty-first pass): a time per call, then per
# byte; the norm's [16, 16, 16, 16] is 10 us by the reduction's
PROFILE = Profile("cpu", 1, {"reduction": FamilyModel((2.87e-6, 2.78e-11, 0.0)),
                             "elementwise": FamilyModel((2.51e-6, 2.41e-11, 0.0)),
                             "copy": FamilyModel((1.21e-6, 1.95e-11, 0.0))}, {})
SLOW = ("aten::linalg_vector_norm",)


@pytest.fixture(scope="module")
def norms(tmp_path_factory: pytest.TempPathFactory) -> Run:
    folder = tmp_path_factory.mktemp("norms")
    script = folder / "norms.py"
    script.write_text(NORMS)
    result = record([sys.executable, str(script), "--batch-size", "16"], folder / "norms.run",
                    RecordOptions(collectors=("torch",), skip=3, steps=4))
    assert result.exit_code == 0
    return result.run


def test_a_reduction_on_a_slow_path_grows_with_its_elements(norms: Run) -> None:
    """At twice the batch the predicted step grows, over the step it predicts at the recorded
    batch, by the norms' own time a step (their elements doubled, their fixed part per call a
    few us); the model's ratio (the fixed part a share of 10 us) had grown it by 0.72 of that
    (the U-Net's step x1.59 where it ran x1.78)."""
    at16 = predict(norms, profile=PROFILE)
    at32 = predict(norms, Change(batch_size=32), profile=PROFILE)
    events = norms.table("events", columns=["name", "dur", "step"])
    steady = {step for _, step in at32.steady}
    names = pc.cast(events.column("name"), "string")
    mine = pc.and_(pc.is_in(names, value_set=pa.array(SLOW, pa.string())),
                   pc.is_in(events.column("step"), value_set=pa.array(sorted(steady), pa.int64())))
    slow_ns = pc.sum(events.filter(mine).column("dur")).as_py() / len(steady)
    assert slow_ns > 0
    assert at32.predicted_steady_ns - at16.predicted_steady_ns == pytest.approx(slow_ns, rel=0.1)


def test_an_op_near_its_model_keeps_the_models_ratio() -> None:
    """A norm over the channels of [16, 16, 16, 16] the run took in its model's time (under
    SMALL_OP_S: mostly fixed cost) scales by the model's ratio; one at 620 us (this VM ran it
    alone at 617.5 us) keeps the fixed part per call and doubles the rest. An elementwise op
    as slow over its model keeps the ratio (a GELU's excess is partly fixed per call), and so
    does a GEMM (test_model_predict: its excess is no work)."""
    scaler = ProfileScaler(PROFILE)
    dims = ((16, 16, 16, 16),)
    for name, family, fixed_s in (("aten::linalg_vector_norm", "reduction", 2.87e-6),
                                  ("aten::silu", "elementwise", None)):
        old = op_cost(name, [list(dims[0])], ["float"])
        assert old is not None and old.family == family
        new = scale_batch(old, 2.0)
        before, after = scaler.model_time(old, dims), scaler.model_time(new, dims)
        assert before is not None and after is not None and before < 20e-6
        near = round(before * 1e9)
        assert scaler.scaled(near, old, new, dims, dims) == round(near * after / before)
        if fixed_s is None:
            assert scaler.scaled(620_000, old, new, dims, dims) == round(
                620_000 * after / before)
            continue
        work = (after - fixed_s) / (before - fixed_s)
        assert work == pytest.approx(2.0, rel=0.02)
        fixed_ns = round(fixed_s * 1e9)
        assert scaler.scaled(620_000, old, new, dims, dims) == round(
            fixed_ns + (620_000 - fixed_ns) * work)
