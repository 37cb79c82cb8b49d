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
from pathlib import Path

from perfswarm.errors import ParameterError
from perfswarm.recorder.tools import ToolCollector
from perfswarm.trace.readers.perf import STACKS_EVENT

# software events perf counts exactly: each is sampled at every occurrence by default
SOFTWARE = frozenset({"context-switches", "cs", "page-faults", "faults", "minor-faults",
                      "major-faults", "cpu-migrations", "migrations", "alignment-faults",
                      "emulation-faults"})
HARDWARE_PERIOD = 100_000  # default sample period of any other event (cycles, cache-misses)
_EVENT_NAME = re.compile(r"^[A-Za-z][\w.:-]*$", re.ASCII)


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
    spins = True  # perf 6.1 -p, once a thread it follows exits (ToolCollector.watch)

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
