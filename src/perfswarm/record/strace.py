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
from pathlib import Path

import orjson

from perfswarm.record.base import MAX_CLOCK_NS, int64_field
from perfswarm.record.tools import ToolCollector

_CALL = re.compile(r"^(\d+)\s+(\d+)\.(\d{6}) (\w+)\((.*)$", re.ASCII)
_RESUMED = re.compile(r"^(\d+)\s+(\d+)\.(\d{6}) <\.\.\. (\w+) resumed>(.*)$", re.ASCII)
_RESULT = re.compile(r"\)\s+=\s+(.*?)\s+<(\d+)\.(\d{6})>$", re.ASCII)
_MAX_SECONDS = MAX_CLOCK_NS // 1_000_000_000


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


@dataclass(frozen=True)
class Syscall:
    tid: int
    ts_ns: int
    dur_ns: int
    name: str
    args: str  # JSON: {"args": text, "result": text}


def _ns(sec: str, frac: str, source: Path, line: int, what: str) -> int:
    return int64_field(sec, source, line, what, _MAX_SECONDS) * 1_000_000_000 + int(frac) * 1000


def parse(text: str, source: Path) -> list[Syscall]:
    """Syscalls of `strace -f -ttt -T` text; other lines (signals, exits) are skipped, numbers
    that cannot be what strace writes are a TraceFormatError naming `source` and the line."""
    out: list[Syscall] = []
    pending: dict[tuple[int, str], tuple[int, str]] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if m := _RESUMED.match(line):
            tid_text, sec, frac, name, rest = m.groups()
            tid = int64_field(tid_text, source, n, "tid")
            start = pending.pop((tid, name), None)
            if start is None:
                continue
            ts, head = start
            call_args = head + rest
        elif m := _CALL.match(line):
            tid_text, sec, frac, name, call_args = m.groups()
            tid = int64_field(tid_text, source, n, "tid")
            ts = _ns(sec, frac, source, n, "time")
            if call_args.endswith("<unfinished ...>"):
                # strace writes the arguments so far, one space, the marker
                head = call_args[: -len("<unfinished ...>")]
                pending[(tid, name)] = (ts, head.removesuffix(" "))
                continue
        else:
            continue
        result = _RESULT.search(call_args)
        if result is None:  # exit_group, or a call cut off by the end of the trace
            continue
        value, dsec, dfrac = result.groups()
        out.append(Syscall(tid, ts, _ns(dsec, dfrac, source, n, "duration"), name, orjson.dumps(
            {"args": call_args[: result.start()], "result": value}).decode()))
    return out
