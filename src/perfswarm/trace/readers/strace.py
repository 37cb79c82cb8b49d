"""`strace -f -ttt -T` text (record/strace.py): syscalls on the epoch clock; a call another
thread interrupted (`<unfinished ...>`, later `<... NAME resumed>`) is joined into one."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import orjson

from perfswarm.trace.readers.fields import MAX_CLOCK_NS, int64_field

_CALL = re.compile(r"^(\d+)\s+(\d+)\.(\d{6}) (\w+)\((.*)$", re.ASCII)
_RESUMED = re.compile(r"^(\d+)\s+(\d+)\.(\d{6}) <\.\.\. (\w+) resumed>(.*)$", re.ASCII)
_RESULT = re.compile(r"\)\s+=\s+(.*?)\s+<(\d+)\.(\d{6})>$", re.ASCII)
_MAX_SECONDS = MAX_CLOCK_NS // 1_000_000_000


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
