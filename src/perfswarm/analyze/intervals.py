"""Interval arithmetic on int64 ns columns: coverage of elementary segments, unions, gaps."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

I64 = npt.NDArray[np.int64]
Mask = npt.NDArray[np.bool_]


def covered(starts: I64, ends: I64, points: I64) -> Mask:
    """For each segment [points[i], points[i+1]), whether any interval [start, end) covers it.

    `points` must be sorted and contain every interval boundary inside its range, so
    each segment is either fully inside or fully outside each interval.
    """
    left = points[:-1]
    keep = ends > starts
    opened = np.searchsorted(np.sort(starts[keep]), left, side="right")
    closed = np.searchsorted(np.sort(ends[keep]), left, side="right")
    return np.asarray((opened - closed) > 0)


def union(starts: I64, ends: I64) -> tuple[I64, I64]:
    """Disjoint sorted intervals covering exactly the union of [start, end)."""
    keep = ends > starts
    s, e = starts[keep], ends[keep]
    if len(s) == 0:
        return s, e
    order = np.argsort(s, kind="stable")
    s, e = s[order], np.maximum.accumulate(e[order])
    # A new run starts where an interval begins after everything before it ended.
    new = np.ones(len(s), dtype=bool)
    new[1:] = s[1:] > e[:-1]
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, len(s) - 1)
    return s[first], e[last]


def total(starts: I64, ends: I64) -> int:
    s, e = union(starts, ends)
    return int((e - s).sum())


def gaps(starts: I64, ends: I64, lo: int, hi: int) -> tuple[I64, I64]:
    """The parts of [lo, hi) that no interval covers."""
    s, e = union(np.clip(starts, lo, hi), np.clip(ends, lo, hi))
    gap_s = np.concatenate([[lo], e]).astype(np.int64)
    gap_e = np.concatenate([s, [hi]]).astype(np.int64)
    keep = gap_e > gap_s
    return gap_s[keep], gap_e[keep]
