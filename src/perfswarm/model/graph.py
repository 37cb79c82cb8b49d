"""The dependency graph of a Run: what the simulator replays.

Nodes take time on one lane each:
- host nodes: the time of every thread cut into pieces where one event is the innermost
  (a CPU op's own time between its children, a runtime call), in time order; the time
  between two pieces is the thread's work outside any op, such as Python (its `gap`);
- device nodes: kernels, copies, sets and collectives, in order on their stream;
- anchors: zero-length nodes where each iteration starts and ends on the thread that
  drives the loop, so iteration times can be read off a simulated timeline.

A node starts when its lane is free (the previous node's end plus its gap) and every
start dependency is met; it ends after its duration and once every end dependency is
met. Dependencies (see analyze/dependencies.py): a device op starts a launch latency
after its launch call starts and a stream gap after an event it waits on; a launch call
starts no earlier than the end of the op launched a full launch queue before it; a
synchronizing call ends a sync latency after the device op it waited for; a collective
ends no earlier than its transfer time after the last rank entered it; a thread that
another thread of its rank handed over to (dependencies.thread_wakes, as the critical path
defines it) resumes no earlier than that thread finished (the main thread waiting for the
autograd thread, or for a DataLoader worker); an
op that consumes a tensor another thread's op produced (execution-trace data edges) starts
after it.

Latencies are per rank and typical (medians over the events where they can be seen
alone), never per event: replaying measured durations through the graph tests the graph,
rather than copying the trace.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np

from perfswarm.analyze.dependencies import Dependencies, Wakes, thread_wakes
from perfswarm.analyze.frame import I64, Events, group_rows, lane_key
from perfswarm.analyze.iterations import StepWindow
from perfswarm.analyze.launch import DEVICE_OPS, FULL_QUEUE, queue_steps

HOST_NODE_KINDS: Final = ("cpu_op", "user_annotation", "runtime", "driver")
DEFAULT_LAUNCH_LAG_NS: Final = 5_000
DEFAULT_STREAM_GAP_NS: Final = 1_000
DEFAULT_SYNC_LAG_NS: Final = 2_000
DEFAULT_SYNC_SELF_NS: Final = 5_000  # a sync call's own time when every one seen waited

# Node roles.
HOST, DEVICE, ANCHOR = 0, 1, 2
# Points of a node.
START, END = 0, 1


@dataclass(frozen=True)
class Lags:
    """A rank's typical latencies, read off its trace."""

    launch_ns: int  # launch call start -> device op start, on an idle stream
    stream_gap_ns: int  # previous op end -> next op start, on a busy stream
    sync_ns: int  # device op end -> end of the sync call that waited for it

    def to_dict(self) -> dict[str, int]:
        return {"launch_ns": self.launch_ns, "stream_gap_ns": self.stream_gap_ns,
                "sync_ns": self.sync_ns}


@dataclass(frozen=True, eq=False)
class Graph:
    """Nodes (arrays indexed by node id) and dependency edges between their points."""

    row: I64  # event row (a host node's: the innermost event of its piece), -1 for anchors
    top: I64  # a host node's outermost event (the op its thread called), else -1
    role: I64  # HOST, DEVICE or ANCHOR
    lane: I64  # lane index (host thread or device stream)
    lane_is_host: tuple[bool, ...]
    rank: I64
    ts: I64  # measured start
    end: I64  # measured end
    dur: I64  # duration to simulate (measured; a sync call's: its duration when it did not wait)
    gap: I64  # lane predecessor's end -> start; for a lane's first host node, from `origin`
    prev: I64  # lane predecessor, -1 for the first node of a lane
    origin: int  # the earliest measured start: where host lanes begin
    # dependency edges: node `dst`'s point `dst_point` >= node `src`'s point `src_point` + lag
    src: I64
    src_point: I64
    dst: I64
    dst_point: I64
    lag: I64
    steps: Mapping[int, tuple[tuple[int, int, int], ...]]  # rank -> (step, start, end anchors)
    lags: Mapping[int, Lags]

    def __len__(self) -> int:
        return len(self.row)

    def node_of_row(self) -> dict[int, int]:
        return {int(r): i for i, r in enumerate(self.row.tolist()) if r >= 0}

    def anchor_gaps(self, dur: I64, gap: I64) -> I64:
        """`gap` with the anchors that sit inside a host piece re-placed for its new duration
        (`dur`); the caller's arrays are left as they are.

        A step's marker ends inside the optimizer-step call whose hook closed it (the last
        one after the profiler's stop, milliseconds long): the anchor keeps its offset from
        the piece's start, within the piece's new duration, and the node after the anchors
        keeps its distance from the piece's end. Measured durations leave every gap as is.
        """
        gap = gap.copy()
        following = np.full(len(self), -1, np.int64)
        has_prev = np.flatnonzero(self.prev >= 0)
        following[self.prev[has_prev]] = has_prev
        for a in np.flatnonzero((self.role == ANCHOR) & (self.gap < 0)).tolist():
            piece = int(self.prev[a])
            if piece < 0 or self.role[piece] == ANCHOR:
                continue
            offset = int(self.ts[a] - self.ts[piece])
            kept = min(offset, int(dur[piece]))
            gap[a] = kept - int(dur[piece])
            after = int(following[a])
            while after >= 0 and self.role[after] == ANCHOR:
                after = int(following[after])
            if after >= 0:
                gap[after] += int(dur[piece]) - kept - (int(self.dur[piece]) - offset)
        return gap


def host_segments(ev: Events, rows: I64) -> list[tuple[int, int, int, int]]:
    """The time of one thread's events (sorted by start, longest first) cut where each event is
    the innermost one: (owner row, start, end, outermost row) per piece, in time order.

    A child that sticks out of its parent (the clocks of CPU ops and CUPTI calls differ a
    little) is cut at the parent's end. Runtime calls keep a piece even when zero-length:
    device ops hang on them.
    """
    out: list[tuple[int, int, int, int]] = []
    stack: list[tuple[int, int]] = []  # open events: (row, end)
    cursor = 0  # where the next piece begins
    keep_empty = ev.of_kind("runtime", "driver")

    def piece(row: int, lo: int, hi: int) -> None:
        if hi > lo or (hi == lo and keep_empty[row] and not (out and out[-1][0] == row)):
            out.append((row, lo, hi, stack[0][0]))

    def close_until(t: int) -> None:
        nonlocal cursor
        while stack and stack[-1][1] <= t:
            piece(stack[-1][0], cursor, stack[-1][1])
            cursor = max(cursor, stack[-1][1])
            stack.pop()

    for row, lo, end in zip(rows.tolist(), ev.ts[rows].tolist(), ev.end[rows].tolist(),
                            strict=True):
        close_until(lo)
        if stack and lo > cursor:
            piece(stack[-1][0], cursor, lo)
        cursor = lo
        stack.append((row, min(end, stack[-1][1]) if stack else end))
    close_until(1 << 62)
    return out


def _median(values: Sequence[int] | I64, default: int) -> int:
    arr = np.asarray(values, np.int64)
    return int(np.median(arr)) if len(arr) else default


def rank_lags(ev: Events, deps: Dependencies, rank: int) -> Lags:
    launch, stream_gap, sync = [], [], []
    for op, call in deps.launch_of.items():
        if ev.rank[op] != rank:
            continue
        prev = deps.prev_on_stream.get(op)
        delay = int(ev.ts[op] - ev.ts[call])
        if prev is None or ev.end[prev] <= ev.ts[call]:
            launch.append(delay)  # the stream was idle when the op was launched
        elif ev.end[prev] > ev.ts[call] + delay // 2:
            stream_gap.append(int(ev.ts[op] - ev.end[prev]))  # queued behind `prev`
    for call, target in deps.sync_target.items():
        if ev.rank[call] == rank and ev.end[target] > ev.ts[call]:
            sync.append(int(ev.end[call] - ev.end[target]))
    clip = np.maximum
    return Lags(int(clip(_median(launch, DEFAULT_LAUNCH_LAG_NS), 0)),
                int(clip(_median(stream_gap, DEFAULT_STREAM_GAP_NS), 0)),
                int(clip(_median(sync, DEFAULT_SYNC_LAG_NS), 0)))


class _Builder:
    """Accumulates nodes lane by lane, then edges."""

    def __init__(self, ev: Events) -> None:
        self.ev = ev
        self.row: list[int] = []
        self.top: list[int] = []
        self.role: list[int] = []
        self.lane: list[int] = []
        self.ts: list[int] = []
        self.dur: list[int] = []
        self.lane_is_host: list[bool] = []
        self.lane_rank: list[int] = []
        self.edges: list[tuple[int, int, int, int, int]] = []

    def new_lane(self, is_host: bool, rank: int) -> int:
        self.lane_is_host.append(is_host)
        self.lane_rank.append(rank)
        return len(self.lane_rank) - 1

    def add(self, row: int, role: int, lane: int, ts: int, dur: int, top: int) -> int:
        self.row.append(row)
        self.top.append(top)
        self.role.append(role)
        self.lane.append(lane)
        self.ts.append(ts)
        self.dur.append(dur)
        return len(self.row) - 1

    def edge(self, src: int, src_point: int, dst: int, dst_point: int, lag: int) -> None:
        self.edges.append((src, src_point, dst, dst_point, lag))


def _main_thread(ev: Events, host: I64, rank: int) -> int:
    """The thread of a rank with the most host time: the one that drives the loop."""
    mine = host[ev.rank[host] == rank]
    tids, inverse = np.unique(ev.tid[mine], return_inverse=True)
    busy = np.bincount(inverse, weights=ev.dur[mine])
    return int(tids[int(np.argmax(busy))])


def build_graph(ev: Events, deps: Dependencies, steps: Mapping[int, Sequence[StepWindow]],
                handoffs: Sequence[tuple[int, int]] = ()) -> Graph:
    """The graph of every rank of `ev`; `steps` become anchors on each rank's main thread;
    `handoffs` (producer, consumer) rows, from the execution trace, join threads."""
    b = _Builder(ev)
    last_of: dict[int, int] = {}
    host = np.flatnonzero(ev.of_kind(*HOST_NODE_KINDS) & ~ev.is_step_marker
                          & ((ev.dur > 0) | ev.of_kind("runtime", "driver")))
    node_of: dict[int, int] = {}
    anchors: dict[int, list[tuple[int, int, int]]] = {}
    lane_nodes: list[list[int]] = []
    lane_of_thread: dict[int, int] = {}
    for key, thread in sorted(group_rows(lane_key(ev.rank[host], ev.tid[host]), host).items()):
        pieces = host_segments(ev, thread[np.lexsort((-ev.dur[thread], ev.ts[thread]))])
        rank, tid = int(ev.rank[thread[0]]), int(ev.tid[thread[0]])
        lane = b.new_lane(True, rank)
        lane_of_thread[key] = lane
        # (time, order, index or step): anchors that end a step sort before what starts then
        items = [(lo, 2, i) for i, (_row, lo, _hi, _top) in enumerate(pieces)]
        if tid == _main_thread(ev, host, rank):
            for w in steps.get(rank, ()):
                items += [(w.start, 1, -1 - w.step), (w.end, 0, -1 - w.step)]
        nodes = []
        open_steps: dict[int, int] = {}
        for t, order, what in sorted(items):
            if order == 2:
                row, lo, hi, top = pieces[what]
                node = b.add(row, HOST, lane, lo, hi - lo, top)
                node_of.setdefault(row, node)
                last_of[row] = node
            else:
                node = b.add(-1, ANCHOR, lane, t, 0, -1)
                step = -1 - what
                if order == 1:
                    open_steps[step] = node
                elif step in open_steps:
                    anchors.setdefault(rank, []).append((step, open_steps.pop(step), node))
            nodes.append(node)
        lane_nodes.append(nodes)
    device = np.flatnonzero(ev.of_kind(*DEVICE_OPS))
    # Events are stored sorted by (rank, ts); grouping keeps that order.
    for _key, stream in sorted(group_rows(lane_key(ev.rank[device], ev.stream[device]),
                                          device).items()):
        lane = b.new_lane(False, int(ev.rank[stream[0]]))
        nodes = []
        for r, t, d in zip(stream.tolist(), ev.ts[stream].tolist(), ev.dur[stream].tolist(),
                           strict=True):
            node_of[r] = b.add(r, DEVICE, lane, t, d, -1)
            nodes.append(node_of[r])
        lane_nodes.append(nodes)
    lags = {rank: rank_lags(ev, deps, rank) for rank in ev.ranks}
    n = len(b.row)
    ts, dur = np.array(b.ts, np.int64), np.array(b.dur, np.int64)
    prev = np.full(n, -1, np.int64)
    gap = np.zeros(n, np.int64)
    origin = int(ts.min()) if n else 0
    for lane, nodes in enumerate(lane_nodes):
        arr = np.array(nodes, np.int64)
        if len(arr) == 0:
            continue
        prev[arr[1:]] = arr[:-1]
        gap[arr[1:]] = ts[arr[1:]] - (ts[arr[:-1]] + dur[arr[:-1]])
        gap[arr[0]] = ts[arr[0]] - origin
        if not b.lane_is_host[lane]:
            rank = b.lane_rank[lane]
            # A stream runs its next op a stream gap after the previous one, no sooner
            # than the trace shows (the gap cannot explain a later start: launches do).
            gap[arr[1:]] = np.minimum(gap[arr[1:]], lags[rank].stream_gap_ns)
    _device_edges(b, ev, deps, node_of, lags, dur)
    _wake_edges(b, thread_wakes(ev), lane_of_thread, lane_nodes, gap)
    for producer, consumer in handoffs:
        if producer in last_of and consumer in node_of:
            b.edge(last_of[producer], END, node_of[consumer], START,
                   max(0, int(ev.ts[consumer] - ev.end[producer])))
    src, src_point, dst, dst_point, lag = (np.array(c, np.int64).reshape(-1) for c in
                                           zip(*b.edges, strict=True)) if b.edges else (
        np.zeros(0, np.int64) for _ in range(5))
    lanes = np.array(b.lane, np.int64)
    return Graph(np.array(b.row, np.int64), np.array(b.top, np.int64),
                 np.array(b.role, np.int64), lanes,
                 tuple(b.lane_is_host), np.array(b.lane_rank, np.int64)[lanes] if n else lanes,
                 ts, ts + np.array(b.dur, np.int64), dur, gap, prev, origin,
                 src, src_point, dst, dst_point, lag,
                 {r: tuple(sorted(a)) for r, a in sorted(anchors.items())}, lags)


def _device_edges(b: _Builder, ev: Events, deps: Dependencies, node_of: dict[int, int],
                  lags: Mapping[int, Lags], dur: I64) -> None:
    for op, call in sorted(deps.launch_of.items()):
        if op in node_of and call in node_of:
            lag = min(lags[int(ev.rank[op])].launch_ns, int(ev.ts[op] - ev.ts[call]))
            b.edge(node_of[call], START, node_of[op], START, max(lag, 0))
    for op, recorded in sorted(deps.waits_for.items()):
        if op in node_of and recorded in node_of:
            lag = min(lags[int(ev.rank[op])].stream_gap_ns, int(ev.ts[op] - ev.end[recorded]))
            b.edge(node_of[recorded], END, node_of[op], START, max(lag, 0))
    _sync_edges(b, ev, deps, node_of, lags, dur)
    _queue_edges(b, ev, deps, node_of)
    for op, peers in sorted(deps.peers.items()):
        if op not in node_of or not peers:
            continue
        # The transfer itself: the instance's shortest duration (its last arrival's, which
        # waited for nobody); every member ends that long after the last one entered.
        transfer = min(int(ev.dur[r]) for r in (op, *peers))
        dur[node_of[op]] = transfer
        for p in peers:
            if p in node_of:
                b.edge(node_of[p], START, node_of[op], END, transfer)


def _queue_edges(b: _Builder, ev: Events, deps: Dependencies, node_of: dict[int, int]) -> None:
    """A launch call waits while its rank's launch queue is full (the host ran that far
    ahead of the device): it starts no earlier than the end of the op launched `depth`
    launches before it, `depth` being FULL_QUEUE (HTA's default for CUDA's queue) or the
    deepest queue the rank's trace shows, if deeper."""
    by_rank: dict[int, list[tuple[int, int]]] = {}
    for op, call in deps.launch_of.items():
        if op in node_of and call in node_of:
            by_rank.setdefault(int(ev.rank[op]), []).append((op, call))
    for pairs in by_rank.values():
        pairs.sort(key=lambda p: (int(ev.ts[p[1]]), p[1]))
        ops = np.array([op for op, _ in pairs], np.int64)
        calls = np.array([call for _, call in pairs], np.int64)
        depth = max(FULL_QUEUE, int(queue_steps(ev.ts[calls], ev.end[ops])[1].max()))
        for before, call in zip(ops[:-depth].tolist(), calls[depth:].tolist(), strict=True):
            b.edge(node_of[before], END, node_of[call], START, 0)


def _sync_edges(b: _Builder, ev: Events, deps: Dependencies, node_of: dict[int, int],
                lags: Mapping[int, Lags], dur: I64) -> None:
    """A sync call lasts its no-wait duration, and ends after the op it waited for."""
    calls = [c for c in sorted(deps.sync_target) if c in node_of]
    waited = {c for c in calls if ev.end[deps.sync_target[c]] > ev.ts[c]}
    by_name: dict[tuple[int, int], list[int]] = {}
    for c in calls:
        by_name.setdefault((int(ev.rank[c]), int(ev.name[c])), []).append(c)
    for group in by_name.values():
        free = [int(ev.dur[c]) for c in group if c not in waited]
        self_ns = _median(free, DEFAULT_SYNC_SELF_NS)
        for c in group:
            dur[node_of[c]] = min(self_ns, int(ev.dur[c]))
            target = deps.sync_target[c]
            if target in node_of:
                lag = min(lags[int(ev.rank[c])].sync_ns, int(ev.end[c] - ev.end[target]))
                b.edge(node_of[target], END, node_of[c], END, max(lag, 0))


def _wake_edges(b: _Builder, wakes: Mapping[int, Wakes], lane_of_thread: Mapping[int, int],
                lane_nodes: list[list[int]], gap: I64) -> None:
    """A thread that another thread of its rank handed over to (dependencies.thread_wakes: the
    hand-overs the critical path follows) resumes no earlier than the node of the other thread
    that ended the work it waited for (plus the measured hand-over), and the idle stretch
    before its first node after that no longer holds it back."""
    ev = b.ev
    ts = np.array(b.ts, np.int64)
    end = ts + np.array(b.dur, np.int64)  # as measured
    for key, found in sorted(wakes.items()):
        if key not in lane_of_thread:
            continue
        nodes = np.array(lane_nodes[lane_of_thread[key]], np.int64)
        firsts = np.searchsorted(ts[nodes], found.resume, side="left")
        for first, waker, waker_end in zip(firsts.tolist(), found.waker.tolist(),
                                           found.waker_end.tolist(), strict=True):
            other = lane_of_thread.get(int(lane_key(int(ev.rank[waker]), int(ev.tid[waker]))))
            if first >= len(nodes) or other is None:
                continue
            theirs = np.array(lane_nodes[other], np.int64)
            # a thread's pieces follow one another: their ends rise with their starts
            last = int(np.searchsorted(end[theirs], waker_end, side="right")) - 1
            if last < 0:
                continue
            v, w = int(nodes[first]), int(theirs[last])
            b.edge(w, END, v, START, max(0, int(ts[v] - end[w])))
            gap[v] = 0
