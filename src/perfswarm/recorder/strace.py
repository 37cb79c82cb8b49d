"""strace (opt-in): every syscall of the process tree as a `syscall` event on the epoch clock.

`strace -f -ttt -T` stamps wall-clock (epoch) microseconds, so no offset is
needed. A syscall that another thread interrupts is written as
`<unfinished ...>` and later `<... NAME resumed>`; the pair becomes one event.
strace attaches with ptrace, as py-spy does to pause threads: record one of
them at a time.
"""

from __future__ import annotations

from perfswarm.recorder.tools import ToolCollector


class StraceCollector(ToolCollector):
    name = "strace"
    tool = "strace"
    output = "strace.txt"
    ptrace = True

    def clock_offset(self, monotonic_offset: int) -> int | None:
        return 0  # -ttt: epoch seconds

    def argv(self, pid: int) -> list[str]:
        assert self.exe is not None
        return [self.exe, "-f", "-ttt", "-T", "-qq", "-s", "64", "-p", str(pid),
                "-o", str(self.raw / self.output)]
