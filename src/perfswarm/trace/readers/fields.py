"""What the readers of the files beside the traces share: their one protocol (`SideReader`:
a file and its `Placement` on the Run give `SideTables`, rows in the Run's schemas), the
bound on a clock reading, a checked integer field, and a counter row."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
import pyarrow as pa

from perfswarm.errors import TraceFormatError
from perfswarm.trace.schema import COUNTERS, EVENTS, GRAPH_EDGES, GRAPH_NODES, NONE

# Tools' clock readings and durations beyond this (146 years of ns) are not a clock; the bound
# leaves room to add an epoch offset, or a duration to a time, within int64.
MAX_CLOCK_NS = 1 << 62
Row = tuple[int, str, int, float]  # ts, name, device, value


def int64_field(text: str, path: Path, line: int, what: str, limit: int = 1 << 63) -> int:
    """A decimal (or 0x-hex) integer field of a tool's text output, checked to fit `limit`
    (an int64 column by default): anything larger means the file is not what the tool writes."""
    if len(text) <= 20:  # longer cannot fit, and int() of thousands of digits is refused
        value = int(text, 16) if text[:2] in ("0x", "0X") else int(text)
        if -limit <= value < limit:
            return value
    raise TraceFormatError(path, f"line {line}", f"{what} out of range: {text[:24]}")


@dataclass(frozen=True)
class Placement:
    """Where a file beside the traces lies on the Run: the rank it belongs to (a memory
    timeline, an execution trace), the ranks of the processes it saw (pid -> rank: strace),
    the samplers' interval (a capture's points)."""

    rank: int = NONE
    rank_of: Mapping[int, int] = field(default_factory=dict)
    interval_ns: int = 1


@dataclass(frozen=True)
class SideTables:
    """What a reader of a file beside the traces gives: its format, and its rows in the Run's
    schemas (the tables it has none of are empty); `warnings`: what it mended to read the
    file (what -> count), for the manifest."""

    format: str
    events: pa.Table = field(default_factory=EVENTS.empty_table)
    counters: pa.Table = field(default_factory=COUNTERS.empty_table)
    graph_nodes: pa.Table = field(default_factory=GRAPH_NODES.empty_table)
    graph_edges: pa.Table = field(default_factory=GRAPH_EDGES.empty_table)
    warnings: Mapping[str, int] = field(default_factory=dict)


class SideReader(Protocol):
    def __call__(self, path: Path, at: Placement) -> SideTables: ...


def counter_table(rows: Sequence[Row]) -> pa.Table:
    """Counter rows of no rank (the machine's), sorted, as the counters table."""
    if not rows:
        return COUNTERS.empty_table()
    ts, name, device, value = zip(*sorted(rows), strict=True)
    return pa.table({"rank": pa.array(np.full(len(ts), NONE, np.int32)), "ts": ts,
                     "name": name, "device": device, "value": value}).cast(COUNTERS)
