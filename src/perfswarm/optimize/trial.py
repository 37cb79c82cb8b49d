"""One measured run of the tuned command: its steady-state step times, watched as they come.

Two ways to measure, same result shape:
- `record` (the default): a light recorded run (recorder.session with the torch collector, a
  short profiling window and the system sampler; no perf, py-spy or execution trace) into its
  own Run. Step times stream from the optimizer-step hooks while it runs; the throughput is
  then taken from the Run's steps table (analyze.iterations.steady_state). It needs a Python
  command with a torch.optim training loop, and it leaves a Run to analyze, advise and report.
- `stdout`: step times read from the lines the command prints (`step N TIME ms`, as the
  bundled workloads print them; the pattern is an option), for commands the recorder cannot
  time: no torch.optim loop (inference, JAX, a C++ binary). No Run.

Steady-state steps are those numbered `warmup` or later (step i is iteration i), outside the
profiling window, which the profiler slows, and the step after it, which carries the
trace's export. `watch` sees them as they arrive; returning False
stops the command (its whole process group: DataLoader workers too) and raises Stopped.
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import signal
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from perfswarm.analyze.iterations import steady_state
from perfswarm.defaults import Measure
from perfswarm.errors import PerfswarmError
from perfswarm.recorder.session import Child, RecordOptions, Status, record

Watch = Callable[[Sequence[tuple[int, float]]], bool]  # steady (step, seconds) so far

_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0}
# A trial records only what its Run needs: the ops of a short window and the machine's load.
LIGHT_COLLECTORS = ("torch", "system")
LIGHT_HZ = 10.0
_TAIL_LINES = 5


@dataclass(frozen=True)
class Plan:
    """Which steps count, and how a recorded trial is recorded."""

    warmup: int = 1  # leading iterations left out
    window: int = 2  # profiled steps of a recorded trial, right after the warm-up
    timeout_s: float | None = None

    @property
    def skip(self) -> int:
        """Steps before the profiler starts; it can start only at an optimizer step."""
        return max(self.warmup, 1)

    def steady(self, step: int, measure: Measure) -> bool:
        # The step after the window carries the trace's export (done in the closing hook).
        profiled = measure == "record" and self.skip <= step <= self.skip + self.window
        return step >= self.warmup and not profiled


@dataclass(frozen=True)
class Measurement:
    steps: tuple[int, ...]  # the steady-state steps' numbers
    step_s: tuple[float, ...]  # and their times
    wall_s: float
    run: Path | None = None  # the recorded trial's Run

    @property
    def median_s(self) -> float:
        return statistics.median(self.step_s) if self.step_s else 0.0

    @property
    def throughput(self) -> float:
        """Steps per second from the median steady-state step."""
        return 1 / self.median_s if self.median_s > 0 else 0.0


class Stopped(Exception):
    """`watch` asked to stop the command (the trial is pruned)."""


class CommandFailed(PerfswarmError):
    """The command exited non-zero, timed out, or ran too few steady-state steps."""


def step_time_s(line: str, pattern: re.Pattern[str]) -> float | None:
    """The step time a line reports, in seconds (group 2 the number, group 3 the unit)."""
    m = pattern.search(line)
    if m is None:
        return None
    unit = m.group(3) if m.re.groups >= 3 and m.group(3) else "s"
    return float(m.group(2)) * _UNIT_S[unit]


def _too_few(argv: Sequence[str], seen: int, plan: Plan, measure: Measure) -> CommandFailed:
    window = (f", the {plan.window}-step profiling window and the step after it"
              if measure == "record" else "")
    return CommandFailed(f"{' '.join(argv)}: {seen} step(s) timed, none past the {plan.warmup} "
                         f"warm-up step(s){window}")


def measure_recorded(argv: Sequence[str], env: Mapping[str, str], run: Path, plan: Plan,
                     watch: Watch | None = None) -> Measurement:
    """Record `argv` into the Run `run` (its output into `run` + .log) and measure it."""
    log = run.with_suffix(".log")
    seen: list[tuple[int, float]] = []
    next_step = 1  # step i runs from hook i-1 to hook i
    why: Literal["pruned", "timeout"] | None = None

    def stop(status: Status) -> str | None:
        nonlocal next_step, why
        hooks = status.step_ns
        fresh = [(i, (hooks[i] - hooks[i - 1]) / 1e9) for i in range(next_step, len(hooks))
                 if plan.steady(i, "record")]
        next_step = max(next_step, len(hooks))
        seen.extend(fresh)
        if fresh and watch is not None and not watch(seen):
            why = "pruned"
            return "pruned by the tuner"
        if plan.timeout_s is not None and status.elapsed_s > plan.timeout_s:
            why = "timeout"
            return f"timed out after {plan.timeout_s:g} s"
        return None

    start = time.perf_counter()
    options = RecordOptions(collectors=LIGHT_COLLECTORS, hz=LIGHT_HZ, skip=plan.skip,
                            steps=plan.window, execution_trace=False, force=True)
    run.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as output:
        result = record(argv, run, options, child=Child(env=env, output=output, stop=stop))
    wall = time.perf_counter() - start
    if why == "pruned":
        raise Stopped
    tail = " | ".join(log.read_text(errors="replace").splitlines()[-_TAIL_LINES:]) or "no output"
    if why == "timeout":
        raise CommandFailed(f"{' '.join(argv)}: timed out after {plan.timeout_s:g} s ({tail})")
    if result.exit_code != 0:
        raise CommandFailed(f"{' '.join(argv)}: exited with {result.exit_code} ({tail})")
    steady = steady_state(result.run.table("steps"), plan.warmup)
    kept = [] if steady is None else [(s, d) for s, d in zip(steady.steps, steady.dur_ns,
                                                             strict=True)
                                      if plan.steady(s, "record")]
    if not kept:
        torch = result.run.manifest()["collectors"]["torch"]["status"]
        if torch.startswith("unavailable"):
            raise CommandFailed(f"{' '.join(argv)}: no optimizer steps seen (torch collector: "
                                f"{torch}); a command without a torch.optim loop needs "
                                "--measure stdout")
        raise _too_few(argv, result.run.table("steps").num_rows, plan, "record")
    return Measurement(tuple(s for s, _ in kept), tuple(d / 1e9 for _, d in kept), wall,
                       result.run.path)


def measure_printed(argv: Sequence[str], env: Mapping[str, str], pattern: re.Pattern[str],
                    plan: Plan, watch: Watch | None = None) -> Measurement:
    """Run `argv`, reading step times from its output as they appear (line i is step i)."""
    start = time.perf_counter()
    try:
        proc = subprocess.Popen(list(argv), env=dict(env), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, errors="replace",
                                start_new_session=True)
    except OSError as exc:
        raise CommandFailed(f"{argv[0]}: cannot run ({exc.strerror or exc})") from None
    timer = threading.Timer(plan.timeout_s, _kill, (proc,)) if plan.timeout_s else None
    if timer:
        timer.start()
    seen: list[tuple[int, float]] = []
    count = 0
    tail: collections.deque[str] = collections.deque(maxlen=_TAIL_LINES)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail.append(line.rstrip())
            t = step_time_s(line, pattern)
            if t is None:
                continue
            count += 1
            if not plan.steady(count - 1, "stdout"):
                continue
            seen.append((count - 1, t))
            if watch is not None and not watch(seen):
                _kill(proc)
                raise Stopped
        code = proc.wait()
    finally:
        if timer:
            timer.cancel()
        if proc.poll() is None:
            _kill(proc)
        proc.wait()
    if code != 0:
        last = " | ".join(tail) or "no output"
        raise CommandFailed(f"{' '.join(argv)}: exited with {code} ({last})")
    if not seen:
        raise _too_few(argv, count, plan, "stdout")
    return Measurement(tuple(s for s, _ in seen), tuple(t for _, t in seen),
                       time.perf_counter() - start)


def _kill(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
