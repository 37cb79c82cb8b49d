"""Kernel breakdown per rank: device time by kind of work and how the kinds overlapped.

Device ops are compute (kernels), communication (collectives) or memory (memcpy,
memset). Per rank: each kind's op count and summed duration, and the rank's device
busy time cut by which kinds were running at each instant (one alone, or two or
three at once), so the overlap classes partition the busy time exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from perfswarm.analyze.concurrency import Activity
from perfswarm.analyze.frame import Events
from perfswarm.analyze.intervals import covered, sorted_unique

TYPES: Final = ("compute", "comm", "memory")
# Overlap classes, by the bit set of TYPES running (1: compute, 2: comm, 4: memory).
CLASSES: Final = {1: "compute", 2: "comm", 4: "memory", 3: "compute+comm",
                  5: "compute+memory", 6: "comm+memory", 7: "compute+comm+memory"}
_KINDS: Final = {"compute": ("kernel",), "comm": ("collective",), "memory": ("memcpy", "memset")}


@dataclass(frozen=True)
class RankKernels:
    rank: int
    count: dict[str, int]  # type -> device ops
    total_ns: dict[str, int]  # type -> summed durations
    overlap_ns: dict[str, int]  # class -> ns of the rank's device busy time

    @property
    def busy_ns(self) -> int:
        return sum(self.overlap_ns.values())

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank,
                "types": {t: {"count": self.count[t], "total_ns": self.total_ns[t]}
                          for t in TYPES},
                "overlap_ns": dict(self.overlap_ns), "busy_ns": self.busy_ns}


def rank_kernels(ev: Events, rank: int) -> RankKernels:
    rows = ev.rank_slice(rank)
    count = {t: int(np.count_nonzero(ev.of_kind(*_KINDS[t])[rows])) for t in TYPES}
    total = {t: int(ev.dur[rows][ev.of_kind(*_KINDS[t])[rows]].sum()) for t in TYPES}
    activity = Activity.of_rank(ev, rank)
    sets = (activity.compute, activity.comm, activity.memory)
    points = sorted_unique(np.concatenate([x for pair in sets for x in pair]))
    overlap = dict.fromkeys(CLASSES.values(), 0)
    if len(points) >= 2:
        bits = sum((covered(s, e, points).astype(np.int64) << i)
                   for i, (s, e) in enumerate(sets))
        ns = np.bincount(np.asarray(bits, np.int64), weights=np.diff(points), minlength=8)
        for bit, name in CLASSES.items():
            overlap[name] = int(ns[bit])
    return RankKernels(rank, count, total, overlap)


def kernel_breakdown(ev: Events) -> tuple[RankKernels, ...]:
    return tuple(rank_kernels(ev, rank) for rank in ev.ranks)
