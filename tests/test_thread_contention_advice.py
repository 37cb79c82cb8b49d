"""cpu_contention on a host whose other processes hold the cores: a loop recorded here with
one intra-op thread a core, while this test keeps every core busy, is told to run as many
threads as the cores the others left free (nanoGPT's two threads on a busy 2-core host took
5-8x one thread's time, and the advice had said only "run on an idle machine")."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

from perfswarm.optimize.rules import host
from perfswarm.optimize.rules.facts import Facts
from perfswarm.recorder.session import RecordOptions, record
from perfswarm.trace.store import Run

LOOP = """
import os
import torch
from torch import nn

torch.set_num_threads(os.cpu_count())
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(256, 512)
for _ in range(30):
    loss = model(x).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


LOADER = """
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

class Slow(Dataset):
    def __len__(self):
        return 10_000
    def __getitem__(self, i):
        s = sum(k * k % 7 for k in range(20_000))  # Python work, no wait
        return torch.full((64,), float(s % 3)), i % 10

torch.set_num_threads(1)
model = nn.Linear(64, 10)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step, (x, y) in enumerate(DataLoader(Slow(), batch_size=8)):
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step == 9:
        break
"""


def _recorded_under_load(tmp_path: Path, text: str = LOOP) -> Run:
    """A loop (LOOP) recorded (torch and the system sampler) while two spinning processes a
    core, in sessions of their own, hold the host's cores. Two, not one: with one a core the
    scheduler had let a one-thread loop keep 0.92 of the 2 cores (others 1.08, and the loop's
    5 profiled steps short enough to hold one sampler reading), so whether the rule's evidence
    was there followed the host's scheduling, not the test."""
    script = tmp_path / "loop.py"
    script.write_text(text)
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"],
                                 start_new_session=True) for _ in range(2 * (os.cpu_count() or 1))]
    try:
        result = record([sys.executable, str(script)], tmp_path / "busy.run",
                        RecordOptions(collectors=("torch", "system"), skip=3, steps=5))
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    assert result.exit_code == 0
    return result.run


def test_fewer_intra_op_threads_on_a_busy_host(tmp_path: Path) -> None:
    run = _recorded_under_load(tmp_path)
    cores = os.cpu_count() or 1
    assert run.manifest()["extra"]["record"]["threads"] == [cores]
    a = host.cpu_contention(Facts.of(run))
    assert a is not None
    e = a.evidence
    # the cores the other processes held: the busy cores less the loop's and the recorder's
    others = e["host_busy_cores"] - e["process_cores"] - e["recorder_cores"]
    assert others >= 0.5  # the spinners' share at least
    free = max(0.0, cores - others)
    assert e["free_cores"] == round(free, 2) < cores
    assert e["threads"] == cores and e["advised_threads"] == max(1, math.floor(free)) < cores
    n = e["advised_threads"]
    assert a.change.startswith(f"torch.set_num_threads({n}) before the loop (or "
                               f"OMP_NUM_THREADS={n} MKL_NUM_THREADS={n}")
    assert "or run on an idle machine" in a.change
    assert f"its {cores} intra-op threads wait for each other" in a.title
    # run with 4 threads a core, thread_oversubscription says the same number, not cores /
    # processes (thr.py's 8 threads on 2 busy cores: 66-80 ms a step, 2 threads 56-210, 1
    # thread 16-26)
    m = run.manifest()
    m["extra"]["record"]["threads"] = [4 * cores]
    run.write_manifest(m)
    over = host.thread_oversubscription(Facts.of(run))
    assert over is not None and over.evidence["free_cores"] == e["free_cores"]
    assert over.change.startswith(f"OMP_NUM_THREADS={n} MKL_NUM_THREADS={n} (the ")
    again = host.cpu_contention(Facts.of(run))
    assert again is not None and again.evidence["advised_threads"] == n
    # the same loop at one thread a process has none fewer to run: the idle machine alone
    m["extra"]["record"]["threads"] = [1]
    run.write_manifest(m)
    one = host.cpu_contention(Facts.of(run))
    assert one is not None and "threads" not in one.evidence
    assert one.change.startswith("run on an idle machine")


def test_the_loader_has_the_cores_the_others_left(tmp_path: Path) -> None:
    """data_loading's pipeline model gives the loader the cores other processes left free
    (cpu_contention's evidence), not the host's: a 7 ms collate with no worker on a loaded
    2-core host had been told 2 workers for 52.7%, and ran slower with them (8.9-9.9 ms a
    step against 7.5-8.25)."""
    from perfswarm.optimize.rules import loader
    from perfswarm.optimize.rules.threads import free_cores

    facts = Facts.of(_recorded_under_load(tmp_path, LOADER))
    busy = host.contended(facts)
    plan = loader.loader_plan(facts)
    assert busy is not None and plan is not None and plan.workers == 0
    cores = os.cpu_count() or 1
    assert plan.cores == min(cores, free_cores(busy[2])) / len(facts.ranks) < cores
