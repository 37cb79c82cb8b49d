"""strace (opt-in): every syscall of the process tree as a `syscall` event on the epoch clock.

`strace -f -ttt -T` stamps wall-clock (epoch) microseconds, so no offset is
needed. A syscall that another thread interrupts is written as
`<unfinished ...>` and later `<... NAME resumed>`; the pair becomes one event.
strace attaches with ptrace, as py-spy does to pause threads: record one of
them at a time. It attaches while a recorded command is held before its exec
(Collector.before_exec), and the command goes on once strace traces it: attached after
the exec, it had missed the program's start, under load a loop's first iterations too.
"""

from __future__ import annotations

import time
from typing import Final

from perfswarm.recorder.base import proc_status
from perfswarm.recorder.tools import ToolCollector

ATTACH_TIMEOUT_S: Final = 30.0  # strace's attach, at most (tens of ms here)


class StraceCollector(ToolCollector):
    name = "strace"
    tool = "strace"
    output = "strace.txt"
    ptrace = True
    before_exec = True

    def start(self, pid: int) -> None:
        """strace on `pid`, back once it traces it (or has stopped, or ATTACH_TIMEOUT_S)."""
        super().start(pid)
        deadline = time.monotonic() + ATTACH_TIMEOUT_S
        while (self.proc is not None and self.proc.poll() is None
               and proc_status(pid).get("TracerPid") != str(self.proc.pid)
               and time.monotonic() < deadline):
            time.sleep(0.01)

    def clock_offset(self, monotonic_offset: int) -> int | None:
        return 0  # -ttt: epoch seconds

    def argv(self, pid: int) -> list[str]:
        assert self.exe is not None
        return [self.exe, "-f", "-ttt", "-T", "-qq", "-s", "64", "-p", str(pid),
                "-o", str(self.raw / self.output)]
