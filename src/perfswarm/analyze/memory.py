"""Memory by category over time: the peak, what it held, and each iteration's peak.

Reads the counters `memory.<category>` that a torch.profiler memory timeline or a CUDA memory
snapshot becomes (trace/readers/memory_timeline.py): bytes alive in a category from each reading
until the next. The total at a time is the sum over categories of their last reading. A
snapshot's `memory_reserved` (the allocator's segments) is not a category: it is reported beside
them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from perfswarm.analyze.frame import I64
from perfswarm.analyze.iterations import StepWindow
from perfswarm.trace.schema import MEMORY_PREFIX, MEMORY_RESERVED

MAX_POINTS = 400  # of the timeline given back; each keeps its stretch's highest total


@dataclass(frozen=True)
class MemoryPeak:
    ts: int
    total_bytes: int
    by_category: dict[str, int]  # what was alive then

    def to_dict(self) -> dict[str, Any]:
        return {"ts": self.ts, "total_bytes": self.total_bytes,
                "by_category": dict(self.by_category)}


@dataclass(frozen=True)
class Reserved:
    """The bytes the allocator reserved (its segments), beside the bytes allocated."""

    peak_bytes: int  # the highest reading
    at_peak_bytes: int  # when the allocated bytes peaked
    bytes: tuple[int, ...]  # at each of the timeline's `t`

    def to_dict(self) -> dict[str, Any]:
        return {"peak_bytes": self.peak_bytes, "at_peak_bytes": self.at_peak_bytes,
                "bytes": list(self.bytes)}


@dataclass(frozen=True)
class RankMemory:
    rank: int
    peak: MemoryPeak
    category_peak_bytes: dict[str, int]  # each category's own highest
    steps: tuple[tuple[int, MemoryPeak], ...]  # (step, its peak), the state it began with too
    t: tuple[int, ...]  # the timeline, at most MAX_POINTS readings
    bytes: dict[str, tuple[int, ...]]  # category -> bytes alive at each of `t`
    reserved: Reserved | None = None  # a snapshot's
    # the bytes alive by category as each of `steps` began
    step_starts: tuple[dict[str, int], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "peak": self.peak.to_dict(),
                "category_peak_bytes": dict(self.category_peak_bytes),
                "steps": [{"step": s, **p.to_dict(), "start_bytes": sum(b.values())}
                          for (s, p), b in zip(self.steps, self.step_starts, strict=True)],
                "t": list(self.t), "bytes": {c: list(v) for c, v in self.bytes.items()},
                "reserved": None if self.reserved is None else self.reserved.to_dict()}


def _peak(times: I64, alive: I64, categories: Sequence[str], rows: I64, since: int) -> MemoryPeak:
    i = int(rows[np.argmax(alive[rows].sum(axis=1))])
    return MemoryPeak(max(int(times[i]), since), int(alive[i].sum()),
                      {c: int(v) for c, v in zip(categories, alive[i].tolist(), strict=True)})


def _shown(total: I64) -> I64:
    """At most MAX_POINTS indices: of each equal stretch of readings, its highest total."""
    if len(total) <= MAX_POINTS:
        return np.arange(len(total))
    return np.array([int(part[np.argmax(total[part])])
                     for part in np.array_split(np.arange(len(total)), MAX_POINTS)], np.int64)


def _at(ts: I64, value: I64, times: I64) -> I64:
    """The last of the readings (ts, value), sorted by ts, at or before each of `times` (0
    before the first)."""
    at = np.searchsorted(ts, times, side="right") - 1
    return np.where(at >= 0, value[np.maximum(at, 0)], 0)


def rank_memory(rank: int, ts: I64, names: Sequence[str], value: I64,
                steps: Sequence[StepWindow], reserved: tuple[I64, I64] | None = None
                ) -> RankMemory:
    """One rank's memory from its `memory.*` readings (ts, name, bytes), and its
    `memory_reserved` readings (ts, bytes) where it has them."""
    categories = sorted(set(names))
    # the reserved bytes change where no allocation does (a segment freed): their times too
    times = np.unique(ts if reserved is None else np.concatenate([ts, reserved[0]]))
    alive = np.zeros((len(times), len(categories)), np.int64)
    for j, c in enumerate(categories):
        mine = np.flatnonzero(np.array(names) == c)
        mine = mine[np.argsort(ts[mine], kind="stable")]
        alive[:, j] = _at(ts[mine], value[mine], times)
    short = [c[len(MEMORY_PREFIX):] for c in categories]
    every = np.arange(len(times))
    per_step, starts = [], []
    for w in steps:
        # the state the step began with (the last reading at or before its start) and every
        # reading inside it
        lo = int(np.searchsorted(times, w.start, side="right")) - 1
        rows = np.arange(max(lo, 0), int(np.searchsorted(times, w.end)))
        if len(rows):
            per_step.append((w.step, _peak(times, alive, short, rows, w.start)))
            starts.append({c: int(v) for c, v in zip(short, alive[lo].tolist(), strict=True)}
                          if lo >= 0 else dict.fromkeys(short, 0))
    shown = _shown(alive.sum(axis=1))
    peak = _peak(times, alive, short, every, int(times[0]))
    held = None
    if reserved is not None:
        r_ts, r_value = reserved
        held = Reserved(int(r_value.max()), int(_at(r_ts, r_value, np.array([peak.ts]))[0]),
                        tuple(_at(r_ts, r_value, times[shown]).tolist()))
    return RankMemory(rank, peak, {c: int(alive[:, j].max()) for j, c in enumerate(short)},
                      tuple(per_step), tuple(times[shown].tolist()),
                      {c: tuple(alive[shown, j].tolist()) for j, c in enumerate(short)}, held,
                      tuple(starts))


def _readings(counters: pa.Table, kept: pa.ChunkedArray) -> tuple[I64, I64, I64, list[str]]:
    """(rank, ts, bytes, name) of the readings `kept`, in the Run's (rank, ts) order."""
    mine = counters.filter(kept)
    return (mine.column("rank").to_numpy(), np.asarray(mine.column("ts").to_numpy(), np.int64),
            np.asarray(mine.column("value").to_numpy(), np.float64).round().astype(np.int64),
            mine.column("name").cast(pa.string()).to_pylist())


def memory_timeline(counters: pa.Table,
                    steps: Mapping[int, Sequence[StepWindow]]) -> tuple[RankMemory, ...]:
    """Per rank with a memory timeline: its memory by category (see the module docstring)."""
    name = counters.column("name").cast(pa.string())
    rank, ts, value, names = _readings(counters, pc.starts_with(name, MEMORY_PREFIX))
    reserved_rank, reserved_ts, reserved, _ = _readings(counters, pc.equal(name, MEMORY_RESERVED))
    out = []
    for r in np.unique(rank).tolist():
        rows = np.flatnonzero(rank == r)
        mine = np.flatnonzero(reserved_rank == r)
        out.append(rank_memory(int(r), ts[rows], [names[i] for i in rows], value[rows],
                               steps.get(int(r), ()),
                               (reserved_ts[mine], reserved[mine]) if len(mine) else None))
    return tuple(out)
