"""Attach to a running process: `perfswarm record --pid PID [--duration S]`.

The samplers and the tools that take a pid (perf, py-spy, strace) watch the
process tree of PID until the duration is up, the process exits, or Ctrl-C
(which stops the recording, not the process: it is not ours). torch traces
come only from a process that runs under the recorder's hook, so the torch
collector is marked unavailable; a process that profiles itself writes its own
traces, which `perfswarm import` reads. The Run is `complete` (what was
recorded is whole); `extra.record.attached` says how it ended.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import psutil

from perfswarm.errors import ParameterError
from perfswarm.recorder.build import Recording
from perfswarm.recorder.clock import monotonic_offset_ns
from perfswarm.recorder.session import (
    FORWARDED,
    RecordOptions,
    RecordResult,
    Status,
    _status,
    finish,
    make_collectors,
    recorded,
)
from perfswarm.trace.store import new_manifest

_EXEC_TRIES = 25  # reads of an empty command line (a process in its exec), _EXEC_WAIT_S apart
_EXEC_WAIT_S = 0.02
NO_TORCH = ("attached to a running process: torch traces come only from a process started"
            " under record (import a process's own traces with perfswarm import)")


def attach(pid: int, out: Path, options: RecordOptions, duration_s: float | None = None,
           on_status: Callable[[Status], None] | None = None) -> RecordResult:
    """Record the running process `pid` (and its descendants) into a Run at `out`."""
    if duration_s is not None and not duration_s > 0:
        raise ParameterError("duration", "must be a positive number of seconds",
                             value=duration_s)
    if out.exists() and not options.force:
        raise ParameterError(None, "already exists (use {force} to replace it)", subject=out)
    try:
        proc = psutil.Process(pid)
        command = proc.cmdline()
        # a process in the middle of its exec has no command line yet (a child just started)
        for _ in range(_EXEC_TRIES):
            if command:
                break
            time.sleep(_EXEC_WAIT_S)
            command = proc.cmdline()
    except psutil.NoSuchProcess:
        raise ParameterError("pid", "no such process", value=pid) from None
    except psutil.AccessDenied:
        raise ParameterError("pid", "not permitted to read the process", value=pid) from None
    if pid == psutil.Process().pid:
        raise ParameterError("pid", "that is perfswarm itself", value=pid)
    return recorded(out, options, lambda raw: (_watch(proc, command, raw, options, duration_s,
                                                      on_status), 0))


def _watch(proc: psutil.Process, command: list[str], raw: Path, options: RecordOptions,
           duration_s: float | None, on_status: Callable[[Status], None] | None) -> Recording:
    collectors = make_collectors([n for n in options.collectors if n != "torch"], raw, options)
    manifest = new_manifest(command)
    ended: list[str] = []

    def interrupted(_signum: int, _frame: FrameType | None) -> None:
        ended.append("interrupted")

    offset_start = monotonic_offset_ns()
    start_ns = time.time_ns()
    for c in collectors:
        c.before_child()
    previous = {sig: signal.signal(sig, interrupted) for sig in FORWARDED}
    try:
        for c in collectors:
            c.start(proc.pid)
        t0 = time.monotonic()
        while not ended:
            elapsed = time.monotonic() - t0
            if duration_s is not None and elapsed >= duration_s:
                ended.append("duration")
            elif not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE:
                ended.append("process exited")
            elif on_status is not None:
                on_status(_status(collectors, elapsed, raw))
            time.sleep(min(0.1, max(0.0, (duration_s or 1.0) - elapsed)))
    except psutil.NoSuchProcess:
        ended.append("process exited")
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for c in collectors:
            c.stop()
    manifest["complete"] = True
    recording = finish(collectors, raw, manifest, options, proc.pid, start_ns,
                       (offset_start, monotonic_offset_ns()))
    if "torch" in options.collectors:
        manifest["collectors"]["torch"] = {"status": f"unavailable: {NO_TORCH}", "files": []}
    manifest["extra"]["record"]["attached"] = {"pid": proc.pid, "duration_s": duration_s,
                                               "ended": ended[0]}
    return recording
