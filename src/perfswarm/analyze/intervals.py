"""Interval arithmetic on int64 ns columns: coverage of elementary segments, unions, gaps."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np
import numpy.typing as npt

I64 = npt.NDArray[np.int64]
Mask = npt.NDArray[np.bool_]
Int = TypeVar("Int", bound=np.integer)


def covered(starts: I64, ends: I64, points: I64) -> Mask:
    """For each segment [points[i], points[i+1]), whether any interval [start, end) covers it.

    `points` must be sorted and contain every interval boundary inside its range, so
    each segment is either fully inside or fully outside each interval.
    """
    # each interval's bounds placed among the points (a search per bound, not per point: the
    # points are all the sets' bounds, several times any one set's), then a running count
    keep = ends > starts
    at = np.searchsorted(points, np.concatenate([starts[keep], ends[keep]]))
    # +1 where one opens, -1 where one closes (float weights: exact below 2**53 intervals)
    steps = np.bincount(at, np.repeat([1.0, -1.0], int(keep.sum())), len(points) + 1)
    return np.asarray(np.cumsum(steps)[:len(points) - 1] > 0)


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


class Covered:
    """How much of any [lo, hi) the union of intervals covers: the union is built once, each
    window is two binary searches (the same as `total` of the intervals clipped to the window)."""

    def __init__(self, starts: I64, ends: I64) -> None:
        self.s, self.e = union(starts, ends)
        self.cum = np.concatenate([[0], np.cumsum(self.e - self.s)]).astype(np.int64)

    def within(self, lo: int, hi: int) -> int:
        first = int(np.searchsorted(self.e, lo, side="right"))  # the first ending after lo
        end = int(np.searchsorted(self.s, hi, side="left"))  # those starting before hi
        if hi <= lo or end <= first:
            return 0
        length = int(self.cum[end] - self.cum[first])
        return length - max(0, lo - int(self.s[first])) - max(0, int(self.e[end - 1]) - hi)


class WindowSums:
    """Sum of the values whose key lies in any [lo, hi): sorted once, two binary searches."""

    def __init__(self, keys: I64, values: I64) -> None:
        order = np.argsort(keys, kind="stable")
        self.keys = keys[order]
        self.cum = np.concatenate([[0], np.cumsum(values[order])]).astype(np.int64)

    def within(self, lo: int, hi: int) -> int:
        first = int(np.searchsorted(self.keys, lo, side="left"))
        end = int(np.searchsorted(self.keys, hi, side="left"))
        return int(self.cum[end] - self.cum[first]) if end > first else 0


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


class StateSums:
    """Nanoseconds per state over any [lo, hi), for a timeline cut into labelled segments.

    Segment i is [points[i], points[i+1]) in state codes[i]; time outside the points
    is in state `outside`. Built once (O(n)); each query is a binary search and a sum of at
    most CHECKPOINT segments past the running sums kept at every CHECKPOINT-th point (kept at
    every point, they took `states` times the points' memory: 14 MB of a 200k-event run's
    concurrency breakdown, beside its 2 MB of points).
    """

    CHECKPOINT = 32

    def __init__(self, points: I64, codes: I64, states: int, outside: int) -> None:
        self.points = points
        self.codes = codes
        self.states = states
        self.outside = outside
        # cum[s, k]: ns in state s of the segments before segment k * CHECKPOINT; the last
        # column, of every segment
        lengths = np.diff(points)
        starts = np.arange(0, len(lengths), self.CHECKPOINT)
        self.cum = np.zeros((states, len(starts) + 1), np.int64)
        for s in range(states):
            if len(starts):
                np.cumsum(np.add.reduceat(np.where(codes == s, lengths, 0), starts),
                          out=self.cum[s, 1:])

    def upto(self, x: I64) -> I64:
        """ns per state in [points[0], x) of each x (a row per x), with time before points[0]
        counted as outside (with no points, all time is outside). Every x at once: one by
        one, each was ~20 numpy calls (the 200k-event Run's 200 step windows: 4.5 ms, 0.5)."""
        x = np.asarray(x, np.int64)
        out = np.zeros((len(x), self.states), np.int64)
        if len(self.points) == 0:
            out[:, self.outside] = x
            return out
        first, last = int(self.points[0]), int(self.points[-1])
        before, after = x <= first, x >= last
        out[before, self.outside] -= first - x[before]
        out[after] += self.cum[:, -1]
        out[after, self.outside] += x[after] - last
        inside = np.flatnonzero(~before & ~after)
        i = np.searchsorted(self.points, x[inside], side="right") - 1
        k = i // self.CHECKPOINT
        out[inside] += self.cum[:, k].T
        # the segments from each checkpoint to i, summed exactly (ns far below 2**53)
        query, segment = spread(k * self.CHECKPOINT, i - k * self.CHECKPOINT)
        out[inside] += np.bincount(
            query * self.states + self.codes[segment],
            self.points[segment + 1] - self.points[segment],
            len(inside) * self.states).astype(np.int64).reshape(-1, self.states)
        out[inside, self.codes[i]] += x[inside] - self.points[i]
        return out

    def between(self, lo: I64, hi: I64) -> I64:
        """ns per state in each [lo, hi) (a row per window)."""
        return self.upto(hi) - self.upto(lo)


def spread(first: I64, count: I64) -> tuple[I64, I64]:
    """Each run i of count[i] consecutive indices from first[i], all runs end to end: the
    run of each index, and the index."""
    run = np.repeat(np.arange(len(first)), count)
    return run, np.arange(len(run)) - np.repeat(np.cumsum(count) - count, count) + first[run]


def state_sweep(sets: Sequence[tuple[I64, I64]], state_of: Callable[[list[Mask]], I64],
                states: int, outside: int, bounds: I64 | None = None) -> StateSums:
    """Every instant's state from one sweep over the interval sets' boundaries (and `bounds`,
    the windows to be asked about): `state_of` gives each elementary segment's state from
    which sets cover it; time no boundary reaches is `outside`."""
    points = sorted_unique(np.concatenate([*([] if bounds is None else [bounds]),
                                           *(x for pair in sets for x in pair)]))
    return StateSums(points, state_of([covered(s, e, points) for s, e in sets]), states,
                     outside)


def first_covering(covers: list[Mask]) -> I64:
    """Each segment's state by priority: the first set that covers it, else len(covers)."""
    return np.select(covers, list(range(len(covers))), default=len(covers)).astype(np.int64)


def sorted_unique(values: npt.NDArray[Int]) -> npt.NDArray[Int]:
    """np.unique of an integer column by sorting: numpy 2.3+'s hash path (np.unique asked
    for the values alone) took 27 CPU ms for 160k mostly distinct int64 values, a sort 1.3."""
    x = np.sort(values)
    if len(x) == 0:
        return x
    keep = np.ones(len(x), dtype=bool)
    keep[1:] = x[1:] != x[:-1]
    return x[keep]


DENSE_PER_KEY = 4  # key_sums counts densely over at most this many slots a key


def key_sums(keys: I64, weights: I64, size: int) -> tuple[I64, I64]:
    """The distinct keys (ascending, each in [0, size)) and each one's weights summed (exact
    below 2**53): a count over every slot where there are at most DENSE_PER_KEY a key, else
    by np.unique's sort (the walks' (walk, state, name) keys of the critical path at 200k
    events, 234k of 130k slots: 12 CPU ms sorted, 1.2 counted)."""
    if size <= DENSE_PER_KEY * len(keys):
        found = np.flatnonzero(np.bincount(keys, minlength=size))
        return found, np.bincount(keys, weights, size)[found].astype(np.int64)
    found, at = np.unique(keys, return_inverse=True)
    return found, np.bincount(at, weights, len(found)).astype(np.int64)


class Coverage:
    """How much of any [lo, hi) disjoint sorted intervals cover, for many queries at once."""

    def __init__(self, starts: I64, ends: I64) -> None:
        self.starts, self.ends = starts, ends
        self.cum = np.concatenate([[0], np.cumsum(ends - starts)]).astype(np.int64)

    def upto(self, x: I64) -> I64:
        if len(self.starts) == 0:
            return np.zeros(np.shape(x), np.int64)
        i = np.searchsorted(self.starts, x, side="right")  # intervals starting at or before x
        last = np.maximum(i - 1, 0)
        inside = np.clip(x - self.starts[last], 0, (self.ends - self.starts)[last])
        return np.asarray(self.cum[last] + np.where(i > 0, inside, 0), np.int64)

    def between(self, lo: I64, hi: I64) -> I64:
        return self.upto(hi) - self.upto(lo)


def innermost(starts: I64, ends: I64, points: I64, rows: I64) -> I64:
    """For each segment [points[i], points[i+1]) of one thread's nested spans (`starts`,
    `ends` of `rows`, each longer than 0; `points` all their starts and ends, sorted and
    unique), the row of the innermost span over it, -1 where none is. The spans over segment
    i are those opened at or before it less those closed by then, D of them; the innermost is
    the last one opened at depth D (a later one at that depth would have closed it)."""
    n = len(points)
    out = np.full(max(n - 1, 0), -1, np.int64)
    if n < 2 or not len(rows):
        return out
    s_at, e_at = np.searchsorted(points, starts), np.searchsorted(points, ends)
    opened = np.cumsum(np.bincount(s_at, minlength=n))  # opened at or before each point
    closed = np.cumsum(np.bincount(e_at, minlength=n))  # closed at or before each point
    over = (opened - closed)[:-1]  # spans over each segment
    # each span's depth as it opens: those open before its point and not closed there, then
    # its place among the spans opening at the point, the outer (longer) first
    order = np.lexsort((-ends, s_at))
    at = s_at[order]
    place = np.arange(len(order)) - np.searchsorted(at, at, side="left")
    depth = np.where(at > 0, opened[np.maximum(at - 1, 0)], 0) - closed[at] + place + 1
    key = depth * n + at  # by depth, then by where it opened
    by_key = np.argsort(key, kind="stable")
    found = np.searchsorted(key[by_key], over * n + np.arange(n - 1), side="right") - 1
    span = by_key[np.maximum(found, 0)]
    hit = (over > 0) & (found >= 0) & (depth[span] == over)
    out[hit] = rows[order[span[hit]]]
    return out
