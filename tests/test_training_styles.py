"""Training styles recorded for real (docs/benchmarks.md, the thirtieth pass's styles): a
torch.compile'd model's recompilation on a new input shape (a last short batch), outside the
profiling window, where no trace shows dynamo's spans; gradient accumulation under CPU
autocast, whose step is an optimizer step of several micro-batches; a new epoch's DataLoader
starting its workers, outside the window."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np

from perfswarm.analyze.iterations import hook_deltas
from perfswarm.optimize.rules import host
from perfswarm.optimize.rules.facts import Facts
from perfswarm.recorder.session import RecordOptions, record
from perfswarm.report.data import report_data
from perfswarm.trace.schema import HOOK_COMPILE, HOOK_LOADER
from perfswarm.trace.store import Run

# 24 steps of 16 rows through a compiled MLP (dynamo's "eager" backend: its compile is
# dynamo's alone, a fraction of a second), but step 20's batch of 3 rows: a new shape, so
# dynamo compiles the forward again (a last partial batch's)
SHORT_BATCH = """
import torch
from torch import nn

torch.set_num_threads(1)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
compiled = torch.compile(model, backend="eager")
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for i in range(24):
    loss = compiled(torch.randn(3 if i == 20 else 16, 32)).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def _per_step(tmp: Path, script: str, counter: str) -> tuple[Run, dict[int, float]]:
    """`script` recorded (`-c torch`, window steps 3-7), and what the recorder's hook counter
    `counter` grew by in each step (0 where it read none)."""
    path = tmp / "script.py"
    path.write_text(script)
    result = record([sys.executable, str(path)], tmp / "script.run",
                    RecordOptions(collectors=("torch",), skip=3, steps=5))
    assert result.exit_code == 0
    steps = result.run.table("steps").sort_by("step")
    grew = np.nan_to_num(hook_deltas(result.run.table("counters"), steps, counter))
    return result.run, dict(zip(steps.column("step").to_pylist(), grew.tolist(), strict=True))


def test_a_recompilation_outside_the_window_is_no_periodic_work(tmp_path: Path) -> None:
    """The recorder clocks dynamo's compiles at every step hook (HOOK_COMPILE, from its
    compile callbacks): step 20 (from the hook ending call 19 to the one ending call 20, the
    short batch's) holds the recompilation, the others none (the first compile, in call 0,
    comes before the first step). outlier_steps says the
    slow step compiled again (and how long) instead of calling it periodic work to move out
    of the loop: the window (steps 3-7) held no entire_frame_compile span of it."""
    run, by_step = _per_step(tmp_path, SHORT_BATCH, HOOK_COMPILE)
    assert by_step[20] > 0
    assert all(ns == 0 for step, ns in by_step.items() if step != 20)

    a = host.outlier_steps(Facts.of(run))
    assert a is not None
    # (steps of 0.3 ms another process preempted may be outliers too: no system sampler here)
    assert 20 in [o["step"] for o in a.evidence["outliers"]]
    assert a.evidence["compile_ns"] == round(by_step[20])
    assert a.change.startswith("torch.compile compiled again in them")


# 12 optimizer steps, each over 4 micro-batches of 8 rows under bfloat16 autocast on the CPU
# (an optimizer step every 4 backward passes, zero_grad(set_to_none=True))
ACCUMULATED = """
import torch
from torch import nn

torch.set_num_threads(1)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(12):
    for micro in range(4):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(torch.randn(8, 32)).square().mean() / 4
        loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
"""


def test_a_step_of_accumulated_micro_batches_is_said(tmp_path: Path) -> None:
    """Under gradient accumulation a step is an optimizer step: its 4 micro-batches' 32
    samples, and the throughput's source says so (it had said "each step's backward" of a
    step that ran 4)."""
    script = tmp_path / "accumulated.py"
    script.write_text(ACCUMULATED)
    result = record([sys.executable, str(script)], tmp_path / "accumulated.run",
                    RecordOptions(collectors=("torch",), skip=3, steps=4))
    assert result.exit_code == 0
    rates = report_data(result.run)["throughput"]
    assert rates["samples_per_step"] == 4 * 8
    assert ("; 4 forward and backward passes a step: a step is an optimizer step, its "
            "samples those of all of them)") in rates["source"]


# 6 epochs of 4 batches from a DataLoader with 2 workers, not persistent: each epoch's first
# batch waits for 2 new workers (forked, then fetching it); the 18th batch's step (step 17: a
# step runs from one hook to the next) runs an evaluation of 2,000 forwards besides
EPOCHS = """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.set_num_threads(1)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(TensorDataset(torch.randn(32, 32)), batch_size=8, num_workers=2)
step = 0
for epoch in range(6):
    for (x,) in loader:
        step += 1
        if step == 18:
            with torch.no_grad():
                for _ in range(2000):
                    model(torch.randn(64, 32))
        for _ in range(5):
            opt.zero_grad()
            model(x).square().mean().backward()
        opt.step()
"""


def test_a_new_epochs_loader_outside_the_window_is_named(tmp_path: Path) -> None:
    """The recorder times what starting a loader's workers takes (HOOK_LOADER, at every step
    hook): in the steps that begin an epoch (4, 8, 12, 16, 20: the hook ending its last batch
    is the step's start) and the next (the second worker's first batch), none in the others.
    outlier_steps names those outside the window (steps 3-7) as a new epoch's workers
    starting, with the time timed, not as periodic work to find; step 17's evaluation stays
    the work to find (denoising-diffusion-pytorch's epoch restarts had been "find what runs in
    those steps (evaluation, generate() ...)")."""
    run, by_step = _per_step(tmp_path, EPOCHS, HOOK_LOADER)
    timed = {s for s, ns in by_step.items() if ns > 0}
    # the second worker's first batch is the next step's (a plain loop takes one a step)
    assert {4, 8, 12, 16, 20} <= timed <= {1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21}

    a = host.outlier_steps(Facts.of(run))
    assert a is not None
    named = [o["step"] for o in a.evidence["outliers"]]
    # (steps of a few ms another process preempted may be outliers too: no system sampler)
    assert {12, 16, 17, 20} <= set(named)
    # the steps named a new epoch's start: each epoch's first step outside the window, and
    # the next where its second worker's first batch made it an outlier too (steps 5, 13,
    # 21 on a loaded host), never the evaluation's
    said = re.match(r"steps? ([\d, ]+) starts? a new epoch's DataLoader workers: the recorder "
                    r"timed ([\d,.]+) ms of their ", a.change)
    assert said is not None, a.change
    epochs = [int(n) for n in said[1].split(", ")]
    assert {12, 16, 20} <= set(epochs) <= {4, 5, 8, 9, 12, 13, 16, 20, 21} & set(named)
    assert a.evidence["loader_start_steps"] == len(epochs)
    assert a.evidence["loader_start_ns"] == round(sum(by_step[s] for s in named))
    assert said[2] == f"{sum(by_step[s] for s in epochs) / 1e6:,.1f}"
    assert "; the other outliers: find what runs in those steps (evaluation" in a.change
