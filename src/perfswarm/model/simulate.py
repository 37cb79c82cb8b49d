"""Simulate a dependency graph: every node starts as soon as its lane and its dependencies let it.

Each node has two points, start and end. A start is the latest of: the lane
predecessor's end plus the node's gap (a host lane's first node: the graph's origin
plus its gap; a device lane's first node, only when nothing else constrains it), and
each start dependency; an end is the latest of start plus duration and each end
dependency. That is a longest path over a DAG of points.

`simulate` walks, in a topological order fixed per graph (`Schedule`), only the points
that a dependency constrains and fills in the rest of each lane with numpy, so predictions
that only change durations and gaps reuse the order. `simulate_reference`
iterates every constraint to a fixed point with whole-array operations: slow (one pass
per point on the longest chain) but obviously right; the tests hold the two equal.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from perfswarm.analyze.frame import I32, I64, int_array
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
    """What the simulation of a graph walks, fixed per graph.

    The walk visits only the "keys": the points a kept dependency edge ends at, and each
    lane's first start. Any other point follows its lane's last key by the lane's own
    durations and gaps in between. A lane's nodes are consecutive ids (build_graph adds them
    lane by lane), so its points are a range of point ids and that distance is a difference
    of one cumulative sum, which numpy takes for every point at once.
    """

    graph: Graph
    kept: Mask  # per dependency edge
    starts_free: Mask  # per node: its start has no lane or dependency constraint but the origin
    keys: I32  # the visited points (2 * node + point), ascending
    anchor: I32  # per point: the index in `keys` of its lane's last key at or before it
    lane: I64  # the keys after their lane's first (by index): each follows the key before it
    first: I64  # the lanes' first keys (by index)
    edge_point: I32  # per kept edge: its source point
    edge_src: I32  # per kept edge: the key its source point follows (by index)
    # The walk's steps in a topological order of the keys they set: key step_dst >= key
    # step_src (len(keys): a zero) + that step's offset; step_of: where each step's offset is
    # in [lane steps, first keys, edges]. The loop's operands are machine-int arrays: the loop
    # iterates them as fast as lists, in 8 bytes an entry where a list of ints takes 36-40.
    step_dst: array[int]
    step_src: array[int]
    step_of: I32

    @classmethod
    def of(cls, g: Graph) -> Schedule:
        """Kahn's algorithm over the keys. Dependencies the trace itself contradicts (the
        source point measured after the destination) are dropped if they close a cycle."""
        n = len(g)
        has_prev = g.prev >= 0
        if not np.array_equal(g.prev[has_prev], np.flatnonzero(has_prev) - 1):
            raise ValueError("a lane's nodes must be consecutive node ids")
        kept = np.ones(len(g.src), bool)
        measured = np.stack([g.ts, g.end], axis=1).reshape(-1)
        src, dst = 2 * g.src + g.src_point, 2 * g.dst + g.dst_point
        heads = 2 * np.flatnonzero(~has_prev)
        while True:
            keys = np.union1d(heads, dst[kept]).astype(np.int64)
            anchor = np.searchsorted(keys, np.arange(2 * n), side="right") - 1
            is_head = np.isin(keys, heads)
            lane, first = np.flatnonzero(~is_head), np.flatnonzero(is_head)
            edge_src, edge_dst = anchor[src[kept]], np.searchsorted(keys, dst[kept])
            step_from = np.concatenate([lane - 1, edge_src])
            step_to = np.concatenate([lane, edge_dst])
            order = _measured_order(measured[keys], step_from, step_to)
            if order is None:
                order = _topological(len(keys), step_from, step_to)
            if len(order) == len(keys):
                break
            done = np.zeros(2 * n, bool)
            done[keys[order]] = True
            into_cycle = ~done[dst] & kept
            late = measured[src] > measured[dst]
            drop = into_cycle & late if np.any(into_cycle & late) else into_cycle
            kept &= ~drop
        constrained = np.zeros(n, bool)
        constrained[g.dst[kept & (g.dst_point == START)]] = True
        host_lane = np.array(g.lane_is_host, bool)[g.lane] if n else np.zeros(0, bool)
        starts_free = ~has_prev & (host_lane | ~constrained)
        rank = np.empty(len(keys), np.int64)
        rank[order] = np.arange(len(keys))
        step_dst = np.concatenate([lane, first, edge_dst])
        step_src = np.concatenate([lane - 1, np.full(len(first), len(keys)), edge_src])
        step_of = np.argsort(rank[step_dst], kind="stable")
        # (points and the indexes of keys and steps in 32 bits: fewer than 2**31; held through
        # the whole prediction, a command's peak)
        return cls(g, kept, starts_free, keys.astype(np.int32), anchor.astype(np.int32), lane,
                   first, src[kept], edge_src.astype(np.int32), int_array(step_dst[step_of]),
                   int_array(step_src[step_of]), step_of.astype(np.int32))


def _measured_order(at: I64, src: I64, dst: I64) -> I64 | None:
    """The points in the order they were measured (ties in id order), when that is a
    topological order of the edges src -> dst: on a trace, dependencies point forward in time,
    so it nearly always is (on 22 of 23 kept Runs; on the 23rd the device's clock runs 1-6 us
    ahead of the host's, and a kernel starts after the host call that waited on it ended), and
    a sort costs a fraction of Kahn's walk."""
    order = np.lexsort((np.arange(len(at)), at))
    rank = np.empty(len(at), np.int64)
    rank[order] = np.arange(len(at))
    return order if bool(np.all(rank[src] < rank[dst])) else None


def _topological(n: int, src: I64, dst: I64) -> I64:
    """Kahn's algorithm over `n` nodes and the edges src -> dst (each node's successors in one
    flat list, by numpy); fewer than `n` nodes come back when the edges close a cycle."""
    succ = dst[np.argsort(src, kind="stable")].tolist()
    bounds = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=bounds[1:])
    first = bounds.tolist()
    indegree = np.bincount(dst, minlength=n)
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
    d = g.dur if dur is None else dur
    gp = g.gap if gap is None else gap
    # along a lane, a start follows the previous end by its gap and an end its start by the
    # duration: `along` sums those steps over all points (lanes are ranges of points). In
    # place, here and below: this runs while the whole graph is held, at a command's peak.
    along = np.zeros(2 * n, np.int64)
    along[0::2] = np.where(g.prev >= 0, gp, 0)
    along[1::2] = d
    np.cumsum(along, out=along)
    at_key = along[s.keys]
    head = s.keys[s.first] >> 1
    offset = int_array(np.concatenate([
        at_key[s.lane] - at_key[s.lane - 1],
        np.where(s.starts_free[head], g.origin + gp[head], NEG),
        along[s.edge_point] - at_key[s.edge_src] + g.lag[s.kept]])[s.step_of])
    value: list[float] = [-math.inf] * len(s.keys) + [0]
    for k, a, o in zip(s.step_dst, s.step_src, offset, strict=True):
        y = value[a] + o
        if y > value[k]:  # noqa: PLR1730 (the builtin max costs a call per step)
            value[k] = y
    del offset
    key_time = np.array(value[:-1], np.int64)
    del value
    if not n:
        return Timeline(np.zeros(0, np.int64), np.zeros(0, np.int64))
    times = key_time[s.anchor]
    times += along
    times -= at_key[s.anchor]
    del along
    return Timeline(times[START::2].copy(), times[END::2].copy())


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
