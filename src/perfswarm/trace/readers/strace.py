"""`strace -f -ttt -T` text (recorder/strace.py): syscalls on the epoch clock; a call another
thread interrupted (`<unfinished ...>`, later `<... NAME resumed>`) is joined into one;
`events` gives them as the Run's `syscall` events."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa

from perfswarm.trace.detail import with_detail
from perfswarm.trace.readers.fields import MAX_CLOCK_NS, Placement, SideTables, int64_field
from perfswarm.trace.schema import EVENTS, NONE

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


def read(path: Path, at: Placement, held: bool = True) -> SideTables:
    """strace's syscalls as events, each on its process's rank; strace -f names threads only,
    so pid = tid. `held`: strace attached while the recorder's wrapper held the command before
    its exec (recorder/strace.py), whose last calls (its hold pipe read, the signals restored)
    are the recorder's: the root's calls start at its first exec. A process attached by pid
    (record --pid) was not held: every call is its own, those before an exec it runs later
    too."""
    calls = parse(path.read_text(errors="replace"), path) if path.is_file() else []
    if not calls:
        return SideTables("strace")
    if held:
        root = calls[0].tid
        calls = calls[next((i for i, c in enumerate(calls)
                            if c.tid == root and c.name == "execve"), 0):]
    rank_of = at.rank_of
    n = len(calls)
    none = pa.array(np.full(n, NONE, np.int64))
    tids = pa.array([c.tid for c in calls], pa.int64())
    return SideTables("strace", events=with_detail(pa.table({
        "rank": pa.array([rank_of.get(c.tid, NONE) for c in calls], pa.int32()),
        "ts": pa.array([c.ts_ns for c in calls], pa.int64()),
        "dur": pa.array([c.dur_ns for c in calls], pa.int64()),
        "kind": pa.array(["syscall"] * n).dictionary_encode(),
        "name": pa.array([c.name for c in calls]).dictionary_encode(),
        "pid": tids, "tid": tids,
        "device": pa.array(np.full(n, NONE, np.int32)), "stream": none, "correlation": none,
        "external_id": none, "rf_id": none, "step": pa.array(np.full(n, NONE, np.int32)),
        "args": pa.array([c.args for c in calls], pa.string()),
    })).cast(EVENTS))
