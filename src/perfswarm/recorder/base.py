"""What every collector is: started on the child's pid, stopped, and a status for the manifest."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import orjson

from perfswarm.trace.store import CollectorStatus

Clock = Callable[[], int]


# Sets PR_SET_PDEATHSIG (1) to SIGKILL (9), which survives exec, waits for the hold fd (-1:
# none) to be written to or closed, puts SIGPIPE and SIGXFSZ back to their default (this
# Python ignored both as it started, and exec keeps an ignored signal; subprocess restores
# them before its own exec), then execs the command with the environment this process was
# given (its start-up may have added LC_CTYPE: dies_with_parent).
_DIES_WITH_PARENT = ("import ctypes, os, signal, sys; ctypes.CDLL(None).prctl(1, 9); "
                     "os.getppid() == int(sys.argv[1]) or os._exit(1); "
                     "h = int(sys.argv[2]); h < 0 or (os.read(h, 1), os.close(h)); "
                     "signal.signal(signal.SIGPIPE, signal.SIG_DFL); "
                     "signal.signal(signal.SIGXFSZ, signal.SIG_DFL); "
                     "env = open('/proc/self/environ', 'rb').read().split(b'\\0'); "
                     "os.execvpe(sys.argv[3], sys.argv[3:], "
                     "dict(kv.split(b'=', 1) for kv in env if b'=' in kv))")


def proc_status(pid: int) -> dict[str, str]:
    """/proc/PID/status as field -> value ("TracerPid" -> "0"), {} for a process gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    return {k: v.strip() for k, _, v in (line.partition(":") for line in text.splitlines())}


def dies_with_parent(argv: list[str], hold: int = -1) -> list[str]:
    """`argv` run so that it is SIGKILLed when this process dies (even by SIGKILL, which
    leaves no handler to clean up): a killed recorder orphans neither the workload nor perf or
    py-spy. An isolated Python (no site, no PYTHON* variables) sets it and execs `argv`, so
    the pid is the command's; no preexec_fn, which is unsafe beside the sampler threads. The
    command starts with the signal dispositions it would have from subprocess directly, and
    with the environment given to it as it was (this Python's start-up, in the C locale, set
    LC_CTYPE=C.UTF-8 in its own: see session.program_environ).
    `hold`: a pipe's read end (passed to the child) it waits on before the exec, until the
    write end is written to or closed."""
    return [sys.executable, "-I", "-S", "-c", _DIES_WITH_PARENT, str(os.getpid()), str(hold),
            *argv]


class Collector:
    """A source of raw files in the recording directory. Subclasses override what they need.

    A missing tool or permission is never fatal: `status` becomes
    `unavailable: reason` and the recording goes on without this collector.
    """

    name = ""
    unit = ""  # what count() counts, for the live status line ("" : nothing to count live)
    # started while the child is held before its exec (a recorded command's): it sees all
    # the program does, every library it maps included
    before_exec = False

    def __init__(self, raw: Path) -> None:
        self.raw = raw
        self.state = "ok"

    def env(self) -> dict[str, str]:
        """Variables the child needs (only the torch collector sets any)."""
        return {}

    def before_child(self) -> None:
        """Called before the child starts: for collectors that watch the whole host."""

    def start(self, pid: int) -> None:
        """Begin collecting on the process tree rooted at `pid`."""

    def stop(self) -> None:
        """Flush and close; called once, after the child has exited."""

    def files(self) -> list[str]:
        return []

    def count(self) -> int:
        """How many `unit`s so far, for the live status line."""
        return 0

    def clock_offset(self, monotonic_offset: int) -> int | None:
        """ns added to this collector's own timestamps to put them on the run clock (epoch);
        None when it writes no times of its own (torch's files carry theirs)."""
        return None

    def status(self) -> CollectorStatus:
        return CollectorStatus(status=self.state, files=sorted(self.files()))

    def unavailable(self, why: str) -> None:
        self.state = f"unavailable: {why}"

    def failed(self, why: str) -> None:
        self.state = f"failed: {why}"


class Sampler(Collector):
    """A thread that reads named values at a fixed rate into `<name>.jsonl` (one object per line).

    `clock` is injectable so tests can drive it with a fake clock.
    """

    unit = "readings"

    def __init__(self, raw: Path, hz: float, clock: Clock = time.time_ns) -> None:
        super().__init__(raw)
        self.interval = 1.0 / hz
        self.clock = clock
        self.path = raw / f"{self.name}.jsonl"
        self.samples = 0
        self.cpu_ns = 0  # the sampler thread's own CPU time
        self._running = threading.Lock()  # held while sampling; stop() releases it
        self._thread: threading.Thread | None = None

    def read(self) -> dict[str, float]:
        """One reading: counter name -> value. Subclasses implement it."""
        raise NotImplementedError

    def read_text(self) -> dict[str, str]:
        """Raw text kept beside the values, for counters derived when the Run is built
        (deriving them while recording would cost the sampler more CPU)."""
        return {}

    def start(self, pid: int) -> None:
        self.pid = pid
        self._running.acquire()
        self._thread = threading.Thread(target=self._loop, name=f"perfswarm-{self.name}",
                                        daemon=True)
        self._thread.start()

    def sample_once(self, out: object) -> None:
        ts = self.clock()
        values = self.read()
        text = self.read_text()
        if values or text:
            line = orjson.dumps({"ts": ts, "values": values, **text})
            out.write(line + b"\n")  # type: ignore[attr-defined]
            self.samples += 1

    def _loop(self) -> None:
        try:
            with self.path.open("ab", buffering=0) as out:
                next_at = time.monotonic()
                while True:
                    self.sample_once(out)
                    now = time.monotonic()
                    next_at = max(next_at + self.interval, now)  # late: no burst to catch up
                    # A lock wait is one C call; Event.wait builds a lock and a Condition.
                    if self._running.acquire(timeout=next_at - now):
                        break
                self.sample_once(out)  # the state at the end
        except OSError as exc:  # a full disk: the readings so far stay, the recording goes on
            self.failed(f"cannot write {self.path.name} ({exc.strerror or exc})")
        self.cpu_ns = time.thread_time_ns()

    def stop(self) -> None:
        if self._thread is not None:
            self._running.release()
            self._thread.join()
            self._thread = None

    def files(self) -> list[str]:
        return [self.path.name] if self.path.exists() else []

    def count(self) -> int:
        return self.samples

    def clock_offset(self, monotonic_offset: int) -> int | None:
        return 0  # stamped with time.time_ns()
