"""`perf script` text of a perf.data file (recorder/perf.py): stack samples (cpu-clock) and the
other events' samples, each stamped on CLOCK_MONOTONIC.

perf names code in a process's anonymous executable memory (JIT kernels: oneDNN's) by
/tmp/perf-PID.map, the perf map the JIT writes there; the recorder keeps that file beside
perf.data (recorder/perf.py), where `jit_names` reads it when perf could not.
"""

from __future__ import annotations

import bisect
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from perfswarm.errors import TraceFormatError
from perfswarm.trace.readers.fields import MAX_CLOCK_NS, Row, int64_field

SCRIPT_FIELDS = "pid,tid,time,event,period,ip,sym,dso"
STACKS_EVENT = "cpu-clock"
# [comm] pid/tid sec.nsec: [period event:] [address symbol (dso): an event without stacks]
# and then, for one with stacks,   \taddress symbol (dso)   a line each
_HEADER = re.compile(r"(\d+)/(\d+)\s+(\d+)\.(\d{9}):(?:\s+(\d+)\s+([^\s/:]+)\S*:)?\s*(.*)$",
                     re.ASCII)
# the dso is the last parenthesized group (one nested pair: "(/lib/x.so (deleted))"), after
# one space; a C++ symbol holds its own: "c10::function_ref<void (char**, long)>::cb<...>"
_FRAME = re.compile(r"\s*([0-9a-fA-F]+)\s+(.*) \(((?:[^()]++|\([^()]*+\))*+)\)\s*$", re.ASCII)

Frame = tuple[str, str, int]  # function, module (dso), address
UNKNOWN = "[unknown]"
# the dso perf gives a sample in a process's anonymous executable memory
PERF_MAP = re.compile(r"/tmp/perf-(\d+)\.map", re.ASCII)
# a perf map's line: START SIZE name (hex, no 0x needed; the name may hold spaces)
_MAP_LINE = re.compile(r"(?:0x)?([0-9a-fA-F]+) (?:0x)?([0-9a-fA-F]+) (.+)", re.ASCII)


@dataclass
class Sample:
    pid: int
    tid: int
    mono_ns: int
    frames: list[Frame] = field(default_factory=list)  # leaf first
    event: str = STACKS_EVENT
    period: int = 1


def parse_script(text: str, source: Path) -> list[Sample]:
    """Samples from `perf script -F pid,tid,time[,event,period],ip,sym,dso --ns` text (stacks
    leaf first).

    Lines of neither shape (perf's own warnings) are skipped; numbers that cannot be what
    perf writes are a TraceFormatError naming `source` (the perf.data file) and the line.
    """
    samples: list[Sample] = []
    for n, text_line in enumerate(text.splitlines(), 1):
        line = text_line
        head = None if line.startswith("\t") else _HEADER.search(line)
        if head:
            pid, tid, sec, nsec, period, event, rest = head.groups()
            mono = int64_field(sec, source, n, "time", MAX_CLOCK_NS // 1_000_000_000)
            samples.append(Sample(int64_field(pid, source, n, "pid"),
                                  int64_field(tid, source, n, "tid"),
                                  mono * 1_000_000_000 + int(nsec), [],
                                  event or STACKS_EVENT,
                                  int64_field(period, source, n, "period") if period else 1))
            line = rest
        frame = _FRAME.match(line)
        if frame and samples:
            addr, sym, dso = frame.groups()
            if len(addr) > 16:
                raise TraceFormatError(source, f"line {n}", f"address beyond 64 bits: {addr[:24]}")
            address = int(addr, 16)
            # kernel addresses (0xffff...) do not fit int64: keep their two's-complement bits
            samples[-1].frames.append((sym, dso, address - (1 << 64) if address >> 63 else address))
    return samples


def read_perf_map(path: Path) -> tuple[list[int], list[tuple[int, str]]]:
    """A perf map's symbols sorted by start: (starts, (end, name) of each); lines of another
    shape are skipped, and a later line for the same start wins (a JIT reusing the address)."""
    spans: dict[int, tuple[int, str]] = {}
    for line in path.read_text(errors="replace").splitlines():
        m = _MAP_LINE.fullmatch(line.strip())
        if m and len(m[1]) <= 16 and len(m[2]) <= 16:
            start = int(m[1], 16)
            spans[start] = (start + int(m[2], 16), m[3])
    starts = sorted(spans)
    return starts, [spans[s] for s in starts]


def jit_names(samples: Sequence[Sample], maps: Path) -> None:
    """Name, in place, the frames perf left unknown in /tmp/perf-PID.map from the perf map
    `maps`/perf-PID.map kept with the recording (a frame outside its spans stays unknown)."""
    tables: dict[str, tuple[list[int], list[tuple[int, str]]] | None] = {}
    for s in samples:
        for i, (sym, dso, address) in enumerate(s.frames):
            if sym != UNKNOWN or not (m := PERF_MAP.fullmatch(dso)):
                continue
            if dso not in tables:
                kept = maps / f"perf-{m[1]}.map"
                tables[dso] = read_perf_map(kept) if kept.is_file() else None
            table = tables[dso]
            if table is None:
                continue
            starts, spans = table
            at = bisect.bisect_right(starts, address) - 1
            if at >= 0 and address < spans[at][0]:
                s.frames[i] = (spans[at][1], dso, address)


def read_perf_data(exe: str, data: Path) -> list[Sample]:
    out = subprocess.run([exe, "script", "-i", str(data), "-F", SCRIPT_FIELDS, "--ns"],
                         capture_output=True, text=True, errors="replace", check=False,
                         timeout=600)
    samples = parse_script(out.stdout, data)
    jit_names(samples, data.parent)
    return samples


def event_counters(samples: Sequence[Sample], offset_ns: int, interval_ns: int) -> list[Row]:
    """`perf.<event>` rows of the non-stack events: the count since the recording began (the
    sum of the sampled periods), one point per interval an event occurred in, at its last
    sample."""
    rows: list[Row] = []
    totals: dict[str, int] = {}
    last: dict[tuple[str, int], int] = {}
    for s in sorted((s for s in samples if s.event != STACKS_EVENT), key=lambda s: s.mono_ns):
        totals[s.event] = totals.get(s.event, 0) + s.period
        last[(s.event, s.mono_ns // interval_ns)] = len(rows)
        rows.append((s.mono_ns + offset_ns, f"perf.{s.event}", -1, float(totals[s.event])))
    return [rows[i] for i in sorted(last.values())]
