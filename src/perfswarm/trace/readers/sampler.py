"""The samplers' files (recorder/system.py, recorder/gpu.py): one JSON reading a line, `ts` on the
epoch clock and `values` by counter name; the system sampler also keeps the per-core lines of
/proc/stat unparsed, whose shares are derived here."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Final

import msgspec
import numpy as np

from perfswarm.errors import TraceFormatError
from perfswarm.trace.readers.fields import (
    MAX_CLOCK_NS,
    Placement,
    Row,
    SideTables,
    counter_table,
)

I64 = np.ndarray[Any, np.dtype[np.int64]]
SHARES = ("usr", "sys", "iowait", "steal")
# each share's columns of user, nice, system, idle, iowait, irq, softirq, steal: usr is user
# mode, niced or not (a nice-19 rival's two cores had read as idle), sys the kernel's, its
# interrupts too
_SHARE_OF: Final = np.array([[1, 0, 0, 0], [1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 0, 0],
                             [0, 0, 1, 0], [0, 1, 0, 0], [0, 1, 0, 0], [0, 0, 0, 1]], np.int64)
_DEVICE = re.compile(r"^gpu(\d{1,9})\.", re.ASCII)


class Reading(msgspec.Struct):
    """One line of a sampler file."""

    ts: int
    values: dict[str, float | None]  # orjson writes NaN as null
    stat: str | None = None  # the system sampler's raw per-core /proc/stat lines


_READING = msgspec.json.Decoder(Reading)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The readings of a sampler file (`ts`, `values`, and `stat` where the system sampler kept
    raw lines); a torn last line (crash) is skipped, anything else malformed is an error."""
    items: list[dict[str, Any]] = []
    lines = path.read_bytes().splitlines()
    for n, line in enumerate(lines, 1):
        try:
            item = _READING.decode(line)
        except msgspec.DecodeError as exc:
            if n == len(lines):  # the write a crash cut short
                continue
            raise TraceFormatError(path, f"line {n}", f"not a sampler reading: {exc}") from None
        if not 0 <= item.ts < MAX_CLOCK_NS:
            raise TraceFormatError(path, f"line {n}", f"time out of range: {item.ts}")
        reading: dict[str, Any] = {"ts": item.ts, "values": item.values}
        if item.stat is not None:
            reading["stat"] = item.stat
        items.append(reading)
    return items


def value_rows(items: list[dict[str, Any]]) -> list[Row]:
    """(ts, name, device, value) rows of the readings' values (orjson writes NaN as null: no
    value); device from a `gpuN.` prefix."""
    rows: list[Row] = []
    for item in items:
        for name, value in item["values"].items():
            if value is not None:
                m = _DEVICE.match(name)
                rows.append((int(item["ts"]), name, int(m.group(1)) if m else -1, float(value)))
    return rows


def parse_cpu_lines(text: str) -> I64:
    """Per-core lines as rows of ticks: core, user, nice, system, idle, iowait, irq, softirq,
    steal (then guest, guest_nice on newer kernels). One numpy call for all cores."""
    width = len(text.split("\n", 1)[0].split())  # "cpuN" and its fields: a row is N and them
    if width < 9:
        raise ValueError(f"a per-core line has {width} fields, not 9 or more")
    return np.fromstring(text.replace("cpu", ""), dtype=np.int64, sep=" ").reshape(-1, width)


def cpu_fractions(prev: I64, now: I64) -> dict[str, float]:
    """Per-core user (with nice), system (with irq and softirq), iowait and steal shares of
    the ticks between two readings. The span is user..steal: guest time is already inside
    user and nice, so adding it again (as psutil's sum of fields does) would count it twice."""
    if prev.shape != now.shape or not np.array_equal(prev[:, 0], now[:, 0]):
        return {}  # a core went on- or offline: no common interval
    delta = now[:, 1:9] - prev[:, 1:9]
    span = delta.sum(axis=1)
    shares = np.maximum(delta, 0) @ _SHARE_OF / np.maximum(span, 1)[:, None]
    out: dict[str, float] = {}
    for core, ok, row in zip(now[:, 0].tolist(), (span > 0).tolist(), shares.tolist(),
                             strict=True):
        if ok:  # Python's round: correctly rounded (numpy's scales first: 23/14720 -> .001562)
            out.update(zip([f"cpu.core{core}.{share}" for share in SHARES],
                           (round(v, 6) for v in row), strict=True))
    return out


def cpu_rows(items: list[dict[str, Any]]) -> list[Row]:
    """`cpu.coreN.usr|sys|iowait|steal` rows from the raw per-core lines the sampler kept: each
    reading's shares of the interval since the one before."""
    rows: list[Row] = []
    prev = None
    for item in items:
        if "stat" not in item:
            continue
        now = parse_cpu_lines(item["stat"])
        if prev is not None:
            rows += [(int(item["ts"]), name, -1, value)
                     for name, value in cpu_fractions(prev, now).items()]
        prev = now
    return rows


def read(path: Path, at: Placement) -> SideTables:
    """The counters of a sampler file: its values, and the per-core shares of the lines the
    system sampler kept."""
    items = read_jsonl(path)
    try:
        return SideTables("sampler", counters=counter_table(value_rows(items) + cpu_rows(items)))
    except ValueError as exc:  # the kept /proc/stat lines
        raise TraceFormatError(path, "per-core lines", str(exc)) from None
