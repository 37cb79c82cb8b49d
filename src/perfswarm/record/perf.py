"""Linux perf: `perf record -e cpu-clock -g` on the process tree, parsed with `perf script`.

perf stamps samples with CLOCK_MONOTONIC (`-k CLOCK_MONOTONIC`); the measured
monotonic->epoch offset maps them onto the run clock.

Other events (`--perf-events`) are sampled in the same `perf record` every PERIOD
events, without stacks, and become cumulative counters `perf.<event>`. Each is
probed first with `perf stat`: one perf refuses (a hardware counter a VM does
not expose reads `<not supported>`) is left out, the reason kept for the
manifest. perf falls back from a refused `cycles` to cpu-clock without a word,
so it cannot be left to perf record to refuse.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from perfswarm.errors import ParameterError, TraceFormatError
from perfswarm.record.base import MAX_CLOCK_NS, Row, int64_field
from perfswarm.record.tools import ToolCollector

SCRIPT_FIELDS = "pid,tid,time,event,period,ip,sym,dso"
STACKS_EVENT = "cpu-clock"
# software events perf counts exactly: each is sampled at every occurrence by default
SOFTWARE = frozenset({"context-switches", "cs", "page-faults", "faults", "minor-faults",
                      "major-faults", "cpu-migrations", "migrations", "alignment-faults",
                      "emulation-faults"})
HARDWARE_PERIOD = 100_000  # default sample period of any other event (cycles, cache-misses)
_EVENT_NAME = re.compile(r"^[A-Za-z][\w.:-]*$", re.ASCII)
# [comm] pid/tid sec.nsec: [period event:] [address symbol (dso): an event without stacks]
# and then, for one with stacks,   \taddress symbol (dso)   a line each
_HEADER = re.compile(r"(\d+)/(\d+)\s+(\d+)\.(\d{9}):(?:\s+(\d+)\s+([^\s/:]+)\S*:)?\s*(.*)$",
                     re.ASCII)
_FRAME = re.compile(r"^\s*([0-9a-fA-F]+)\s+(.*?)\s+\((.*)\)\s*$", re.ASCII)

Frame = tuple[str, str, int]  # function, module (dso), address


def parse_events(text: str) -> tuple[tuple[str, int], ...]:
    """`--perf-events` `EVENT[@PERIOD],...` -> (event, period) pairs; PERIOD defaults to 1 for
    perf's software events and HARDWARE_PERIOD for the rest."""
    out: dict[str, int] = {}
    for item in (i.strip() for i in text.split(",")):
        if not item:
            continue
        name, at, period = item.partition("@")
        if not _EVENT_NAME.match(name):
            raise ParameterError("perf_events", "not a perf event name", value=item)
        if at and not (period.isdigit() and 0 < int(period) < 1 << 62):
            raise ParameterError("perf_events", "PERIOD must be a positive integer", value=item)
        out[name] = int(period) if at else (1 if name in SOFTWARE else HARDWARE_PERIOD)
    return tuple(out.items())


def refusal(exe: str, event: str) -> str | None:
    """Why perf will not count `event` here (None: it will), from `perf stat -x,`."""
    try:
        done = subprocess.run([exe, "stat", "-x,", "-e", event, "--", "true"],
                              capture_output=True, text=True, errors="replace", timeout=30,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"perf stat did not run ({exc})"
    lines = [ln.strip() for ln in done.stderr.splitlines() if ln.strip()]
    row = next((ln.split(",") for ln in reversed(lines) if f",{event}," in ln), None)
    if row is None:
        return f"perf stat: {lines[0] if lines else 'no output'}"
    if row[0].startswith("<"):  # <not supported>, <not counted>
        return f"perf stat counts {row[0]} (the kernel or VM exposes no such counter)"
    return None


class PerfCollector(ToolCollector):
    name = "perf"
    tool = "perf"
    output = "perf.data"

    def __init__(self, raw: Path, hz: int, events: tuple[tuple[str, int], ...] = ()) -> None:
        super().__init__(raw, hz)
        self.events: tuple[tuple[str, int], ...] = ()
        self.refused: dict[str, str] = {}
        if self.exe is None:
            self.refused = {e: f"{self.tool} not found" for e, _ in events}
            return
        kept = []
        for event, period in events:
            if event == STACKS_EVENT:
                continue  # sampled already, with stacks
            why = refusal(self.exe, event)
            if why is None:
                kept.append((event, period))
            else:
                self.refused[event] = why
        self.events = tuple(kept)

    def clock_offset(self, monotonic_offset: int) -> int | None:
        return monotonic_offset

    def argv(self, pid: int) -> list[str]:
        assert self.exe is not None
        extra = [a for event, period in self.events
                 for a in ("-e", f"{event}/period={period},call-graph=no/")]
        return [self.exe, "record", "-e", STACKS_EVENT, *extra, "-g", "-k", "CLOCK_MONOTONIC",
                "-F", str(self.hz), "-p", str(pid), "-o", str(self.raw / self.output)]


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


def read_perf_data(exe: str, data: Path) -> list[Sample]:
    out = subprocess.run([exe, "script", "-i", str(data), "-F", SCRIPT_FIELDS, "--ns"],
                         capture_output=True, text=True, errors="replace", check=False,
                         timeout=600)
    return parse_script(out.stdout, data)


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
