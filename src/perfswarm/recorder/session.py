"""The recording session: start collectors, run the child, forward signals, build the Run.

The child runs in its own process group so that Ctrl-C reaches it once, from
us; perf and py-spy run in their own sessions so they survive the Ctrl-C and
flush. However the child ends (exit, crash, SIGKILL) the collectors are
stopped and a valid Run is written, `complete` only when it exited with 0.
A caller that watches the run (the tuner) can stop it early: its whole
process group is killed and the Run says why.
"""

from __future__ import annotations

import contextlib
import copy
import os
import resource
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO

from perfswarm.defaults import DEFAULT_COLLECTORS, PERF_HZ, PYSTACKS_HZ, SAMPLER_HZ
from perfswarm.errors import ParameterError, PerfswarmError
from perfswarm.recorder.base import (
    Collector,
    Sampler,
    dies_with_parent,
    proc_status,
)
from perfswarm.recorder.build import Recording, build_run
from perfswarm.recorder.clock import monotonic_offset_ns
from perfswarm.recorder.gpu import GpuSampler
from perfswarm.recorder.net import NetCollector
from perfswarm.recorder.perf import PerfCollector
from perfswarm.recorder.pystacks import PyStacksCollector
from perfswarm.recorder.recover import hold, leftovers, recover, save_state
from perfswarm.recorder.strace import StraceCollector
from perfswarm.recorder.system import SystemSampler
from perfswarm.recorder.tools import ToolCollector
from perfswarm.recorder.torch_profiler import TorchCollector
from perfswarm.trace.store import Manifest, Run, new_manifest

# opt-in: strace slows every syscall; net captures the whole host's traffic headers
COLLECTORS = (*DEFAULT_COLLECTORS, "strace", "net")
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@dataclass(frozen=True)
class RecordOptions:
    collectors: tuple[str, ...] = DEFAULT_COLLECTORS
    hz: float = SAMPLER_HZ  # system and GPU samplers
    perf_hz: int = PERF_HZ
    pystacks_hz: int = PYSTACKS_HZ
    skip: int = 5
    steps: int = 10
    execution_trace: bool = True
    force: bool = False
    # The heap reserve written into the profiled process before the window opens
    # (inject/sitecustomize.py): opt-in, it changes the program measured.
    heap_reserve_mib: int = 0
    perf_events: tuple[tuple[str, int], ...] = ()  # (event, sample period) beside cpu-clock


@dataclass(frozen=True)
class Status:
    """One tick of the live status line."""

    elapsed_s: float
    active: tuple[str, ...]
    counts: tuple[tuple[str, int], ...]  # (unit, how many so far): readings, traces
    raw_bytes: int
    step_ns: tuple[int, ...] = ()  # optimizer-step hook times so far (first stepping process)


@dataclass(frozen=True)
class RecordResult:
    run: Run
    exit_code: int  # the child's code; 128+N when it died of signal N


def parse_steps(text: str) -> tuple[int, int]:
    """`SKIP:COUNT` (e.g. `5:10`) -> (5, 10)."""
    skip, sep, count = text.partition(":")
    try:
        s, c = int(skip), int(count)
    except ValueError:
        s, c = -1, -1
    if not sep or s < 0 or c < 1:
        raise ParameterError("steps", "expected SKIP:COUNT, e.g. 5:10 (COUNT >= 1)", value=text)
    return s, c


def make_collectors(names: Sequence[str], raw: Path, options: RecordOptions) -> list[Collector]:
    unknown = [n for n in names if n not in COLLECTORS]
    if unknown:
        raise ParameterError("collectors", f"unknown {', '.join(unknown)}"
                             f" (choose from {', '.join(COLLECTORS)})")
    make: dict[str, Callable[[], Collector]] = {
        "torch": lambda: TorchCollector(raw, options.skip, options.steps,
                                        options.execution_trace, options.heap_reserve_mib),
        "system": lambda: SystemSampler(raw, options.hz),
        "gpu": lambda: GpuSampler(raw, options.hz),
        "perf": lambda: PerfCollector(raw, options.perf_hz, options.perf_events),
        "pystacks": lambda: PyStacksCollector(raw, options.pystacks_hz),
        "strace": lambda: StraceCollector(raw, 0),
        "net": lambda: NetCollector(raw, 0),
    }
    return [make[n]() for n in dict.fromkeys(names)]


def _status(collectors: Sequence[Collector], elapsed_s: float, raw: Path) -> Status:
    counts: dict[str, int] = {}
    for c in collectors:
        if c.unit:
            counts[c.unit] = counts.get(c.unit, 0) + c.count()
    raw_bytes = 0
    for p in raw.iterdir():
        with contextlib.suppress(OSError):  # a file renamed or removed meanwhile
            raw_bytes += p.stat().st_size
    torch = next((c for c in collectors if isinstance(c, TorchCollector)), None)
    return Status(elapsed_s, tuple(c.name for c in collectors if c.state == "ok"),
                  tuple(counts.items()), raw_bytes,
                  torch.step_ns() if torch is not None else ())


# What Python's C-locale coercion (PEP 538) sets LC_CTYPE to, the first its C library has
_COERCED_CTYPES = ("C.UTF-8", "C.utf8", "UTF-8")


def program_environ() -> dict[str, str]:
    """The environment the user gave this process, for the program it runs: os.environ, but
    for LC_CTYPE where this interpreter's start-up put it there. Run in the C locale (LANG=C,
    or no locale variable at all), Python sets LC_CTYPE=C.UTF-8 in its own environment
    (PEP 538) before any of ours runs: inherited, the program ran in C.UTF-8, and a Python
    program, which coerces its own locale and so turns on UTF-8 mode (PEP 540), found its
    locale not C and left UTF-8 mode off. The environment as the process was started
    (/proc/self/environ: its exec's, which setenv does not change) says what it was."""
    env = dict(os.environ)
    try:
        started = dict(os.fsdecode(kv).partition("=")[::2]
                       for kv in Path("/proc/self/environ").read_bytes().split(b"\0") if kv)
    except OSError:
        return env
    ctype = env.get("LC_CTYPE")
    if ctype in _COERCED_CTYPES and started.get("LC_CTYPE") != ctype:
        if "LC_CTYPE" in started:  # LC_CTYPE=C or POSIX, overwritten
            env["LC_CTYPE"] = started["LC_CTYPE"]
        else:
            del env["LC_CTYPE"]
    return env


@dataclass(frozen=True)
class Child:
    """How the recorded command runs, for callers other than the CLI (the tuner).

    `env` replaces the user's environment (`program_environ()`; collectors add theirs on
    top); `output` receives the child's stdout and stderr; `stop(status)` is asked at every
    tick and returning a reason kills the child's process group (the reason goes into the
    manifest).
    """

    env: Mapping[str, str] | None = None
    output: IO[bytes] | None = None
    stop: Callable[[Status], str | None] | None = None


EXIT_GRACE_S = 1.0  # a SIGKILLed child still alive after this is held by a tracer
STOP_GRACE_S = 3.0  # a child still alive this long after a forwarded signal is SIGKILLed


def sigkill_pending(pid: int) -> bool:
    """Whether `pid` has been sent SIGKILL (it is on its way out)."""
    status = proc_status(pid)
    bit = 1 << (signal.SIGKILL - 1)
    return any(int(status[k], 16) & bit for k in ("SigPnd", "ShdPnd") if k in status)


def record(command: Sequence[str], out: Path, options: RecordOptions,
           on_status: Callable[[Status], None] | None = None,
           child: Child | None = None) -> RecordResult:
    """Run `command` under every collector and leave an ingested Run at `out`."""
    if not command:
        raise PerfswarmError("record: no command given (usage: perfswarm record -- CMD ...)")
    if out.exists() and not options.force:
        raise ParameterError(None, "already exists (use {force} to replace it)", subject=out)
    exe = shutil.which(command[0])
    if exe is None:
        raise PerfswarmError(f"{command[0]}: command not found")
    for raw in leftovers(out.parent, out.name):
        recover(raw)  # what a killed recorder of this Run left, as an incomplete Run
    return recorded(out, options, lambda raw: _record(list(command), raw, options, on_status,
                                                      child or Child()))


def recorded(out: Path, options: RecordOptions,
             take: Callable[[Path], tuple[Recording, int]]) -> RecordResult:
    """`take(raw)` records into a scratch directory beside `out`; the Run is built from it."""
    out.parent.mkdir(parents=True, exist_ok=True)
    raw = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".recording"))
    held = hold(raw)
    try:
        recording, code = take(raw)
    except BaseException:
        shutil.rmtree(raw, ignore_errors=True)
        os.close(held)
        raise
    try:
        run = build_run(recording, out, options.force)
    except PerfswarmError as exc:
        # Nothing recorded is lost: the collectors' files stay where they were written.
        raise exc.noted(f"the recording's raw files are kept in {raw}") from None
    finally:
        os.close(held)
    shutil.rmtree(raw, ignore_errors=True)
    return RecordResult(run, code if code >= 0 else 128 - code)


def _record(command: list[str], raw: Path, options: RecordOptions,
            on_status: Callable[[Status], None] | None, how: Child) -> tuple[Recording, int]:
    """Run the child under the collectors; the recording and the child's return code."""
    collectors = make_collectors(options.collectors, raw, options)
    manifest = new_manifest(command)
    env = program_environ() if how.env is None else dict(how.env)
    for c in collectors:
        env.update(c.env())
    offset_start = monotonic_offset_ns()
    start_ns = time.time_ns()
    for c in collectors:
        c.before_child()
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    # The child waits before its exec until the collectors that must see it from there on
    # (perf: every library it maps) have started, then the others attach to the program.
    hold, release = os.pipe()
    try:
        child = subprocess.Popen(dies_with_parent(command, hold), env=env, process_group=0,
                                 stdout=how.output, pass_fds=(hold,),
                                 stderr=subprocess.STDOUT if how.output is not None else None)
    except BaseException:
        os.close(release)
        raise
    finally:
        os.close(hold)
    forwarded: list[tuple[int, float]] = []  # (signal, when), as the handler forwards them
    previous = {sig: signal.signal(sig, _forward(child, forwarded)) for sig in FORWARDED}
    escalated = False
    stopped: str | None = None
    try:
        try:
            for c in collectors:
                if c.before_exec:
                    c.start(child.pid)
        finally:
            os.close(release)  # the child execs the command
        for c in collectors:
            if not c.before_exec:
                c.start(child.pid)
        save_state(finish(collectors, raw, copy.deepcopy(manifest), options, child.pid,
                          start_ns, (offset_start, offset_start)))
        t0 = time.monotonic()
        killed_at: float | None = None
        while child.poll() is None:
            for c in collectors:
                if isinstance(c, ToolCollector):
                    c.watch(child.pid, time.monotonic() - t0)
            if on_status is not None or how.stop is not None:
                status = _status(collectors, time.monotonic() - t0, raw)
                if on_status is not None:
                    on_status(status)
                if how.stop is not None and stopped is None:
                    stopped = how.stop(status)
                    if stopped is not None:
                        with contextlib.suppress(ProcessLookupError):
                            os.killpg(child.pid, signal.SIGKILL)  # DataLoader workers too
            if (forwarded and not escalated
                    and (len(forwarded) > 1 or time.monotonic() - forwarded[0][1] > STOP_GRACE_S)):
                # It ignores the signal (or the user asked twice): the whole group goes.
                escalated = True
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.pid, signal.SIGKILL)
            if killed_at is None and sigkill_pending(child.pid):
                killed_at = time.monotonic()
            elif killed_at is not None and time.monotonic() - killed_at > EXIT_GRACE_S:
                # SIGKILLed but still here: a ptrace collector (py-spy pausing it for a
                # sample) holds it at its exit stop, forever. Stopping the tracer frees it.
                for c in collectors:
                    if isinstance(c, ToolCollector) and c.ptrace:
                        c.stop()
            try:
                child.wait(timeout=0.1)
            except subprocess.TimeoutExpired:
                continue
    finally:
        code = child.wait()
        job = resource.getrusage(resource.RUSAGE_CHILDREN)  # the child and what it reaped
        job_cpu_ns = round(1e9 * (job.ru_utime + job.ru_stime - reaped.ru_utime
                                  - reaped.ru_stime))
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for c in collectors:
            c.stop()
    offset_end = monotonic_offset_ns()
    if stopped is not None:
        manifest["warnings"].append({"source": "record", "count": 1,
                                     "what": f"stopped by the caller: {stopped}"})
    manifest["exit_status"] = code if code >= 0 else None
    manifest["signal"] = signal.Signals(-code).name if code < 0 else None
    if forwarded:
        what = signal.Signals(forwarded[0][0]).name
        manifest["warnings"].append({"source": "record", "count": len(forwarded), "what": (
            f"interrupted by {what}" + (f"; the child did not stop within {STOP_GRACE_S:g} s "
                                        "(or it was asked twice) and was killed"
                                        if escalated else ""))})
    manifest["complete"] = code == 0 and not forwarded
    recording = finish(collectors, raw, manifest, options, child.pid, start_ns,
                       (offset_start, offset_end))
    recording.manifest["extra"]["record"]["job_cpu_ns"] = job_cpu_ns
    return recording, code


def finish(collectors: Sequence[Collector], raw: Path, manifest: Manifest,
           options: RecordOptions, pid: int, start_ns: int,
           offsets: tuple[int, int]) -> Recording:
    """The manifest's collector statuses, clock offsets, warnings and `extra.record` once the
    collectors have stopped; the recording to build the Run from."""
    offset_start, offset_end = offsets
    manifest["collectors"] = {c.name: c.status() for c in collectors}
    for c in collectors:
        if isinstance(c, NetCollector) and c.dropped():
            manifest["warnings"].append({"source": "net", "count": c.dropped(), "what": (
                "packets dropped by the kernel during capture: flow counts are short")})
    manifest["clock_offsets"] = {c.name: offset for c in collectors
                                 if (offset := c.clock_offset(offset_start)) is not None}
    if abs(offset_end - offset_start) > 1_000_000:
        manifest["warnings"].append({"source": "clock", "count": 1, "what": (
            f"monotonic->epoch offset moved {(offset_end - offset_start) / 1e6:.3f} ms"
            " during the recording (clock stepped)")})
    torch_c = next((c for c in collectors if isinstance(c, TorchCollector)), None)
    aside = torch_c.aside_at() if torch_c is not None else None
    if aside is not None and torch_c is not None and torch_c.count():
        manifest["warnings"].append({"source": "torch", "count": 1, "what": (
            f"the program started its own torch profiler at step {aside}: the window closed "
            "there, before the steps it was to record (its last marker cut)")})
    perf_c = next((c for c in collectors if isinstance(c, PerfCollector)), None)
    if perf_c is not None and perf_c.restarts:
        manifest["warnings"].append({"source": "perf", "count": len(perf_c.restarts), "what": (
            "perf spun at a core once a thread it followed exited (perf 6.1 attached with -p "
            "polls the thread's hung-up buffer): stopped and started again at "
            + ", ".join(f"{t:.1f}" for t in perf_c.restarts) + " s, its samples in "
            + ", ".join(perf_c.outputs) + "; up to a second of them lost each time")})
    refused = perf_c.refused if perf_c is not None else {}
    for event, why in refused.items():
        manifest["warnings"].append({"source": "perf", "count": 1,
                                     "what": f"event {event} not recorded: {why}"})
    perf_events = ({"recorded": [e for e, _ in perf_c.events], "refused": refused}
                   if perf_c is not None and options.perf_events else None)
    manifest["extra"] = {"record": {
        "start_ns": start_ns, "end_ns": time.time_ns(), "pid": pid,
        "perf_hz": options.perf_hz, "pystacks_hz": options.pystacks_hz,
        "steps_window": [options.skip, options.steps], "hz": options.hz,
        "heap_reserve_mib": options.heap_reserve_mib if "torch" in options.collectors else 0,
        "sampler_cpu_ns": {c.name: c.cpu_ns for c in collectors if isinstance(c, Sampler)},
        "tool_cpu_ns": {c.name: c.cpu_ns for c in collectors if isinstance(c, ToolCollector)},
        **({"perf_events": perf_events} if perf_events else {}),
    }}
    return Recording(raw, manifest, perf_c.exe if perf_c is not None else None, start_ns)


def _forward(child: subprocess.Popen[bytes], forwarded: list[tuple[int, float]]
             ) -> Callable[[int, FrameType | None], None]:
    def handler(signum: int, _frame: FrameType | None) -> None:
        if child.poll() is None:
            forwarded.append((signum, time.monotonic()))
            child.send_signal(signum)

    return handler
