"""Simulate a dependency graph: every node starts as soon as its lane and its dependencies let it.

Each node has two points, start and end. A start is the latest of: the lane
predecessor's end plus the node's gap (a host lane's first node: the graph's origin
plus its gap; a device lane's first node, only when nothing else constrains it), and
each start dependency; an end is the latest of start plus duration and each end
dependency. That is a longest path over a DAG of points.

`simulate` walks the points once in a topological order fixed per graph (`Schedule`),
so predictions that only change durations and gaps reuse it. `simulate_reference`
iterates every constraint to a fixed point with whole-array operations: slow (one pass
per point on the longest chain) but obviously right; the tests hold the two equal.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import numpy.typing as npt

from perfswarm.analyze.frame import I64
from perfswarm.model.graph import END, START, Graph

NEG = -(1 << 62)
Mask = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class Timeline:
    """Simulated start and end of every node of a graph (ns, on the run clock)."""

    start: I64
    end: I64


@dataclass(frozen=True, eq=False)
class Schedule:
    """The dependency edges the simulation honours and a topological order of the points."""

    graph: Graph
    kept: Mask  # per dependency edge
    order: I64  # point ids (2 * node + point)
    starts_free: Mask  # per node: its start has no lane or dependency constraint but the origin

    @classmethod
    def of(cls, g: Graph) -> Schedule:
        """Kahn's algorithm over the points. Dependencies the trace itself contradicts (the
        source point measured after the destination) are dropped if they close a cycle."""
        kept = np.ones(len(g.src), bool)
        measured = np.stack([g.ts, g.end], axis=1).reshape(-1)
        while True:
            order = _topological(g, kept)
            if len(order) == 2 * len(g):
                break
            done = np.zeros(2 * len(g), bool)
            done[order] = True
            into_cycle = ~done[2 * g.dst + g.dst_point] & kept
            late = measured[2 * g.src + g.src_point] > measured[2 * g.dst + g.dst_point]
            drop = into_cycle & late if np.any(into_cycle & late) else into_cycle
            kept &= ~drop
        constrained = np.zeros(len(g), bool)
        constrained[g.dst[kept & (g.dst_point == START)]] = True
        host_lane = np.array(g.lane_is_host, bool)[g.lane] if len(g) else np.zeros(0, bool)
        starts_free = (g.prev < 0) & (host_lane | ~constrained)
        return cls(g, kept, order, starts_free)

    @cached_property
    def incoming(self) -> list[list[tuple[int, int]]]:
        """Per point, the kept edges into it as (source point, lag): built once, however many
        timelines are simulated on the schedule (most points have none: one shared empty list)."""
        g = self.graph
        into: dict[int, list[tuple[int, int]]] = {}
        src = (2 * g.src + g.src_point)[self.kept].tolist()
        dst = (2 * g.dst + g.dst_point)[self.kept].tolist()
        for a, b, lag in zip(src, dst, g.lag[self.kept].tolist(), strict=True):
            into.setdefault(b, []).append((a, lag))
        none: list[tuple[int, int]] = []
        points = [none] * (2 * len(g))
        for b, edges in into.items():
            points[b] = edges
        return points


def _topological(g: Graph, kept: Mask) -> I64:
    """Kahn's algorithm over the points, the successors of each in one flat list (built by
    numpy in the order: its end, the lane's next start, then the kept dependency edges)."""
    n = len(g)
    node = np.arange(n, dtype=np.int64)
    has_prev = g.prev >= 0
    src = np.concatenate([2 * node, 2 * g.prev[has_prev] + 1, (2 * g.src + g.src_point)[kept]])
    dst = np.concatenate([2 * node + 1, 2 * node[has_prev], (2 * g.dst + g.dst_point)[kept]])
    succ = dst[np.argsort(src, kind="stable")].tolist()
    bounds = np.zeros(2 * n + 1, np.int64)
    np.cumsum(np.bincount(src, minlength=2 * n), out=bounds[1:])
    first = bounds.tolist()
    indegree = np.bincount(dst, minlength=2 * n)
    pending = indegree.tolist()
    stack = np.flatnonzero(indegree == 0).tolist()
    order: list[int] = []
    while stack:
        p = stack.pop()
        order.append(p)
        for q in succ[first[p]:first[p + 1]]:
            pending[q] -= 1
            if pending[q] == 0:
                stack.append(q)
    return np.array(order, np.int64)


def simulate(s: Schedule, dur: I64 | None = None, gap: I64 | None = None) -> Timeline:
    """The timeline of the schedule's graph with these durations and gaps (default: the graph's)."""
    g = s.graph
    n = len(g)
    d = (g.dur if dur is None else dur).tolist()
    gp = (g.gap if gap is None else gap).tolist()
    prev = g.prev.tolist()
    free = s.starts_free.tolist()
    incoming = s.incoming
    t = [NEG] * (2 * n)
    origin = g.origin
    for p in s.order.tolist():
        v = p >> 1
        if p & 1:
            x = t[p - 1] + d[v]
        else:
            pv = prev[v]
            x = t[2 * pv + 1] + gp[v] if pv >= 0 else (origin + gp[v] if free[v] else NEG)
        for a, lag in incoming[p]:
            y = t[a] + lag
            x = y if y > x else x  # (the builtin max costs a call per edge)
        t[p] = x
    times = np.array(t, np.int64).reshape(-1, 2) if n else np.zeros((0, 2), np.int64)
    return Timeline(times[:, START].copy(), times[:, END].copy())


def simulate_reference(s: Schedule, dur: I64 | None = None, gap: I64 | None = None) -> Timeline:
    """The same timeline by fixed-point iteration of every constraint at once."""
    g = s.graph
    d = g.dur if dur is None else dur
    gp = g.gap if gap is None else gap
    start = np.where(s.starts_free, g.origin + gp, NEG).astype(np.int64)
    end = start + d
    has_prev = g.prev >= 0
    k = s.kept
    src, src_point, lag = g.src[k], g.src_point[k], g.lag[k]
    dst, dst_point = g.dst[k], g.dst_point[k]
    for _ in range(2 * len(g) + 1):
        new_start = np.where(s.starts_free, g.origin + gp, NEG).astype(np.int64)
        new_start[has_prev] = np.maximum(new_start[has_prev], end[g.prev[has_prev]] + gp[has_prev])
        point = np.where(src_point == START, start[src], end[src]) + lag
        into_start = dst_point == START
        np.maximum.at(new_start, dst[into_start], point[into_start])
        new_end = new_start + d
        np.maximum.at(new_end, dst[~into_start], point[~into_start])
        if np.array_equal(new_start, start) and np.array_equal(new_end, end):
            break
        start, end = new_start, new_end
    return Timeline(start, end)
