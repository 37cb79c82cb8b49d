"""External profilers (perf, py-spy) run as helper processes attached to the child's pid."""

from __future__ import annotations

import contextlib
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from perfswarm.recorder.base import Collector, dies_with_parent


class ToolCollector(Collector):
    """Runs `argv(pid)` in its own session (so Ctrl-C reaches only the child) and stops it with
    SIGINT, which makes perf and py-spy write their output."""

    tool = ""
    output = ""
    ptrace = False  # attaches with ptrace: can hold the child at its exit stop

    def __init__(self, raw: Path, hz: int) -> None:
        super().__init__(raw)
        self.hz = hz  # sampling frequency passed to the tool
        self.proc: subprocess.Popen[bytes] | None = None
        self.cpu_ns = 0  # the tool's own CPU time, read just before it is stopped
        # py-spy installs into the environment's bin/, which need not be on PATH
        beside = Path(sys.executable).parent / self.tool
        self.exe = shutil.which(self.tool) or (str(beside) if beside.is_file() else None)
        self.log = raw / f"{self.name}.log"
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

    def launch(self, argv: list[str]) -> subprocess.Popen[bytes]:
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(dies_with_parent(argv), stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        return self.proc

    def _reason(self) -> str:
        """The tool's last log line that names an error (py-spy's count of them comes
        before its closing flamegraph hint), else its last line."""
        lines = [ln.strip() for ln in self.log.read_text(errors="replace").splitlines()
                 if ln.strip()]
        errors = [ln for ln in lines if "error" in ln.lower()]
        return (errors or lines)[-1] if lines else f"{self.tool} exited at once"

    def stop(self) -> None:
        """Stop the tool (SIGINT: it writes its output) and check it wrote some (idempotent)."""
        if self.proc is None:
            return
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
        out = self.raw / self.output
        if not out.exists() or out.stat().st_size == 0:
            self.failed(f"{self.tool} wrote no output ({self._reason()})")

    def files(self) -> list[str]:
        return [p.name for p in (self.raw / self.output, self.log) if p.exists()]
