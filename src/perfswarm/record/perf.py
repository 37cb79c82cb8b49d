"""Linux perf: `perf record -e cpu-clock -g` on the process tree, parsed with `perf script`.

perf stamps samples with CLOCK_MONOTONIC (`-k CLOCK_MONOTONIC`); the measured
monotonic->epoch offset maps them onto the run clock.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from perfswarm.errors import TraceFormatError
from perfswarm.record.base import MAX_CLOCK_NS, int64_field
from perfswarm.record.tools import ToolCollector

SCRIPT_FIELDS = "pid,tid,time,ip,sym,dso"
# [comm] pid/tid sec.nsec:   and   \taddress symbol (dso)
_HEADER = re.compile(r"(\d+)/(\d+)\s+(\d+)\.(\d{9}):\s*$", re.ASCII)
_FRAME = re.compile(r"^\s*([0-9a-fA-F]+)\s+(.*?)\s+\((.*)\)\s*$", re.ASCII)

Frame = tuple[str, str, int]  # function, module (dso), address


class PerfCollector(ToolCollector):
    name = "perf"
    tool = "perf"
    output = "perf.data"

    def clock_offset(self, monotonic_offset: int) -> int | None:
        return monotonic_offset

    def argv(self, pid: int) -> list[str]:
        assert self.exe is not None
        return [self.exe, "record", "-e", "cpu-clock", "-g", "-k", "CLOCK_MONOTONIC",
                "-F", str(self.hz), "-p", str(pid), "-o", str(self.raw / self.output)]


@dataclass
class Sample:
    pid: int
    tid: int
    mono_ns: int
    frames: list[Frame] = field(default_factory=list)  # leaf first


def parse_script(text: str, source: Path) -> list[Sample]:
    """Samples from `perf script -F pid,tid,time,ip,sym,dso --ns` text (stacks leaf first).

    Lines of neither shape (perf's own warnings) are skipped; numbers that cannot be what
    perf writes are a TraceFormatError naming `source` (the perf.data file) and the line.
    """
    samples: list[Sample] = []
    for n, line in enumerate(text.splitlines(), 1):
        head = None if line.startswith("\t") else _HEADER.search(line)
        if head:
            pid, tid, sec, nsec = head.groups()
            mono = int64_field(sec, source, n, "time", MAX_CLOCK_NS // 1_000_000_000)
            samples.append(Sample(int64_field(pid, source, n, "pid"),
                                  int64_field(tid, source, n, "tid"),
                                  mono * 1_000_000_000 + int(nsec)))
            continue
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
