"""perfswarm record: one recorded torch run shared by most tests, plus tiny non-torch runs."""

from __future__ import annotations

import functools
import itertools
import os
import re
import signal
import statistics
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from conftest import SESSION_OFFSET_NS
from conftest import TRAINER_STEPS as STEPS
from perfswarm.analyze.frame import Events
from perfswarm.analyze.rpc import rpc_hand_overs
from perfswarm.analyze.summary import analyze
from perfswarm.cli.record_cmd import status_line
from perfswarm.errors import PerfswarmError
from perfswarm.optimize.advise import advise
from perfswarm.recorder.base import Sampler
from perfswarm.recorder.clock import monotonic_offset_ns
from perfswarm.recorder.session import Child, RecordOptions, Status, parse_steps, record
from perfswarm.recorder.torch_profiler import PATIENCE, SETTLE, read_live
from perfswarm.trace.readers import perf, pyspy
from perfswarm.trace.readers.sampler import read_jsonl, value_rows
from perfswarm.trace.schema import FAULTS, HOOK_DELAY, OPTIMIZER_CALL
from perfswarm.trace.store import Run

PY = sys.executable



def test_manifest_statuses(trainer_run: Run) -> None:
    m = trainer_run.manifest()
    assert m["complete"] is True and m["exit_status"] == 0 and m["signal"] is None
    status = {k: v["status"] for k, v in m["collectors"].items()}
    assert status["torch"] == "ok" and status["system"] == "ok" and status["pystacks"] == "ok"
    assert status["perf"] == "ok" or status["perf"].startswith("unavailable: ")
    if not Path("/dev/nvidia0").exists():
        assert status["gpu"] == "unavailable: no NVIDIA GPU"
    offsets = m["clock_offsets"]
    assert offsets["system"] == offsets["gpu"] == 0 and "pystacks" not in offsets
    # monotonic -> epoch, as it is now, unless the machine's wall clock stepped meanwhile (the
    # recorder notes a step during a recording; one after it moves only the check's side)
    if abs(monotonic_offset_ns() - SESSION_OFFSET_NS) < 1_000_000:
        assert abs(offsets["perf"] - monotonic_offset_ns()) < 1_000_000
    assert m["ranks"] == [0]
    files = m["collectors"]["torch"]["files"]
    # the main process's three files, and a trace from each of the two DataLoader workers
    assert [f.split("-")[0] for f in files] == ["et", "steps", "torch", "torch", "torch"]
    assert all((trainer_run.raw_dir / f).is_file() for f in files)


def test_steps_marker_window_and_hooks(trainer_run: Run) -> None:
    steps = trainer_run.table("steps").to_pylist()
    assert [(s["step"], s["source"]) for s in steps] == [
        (1, "detected"), (2, "marker"), (3, "marker"), (4, "marker"),
        (5, "export"), (6, "detected"), (7, "detected")]  # step 5 holds the trace export
    events = trainer_run.table("events")
    main = trainer_run.manifest()["extra"]["record"]["pid"]
    steps_of_main = {s for s, p in zip(events.column("step").to_pylist(),
                                       events.column("pid").to_pylist(), strict=True)
                     if p == main}
    assert {2, 3, 4} <= steps_of_main <= {-1, 2, 3, 4, 5}
    assert events.num_rows > 300
    assert trainer_run.table("graph_nodes").num_rows > 50  # one step's execution trace


def test_dataloader_workers_traced_in_the_window(trainer_run: Run) -> None:
    """Each worker profiles the batches it began fetching while the main process's window was
    open: its own pid, the main process's rank, every op inside one of its fetch spans. The
    window opens at the hook that ends the step before its first marked one (the worker sees
    its flag from then on, while the main process's profiler is still starting: on a loaded
    machine a worker's fetch had begun before the first marked step)."""
    main = trainer_run.manifest()["extra"]["record"]["pid"]
    ev = trainer_run.table("events").to_pydict()
    host = [i for i, p in enumerate(ev["pid"]) if p != -1]  # -1: Kineto's own markers
    pids = {ev["pid"][i] for i in host}
    assert main in pids and len(pids) == 3 and {ev["rank"][i] for i in host} == {0}
    steps = trainer_run.table("steps").to_pylist()
    marked = [s for s in steps if s["source"] == "marker"]
    start = max((s["end"] for s in steps if s["end"] <= marked[0]["start"]),
                default=marked[0]["start"])
    end = marked[-1]["end"]
    for worker in pids - {main}:
        mine = [i for i in host if ev["pid"][i] == worker]
        fetches = [(ev["ts"][i], ev["ts"][i] + ev["dur"][i]) for i in mine
                   if ev["name"][i] == "DataLoader worker fetch"]
        assert fetches and all(start <= a <= end for a, _ in fetches)
        assert all(any(a <= ev["ts"][i] <= b for a, b in fetches) for i in mine)
        assert any(ev["name"][i] == "aten::stack" for i in mine)  # the collate
        # written as the worker left, in the loop's last step (its last batch fetched):
        # written at the window's close, it had held the worker's next batch (180 ms, a step
        # after the window)
        trace = trainer_run.path / "raw" / f"torch-rank0-pid{worker}.pt.trace.json"
        last = max(s["start"] for s in trainer_run.table("steps").to_pylist())
        assert trace.stat().st_mtime_ns >= last
    # detection (what --ignore-markers uses) reads the main thread: one iteration per marker
    detected = analyze(trainer_run).iterations.detected[0]
    assert len(detected) == len(marked)
    assert marked[0]["start"] <= detected[0].start < marked[0]["end"]
    # each later one where the step before it ended, its optimizer step: inside the marker
    # before (the profiler is stepped once optimizer.step() has returned)
    assert all(m["start"] < d.start <= m["end"]
               for m, d in zip(marked[:-1], detected[1:], strict=True))


SPAWNED = textwrap.dedent("""
    import time
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset
    if __name__ == "__main__":
        data = TensorDataset(torch.randn(256, 16), torch.randint(0, 2, (256,)))
        batches = iter(DataLoader(data, batch_size=8, num_workers=2, persistent_workers=True,
                                  multiprocessing_context="spawn"))
        model = nn.Linear(16, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(6):
            x, y = next(batches)  # asks a worker for a batch: in the window from step 2 on
            time.sleep(0.3)  # time for the worker to take the request before the step ends
            opt.zero_grad(); nn.functional.cross_entropy(model(x), y).backward(); opt.step()
""")


def test_spawned_dataloader_workers_traced(tmp_path: Path) -> None:
    """Spawned workers unpickle their target by name and run the sitecustomize themselves."""
    script = tmp_path / "spawned.py"
    script.write_text(SPAWNED)
    result = record([PY, str(script)], tmp_path / "sp.run",
                    RecordOptions(collectors=("torch",), skip=2, steps=2))
    m = result.run.manifest()
    main = m["extra"]["record"]["pid"]
    traces = [f for f in m["collectors"]["torch"]["files"] if f.startswith("torch-")]
    assert len(traces) == 3 and f"torch-rank0-pid{main}.pt.trace.json" in traces
    # one steps file: the workers never stepped
    assert [f for f in m["collectors"]["torch"]["files"] if f.startswith("steps-")] == [
        f"steps-rank0-pid{main}.json"]
    ev = result.run.table("events").to_pydict()
    fetches = {p for p, n in zip(ev["pid"], ev["name"], strict=True)
               if n == "DataLoader worker fetch"}
    assert len(fetches) == 2 and main not in fetches


TERMINATED = textwrap.dedent("""
    import time
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset
    data = TensorDataset(torch.randn(256, 16), torch.randint(0, 2, (256,)))
    batches = iter(DataLoader(data, batch_size=8, num_workers=2, persistent_workers=True))
    model = nn.Linear(16, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(6):
        x, y = next(batches)
        time.sleep(0.2)
        opt.zero_grad(); nn.functional.cross_entropy(model(x), y).backward(); opt.step()
    workers = batches._workers
    for w in workers:  # what multiprocessing does at exit to a loader never shut down
        w.terminate()
    for w in workers:
        w.join()
    print("exitcodes", [w.exitcode for w in workers])
""")


def test_terminated_workers_exit_quietly(tmp_path: Path) -> None:
    """A worker terminated by its parent while it traces writes its trace and exits with 0,
    as torch's own handler makes it; killed by the signal, the parent's SIGCHLD handler raised
    "DataLoader worker ... is killed by signal: Terminated" at the script's exit."""
    run, out = _record_script(tmp_path, TERMINATED, skip=2, steps=2)
    m = run.manifest()
    assert m["exit_status"] == 0
    assert len([f for f in m["collectors"]["torch"]["files"] if f.startswith("torch-")]) == 3
    assert "exitcodes [0, 0]" in out, out


def _record_script(tmp_path: Path, source: str, skip: int, steps: int) -> tuple[Run, str]:
    """`source` as a script recorded with the torch collector: the Run and what it printed."""
    script = tmp_path / "script.py"
    script.write_text(source)
    log = tmp_path / "out.txt"
    with log.open("wb") as f:
        result = record([PY, str(script)], tmp_path / "s.run",
                        RecordOptions(collectors=("torch",), skip=skip, steps=steps),
                        child=Child(output=f))
    return result.run, log.read_text()


EPOCHS = textwrap.dedent("""
    import os
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    def inherited(_):  # in each worker before its first fetch: its parent's profiler on here?
        print("inherited", torch._C._autograd._profiler_enabled(), os.getpid(), flush=True)

    data = TensorDataset(torch.randn(32, 16), torch.randint(0, 2, (32,)))
    # 4 batches an epoch; workers not persistent: each epoch forks two more
    loader = DataLoader(data, batch_size=8, num_workers=2, worker_init_fn=inherited)
    model = nn.Linear(16, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(3):
        for x, y in loader:
            opt.zero_grad(); nn.functional.cross_entropy(model(x), y).backward(); opt.step()
""")


def test_workers_forked_in_the_window_drop_the_inherited_profiler(tmp_path: Path) -> None:
    """A DataLoader worker forked while the window is open (a new epoch's) inherits the main
    thread's profiler, on: it recorded every op of the worker into a copy of the parent's
    events, and its own profiler's start freed them (2.3 s for a new epoch's first batch in
    denoising-diffusion-pytorch's Trainer). The child drops it as it forks, with nothing on
    the program's stderr, and traces nothing itself: Kineto started again in such a child
    could crash it at exit (a segmentation fault in its profiler's stop, which ended the
    program's loop in 6 of 22 recordings of a loop like this one)."""
    run, out = _record_script(tmp_path, EPOCHS, skip=2, steps=8)
    # two workers an epoch; the window (steps 2-10) open as epochs 2 and 3 fork theirs
    assert out.count("inherited False") == 6 and "inherited True" not in out, out
    assert "[W" not in out and "Warning" not in out, out
    pids = [int(line.split()[-1]) for line in out.splitlines() if line.startswith("inherited")]
    ev = run.table("events").to_pydict()
    fetched = {p for p, n in zip(ev["pid"], ev["name"], strict=True)
               if n == "DataLoader worker fetch"}
    assert not fetched & set(pids[2:])  # epochs 2 and 3's workers, forked in the window


FREED = textwrap.dedent("""
    import gc, sys, torch
    from torch import nn
    model = nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(6):
        opt.zero_grad(); model(torch.randn(32, 64)).sum().backward(); opt.step()
    gc.disable()  # what frees the profiler must be the window's close, not a later collection
    alive = [o for o in gc.get_objects() if isinstance(o, torch.profiler.profile)]
    sys.stdout.write(f"alive {len(alive)}\\n")
""")


def test_profiler_freed_when_the_window_closes(tmp_path: Path) -> None:
    """A stopped profiler sits in reference cycles; left to a later collection, its events
    kept the heap from reusing tensor buffers and slowed every step after the window."""
    script = tmp_path / "freed.py"
    script.write_text(FREED)
    log = tmp_path / "out.txt"
    with log.open("wb") as f:
        saved = os.dup(1)
        os.dup2(f.fileno(), 1)
        try:
            result = record([PY, str(script)], tmp_path / "f.run",
                            RecordOptions(collectors=("torch",), skip=1, steps=2))
        finally:
            os.dup2(saved, 1)
            os.close(saved)
    assert result.exit_code == 0
    assert log.read_text().split() == ["alive", "0"]


OWN_PROFILER = textwrap.dedent("""
    import sys, torch
    from torch import nn
    from torch.profiler import profile, schedule
    model = nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    start = int(sys.argv[2])  # the step at which the program starts its own profiler
    prof = profile(schedule=schedule(wait=1, warmup=1, active=2, repeat=1),
                   on_trace_ready=lambda p: p.export_chrome_trace(sys.argv[1]))
    for i in range(10):
        if i == start:
            prof.start()
        opt.zero_grad(); model(torch.randn(32, 64)).sum().backward(); opt.step()
        if i >= start:
            prof.step()
    prof.stop()
""")


@pytest.mark.parametrize("start", [0, 3])
def test_a_program_with_its_own_profiler(tmp_path: Path, start: int) -> None:
    """A program that starts its own torch.profiler: the window stands aside as it starts
    (torch runs one profiling session at a time; the program segfaulted in its export when the
    window's stop had ended its session), before the window opened (0) or closing it first
    (3: the window, opened at step 1, keeps steps 1 and 2); the program's own trace is whole."""
    script, theirs = tmp_path / "own.py", tmp_path / "theirs.json"
    script.write_text(OWN_PROFILER)
    result = record([PY, str(script), str(theirs), str(start)], tmp_path / "o.run",
                    RecordOptions(collectors=("torch",), skip=1, steps=4))
    assert result.exit_code == 0
    markers = [e["name"] for e in orjson.loads(theirs.read_bytes())["traceEvents"]
               if e.get("name", "").startswith("ProfilerStep#")]
    assert markers == ["ProfilerStep#2", "ProfilerStep#3"]  # its own count, from its start
    status = result.run.manifest()["collectors"]["torch"]
    steps = [(s["step"], s["source"]) for s in result.run.table("steps").to_pylist()]
    if start == 0:
        assert status["status"].startswith(
            "unavailable: the program started its own torch profiler at step 0")
        return
    assert status["status"] == "ok"
    assert [s for s in steps if s[1] == "marker"] == [(1, "marker"), (2, "marker")]
    assert [w["what"] for w in result.run.manifest()["warnings"] if w["source"] == "torch"] == [
        "the program started its own torch profiler at step 3: the window closed there, "
        "before the steps it was to record (its last marker cut)"]


@pytest.mark.parametrize("level", [None, "3"])
def test_a_window_adds_nothing_to_the_program_s_stderr(tmp_path: Path, level: str | None
                                                        ) -> None:
    """Kineto wrote a `USDT: ... profiler_start` and a `profiler_stop` line on the program's
    stderr as the window's profiler started and stopped. A program whose own profiler runs
    after the window (steps 6-9) writes on stderr, recorded, exactly the lines it writes bare,
    its own profiler's (the log level Kineto's first start sets is the one the program's
    environment gives it: KINETO_LOG_LEVEL unset, or 3, which adds three `STAGE:` lines);
    lines compared without their time and thread ids."""
    script = tmp_path / "own.py"
    script.write_text(OWN_PROFILER)
    env = {k: v for k, v in os.environ.items() if k != "KINETO_LOG_LEVEL"}
    if level is not None:
        env["KINETO_LOG_LEVEL"] = level

    def lines(*prefix: str) -> list[str]:
        err = subprocess.run([*prefix, PY, str(script), str(tmp_path / "t.json"), "6"],
                             env=env, capture_output=True, text=True, check=True).stderr
        return [re.sub(r"^([A-Z]+):\S+ \S+ \d+:\d+ ", r"\1: ", line)
                for line in err.splitlines()]

    bare = lines()
    assert [line.split("]")[-1] for line in bare] == (
        [" profiler_start", " profiler_stop"] if level is None else
        [" Completed Stage: Warm Up", " profiler_start", " profiler_stop",
         " Completed Stage: Collection", " Completed Stage: Post Processing"])
    out = tmp_path / "q.run"
    assert lines(PY, "-m", "perfswarm.cli.main", "record", "--quiet", "-c", "torch",
                 "--steps", "1:2", "--out", str(out), "--") == bare
    assert [(s["step"], s["source"]) for s in Run(out).table("steps").to_pylist()
            if s["source"] == "marker"] == [(1, "marker"), (2, "marker")]


def test_window_from_step_0(tmp_path: Path) -> None:
    """SKIP 0 opens the window when the optimizer is built: no step has ended before step 0."""
    script = tmp_path / "freed.py"
    script.write_text(FREED)
    result = record([PY, str(script)], tmp_path / "zero.run",
                    RecordOptions(collectors=("torch",), skip=0, steps=2))
    assert [(s["step"], s["source"]) for s in result.run.table("steps").to_pylist()] == [
        (0, "marker"), (1, "marker"), (2, "export"), (3, "detected"), (4, "detected"),
        (5, "detected")]
    names = set(result.run.table("events", columns=["name"]).column("name").to_pylist())
    assert {"aten::addmm", "Optimizer.step#SGD.step"} <= names


def test_a_window_the_program_ends_in(tmp_path: Path) -> None:
    """The program ends (here: 6 steps) inside the window: the last marker, which no optimizer
    step ended (its exit), is the `tail`, no profiled step: it counts in no analysis."""
    script = tmp_path / "short.py"
    script.write_text(FREED)
    result = record([PY, str(script)], tmp_path / "short.run",
                    RecordOptions(collectors=("torch",), skip=4, steps=5))
    assert [(s["step"], s["source"]) for s in result.run.table("steps").to_pylist()] == [
        (1, "detected"), (2, "detected"), (3, "detected"), (4, "marker"), (5, "marker"),
        (6, "tail")]
    assert [w.step for w in analyze(result.run).iterations.steps[0]] == [4, 5]


def test_a_window_the_program_leaves_by_os_exit(tmp_path: Path) -> None:
    """os._exit inside the window runs no exit handler: the trace is lost, and the status
    says so (it had said fewer steps than the window's start had run)."""
    script = tmp_path / "gone.py"
    script.write_text(FREED.replace("gc.disable()", "import os; os._exit(0)"))
    result = record([PY, str(script)], tmp_path / "gone.run",
                    RecordOptions(collectors=("torch",), skip=2, steps=10))
    assert result.run.manifest()["collectors"]["torch"]["status"] == (
        "failed: the window opened after step 2, but the process ended before it closed "
        "(os._exit, or killed): the trace was not written")


def test_optimizer_calls_timed_without_their_closure(tmp_path: Path) -> None:
    """The recorder times each optimizer.step() call's own work at every hook, outside the
    window too: with a closure, from the end of its backward; Adam's update of a small CNN is
    a small part of a step that runs the closure's forward and backward inside the call."""
    closure = Path(__file__).parent / "data" / "closure_adam.py"
    result = record([PY, str(closure)], tmp_path / "closure.run",
                    RecordOptions(collectors=("torch",), skip=2, steps=3))
    run = result.run
    steps = {s["end"]: s["end"] - s["start"] for s in run.table("steps").to_pylist()
             if s["source"] == "detected"}
    calls = [(c["ts"], c["value"]) for c in run.table("counters").to_pylist()
             if c["name"] == OPTIMIZER_CALL]
    assert len(calls) == 8  # one per step, inside the window and out
    outside = [value for ts, value in calls if ts in steps]
    assert len(outside) == len(steps) >= 3
    # (the median: a step the machine's other load descheduled mid-update may cross it)
    assert all(value > 0 for _, value in calls)
    assert statistics.median(value / steps[ts] for ts, value in calls if ts in steps) < 0.5
    # what the stepping process ran with as its window opened: the script sets one thread
    import torch

    noted = run.manifest()["extra"]["record"]
    assert noted["threads"] == [1] and noted["cuda"] is torch.cuda.is_available()


GAN = textwrap.dedent("""
    import time, torch
    from torch import nn
    d, g = nn.Linear(16, 1), nn.Linear(8, 16)
    opt_d = torch.optim.Adam(d.parameters())
    opt_g = torch.optim.Adam(g.parameters())
    ends = []
    for _ in range(8):
        opt_d.zero_grad(); d(g(torch.randn(4, 8)).detach()).mean().backward(); opt_d.step()
        opt_g.zero_grad(); (-d(g(torch.randn(4, 8)))).mean().backward(); opt_g.step()
        ends.append(time.time_ns())
    print(*ends)
""")


def test_two_optimizers_step_once_an_iteration(tmp_path: Path) -> None:
    """A GAN steps its discriminator's optimizer, then its generator's: a training step is
    both (learned when the first steps again), not each call; its steps end where the loop's
    iterations do."""
    script = tmp_path / "gan.py"
    script.write_text(GAN)
    result = record([PY, str(script)], tmp_path / "gan.run",
                    RecordOptions(collectors=("torch",), skip=3, steps=3))
    steps = result.run.table("steps").to_pylist()
    assert [(s["step"], s["source"]) for s in steps] == [
        (1, "detected"), (2, "detected"), (3, "marker"), (4, "marker"), (5, "marker"),
        (6, "export"), (7, "detected")]
    # eight steps, one an iteration: a counter of the optimizers' own time at each
    calls = [c for c in result.run.table("counters").to_pylist() if c["name"] == OPTIMIZER_CALL]
    assert len(calls) == 8 and all(c["value"] > 0 for c in calls)
    # both optimizers' calls lie inside each marked step
    events = result.run.table("events", ["name", "ts"]).to_pylist()
    for s in (s for s in steps if s["source"] == "marker"):
        inside = {e["name"] for e in events if s["start"] <= e["ts"] < s["end"]}
        assert {"Optimizer.step#Adam.step"} <= inside
        assert sum(e["name"] == "Optimizer.step#Adam.step" and s["start"] <= e["ts"] < s["end"]
                   for e in events) == 2


WGAN = textwrap.dedent("""
    import sys, torch
    from torch import nn
    torch.manual_seed(0)
    critic, gen = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)), nn.Linear(8, 16)
    first = sys.argv[1] == "generator"  # the generator's optimizer built, and stepped, first
    if sys.argv[1] == "spare":  # an optimizer built and never stepped
        spare = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    if first:
        opt_g = torch.optim.RMSprop(gen.parameters())
    opt_c = torch.optim.Adam(critic.parameters())
    if not first:
        opt_g = torch.optim.RMSprop(gen.parameters())

    def generator_step():
        opt_g.zero_grad(); (-critic(gen(torch.randn(4, 8)))).mean().backward(); opt_g.step()

    for _ in range(8):
        if first:
            generator_step()
        for _ in range(5):
            fake = gen(torch.randn(4, 8)).detach()
            opt_c.zero_grad(); (critic(fake) - critic(torch.randn(4, 16))).mean().backward()
            opt_c.step()
        if not first:
            generator_step()
""")


@pytest.mark.parametrize("first", ["critic", "generator", "spare"])
def test_a_critic_stepped_five_times_a_generator_step(tmp_path: Path, first: str) -> None:
    """A WGAN steps its critic's optimizer 5 times, then its generator's once (or the
    generator's first): a training step is all 6 calls, the loop's iteration, from its first
    call to its last (the generator's, or the critic's fifth where the generator steps first:
    those had ended at the generator's, a step its critic calls and the next iteration's
    generator call). The critic had ended every step (the first optimizer to step again) and
    the window had opened inside the first iteration: 39 steps of 8 iterations (47 with the
    generator's first: each call a step in a window opened before any optimizer stepped
    again); the trace's detection had found 18 of the 3 marked. With a spare optimizer built
    and never stepped, the cycle is known once the calls repeat it for 12 (two iterations),
    not after 64 (the window had never opened: 48 calls), and the window opens after 24."""
    script = tmp_path / "wgan.py"
    script.write_text(WGAN)
    result = record([PY, str(script), first], tmp_path / "wgan.run",
                    RecordOptions(collectors=("torch",), skip=2, steps=3))
    steps = result.run.table("steps").to_pylist()
    # eight iterations, seven steps between their ends (the generator's first call the first);
    # beside the spare the window waits for 24 calls, 4 iterations
    opened = 4 if first == "spare" else 2
    assert [(s["step"], s["source"]) for s in steps] == [
        *((i, "detected") for i in range(1, opened)),
        *((i, "marker") for i in range(opened, opened + 3)), (opened + 3, "export"),
        *((i, "detected") for i in range(opened + 4, 8))]
    calls = [c for c in result.run.table("counters").to_pylist() if c["name"] == OPTIMIZER_CALL]
    assert len(calls) == 8 and all(c["value"] > 0 for c in calls)
    # the optimizers' own time of each step: 6 calls', the first step's too (the generator's
    # first call its end: the critic's 5 after it carried into it, not dropped: one call of
    # six would read about a sixth of a step's; 0.3, as another process's burst can halve one;
    # beside every later step with its own time, the export step's too: a clean-clone CI run
    # under a helper's load read both detected steps after the first over 15 ms, 4x their usual)
    own = {s["step"]: c["value"] for s in steps for c in calls if c["ts"] == s["end"]}
    assert own[1] > 0.3 * min(own[s["step"]] for s in steps
                              if s["source"] in ("detected", "export") and s["step"] > 1)
    events = sorted(result.run.table("events", ["name", "ts"]).to_pylist(),
                    key=lambda e: e["ts"])
    for s in (s for s in steps if s["source"] == "marker"):
        inside = [e["name"].removeprefix("Optimizer.step#") for e in events
                  if s["start"] <= e["ts"] < s["end"] and e["name"].startswith("Optimizer.step#")]
        assert inside == (["RMSprop.step"] + ["Adam.step"] * 5 if first == "generator" else
                          ["Adam.step"] * 5 + ["RMSprop.step"])
    # the trace alone (the calls' kinds: analyze.optimizer_kinds) finds the same 3 steps
    (agreement,) = analyze(result.run).iterations.agreement
    assert (agreement.marker_count, agreement.detected_count) == (3, 3)


NESTED = textwrap.dedent("""
    import sys, torch
    from torch import nn

    class Wrap(torch.optim.Optimizer):  # steps the optimizer inside it
        def __init__(self, inner):
            super().__init__(inner.param_groups[0]["params"], {})
            self.inner = inner

        def step(self, closure=None):
            self.inner.step()

    class Plain(torch.optim.SGD):  # steps through SGD's own step
        def step(self, closure=None):
            return super().step(closure)

    d, g = nn.Linear(4, 1), nn.Linear(4, 4)
    if sys.argv[1] == "wrapper":
        opts = [Wrap(torch.optim.SGD(d.parameters(), lr=0.1))]
    else:
        opts = [Plain(d.parameters(), lr=0.1), torch.optim.SGD(g.parameters(), lr=0.1)]
    for _ in range(8):
        for opt in opts:
            opt.zero_grad(); d(g(torch.randn(2, 4))).sum().backward(); opt.step()
""")


@pytest.mark.parametrize("style", ["wrapper", "subclass"])
def test_an_optimizer_stepped_inside_another(tmp_path: Path, style: str) -> None:
    """A wrapper optimizer's inner one steps only inside the wrapper's step: no cycle holds
    it (the window had waited for it to the end); a subclass's step calling its class's
    (super().step()) is one optimizer, still one of a GAN's two (the window had opened before
    their cycle was known, every call a step: 15 steps)."""
    script = tmp_path / "nested.py"
    script.write_text(NESTED)
    result = record([PY, str(script), style], tmp_path / "n.run",
                    RecordOptions(collectors=("torch",), skip=2, steps=3, execution_trace=False))
    assert [(s["step"], s["source"]) for s in result.run.table("steps").to_pylist()] == [
        (1, "detected"), (2, "marker"), (3, "marker"), (4, "marker"), (5, "export"),
        (6, "detected"), (7, "detected")]


@pytest.mark.parametrize("calls", [20, 30])
def test_an_optimizer_built_and_never_stepped_beside_the_loops(tmp_path: Path,
                                                                 calls: int) -> None:
    """Two optimizers built, the loop stepping one: its cycle is known once 12 calls repeat
    it (the other could be a generator a critic steps 5 times before; it had waited for
    PATIENCE, 64), and the window waits for twice that, the other's first step learning the
    cycle again till then (a critic's warm-up): it opens at the 24th call, or never, and the
    status says why."""
    script = tmp_path / "unused.py"
    script.write_text(textwrap.dedent(f"""
        import torch
        from torch import nn
        model, other = nn.Linear(8, 1), nn.Linear(8, 1)
        unused = torch.optim.SGD(other.parameters(), lr=0.1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range({calls}):
            opt.zero_grad(); model(torch.randn(4, 8)).sum().backward(); opt.step()
    """))
    result = record([PY, str(script)], tmp_path / "u.run",
                    RecordOptions(collectors=("torch",), skip=2, steps=3, execution_trace=False))
    status = result.run.manifest()["collectors"]["torch"]["status"]
    if calls < 2 * SETTLE:
        assert status.startswith("unavailable: several optimizers were built, and the cycle")
        return
    assert status == "ok"
    steps = result.run.table("steps").to_pylist()
    assert len(steps) == calls - 1
    assert [s["step"] for s in steps if s["source"] == "marker"] == [24, 25, 26]


DDP = textwrap.dedent("""
    import torch, torch.distributed as dist
    from torch import nn
    dist.init_process_group("gloo")
    model = nn.parallel.DistributedDataParallel(nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(5):
        opt.zero_grad(); model(torch.randn(8, 16)).sum().backward(); opt.step()
    dist.barrier()  # both ranks done before either tears gloo down (a rank had aborted in its
    dist.destroy_process_group()  # teardown once: "terminate called without an active exception")
""")


def test_torchrun_ranks_from_rank(tmp_path: Path) -> None:
    """Under torchrun each rank's files carry its RANK; the agent (which imports torch.optim
    but never steps) leaves none."""
    script = tmp_path / "ddp.py"
    script.write_text(DDP)
    result = record([PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                     str(script)], tmp_path / "ddp.run",
                    RecordOptions(collectors=("torch",), skip=1, steps=2))
    assert result.exit_code == 0
    m = result.run.manifest()
    assert m["ranks"] == [0, 1]
    files = m["collectors"]["torch"]["files"]
    assert sorted(f.split("-")[0] + "-" + f.split("-")[1] for f in files) == [
        "et-rank0", "et-rank1", "steps-rank0", "steps-rank1", "torch-rank0", "torch-rank1"]
    steps = [(s["rank"], s["step"], s["source"]) for s in result.run.table("steps").to_pylist()]
    assert [s for s in steps if s[2] == "marker"] == [(0, 1, "marker"), (0, 2, "marker"),
                                                      (1, 1, "marker"), (1, 2, "marker")]
    ev = result.run.table("events").to_pydict()
    by_rank = {r: {p for p, rr in zip(ev["pid"], ev["rank"], strict=True) if rr == r and p > 0}
               for r in (0, 1)}
    assert len(by_rank[0]) == len(by_rank[1]) == 1 and by_rank[0] != by_rank[1]


def test_torch_markers_align_with_hook_times(trainer_run: Run) -> None:
    """ProfilerStep#k (Kineto clock) ends inside the optimizer hook of iteration k (time.time_ns:
    the hook's start, and the moment prof.step() returned), to within 1 ms."""
    (hooks_file,) = trainer_run.raw_dir.glob("steps-rank0-pid*.json")
    data = orjson.loads(hooks_file.read_bytes())
    hooks, done = data["hook_ns"], data["step_done_ns"]
    assert len(hooks) == STEPS and sorted(done) == ["2", "3"]
    marker = {s["step"]: s for s in trainer_run.table("steps").to_pylist()
              if s["source"] == "marker"}
    for k in (2, 3):
        assert hooks[k] - 1_000_000 <= marker[k]["end"] <= done[str(k)] + 1_000_000


def test_markers_end_after_the_optimizer_step(trainer_run: Run) -> None:
    """The profiler is stepped once optimizer.step() has returned, not from torch's step
    post-hook inside its `Optimizer.step#` range: each such range lies inside one marker (the
    hook's marker ended inside the range and its rest fell in the next step)."""
    pid = trainer_run.manifest()["extra"]["record"]["pid"]
    (trace,) = trainer_run.raw_dir.glob(f"torch-rank0-pid{pid}*.json")
    spans = [e for e in orjson.loads(trace.read_bytes())["traceEvents"] if e.get("ph") == "X"]
    markers = [(e["ts"], e["ts"] + e["dur"]) for e in spans
               if e["name"].startswith("ProfilerStep#")]
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in spans
             if e["name"].startswith("Optimizer.step#")]
    assert len(markers) == len(steps) == 3
    assert all(lo <= a and b <= hi for (lo, hi), (a, b) in zip(markers, steps, strict=True))


def test_page_faults_counted_at_every_hook(trainer_run: Run) -> None:
    """The process's minor page faults at each optimizer hook, on the hooks' times: a counter
    that only grows (the first steps touch the model's memory for the first time)."""
    (hooks_file,) = trainer_run.raw_dir.glob("steps-rank0-pid*.json")
    data = orjson.loads(hooks_file.read_bytes())
    counters = trainer_run.table("counters").to_pylist()
    faults = [(c["ts"], c["value"]) for c in counters if c["name"] == FAULTS]
    assert [ts for ts, _ in faults] == data["hook_ns"]
    assert [v for _, v in faults] == data["hook_faults"] == sorted(data["hook_faults"])
    assert {c["rank"] for c in counters if c["name"] == FAULTS} == {0}
    assert data["hook_faults"][0] > 1000  # torch and the model were loaded by then
    assert trainer_run.manifest()["extra"]["record"]["heap_reserve_mib"] == 0  # opt-in
    import torch  # the advice rules read which torch ran (fused optimizers on the CPU)

    assert trainer_run.manifest()["extra"]["record"]["torch_version"] == torch.__version__



def test_run_delay_read_at_every_hook(trainer_run: Run) -> None:
    """The stepping thread's run delay (schedstat) at each optimizer hook, on the hooks'
    times: it only grows, and no step between two hooks waited longer than it lasted (a
    reading comes microseconds after its hook's time: 1 ms allowed)."""
    (hooks_file,) = trainer_run.raw_dir.glob("steps-rank0-pid*.json")
    data = orjson.loads(hooks_file.read_bytes())
    counters = trainer_run.table("counters").to_pylist()
    delays = [(c["ts"], c["value"]) for c in counters if c["name"] == HOOK_DELAY]
    assert [ts for ts, _ in delays] == data["hook_ns"]
    assert [v for _, v in delays] == data["hook_delays"] == sorted(data["hook_delays"])
    assert data["hook_delays"][0] >= 0
    assert all(d1 - d0 <= t1 - t0 + 1e6 for (t0, d0), (t1, d1) in itertools.pairwise(delays))


def test_page_faults_a_step_in_and_after_the_window(trainer_run: Run) -> None:
    """step_faults' profiled median is that of the faults between the hooks nearest each
    marked step's ends (the recorder's own hook file); the steps after the window are too few
    (MIN_AFTER) for a median outside it."""
    from perfswarm.analyze.iterations import MIN_AFTER, step_faults

    (hooks_file,) = trainer_run.raw_dir.glob("steps-rank0-pid*.json")
    data = orjson.loads(hooks_file.read_bytes())
    hooks, faults = np.asarray(data["hook_ns"]), data["hook_faults"]
    steps = trainer_run.table("steps").to_pylist()
    marked = [(s["start"], s["end"]) for s in steps if s["source"] == "marker"]
    nearest = [[int(np.abs(hooks - t).argmin()) for t in ends] for ends in marked]
    found = step_faults(trainer_run)
    assert found is not None
    assert found.profiled == statistics.median(faults[b] - faults[a] for a, b in nearest)
    after = [s for s in steps if s["source"] == "detected" and s["start"] >= marked[-1][1]]
    assert len(after) < MIN_AFTER and found.outside is None

RESERVED = """
import ctypes, resource, sys
from perfswarm.recorder.inject._perfswarm_heap import reserve_heap
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.free(libc.malloc(8 << 20))  # mmapped, and freed: glibc then keeps 8 MiB blocks on the heap
reserve_heap(int(sys.argv[1]))
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
ctypes.memset(libc.malloc(4 << 20), 1, 4 << 20)  # a tensor displaced to new heap
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.parametrize(("mib", "most", "least"), [(0, None, 1000), (16, 20, 0)])
def test_heap_reserve_takes_displaced_blocks(mib: int, most: int | None, least: int) -> None:
    """A 4 MiB block the heap has no hole for page-faults its 1,024 pages, unless the reserve
    written before (and freed, not trimmed) is there to take it."""
    done = subprocess.run([PY, "-c", RESERVED, str(mib)], check=True,
                          capture_output=True, text=True)
    faults = int(done.stdout)
    assert faults >= least and (most is None or faults <= most)


def test_system_counters_on_run_clock(trainer_run: Run) -> None:
    m = trainer_run.manifest()
    rec = m["extra"]["record"]
    c = trainer_run.table("counters").to_pydict()
    names = set(c["name"])
    assert {"cpu.core0.usr", "cpu.core0.sys", "mem.used_bytes", "proc.rss_bytes",
            "net.rx_bytes", "proc.cpu_cores"} <= names
    ts = np.array(c["ts"])
    assert rec["start_ns"] <= ts.min() and ts.max() <= rec["end_ns"]
    assert c["ts"] == sorted(c["ts"])


def test_stack_samples(trainer_run: Run) -> None:
    samples = trainer_run.table("samples").to_pydict()
    stacks = trainer_run.table("stacks").to_pydict()
    assert "py-spy" in samples["source"]
    spy_funcs = {f for f, s in zip(stacks["function"], stacks["stack_id"], strict=True)
                 if s in {sid for sid, src in zip(samples["stack_id"], samples["source"],
                                                  strict=True) if src == "py-spy"}}
    assert "train" in spy_funcs
    assert set(samples["stack_id"]) == set(stacks["stack_id"])


BUSY_SLEEP = textwrap.dedent("""
    import sys, time, json
    marks = []
    time.sleep(1.5)  # perf attaches after the child has started
    for _ in range(3):
        t0 = time.time_ns()
        while time.time_ns() - t0 < 150_000_000:
            pass
        t1 = time.time_ns()
        time.sleep(0.15)
        marks.append((t0, t1, time.time_ns()))
    open(sys.argv[1], "w").write(json.dumps(marks))
""")


def test_perf_samples_align_within_1ms(tmp_path: Path) -> None:
    """cpu-clock samples only fire while the thread runs: none may fall in its sleeps."""
    marks_path = tmp_path / "marks.json"
    result = record([PY, "-c", BUSY_SLEEP, str(marks_path)], tmp_path / "a.run",
                    RecordOptions(collectors=("perf",), perf_hz=999))
    status = result.run.manifest()["collectors"]["perf"]["status"]
    if status != "ok":
        pytest.skip(f"perf {status}")
    stepped = [w["what"] for w in result.run.manifest()["warnings"] if "clock stepped" in w["what"]]
    if stepped:  # the recording says its epoch and monotonic times cannot be aligned
        pytest.skip(stepped[0])
    pid = result.run.manifest()["extra"]["record"]["pid"]
    s = result.run.table("samples").to_pydict()
    ts = np.array([t for t, p, tid in zip(s["ts"], s["pid"], s["tid"], strict=True)
                   if p == pid and tid == pid])
    ms = 1_000_000
    for busy_start, busy_end, sleep_end in orjson.loads(marks_path.read_bytes()):
        assert ((ts > busy_start) & (ts < busy_end)).sum() > 5  # it ran (a busy host: a bit)
        asleep = (ts > busy_end + ms) & (ts < sleep_end - ms)
        assert asleep.sum() == 0


def test_monotonic_offset_maps_to_epoch() -> None:
    offset = monotonic_offset_ns()
    assert abs(time.clock_gettime_ns(time.CLOCK_MONOTONIC) + offset - time.time_ns()) < 1_000_000


@pytest.mark.parametrize(("code", "exit_code", "sig"), [
    ("raise SystemExit(3)", 3, None),
    ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", 137, "SIGKILL"),
])
def test_crash_leaves_incomplete_run(tmp_path: Path, code: str, exit_code: int,
                                     sig: str | None) -> None:
    result = record([PY, "-c", code], tmp_path / "c.run", RecordOptions(collectors=("system",)))
    assert result.exit_code == exit_code
    m = Run.open(tmp_path / "c.run").manifest()
    assert m["complete"] is False and m["signal"] == sig
    assert m["exit_status"] == (None if sig else exit_code)
    assert m["collectors"]["system"]["status"] == "ok"


def test_sigint_is_forwarded_and_collectors_flush(tmp_path: Path) -> None:
    """The recorder started with Ctrl-C at its default: a shell's background job (`make test &`
    in a script) starts with SIGINT ignored, which exec passes on to the recorder and from it to
    the child, which then ignores the forwarded signal (the recorder keeps what it was given:
    the program run bare would have had it too)."""
    out = tmp_path / "i.run"
    child = "import time\nprint('ready', flush=True)\ntime.sleep(30)"
    default_sigint = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                      "os.execv(sys.argv[1], sys.argv[1:])")
    proc = subprocess.Popen([PY, "-c", default_sigint, PY, "-m", "perfswarm.cli.main", "record",
                             "--quiet", "--out", str(out), "--collectors", "system", "--", PY,
                             "-c", child], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    os.kill(proc.pid, signal.SIGINT)
    assert proc.wait(timeout=60) == 130
    m = Run.open(out).manifest()
    assert m["signal"] == "SIGINT" and m["complete"] is False
    assert Run(out).table("counters").num_rows > 0


def test_bad_input_is_one_error(tmp_path: Path) -> None:
    with pytest.raises(PerfswarmError, match="no-such-program-xyz: command not found"):
        record(["no-such-program-xyz"], tmp_path / "x.run", RecordOptions())
    with pytest.raises(PerfswarmError, match="unknown bogus"):
        record([PY, "-c", "pass"], tmp_path / "y.run", RecordOptions(collectors=("bogus",)))
    assert not (tmp_path / "y.run").exists()
    assert parse_steps("5:10") == (5, 10)
    for bad in ("5", "a:b", "1:0", "-1:3"):
        with pytest.raises(PerfswarmError, match="SKIP:COUNT"):
            parse_steps(bad)


PERF_SCRIPT = """\
python  4242/4243  3836.874878123:
\tffffffff8226633f io_schedule ([kernel.kallsyms])
\t    7f7e7eaf2ad7 PyEval_EvalFrame (/usr/lib/libpython3.11.so)
\t    7f7e7e000010 c10::function_ref<void (char**, long const*, long, long)>::callback_fn<at::\
native::loop2d<at::native::copy_kernel(at::TensorIterator&)::{lambda()#1}> > (/t/libtorch_cpu.so)
\t    7f7e7e000020 old_fn (/t/libgone.so (deleted))

python  4242/4242  3836.875358000:
\t    55d0c0ffee00 [unknown] ([unknown])
"""


def test_parse_perf_script() -> None:
    a, b = perf.parse_script(PERF_SCRIPT, Path("perf.data"))
    assert (a.pid, a.tid, a.mono_ns) == (4242, 4243, 3836874878123)
    assert a.frames == [("io_schedule", "[kernel.kallsyms]", 0xffffffff8226633f - (1 << 64)),
                        ("PyEval_EvalFrame", "/usr/lib/libpython3.11.so", 0x7f7e7eaf2ad7),
                        ("c10::function_ref<void (char**, long const*, long, long)>::callback_fn<"
                         "at::native::loop2d<at::native::copy_kernel(at::TensorIterator&)::"
                         "{lambda()#1}> >", "/t/libtorch_cpu.so", 0x7f7e7e000010),
                        ("old_fn", "/t/libgone.so (deleted)", 0x7f7e7e000020)]
    assert (b.tid, b.frames) == (4242, [("[unknown]", "[unknown]", 0x55d0c0ffee00)])


def test_parse_pyspy_raw() -> None:
    text = ('process 7:"python -c x;y";thread (0x1F);<module> (t.py:3);f (pkg/m.py:10) 12\n'
            'process 7:"python";thread (8): MainThread;g (a.py:1) 2\n'
            "garbage\n"
            'process 9:"python -c import time\nwhile 1:\n    pass\n";thread (9) 4\n'
            'process 9:"python -c import time\nwhile 1:\n    pass\n";thread (9);'
            "<module> (<string>:3) 5\n"
            # --subprocesses: a child's stack names its parent first
            'process 7564:"python parent.py";process 7575:"python child.py";thread (7575): '
            "MainThread;<module> (child.py:8) 30\n")
    f, g, idle, spin, child = pyspy.parse_raw(text, Path("pystacks.txt"))
    assert (child.pid, child.tid, child.count) == (7575, 7575, 30)
    assert (idle.pid, idle.frames, idle.count) == (9, (), 4)
    assert (spin.tid, spin.frames, spin.count) == (9, (("<module>", "<string>", 3),), 5)
    assert (g.tid, g.frames, g.count) == (8, (("g", "a.py", 1),), 2)
    assert (f.pid, f.tid, f.count) == (7, 0x1F, 12)
    assert f.frames == (("f", "pkg/m.py", 10), ("<module>", "t.py", 3))


class _Counting(Sampler):
    name = "fake"

    def read(self) -> dict[str, float]:
        return {"gpu1.x": 2.5, "y": 1.0}


def test_sampler_with_fake_clock(tmp_path: Path) -> None:
    ticks = iter(range(1000, 10_000, 1000))
    s = _Counting(tmp_path, 10.0, clock=lambda: next(ticks))
    with s.path.open("wb") as out:
        s.sample_once(out)
        s.sample_once(out)
        out.write(b'{"ts": 3000, "val')  # a torn last line, as after a crash
    assert value_rows(read_jsonl(s.path)) == [(1000, "gpu1.x", 1, 2.5), (1000, "y", -1, 1.0),
                                              (2000, "gpu1.x", 1, 2.5), (2000, "y", -1, 1.0)]
    assert s.count() == 2


def test_tree_pids_walks_descendants() -> None:
    from perfswarm.recorder.system import tree_pids

    child = subprocess.Popen([PY, "-c", "import subprocess, sys; subprocess.run(['sleep', '5'])"])
    try:
        deadline = time.monotonic() + 20
        while len(tree_pids(child.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        pids = tree_pids(child.pid)
        assert pids[0] == child.pid and len(pids) == 2
    finally:
        child.kill()
        child.wait()


STRACED = textwrap.dedent("""
    import json, os, sys, time
    marks = []
    for _ in range(5):
        before = time.time_ns()
        os.write(1, b".")
        marks.append((before, time.time_ns()))
        time.sleep(0.05)
    open(sys.argv[1], "w").write(json.dumps(marks))
""")


def test_strace_syscalls_on_the_run_clock(tmp_path: Path) -> None:
    """Each write(2) lies between the child's own clock reads around it, to 1 ms; strace sees
    the program from its exec (attached once the command had started, it had missed its
    start, and the test had slept a second first)."""
    marks_path = tmp_path / "marks.json"
    result = record([PY, "-c", STRACED, str(marks_path)], tmp_path / "s.run",
                    RecordOptions(collectors=("strace",)))
    status = result.run.manifest()["collectors"]["strace"]["status"]
    if status != "ok":
        pytest.skip(f"strace {status}")
    ev = result.run.table("events").to_pydict()
    writes = [(ts, a) for ts, n, k, a in zip(ev["ts"], ev["name"], ev["kind"], ev["args"],
                                              strict=True)
              if n == "write" and k == "syscall" and a.startswith('{"args":"1, \\".\\"')]
    assert [orjson.loads(a) for _, a in writes] == [{"args": '1, ".", 1', "result": "1"}] * 5
    execs = [orjson.loads(a)["args"] for n, a in zip(ev["name"], ev["args"], strict=True)
             if n == "execve"]
    assert execs and execs[0].startswith(f'"{PY}"')
    # the first call is the command's exec: the wrapper's before it (its hold pipe) are not its
    assert min((ts, n) for ts, n, k in zip(ev["ts"], ev["name"], ev["kind"], strict=True)
               if k == "syscall")[1] == "execve"
    ms = 1_000_000
    for (ts, _), (before, after) in zip(writes, orjson.loads(marks_path.read_bytes()),
                                        strict=True):
        assert before - ms <= ts <= after + ms


def test_strace_calls_from_the_commands_exec(tmp_path: Path) -> None:
    """The traced command's calls from its exec (the recorder's wrapper read its hold pipe
    and restored a signal first, on the same pid); a process attached by pid, which runs no
    exec first, keeps every call, and so do its children's before their own execs."""
    from perfswarm.trace.readers import strace
    from perfswarm.trace.readers.fields import Placement

    lines = ['7  1.000001 read(4, "", 1) = 0 <0.000002>',
             '7  1.000010 rt_sigaction(SIGPIPE, {sa_handler=SIG_DFL}, NULL, 8) = 0 <0.000001>',
             '7  1.000020 execve("/bin/true", ["true"], 0x1 /* 2 vars */) = 0 <0.000100>',
             '7  1.000200 brk(NULL) = 0x1 <0.000001>',
             '8  1.000300 read(3, "x", 1) = 1 <0.000001>',
             '8  1.000400 execve("/bin/false", ["false"], 0x1 /* 2 vars */) = 0 <0.000100>']
    path = tmp_path / "strace.txt"
    path.write_text("\n".join(lines) + "\n")
    names = strace.read(path, Placement()).events.column("name").to_pylist()
    assert names == ["execve", "brk", "read", "execve"]
    path.write_text("\n".join(lines[3:]) + "\n")  # attached by pid: no exec of its own
    assert strace.read(path, Placement()).events.column("name").to_pylist() == [
        "brk", "read", "execve"]


def test_samplers_stamp_the_run_clock(tmp_path: Path) -> None:
    """A reading is stamped with time.time_ns() as it is taken (no offset to apply)."""
    s = _Counting(tmp_path, 10.0)
    with s.path.open("wb") as out:
        before = time.time_ns()
        s.sample_once(out)
        after = time.time_ns()
    (item,) = read_jsonl(s.path)
    assert before <= item["ts"] <= after


def test_status_line_and_quiet(tmp_path: Path) -> None:
    statuses: list[Status] = []
    record([PY, "-c", "import time; time.sleep(1.2)"], tmp_path / "q.run",
           RecordOptions(collectors=("system", "pystacks")), on_status=statuses.append)
    last = statuses[-1]
    assert last.active in (("system", "pystacks"), ("system",))  # py-spy may lack ptrace
    (unit, readings), = last.counts
    assert unit == "readings" and readings >= 1 and last.raw_bytes > 0
    line = status_line(Status(12.34, ("torch", "system"), (("readings", 1234), ("traces", 1)),
                              3_400_000)).plain
    assert line == ("recording   12.3s | torch, system | 1,234 readings | 1 traces"
                    " | 3.2 MiB raw")  # 3,400,000 / 2**20
    stepping = status_line(Status(1.0, ("torch",), (("traces", 0),), 0, (5, 6, 7))).plain
    assert stepping == "recording    1.0s | torch | 3 steps | 0 traces | 0 B raw"
    child = [PY, "-c", "print('hello')"]
    for quiet in (True, False):
        out = subprocess.run([PY, "-m", "perfswarm.cli.main", "record", "--out",
                              str(tmp_path / f"{quiet}.run"), "--collectors", "system",
                              *(["--quiet"] if quiet else []), "--", *child],
                             capture_output=True, check=True)
        # the program's stdout is its own; the summary line goes to stderr
        assert out.stdout == b"hello\n"
        assert out.stderr == b"" if quiet else out.stderr.startswith(b"recorded ")


@pytest.mark.parametrize("ctype", [None, "C", "POSIX"])
def test_the_program_runs_in_the_locale_it_is_given(tmp_path: Path, ctype: str | None
                                                      ) -> None:
    """Run in the C locale (LANG=C and LC_CTYPE unset, C or POSIX), Python sets
    LC_CTYPE=C.UTF-8 in its own environment as it starts (PEP 538): the recorder's, and its
    exec wrapper's, and a recorded program inherited it, and a Python program, finding its
    locale not C, left UTF-8 mode (PEP 540) off. The program now sees the environment it
    sees bare: `env`'s locale variables, and a Python program's LC_CTYPE (its own coercion's)
    and UTF-8 mode."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LC_", "LANG"))}
    env["LANG"] = "C"
    if ctype is not None:
        env["LC_CTYPE"] = ctype
    probe = [PY, "-c", "import os, sys; print(os.environ.get('LC_CTYPE'), sys.flags.utf8_mode)"]

    def seen(*prefix: str) -> list[str]:
        def out(command: list[str]) -> list[str]:
            return subprocess.run([*prefix, *command], env=env, capture_output=True, text=True,
                                  check=True).stdout.splitlines()

        return sorted(v for v in out(["env"]) if v.startswith(("LC_", "LANG="))) + out(probe)

    bare = seen()
    assert bare == ["LANG=C", *([f"LC_CTYPE={ctype}"] if ctype else []), "C.UTF-8 1"]
    assert seen(PY, "-m", "perfswarm.cli.main", "record", "--quiet", "-c", "system", "--out",
                str(tmp_path / "l.run"), "--force", "--") == bare


def test_parse_strace_pairs_unfinished_calls() -> None:
    from perfswarm.trace.readers.strace import parse

    text = ('101 1700000000.000100 read(3, "ab", 4096) = 2 <0.000012>\n'
            "102 1700000000.000200 futex(0x1, FUTEX_WAIT, 0, NULL <unfinished ...>\n"
            "102 1700000000.000900 <... futex resumed>) = 0 <0.000700>\n"
            "101 1700000000.001000 +++ exited with 0 +++\n")
    read, futex = parse(text, Path("strace.txt"))
    assert (read.tid, read.ts_ns, read.dur_ns, read.name) == (101, 1700000000000100000, 12000,
                                                              "read")
    assert (futex.tid, futex.ts_ns, futex.dur_ns) == (102, 1700000000000200000, 700000)
    assert orjson.loads(futex.args) == {"args": "0x1, FUTEX_WAIT, 0, NULL", "result": "0"}


STEPPER = textwrap.dedent("""\
    import os, time, torch
    print("tag", os.environ["TAG"], flush=True)
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.1)
    for _ in range(3000):
        opt.step()
        time.sleep(0.01)
""")


def test_a_watcher_sees_steps_live_and_stops_the_child(tmp_path: Path) -> None:
    """Hook times stream to the live file; stopping kills the child, whose steps survive."""
    seen: list[int] = []

    def stop(status: Status) -> str | None:
        seen.append(len(status.step_ns))
        return "enough steps" if len(status.step_ns) >= 5 else None

    log = tmp_path / "child.log"
    with log.open("wb") as output:
        result = record([PY, "-c", STEPPER], tmp_path / "w.run",
                        RecordOptions(collectors=("torch",), skip=1000, steps=1),
                        child=Child(env={**os.environ, "TAG": "trial-7"}, output=output,
                                    stop=stop))
    assert log.read_text().startswith("tag trial-7\n")
    assert seen == sorted(seen) and seen[-1] >= 5
    m = result.run.manifest()
    assert m["signal"] == "SIGKILL" and m["complete"] is False
    assert {"source": "record", "count": 1, "what": "stopped by the caller: enough steps"} in (
        m["warnings"])
    assert m["collectors"]["torch"]["status"].startswith("failed: no profiling window")
    (live,) = m["collectors"]["torch"]["files"]
    assert live.startswith("steps-rank0-pid") and live.endswith(".live")
    steps = result.run.table("steps").to_pylist()
    hooks = read_live((result.run.raw_dir / live).read_bytes())
    assert len(hooks) >= seen[-1]  # it kept stepping until the kill landed
    assert [s["step"] for s in steps] == list(range(1, len(hooks)))
    assert all(s["source"] == "detected" for s in steps)
    assert [(s["start"], s["end"]) for s in steps] == list(itertools.pairwise(hooks))


def test_live_file_reader_leaves_a_torn_line() -> None:
    assert read_live(b"10\n20\n3") == [10, 20]
    assert read_live(b"") == []


NO_OPTIM = textwrap.dedent("""
    import sys, torch
    from torch import nn
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    if sys.argv[1] == "quant":  # int8 inference: quantize_dynamic observes each weight first
        model = torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
    if sys.argv[1] == "traced":  # torch.jit.trace runs the forward to trace it, then to check it
        model = torch.jit.trace(model, x)
    criterion = nn.MSELoss()  # a module called at the top level too: no model's forward
    with torch.no_grad():
        model(x)  # an evaluation before training: forward alone, once
    for i in range(8):
        loss = criterion(model(x), y)
        if sys.argv[1] == "sgd":  # manual SGD, as pytorch/examples' word_language_model
            model.zero_grad()
            loss.backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.01 * p.grad
""")


@pytest.mark.parametrize(("style", "said"), [
    ("sgd", "backward() (no optimizer stepped)"),
    ("infer", "top-level forward() (no optimizer stepped, no backward)")])
def test_the_summary_line_says_what_counted_the_steps(tmp_path: Path, style: str,
                                                      said: str) -> None:
    """A loop without torch.optim: record's summary line says which call counted its steps."""
    script = tmp_path / "loop.py"
    script.write_text(NO_OPTIM)
    out = subprocess.run([PY, "-m", "perfswarm.cli.main", "record", "-o", str(tmp_path / "r.run"),
                          "-c", "torch", "--steps", "2:3", "--no-et", "--", PY, str(script),
                          style], capture_output=True, text=True, check=True)
    assert out.stderr.rstrip("\n").endswith(f"torch: ok; a step at each {said}")


@pytest.mark.parametrize(("style", "driver", "ops"), [
    ("sgd", "backward", {"autograd::engine::evaluate_function: AddmmBackward0", "aten::sub_"}),
    ("infer", "forward", {"aten::addmm"}),  # a forward-driven window opens a step later
    ("quant", "forward", {"quantized::linear_dynamic"}),
    ("traced", "forward", {"aten::linear"})])
def test_window_without_an_optimizer(tmp_path: Path, style: str, driver: str,
                                     ops: set[str]) -> None:
    """No torch.optim: the window opens on what the loop does, backward (over the forward
    it also runs) or a top-level module's forward, and the manifest says which; a loss
    module's forward, a quantization observer's, or torch.jit.trace's of the model it traces
    and checks, makes no step (the observers of quantize_dynamic had counted three steps
    before the loop's, torch.jit.trace three: 11 steps of a loop of 8 and an evaluation)."""
    script = tmp_path / "loop.py"
    script.write_text(NO_OPTIM)
    result = record([PY, str(script), style], tmp_path / f"{style}.run",
                    RecordOptions(collectors=("torch",), skip=2, steps=3, execution_trace=False))
    run = result.run
    assert run.manifest()["collectors"]["torch"]["status"] == "ok"
    assert run.manifest()["extra"]["record"]["window_on"] == driver
    steps = [(s["step"], s["source"]) for s in run.table("steps").to_pylist()]
    first = 2 if driver == "backward" else 3
    assert [s for s, src in steps if src == "marker"] == [first, first + 1, first + 2]
    assert (first + 3, "export") in steps
    # a step ends at each forward after the first: the evaluation's, then the loop's 8
    if driver == "forward":
        assert [s for s, _ in steps] == list(range(1, 9))
    names = set(run.table("events", columns=["name"]).column("name").to_pylist())
    assert ops <= names and not any(n.startswith("Optimizer.") for n in names)


UNSTEPPED = textwrap.dedent("""
    import os, signal, sys, torch
    from torch import nn
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    late = sys.argv[3] == "late"
    if not late:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)  # built before the loop
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x.repeat(80, 1)),
                                       batch_size=32, num_workers=int(sys.argv[4]))
    with torch.no_grad():  # inference, or an evaluation before training
        for i, (batch,) in zip(range(int(sys.argv[1])), data):
            model(batch)
    if late:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for i in range(int(sys.argv[2])):
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        if sys.argv[5:] == ["kill"] and i == 2:  # killed before the optimizer's window opens
            os.kill(os.getpid(), signal.SIGKILL)
""")


@pytest.mark.parametrize(("forwards", "trained", "built", "workers", "driver"), [
    # an inference loop beside an optimizer it never steps
    (PATIENCE + 12, 0, "first", 0, "forward"),
    # an evaluation first (its DataLoader's worker traced in the window on its forwards)
    (PATIENCE + 12, 8, "first", 1, "optimizer"),
    # an optimizer built after an evaluation the forwards' window had covered
    (20, 8, "late", 0, "optimizer")])
def test_window_beside_an_optimizer_that_does_not_step(
        tmp_path: Path, forwards: int, trained: int, built: str, workers: int,
        driver: str) -> None:
    """An optimizer built drives the window once it steps: a process that builds one and
    runs PATIENCE forwards (no backward) without stepping it has its window on those forwards
    (it had recorded nothing), and where an optimizer steps after a window on forwards opened,
    the optimizer's window replaces it, the traces of its DataLoader's workers too."""
    script = tmp_path / "loop.py"
    script.write_text(UNSTEPPED)
    result = record([PY, str(script), str(forwards), str(trained), built, str(workers)],
                    tmp_path / "u.run",
                    RecordOptions(collectors=("torch",), skip=2, steps=3, execution_trace=False))
    run = result.run
    assert run.manifest()["collectors"]["torch"]["status"] == "ok"
    assert run.manifest()["extra"]["record"]["window_on"] == driver
    steps = run.table("steps").to_pylist()
    first = 3 if driver == "forward" else 2
    assert [s["step"] for s in steps if s["source"] == "marker"] == [first, first + 1,
                                                                       first + 2]
    # the forward-driven steps counted from the PATIENCE-th forward on; the optimizer's from
    # its first step: 8 of them, the last closing the export
    assert len(steps) == (forwards - PATIENCE if driver == "forward" else trained - 1)
    names = set(run.table("events", columns=["name"]).column("name").to_pylist())
    assert ("Optimizer.step#SGD.step" in names) == (driver == "optimizer")
    # the main process's trace alone: the evaluation's worker traced in a window dropped
    assert len(list(run.raw_dir.glob("torch-*.pt.trace.json"))) == 1


def test_a_window_set_aside_stands_when_the_process_is_killed_before_the_next(
        tmp_path: Path) -> None:
    """An evaluation's window, set aside at the optimizer's first step, then the process killed
    (SIGKILL: no exit handlers) before the optimizer's window opens: the Run holds that window
    and its own steps together (its steps file is written as it is set aside; the live file
    had held the training's three steps beside the evaluation's trace)."""
    script = tmp_path / "loop.py"
    script.write_text(UNSTEPPED)
    result = record([PY, str(script), str(PATIENCE + 12), "8", "first", "0", "kill"],
                    tmp_path / "k.run",
                    RecordOptions(collectors=("torch",), skip=5, steps=3, execution_trace=False))
    run = result.run
    assert run.manifest()["extra"]["record"]["window_on"] == "forward"
    steps = run.table("steps").to_pylist()
    # the forwards' steps from the PATIENCE-th on, the training's first forward counted too
    assert len(steps) == 13
    assert [s["step"] for s in steps if s["source"] == "marker"] == [6, 7, 8]
    names = set(run.table("events", columns=["name"]).column("name").to_pylist())
    assert "aten::addmm" in names and "Optimizer.step#SGD.step" not in names


def test_manual_sgd_after_an_evaluation_takes_the_window(tmp_path: Path) -> None:
    """No optimizer: 30 evaluation forwards (under no_grad) opened and closed a window on
    forwards; the manual SGD loop after them takes it over at its first backward (its
    training had gone unprofiled), and its window is on backwards."""
    script = tmp_path / "loop.py"
    script.write_text(textwrap.dedent("""
        import torch
        from torch import nn
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
        x, y = torch.randn(32, 8), torch.randn(32, 1)
        with torch.no_grad():
            for _ in range(30):
                model(x)
        for _ in range(10):
            model.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.01 * p.grad
    """))
    result = record([PY, str(script)], tmp_path / "s.run",
                    RecordOptions(collectors=("torch",), skip=2, steps=3, execution_trace=False))
    run = result.run
    assert run.manifest()["extra"]["record"]["window_on"] == "backward"
    steps = run.table("steps").to_pylist()
    assert [s["step"] for s in steps if s["source"] == "marker"] == [2, 3, 4]
    assert len(steps) == 9  # ten backwards
    names = set(run.table("events", columns=["name"]).column("name").to_pylist())
    assert {"autograd::engine::evaluate_function: AddmmBackward0", "aten::sub_"} <= names


def test_too_few_steps_beside_an_unstepped_optimizer_say_so(tmp_path: Path) -> None:
    """Fewer forwards than PATIENCE beside an optimizer never stepped: nothing drives a window,
    and the torch collector says why, with the forwards counted."""
    script = tmp_path / "loop.py"
    script.write_text(UNSTEPPED)
    result = record([PY, str(script), "20", "0", "first", "0"], tmp_path / "u.run",
                    RecordOptions(collectors=("torch",), skip=2, steps=3, execution_trace=False))
    status = result.run.manifest()["collectors"]["torch"]["status"]
    assert status.startswith("unavailable: an optimizer was built and never stepped; the "
                             f"loop's 20 forwards were under the {PATIENCE}")


def test_torch_child_tears_cupti_down(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The recorded child gets TEARDOWN_CUPTI=1 (Kineto would keep CUPTI subscribed after the
    window), unless the user's environment says otherwise."""
    from perfswarm.recorder.torch_profiler import TorchCollector

    monkeypatch.delenv("TEARDOWN_CUPTI", raising=False)
    assert TorchCollector(tmp_path, 1, 1).env()["TEARDOWN_CUPTI"] == "1"
    monkeypatch.setenv("TEARDOWN_CUPTI", "0")
    assert TorchCollector(tmp_path, 1, 1).env()["TEARDOWN_CUPTI"] == "0"
    script = "import os; print(os.environ['TEARDOWN_CUPTI'])"
    monkeypatch.delenv("TEARDOWN_CUPTI")
    out = tmp_path / "printed.txt"
    with out.open("wb") as f:
        result = record([sys.executable, "-c", script], tmp_path / "t.run",
                        RecordOptions(collectors=("torch",)), child=Child(output=f))
    assert result.exit_code == 0 and out.read_text().strip() == "1"


@pytest.mark.parametrize(("setting", "matmul"), [("", "ieee"), (
    "torch.backends.cuda.matmul.allow_tf32 = True", "tf32"), (
    "torch.set_float32_matmul_precision('high')", "tf32")])
def test_the_scripts_tf32_settings(tmp_path: Path, setting: str, matmul: str) -> None:
    """The recorder writes down how the script would run FP32 GEMMs and convolutions on a CUDA
    GPU as it had set them when the window opened (torch's defaults: GEMMs in full FP32,
    convolutions on TF32), also on a CPU, where they change nothing: predict --device reads
    them."""
    script = tmp_path / "loop.py"
    script.write_text(f"import torch\n{setting}\n{NO_OPTIM}")
    result = record([PY, str(script), "sgd"], tmp_path / "t.run",
                    RecordOptions(collectors=("torch",), skip=2, steps=2, execution_trace=False))
    extra = result.run.manifest()["extra"]["record"]
    assert (extra["fp32_matmul"], extra["fp32_conv"]) == (matmul, "tf32")


INFERENCE = textwrap.dedent("""
    import sys
    import torch
    from torch import nn
    class Model(nn.Module):  # called as a Hugging Face model is: by keyword, a cache first
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
        def forward(self, input_ids=None, cache=None, attention_mask=None, cache_position=None):
            return self.net(input_ids)
    model = Model()
    with torch.inference_mode():
        for batch in [1, 4, 16, 2, 8, 32, 1, 4, 16, 2, 8, 32]:
            x = torch.randn(batch, 16)
            if sys.argv[1] == "positional":
                model(x)
            elif sys.argv[1] == "keywords":
                model(cache=[x], input_ids=x, attention_mask=torch.ones(1))
            else:  # transformers 4.45-4.5x's generate(): the positions first, then the input
                model(cache_position=torch.arange(3), cache=[x], input_ids=x)
""")


@pytest.mark.parametrize("call", ["positional", "keywords", "positions_first"])
def test_a_forward_driven_loop_records_its_batches(tmp_path: Path, call: str) -> None:
    """An inference loop's steps start at its model's forward; each step's batch (the first
    input tensor's leading dimension: a positional one, else the first keyword one of two
    dimensions or more, as generate() calls a Hugging Face model, its 1-D cache_position
    first in transformers 4.45-4.5x: 3 had been every step's batch) is a counter at its start,
    inside that step: an inference server's requests differ in size."""
    from perfswarm.analyze.iterations import batch_sizes, step_batches
    from perfswarm.trace.schema import STEP_INPUT

    script = tmp_path / "serve.py"
    script.write_text(INFERENCE)
    run = record([PY, str(script), call], tmp_path / "s.run",
                 RecordOptions(collectors=("torch",), skip=2, steps=3)).run
    steps = run.table("steps")
    rank, start, end = (np.asarray(steps.column(c).to_numpy(), np.int64)
                        for c in ("rank", "start", "end"))
    batch_of = dict(zip(steps.column("step").to_pylist(),
                        step_batches(rank, start, end, batch_sizes(run)).tolist(), strict=True))
    # a hook at each forward's start: step i (from hook i - 1) runs the i-th forward
    assert batch_of == dict(enumerate([1, 4, 16, 2, 8, 32, 1, 4, 16, 2, 8], start=1))
    assert len(batch_of) == 11 and {3, 4, 5} <= set(batch_of)  # the marked steps too
    # and the elements of that input (STEP_INPUT): batch x 16 features, at every forward's
    # start (the last one's step never closes)
    counters = run.table("counters").to_pylist()
    elements = [int(c["value"]) for c in sorted(counters, key=lambda c: c["ts"])
                if c["name"] == STEP_INPUT]
    assert elements == [16 * b for b in [1, 4, 16, 2, 8, 32, 1, 4, 16, 2, 8, 32]]


SERVER = textwrap.dedent("""
    import queue, threading, time, torch
    from torch import nn
    torch.set_num_threads(1)  # (two intra-op threads on a loaded VM: 20-40 ms a forward)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
    requests = queue.Queue()
    def worker():  # waits for each request, then serves it
        with torch.inference_mode():
            while (x := requests.get()) is not None:
                model(x)
    served = threading.Thread(target=worker)
    served.start()
    for _ in range(14):
        requests.put(torch.randn(4, 16))
        time.sleep(0.03)
    requests.put(None)
    served.join()
""")


def test_a_servers_step_is_its_forward_and_its_wait(tmp_path: Path) -> None:
    """An inference server's worker waits for each request, then runs the model: a step, from
    one forward's start to the next, is mostly the wait (30 ms between requests). The recorder
    times each forward too (STEP_FORWARD, at the step's start): the forward time card is their
    median over the steps after the window, the worker's busy work, beside the step time card
    (the whole steps' median), and the throughput the steps over their whole time, waits
    included (steps/s had been from the median step)."""
    from perfswarm.analyze.iterations import step_counters
    from perfswarm.report.data import report_data
    from perfswarm.trace.schema import STEP_FORWARD

    script = tmp_path / "server.py"
    script.write_text(SERVER)
    run = record([PY, str(script)], tmp_path / "s.run",
                 RecordOptions(collectors=("torch",), skip=2, steps=3,
                               execution_trace=False)).run
    steps = sorted(run.table("steps").to_pylist(), key=lambda s: s["step"])
    forwards = sorted(step_counters(run, STEP_FORWARD).to_pylist(), key=lambda c: c["ts"])
    # a forward's time at every forward's start (the last one's step never closes): at the
    # hook that begins a step outside the window, shorter than it (each waits 30 ms for its
    # request; the first marked step begins once the profiler has started, after its hook)
    assert len(forwards) == 14 and len(steps) == 13
    assert [s["source"] for s in steps] == ["detected"] * 2 + ["marker"] * 3 + ["export"] + [
        "detected"] * 7
    outside = [(s, f) for s, f in zip(steps, forwards, strict=False) if s["source"] == "detected"]
    for s, f in outside:
        assert s["start"] == f["ts"] and 0 < f["value"] < s["end"] - s["start"]
    after = outside[2:]  # steps 7-13
    busy = statistics.median(f["value"] for _s, f in after)
    whole = statistics.mean(s["end"] - s["start"] for s, _f in after)
    data = report_data(run)
    assert (data["step_time"]["busy_ns"], data["step_time"]["mean_ns"]) == (busy, whole)
    cards = {c["label"]: c for c in data["cards"]}
    assert cards["step time"]["value"] == \
        f"{statistics.median(s['end'] - s['start'] for s, _f in after) / 1e6:.3f} ms"
    assert cards["forward time"]["value"] == f"{busy / 1e6:.3f} ms"
    assert cards["throughput"]["value"] == f"{1e9 / whole:,.2f} steps/s"


def _inject_site(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The recorder's sitecustomize as a module (no PERFSWARM_RECORD_DIR: it installs
    nothing)."""
    import importlib.util

    from perfswarm.recorder.torch_profiler import INJECT

    monkeypatch.syspath_prepend(str(INJECT))  # as injected: its helper module beside it
    spec = importlib.util.spec_from_file_location("inject_site", INJECT / "sitecustomize.py")
    assert spec is not None and spec.loader is not None
    site = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(site)
    return site


class _Optimizer:
    """An optimizer as the window sees one: built (noted), then stepped by its id."""


def _cycle_steps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                 iterations: list[str]) -> tuple[str, list[tuple[int, int]], int]:
    """A loop of two optimizers, D and G, built first, each iteration's calls a string
    ("DDGG"), through the window's cycle logic (no window opens): the cycle learned, where
    each step ended, (iteration, call in it), and the first call after which the window may
    open."""
    site = _inject_site(monkeypatch)
    window = site._Window(str(tmp_path), 10**6, 1, False, 0, PATIENCE, SETTLE)
    window.driver = "optimizer"
    built = {name: _Optimizer() for name in "DG"}
    for optimizer in built.values():
        window.built.add(optimizer)
    names = {id(o): name for name, o in built.items()}
    at: dict[int, tuple[int, int]] = {}
    settled: list[int] = []
    for i, calls in enumerate(iterations):
        for c, name in enumerate(calls):
            window.stepped(id(built[name]), 0)
            at.setdefault(window.hook_ns[-1], (i, c))  # the call ended a step, or another
            settled += [window.calls] * (not settled and window.settled())
    return ("".join(names[k] for k in window.cycle), [at[t] for t in window.hook_ns],
            settled[0])


def test_a_second_optimizer_that_first_steps_late_joins_the_cycle(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second optimizer built that first steps after SETTLE calls of the first (the
    original WGAN's critic 20 times before each of the first 2 generator steps, then 5; a
    generator pretrained 12 iterations) joins the cycle: it is learned again as it first
    steps, no window open. The critic's calls had been the cycle alone, every one a step (89
    steps for 12 iterations); the pretrained generator's each a step, ending mid-iteration."""
    # the window waits for the critic's 20 calls and the generator's twice over (42), the calls
    # after the generator's first no cycle of the critic's alone (it had opened at the 33rd)
    wgan = ["D" * (20 if i < 2 else 5) + "G" for i in range(12)]
    assert _cycle_steps(tmp_path, monkeypatch, wgan) == (
        "D" * 20 + "G", [(i, len(wgan[i]) - 1) for i in range(12)], 42)
    warm = ["G" if i < 12 else "GD" for i in range(40)]  # G, D twice: the 16th call
    assert _cycle_steps(tmp_path, monkeypatch, warm) == (
        "GD", [(i, len(warm[i]) - 1) for i in range(40)], 16)


def test_extra_calls_in_an_iteration_merge_no_iterations(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """StyleGAN2's lazy regularisation: a second D step every 16th iteration, a second G step
    every 4th, the first iteration both. The cycle is the one the calls repeat twice (D, G),
    not the first iteration's; a call repeating the last one's optimizer where the cycle
    holds no repeat ends no step. The first iteration's cycle had taken the next D's place
    past its end: a step every 4th iteration, 10 for 40."""
    lazy = ["D" + "D" * (i % 16 == 0) + "G" + "G" * (i % 4 == 0) for i in range(40)]
    # the first iteration's first D its own step (the calls before the cycle's repeats)
    ends = [(0, 0), (0, 3)] + [(i, lazy[i].index("G")) for i in range(1, 40)]
    assert _cycle_steps(tmp_path, monkeypatch, lazy) == ("DG", ends, 7)


def test_a_torch_whose_global_hooks_take_no_keywords(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A torch whose global forward hooks take no with_kwargs (older than the one here): the
    recorder's forward hooks still go on, each step's batch from a positional input, none
    from a keyword call (its step counted all the same)."""
    import types

    import torch
    from torch.nn.modules import module as nn_module

    site = _inject_site(monkeypatch)
    window = site._Window(str(tmp_path), 100, 1, False, 0, PATIENCE, SETTLE)

    def register(hook: object, *, always_call: bool = False) -> object:
        return nn_module.register_module_forward_hook(hook, always_call=always_call)  # type: ignore[arg-type]

    older = types.ModuleType("torch.nn.modules.module")
    older.register_module_forward_pre_hook = nn_module.register_module_forward_pre_hook  # type: ignore[attr-defined]
    older.register_module_forward_hook = register  # type: ignore[attr-defined]
    site._watch_forward(window, older)
    model = torch.nn.Linear(16, 2)
    try:
        model(torch.randn(4, 16))
        model(input=torch.randn(8, 16))
        model(torch.randn(2, 16))
    finally:
        window.drop_forward_hooks()
    assert len(window.hook_ns) == 3 and window.batches == {0: 4, 2: 2}
    assert window.inputs == {0: 64, 2: 32}


HOGWILD = textwrap.dedent("""
    import sys
    import torch
    from torch import nn
    import torch.multiprocessing as mp
    def train(model):
        torch.set_num_threads(1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(12):
            x, y = torch.randn(16, 32), torch.randint(0, 4, (16,))
            opt.zero_grad(); nn.functional.cross_entropy(model(x), y).backward(); opt.step()
    if __name__ == "__main__":
        mp.set_start_method(sys.argv[1])
        model = nn.Linear(32, 4)
        model.share_memory()
        ps = [mp.Process(target=train, args=(model,)) for _ in range(2)]
        for p in ps: p.start()
        for p in ps: p.join()
""")


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_hogwild_processes_are_ranks(tmp_path: Path, start: str) -> None:
    """torch.multiprocessing processes that each step an optimizer (pytorch/examples'
    mnist_hogwild) are each traced, as ranks 1 and 2 of their own: forked ones had been taken
    for DataLoader workers (no torch data at all), spawned ones both written as rank 0."""
    script = tmp_path / "hogwild.py"
    script.write_text(HOGWILD)
    run = record([PY, str(script), start], tmp_path / "h.run",
                 RecordOptions(collectors=("torch",), skip=2, steps=3)).run
    m = run.manifest()
    assert m["ranks"] == [1, 2] and m["collectors"]["torch"]["status"] == "ok"
    steps = run.table("steps").to_pylist()
    for rank in (1, 2):
        mine = [s for s in steps if s["rank"] == rank]
        assert [s["step"] for s in mine if s["source"] == "marker"] == [2, 3, 4]
        assert len(mine) == 11  # 12 optimizer steps: 11 between their hooks
    pids = {r: {p for p, rr in zip(*run.table("events", ["pid", "rank"]).to_pydict().values(),
                                     strict=True) if rr == r and p > 0} for r in (1, 2)}
    assert len(pids[1]) == len(pids[2]) == 1 and pids[1] != pids[2]


THREAD_PER_REQUEST = textwrap.dedent("""
    import threading, torch
    from torch import nn
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    x = torch.randn(32, 8)
    def serve():
        with torch.no_grad():
            model(x)
    for i in range(10):  # a server's thread per request: each forward on a thread of its own
        worker = threading.Thread(target=serve)
        worker.start()
        worker.join()
""")


def test_a_window_opened_off_the_main_thread_closes_on_another(tmp_path: Path) -> None:
    """A forward-driven window opened by one server thread's request is stepped and closed by
    other threads' (torch.distributed.rpc's worker pool runs a remote module's forwards so):
    torch's profiler was the opening thread's alone, and stopped on another thread it found no
    session and its export segfaulted (the program killed, no trace); now it profiles every
    thread and each request's ops are in the window, on their own threads."""
    script = tmp_path / "server.py"
    script.write_text(THREAD_PER_REQUEST)
    result = record([PY, str(script)], tmp_path / "s.run",
                    RecordOptions(collectors=("torch",), skip=2, steps=3, execution_trace=False))
    run = result.run
    assert run.manifest()["exit_status"] == 0
    assert run.manifest()["collectors"]["torch"]["status"] == "ok"
    steps = run.table("steps").to_pylist()
    assert [s["step"] for s in steps if s["source"] == "marker"] == [3, 4, 5]
    events = run.table("events", columns=["name", "tid"]).to_pylist()
    # the window's 3 requests (a step from one forward's start to the next's), each on its own
    # thread: the one that opened it, then two others, and a fourth's thread stopped it
    assert len({e["tid"] for e in events if e["name"] == "aten::addmm"}) == 3


RPC_TRAINER = textwrap.dedent("""
    import os, sys, torch
    import torch.distributed.autograd as dist_autograd
    import torch.distributed.rpc as rpc
    import torch.multiprocessing as mp
    from torch.distributed.optim import DistributedOptimizer

    class Remote(torch.nn.Module):  # its forward calls its layer: the layer's forward is a step
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(8, 16)

        def forward(self, x):
            return self.layer(x)

    def params(rref):
        return [rpc.RRef(p) for p in rref.local_value().parameters()]

    def run(rank, port):
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", port
        rpc.init_rpc(f"w{rank}", rank=rank, world_size=2)
        if rank == 0:  # a trainer; its first layer lives on w1, which serves its forwards
            remote = rpc.remote("w1", Remote)
            head = torch.nn.Linear(16, 1)
            opt = DistributedOptimizer(torch.optim.SGD, [rpc.RRef(p) for p in head.parameters()]
                                       + rpc.rpc_sync("w1", params, args=(remote,)), lr=0.01)
            for i in range(10):
                with dist_autograd.context() as ctx:
                    loss = head(remote.rpc_sync().forward(torch.randn(32, 8))).pow(2).mean()
                    dist_autograd.backward(ctx, [loss])
                    opt.step(ctx)
        rpc.shutdown()

    if __name__ == "__main__":
        mp.spawn(run, args=(sys.argv[1],), nprocs=2)
""")


def test_a_torch_distributed_rpc_trainer(tmp_path: Path) -> None:
    """torch.distributed.rpc: the trainer's window (on its forwards) and the server's (on the
    remote module's forwards, run by its RPC threads) each open and close; torch's execution
    trace observer, which segfaults in dist_autograd.backward (torch 2.13, recorder or not),
    stays off in an RPC process (the trainer had died of SIGSEGV at its window's first step,
    the server of its stop on another thread). Each request the trainer sends in its window is
    named as torch's profiler key names it, from its send to its reply, and each Python request
    the server runs is named too (none had been: torch names them under its legacy profiler
    only); the analysis pairs each with the work it asked for."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = tmp_path / "rpc.py"
    script.write_text(RPC_TRAINER)
    result = record([PY, str(script), str(port)], tmp_path / "r.run",
                    RecordOptions(collectors=("torch",), skip=2, steps=3))
    run = result.run
    assert run.manifest()["exit_status"] == 0
    assert run.manifest()["collectors"]["torch"]["status"] == "ok"
    assert not list(run.raw_dir.glob("et-*.json"))
    steps = run.table("steps").to_pylist()
    for rank in {s["rank"] for s in steps}:
        assert [s["step"] for s in steps if s["rank"] == rank and s["source"] == "marker"] \
            == [3, 4, 5]
    assert len({s["rank"] for s in steps}) == 2
    ev = Events.load(run)
    names = Counter(ev.names[n] for n in ev.name.tolist())
    step = "__torch__.torch.distributed.optim.optimizer._script_local_optimizer_step"
    # the window's 3 steps of each: a forward's request, the optimizer's to either worker
    assert names["rpc_sync#_local_invoke(w0 -> w1)"] >= 3
    assert names[f"rpc_async#{step}(w0 -> w1)"] >= 3 and names[f"rpc_async#{step}(w0 -> w0)"] >= 3
    assert names["rpc_serve#_local_invoke(w1)"] >= 3
    found = rpc_hand_overs(ev)
    assert sum(map(len, found.replies.values())) >= 3
    assert sum(map(len, found.requested.values())) >= 3


RPC_CALLABLES = textwrap.dedent("""
    import functools, os, sys, torch
    import torch.distributed.rpc as rpc
    import torch.multiprocessing as mp

    torch.manual_seed(0)
    LAYER = torch.nn.Linear(8, 8)  # each request's forward is a step of the callee's

    def plus(x, k):
        return LAYER(x).detach() + k

    class Scaled:
        def __call__(self, x):
            return LAYER(x).detach() * 2

    def fails(x):
        raise ValueError(f"bad input of shape {tuple(x.shape)}")

    def run(rank, port):
        torch.manual_seed(0)
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", port
        rpc.init_rpc(f"w{rank}", rank=rank, world_size=2)
        if rank == 0:
            net = torch.nn.Linear(8, 8)
            opt = torch.optim.SGD(net.parameters(), lr=0.1)
            for i in range(8):
                x = torch.randn(4, 8)
                y = rpc.rpc_sync("w1", functools.partial(plus, k=1.0), args=(x,)) \\
                    + rpc.rpc_async("w1", Scaled(), args=(x,)).wait()
                try:
                    rpc.rpc_sync("w1", fails, args=(x,))
                except ValueError as e:
                    print("caught", "ValueError('bad input of shape (4, 8)')" in str(e))
                opt.zero_grad()
                (net(x) - y).pow(2).mean().backward()
                opt.step()
            print("weights", f"{sum(p.sum().item() for p in net.parameters()):.6f}")
        rpc.shutdown()

    if __name__ == "__main__":
        mp.spawn(run, args=(sys.argv[1],), nprocs=2)
""")


def test_rpc_of_any_callable_recorded_as_bare(tmp_path: Path) -> None:
    """torch.distributed.rpc requests of a functools.partial and of a callable object, and one
    whose function raises on its callee: recorded, the program prints what it prints bare
    (the same results, the callee's exception caught as bare) and exits 0 (the request
    wrapper's `func.__qualname__` had raised AttributeError at the window's first partial and
    the program died); each request is named by its function on both sides (the callee had
    named the partial `partial`, its caller's request `plus`: no pair)."""
    import socket

    script = tmp_path / "callables.py"
    script.write_text(RPC_CALLABLES)
    out = tmp_path / "c.run"
    printed = []
    for prefix in ([], [PY, "-m", "perfswarm.cli.main", "record", "--quiet", "-c", "torch",
                        "--steps", "2:3", "--no-et", "--out", str(out), "--"]):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        done = subprocess.run([*prefix, PY, str(script), str(port)], capture_output=True,
                              text=True, timeout=300, check=False)
        assert done.returncode == 0, done.stderr[-2000:]
        printed.append(done.stdout)
    assert printed[1] == printed[0]
    assert printed[0].count("caught True") == 8
    ev = Events.load(Run(out))
    names = Counter(ev.names[n] for n in ev.name.tolist())
    # the caller's window: 3 steps of 3 requests; the callee's: 3 forwards, plus's and Scaled's
    assert names["rpc_sync#plus(w0 -> w1)"] == names["rpc_sync#fails(w0 -> w1)"] == 3
    assert names["rpc_async#Scaled(w0 -> w1)"] == 3
    assert names["rpc_serve#plus(w1)"] + names["rpc_serve#Scaled(w1)"] == 3
    assert names["rpc_serve#plus(w1)"] >= 1 and names["rpc_serve#Scaled(w1)"] >= 1


class _Worker:
    def __init__(self, name: str) -> None:
        self.name = name


class _Scaled:
    """A callable object: an instance has no `__qualname__`."""

    def __call__(self, x: float) -> float:
        return 2 * x


def _plus(x: float, k: float) -> float:
    return x + k


@pytest.mark.parametrize(("func", "named"), [
    (functools.partial(_plus, k=3.0), "rpc_async#_plus(w0 -> w1)"),
    (_Scaled(), "rpc_async#_Scaled(w0 -> w1)"),
    (lambda x: x, "rpc_async#<lambda>(w0 -> w1)"),
])
def test_the_request_wrapper_names_any_callable(monkeypatch: pytest.MonkeyPatch, func: Any,
                                                named: str) -> None:
    """Any callable torch sends is a request its range names, recorded as bare: a
    functools.partial by its function, a callable object by its class (the wrapper read
    `func.__qualname__`, and each raised AttributeError in the program, which torch sends
    fine). torch's RPC module is a stand-in here: a sent request's future already done."""
    import types

    import torch
    from torch.distributed.rpc import api as rpc_api

    site = _inject_site(monkeypatch)
    sent: list[Any] = []

    def invoke(to: str, f: Any, rpc_type: Any, args: Any = None, *rest: Any) -> Any:
        sent.append(f)
        fut: torch.futures.Future[float] = torch.futures.Future()
        fut.set_result(f(*args))
        return fut

    api = types.ModuleType("api")
    vars(api).update(_invoke_rpc=invoke, RPCExecMode=rpc_api.RPCExecMode,
                     _build_rpc_profiling_key=rpc_api._build_rpc_profiling_key,
                     _is_current_rpc_agent_set=lambda: True,
                     get_worker_info=lambda: _Worker("w0"), _to_worker_info=_Worker)
    window = types.SimpleNamespace(open_here=lambda: True)
    site._trace_rpc_requests(window, api)
    with torch.profiler.profile() as prof:
        assert api._invoke_rpc("w1", func, rpc_api.RPCExecMode.ASYNC, (1.0,)).wait() \
            == func(1.0)
    assert sent == [func]
    assert named in {e.name for e in prof.events()}


def test_the_request_wrapper_leaves_refusals_to_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """A function that is not callable torch refuses as bare, with its TypeError (the
    wrapper's AttributeError, reading its `__qualname__`, had come first)."""
    import types

    from torch.distributed.rpc import api as rpc_api

    site = _inject_site(monkeypatch)
    api = types.ModuleType("api")
    vars(api)["_invoke_rpc"] = rpc_api._invoke_rpc
    site._trace_rpc_requests(types.SimpleNamespace(open_here=lambda: True), api)
    with pytest.raises(TypeError, match="function should be callable"):
        api._invoke_rpc("w1", "not a function", rpc_api.RPCExecMode.SYNC)


@pytest.mark.parametrize("pin", [True, False])
def test_pin_memory_without_an_accelerator(tmp_path: Path, pin: bool) -> None:
    """DataLoader(pin_memory=True) on a machine with no accelerator: torch turns it off (and
    warns); the recorder notes it and advise says so. Without the option: neither. The
    program's stderr is the same recorded as bare: torch's warning names the line of its
    caller (a wrapper of the iterator's __init__ had become that line)."""
    script = tmp_path / "loop.py"
    script.write_text(textwrap.dedent(f"""
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        net = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
        for x, y in DataLoader(data, batch_size=8, pin_memory={pin}):
            opt.zero_grad()
            torch.nn.functional.mse_loss(net(x), y).backward()
            opt.step()
    """))
    out = tmp_path / "t.run"
    bare, recorded = (subprocess.run([*prefix, PY, str(script)], capture_output=True, text=True,
                                     check=True).stderr
                      for prefix in ([], [PY, "-m", "perfswarm.cli.main", "record", "--quiet",
                                          "-c", "torch", "--steps", "2:2", "--no-et", "--out",
                                          str(out), "--"]))
    assert recorded == bare and ("no accelerator is found" in bare) is pin
    run = Run(out)
    extra = run.manifest()["extra"]["record"]
    assert extra.get("pin_memory_unused") is (True if pin else None)
    assert extra["cuda"] is False
    rules = {a.rule: a for a in advise(run).advice}
    assert ("pin_memory_unused" in rules) is pin
    if pin:
        a = rules["pin_memory_unused"]
        assert (a.gain_ns, a.severity) == (0, "low")
        assert a.change.startswith("DataLoader(pin_memory=False)")
