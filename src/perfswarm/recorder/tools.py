"""External profilers (perf, py-spy) run as helper processes attached to the child's pid."""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from perfswarm.recorder.base import Collector, dies_with_parent

WATCH_S = 1.0  # how often a tool that `spins` is looked at
SPIN_CORES = 0.5  # a tool using this much of a core since the last look spins
MAX_RESTARTS = 20  # a tool spinning again at once after this many restarts is stopped
_TICK = os.sysconf("SC_CLK_TCK")


class ToolCollector(Collector):
    """Runs `argv(pid)` in its own session (so Ctrl-C reaches only the child) and stops it with
    SIGINT, which makes perf and py-spy write their output."""

    tool = ""
    output = ""
    ptrace = False  # attaches with ptrace: can hold the child at its exit stop
    # spins once a thread it follows exits: watched, and started again when it does
    spins = False

    def __init__(self, raw: Path, hz: int) -> None:
        super().__init__(raw)
        self.hz = hz  # sampling frequency passed to the tool
        self.proc: subprocess.Popen[bytes] | None = None
        self.cpu_ns = 0  # the tool's own CPU time, read just before it is stopped
        # py-spy installs into the environment's bin/, which need not be on PATH
        beside = Path(sys.executable).parent / self.tool
        self.exe = shutil.which(self.tool) or (str(beside) if beside.is_file() else None)
        self.log = raw / f"{self.name}.log"
        self.outputs = [self.output]  # one per start: a tool started again writes another
        self.restarts: list[float] = []  # seconds into the recording of each restart
        self._watched: tuple[float, int] | None = None  # (when, the tool's CPU ticks then)
        if self.exe is None:
            self.unavailable(f"{self.tool} not found")

    def argv(self, pid: int) -> list[str]:
        raise NotImplementedError

    def start(self, pid: int) -> None:
        if self.exe is None:
            return
        proc = self.launch(self.argv(pid))
        time.sleep(0.05)
        if proc.poll() is not None and proc.returncode != 0:
            self.unavailable(self._reason())
            self.proc = None

    def launch(self, argv: list[str], pass_fds: tuple[int, ...] = ()) -> subprocess.Popen[bytes]:
        with self.log.open("ab" if self.restarts else "wb") as log:
            self.proc = subprocess.Popen(dies_with_parent(argv), stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True,
                                         pass_fds=pass_fds)
        return self.proc

    def _reason(self) -> str:
        """The tool's last log line that names an error (py-spy's count of them comes
        before its closing flamegraph hint), else its last line."""
        lines = [ln.strip() for ln in self.log.read_text(errors="replace").splitlines()
                 if ln.strip()]
        errors = [ln for ln in lines if "error" in ln.lower()]
        return (errors or lines)[-1] if lines else f"{self.tool} exited at once"

    def watch(self, pid: int, elapsed_s: float) -> None:
        """Every WATCH_S: a tool that `spins` and used SPIN_CORES or more since the last look
        is stopped (its output written) and started again on `pid`, writing a new file. perf
        6.1 attached with -p polls the hung-up ring buffer of each thread that exits, in a
        loop: a core from then on (4 million wake-ups in 6 s of a sleeping program), which the
        recorded program then shares its cores with."""
        if not self.spins or self.proc is None or self.proc.poll() is not None:
            return
        now = time.monotonic()
        if self._watched is not None and now - self._watched[0] < WATCH_S:
            return
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
        except OSError:
            return
        ticks = int(fields[11]) + int(fields[12])
        before, self._watched = self._watched, (now, ticks)
        if before is None or (ticks - before[1]) / _TICK < SPIN_CORES * (now - before[0]):
            return
        self._end()
        if len(self.restarts) >= MAX_RESTARTS:  # it spins again at once: stopped for good
            return
        self.restarts.append(round(elapsed_s, 3))
        self.output = f"{Path(self.outputs[0]).stem}-{len(self.outputs) + 1}" \
                      f"{Path(self.outputs[0]).suffix}"
        self.outputs.append(self.output)
        self._watched = None
        self.launch(self.argv(pid))

    def stop(self) -> None:
        """Stop the tool (SIGINT: it writes its output) and check it wrote some (idempotent)."""
        if self.proc is None:
            return
        self._end()
        if not any((self.raw / o).exists() and (self.raw / o).stat().st_size
                   for o in self.outputs):
            self.failed(f"{self.tool} wrote no output ({self._reason()})")

    def _end(self) -> None:
        """Stop the running tool (SIGINT) and count its CPU."""
        assert self.proc is not None
        # The tool's CPU: what reaping it adds to this process's children's usage.
        reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        done = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.cpu_ns += round(1e9 * (done.ru_utime + done.ru_stime - reaped.ru_utime
                                    - reaped.ru_stime))

    def files(self) -> list[str]:
        return [p.name for p in (*(self.raw / o for o in self.outputs), self.log) if p.exists()]
