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

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from perfswarm.analyze.step_threads import history, prevailing, step_threads
from perfswarm.model.predict import THREADS_NOTE, predict
from perfswarm.optimize.rules import host
from perfswarm.optimize.rules.facts import Facts
from perfswarm.recorder.session import RecordOptions, record
from perfswarm.trace.schema import HOOK_THREADS
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

# LOOP lowering its threads to 1 at its 6th step, inside the window (steps 3-7: 3 at the cores'
# count, 2 at 1), as /tmp/p29/unseen/timer_plateau.py did at its 10th
LOWERED = LOOP.replace("for _ in range(30):\n", """for i in range(30):
    if i == 6:
        torch.set_num_threads(1)
""")

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
    # thread 16-26); as a Run recorded before the steps' thread counts says it (the
    # manifest's count as the window opened)
    counters = run.table("counters")
    run.write_table("counters", counters.filter(pc.not_equal(
        counters.column("name").cast(pa.string()), HOOK_THREADS)))
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
    (the system sampler's, one definition with cpu_contention's), not the host's: a 7 ms
    collate with no worker on a loaded 2-core host had been told 2 workers for 52.7%, and ran
    slower with them (8.9-9.9 ms a step against 7.5-8.25). Measured whether or not the others
    held the run itself back (cpu_contention): a worker needs a core the run did not use."""
    from perfswarm.optimize.rules import loader
    from perfswarm.optimize.rules.threads import free_cores

    facts = Facts.of(_recorded_under_load(tmp_path, LOADER))
    plan = loader.loader_plan(facts)
    load = host.host_load(facts) or host.host_load(facts, timed=True)
    assert load is not None and plan is not None and plan.workers == 0
    cores = os.cpu_count() or 1
    assert plan.free == free_cores(load) < cores
    assert plan.cores == min(cores, plan.free) / len(facts.ranks)


def test_threads_lowered_inside_the_window(tmp_path: Path) -> None:
    """A loop that sets 1 intra-op thread at its 6th step, inside the window: the recorder reads
    torch.get_num_threads() at each step hook (the counter HOOK_THREADS, each step's at the
    hook ending it); cpu_contention advises no fewer threads where the later steps run at one
    already (it had said "its 2 intra-op threads" and set_num_threads(1) "before the loop");
    predict says the steps mix counts, predicts the steps at the count most ran (the cores'),
    and leaves the steps after the window, at 1, out of the program's own step."""
    run = _recorded_under_load(tmp_path, LOWERED)
    cores = os.cpu_count() or 1
    assert cores >= 2  # (one core: nothing to lower)
    assert run.manifest()["extra"]["record"]["threads"] == [cores]  # as the window opened
    (steps_file,) = run.raw_dir.glob("steps-rank0-pid*.json")
    data = orjson.loads(steps_file.read_bytes())
    assert data["hook_threads"] == [cores] * 6 + [1] * 24
    counters = run.table("counters").to_pylist()
    assert [(c["ts"], c["value"]) for c in counters if c["name"] == HOOK_THREADS] == list(
        zip(data["hook_ns"], data["hook_threads"], strict=True))
    counted = step_threads(run.table("counters"), run.table("steps"))
    marked = {s["step"] for s in run.table("steps").to_pylist() if s["source"] == "marker"}
    assert marked == {3, 4, 5, 6, 7}
    assert counted == {(0, k): cores if k < 6 else 1 for k in range(1, 30)}
    assert history({k: v for k, v in counted.items() if k[1] in marked}) == (
        f"{cores} then 1 from step 6")

    a = host.cpu_contention(Facts.of(run))
    assert a is not None and "threads" not in a.evidence
    assert "intra-op" not in a.title and a.change.startswith("run on an idle machine")

    p = predict(run)
    said = THREADS_NOTE.format(history=f"{cores} then 1 from step 6", threads=cores, steps=3)
    assert said in p.notes
    assert p.steady and {s for _, s in p.steady} <= {3, 4, 5}
    assert p.unprofiled_ns is None  # the steps after the window ran at 1: none at the cores'
    after = sum(s["source"] == "detected" and s["step"] > 7
                for s in run.table("steps").to_pylist())
    assert after == 21 and (f"{after} steps after the window ran at other intra-op threads (1) "
                            f"than the prediction's {cores}: left out of the program's own "
                            "step there") in p.notes

    # thread_oversubscription too: the manifest's count as the window opened, raised here to 4
    # a core, is not what the later steps ran with
    m = run.manifest()
    m["extra"]["record"]["threads"] = [4 * cores]
    run.write_manifest(m)
    assert host.thread_oversubscription(Facts.of(run)) is None


def test_the_count_most_steps_ran_the_later_on_a_tie() -> None:
    assert prevailing({(0, 1): 2, (0, 2): 2, (0, 3): 1}) == 2
    assert prevailing({(0, 1): 2, (0, 2): 1}) == 1
    assert prevailing({}) is None
    assert history({(0, 1): 4, (0, 2): 4, (1, 1): 2, (1, 2): 1, (1, 3): 2}) == (
        "rank 1: 2 then 1 from step 2 then 2 from step 3")


def test_the_change_made_where_the_program_sets_its_threads() -> None:
    """Threads raised inside the steps judged: the change goes where the program sets them
    (a set_num_threads before the loop would be undone there), saying how they ran."""
    from perfswarm.optimize.rules.threads import FewerThreads, RanWith

    ran = RanWith(1, 2, "torch.get_num_threads() at each step", 2, "1 then 2 from step 10")
    fewer = FewerThreads(ran, 0.96, 1)
    assert fewer.change().startswith(
        "torch.set_num_threads(1) where the program sets its threads (its steps ran 1 then 2 "
        "from step 10): other processes left 0.96 of the cores free, and its 2 intra-op threads")
    assert fewer.evidence()["threads_by_step"] == "1 then 2 from step 10"
