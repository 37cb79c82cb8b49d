"""strace (opt-in): every syscall of the process tree as a `syscall` event on the epoch clock.

`strace -f -ttt -T` stamps wall-clock (epoch) microseconds, so no offset is
needed. A syscall that another thread interrupts is written as
`<unfinished ...>` and later `<... NAME resumed>`; the pair becomes one event.
strace attaches with ptrace, as py-spy does to pause threads: record one of
them at a time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import orjson

from perfswarm.record.tools import ToolCollector

_CALL = re.compile(r"^(\d+)\s+(\d+)\.(\d{6}) (\w+)\((.*)$")
_RESUMED = re.compile(r"^(\d+)\s+(\d+)\.(\d{6}) <\.\.\. (\w+) resumed>(.*)$")
_RESULT = re.compile(r"\)\s+=\s+(.*?)\s+<(\d+)\.(\d{6})>$")


class StraceCollector(ToolCollector):
    name = "strace"
    tool = "strace"
    output = "strace.txt"

    def clock_offset(self, monotonic_offset: int) -> int | None:
        return 0  # -ttt: epoch seconds

    def argv(self, pid: int) -> list[str]:
        assert self.exe is not None
        return [self.exe, "-f", "-ttt", "-T", "-qq", "-s", "64", "-p", str(pid),
                "-o", str(self.raw / self.output)]


@dataclass(frozen=True)
class Syscall:
    tid: int
    ts_ns: int
    dur_ns: int
    name: str
    args: str  # JSON: {"args": text, "result": text}


def _ns(sec: str, frac: str) -> int:
    return int(sec) * 1_000_000_000 + int(frac) * 1000


def parse(text: str) -> list[Syscall]:
    out: list[Syscall] = []
    pending: dict[tuple[int, str], tuple[int, str]] = {}
    for line in text.splitlines():
        if m := _RESUMED.match(line):
            tid, sec, frac, name, rest = m.groups()
            start = pending.pop((int(tid), name), None)
            if start is None:
                continue
            ts, head = start
            call_args = head + rest
        elif m := _CALL.match(line):
            tid, sec, frac, name, call_args = m.groups()
            ts = _ns(sec, frac)
            if call_args.endswith("<unfinished ...>"):
                pending[(int(tid), name)] = (ts, call_args[: -len("<unfinished ...>")].rstrip())
                continue
        else:
            continue
        result = _RESULT.search(call_args)
        if result is None:  # exit_group, or a call cut off by the end of the trace
            continue
        value, dsec, dfrac = result.groups()
        out.append(Syscall(int(tid), ts, _ns(dsec, dfrac), name, orjson.dumps(
            {"args": call_args[: result.start()], "result": value}).decode()))
    return out
