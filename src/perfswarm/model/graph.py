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
synchronizing call ends a sync latency after the device op it waited for; a collective (a
device's, or a CPU process group's on its host thread: gloo's) ends no earlier than its
transfer time (measured from the last rank's entry to its own end) after each other rank
entered it, and one on a host thread starts once the call that issued it has; a thread that
another thread of its rank handed over to (dependencies.thread_wakes, as the critical path
defines it) resumes no earlier than that thread finished (the main thread waiting for the
autograd thread, or for a DataLoader worker), the pieces it sat blocked in keeping none of
that wait; an
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

from perfswarm.analyze.dependencies import Dependencies, Issued, Wakes, issued, thread_wakes
from perfswarm.analyze.frame import DEVICE_OPS, I8, I32, I64, Events, Mask, group_rows, lane_key
from perfswarm.analyze.intervals import sorted_unique, union
from perfswarm.analyze.iterations import StepWindow
from perfswarm.analyze.launch import FULL_QUEUE, queue_steps
from perfswarm.analyze.nesting import bounded_open_before, roots, subtree_ends

HOST_NODE_KINDS: Final = ("cpu_op", "user_annotation", "runtime", "driver")
DEFAULT_LAUNCH_LAG_NS: Final = 5_000
DEFAULT_STREAM_GAP_NS: Final = 1_000
DEFAULT_SYNC_LAG_NS: Final = 2_000
DEFAULT_SYNC_SELF_NS: Final = 5_000  # a sync call's own time when every one seen waited

# Node roles.
HOST, DEVICE, ANCHOR = 0, 1, 2
# Points of a node.
START, END = 0, 1
# An edge's columns (src, src_point, dst, dst_point, lag)
_EDGE_DTYPES: Final = (np.int32, np.int8, np.int32, np.int8, np.int64)


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
    """Nodes (arrays indexed by node id) and dependency edges between their points. Roles,
    points and ranks in the fewest bytes that hold them, event rows and node ids in 32 bits
    (a Run's events and a graph's nodes are fewer than 2**31; times stay 64): the graph is held
    through the whole prediction, a command's peak (158k nodes and 79k edges at 200k trace
    events)."""

    row: I32  # event row (a host node's: the innermost event of its piece), -1 for anchors
    top: I32  # a host node's outermost event (the op its thread called), else -1
    role: I8  # HOST, DEVICE or ANCHOR
    lane: I32  # lane index (host thread or device stream)
    lane_is_host: tuple[bool, ...]
    rank: I32
    ts: I64  # measured start
    end: I64  # measured end
    dur: I64  # duration to simulate (measured; a sync call's: its duration when it did not wait)
    gap: I64  # lane predecessor's end -> start; for a lane's first host node, from `origin`
    prev: I32  # lane predecessor, -1 for the first node of a lane
    origin: int  # the earliest measured start: where host lanes begin
    # dependency edges: node `dst`'s point `dst_point` >= node `src`'s point `src_point` + lag
    src: I32
    src_point: I8
    dst: I32
    dst_point: I8
    lag: I64
    steps: Mapping[int, tuple[tuple[int, int, int], ...]]  # rank -> (step, start, end anchors)
    lags: Mapping[int, Lags]

    def __len__(self) -> int:
        return len(self.row)

    def last_nodes(self, rows: I64) -> I64:
        """The last node of each event row (a host op cut in pieces has several), -1 for none."""
        real = np.flatnonzero(self.row >= 0)[::-1]
        keys, last = np.unique(self.row[real], return_index=True)
        if not len(keys):
            return np.full(len(rows), -1, np.int64)
        at = np.minimum(np.searchsorted(keys, rows), len(keys) - 1)
        return np.where(keys[at] == rows, real[last[at]], -1)

    def idle_gaps(self) -> Mask:
        """Per node: a gap that holds a whole step of its rank, start and end, as measured: its
        thread sat out that step, idle (a pool thread waiting for work others were handed: an
        RPC server's threads take its requests in turn, each idle for seconds between its
        own), not spending the gap in Python before the node. A thread working in the loop
        never does: the loop thread's steps are its own, and a helper thread (autograd's, a
        collective's) works in every step. A lane's first gap, too: it runs from the Run's
        first event (another rank's, another thread's), before its thread was seen at all."""
        idle: Mask = (self.prev < 0) & (self.role == HOST)
        for rank, anchors in self.steps.items():
            marks = np.array(anchors, np.int64).reshape(-1, 3)
            starts, ends = self.ts[marks[:, 1]], self.ts[marks[:, 2]]
            order = np.argsort(starts)
            # of the steps starting in a gap or after it, the earliest end: within the gap?
            earliest = np.minimum.accumulate(ends[order][::-1])[::-1]
            mine = np.flatnonzero((self.rank == rank) & (self.role == HOST) & (self.gap > 0))
            at = np.searchsorted(starts[order], self.ts[mine] - self.gap[mine], side="left")
            held = at < len(order)
            held[held] = earliest[at[held]] <= self.ts[mine[held]]
            idle[mine[held]] = True
        return idle

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


def collective_waits(g: Graph, ev: Events) -> tuple[Mask, Mask]:
    """Per node, time that is a wait on other ranks, not the thread's own: (its time, its gap).
    A CPU process group's collective on its host thread (gloo's, every piece of it): its time
    and its gap, a
    wait for the last rank and for its issue (both priced by the graph's edges); and a gap of
    the thread that issued a collective still in flight when the gap began (after the call
    returned: DDP's reducer waiting for gloo's all-reduce of its buckets, untraced, where the
    collective's range closed after the thread resumed and so no hand-over is seen)."""
    time = (g.top >= 0) & (g.role == HOST) & ev.host_collective[np.maximum(g.top, 0)]
    gap = time.copy()
    found = issued(ev)
    colls = np.fromiter(found.call, np.int64, len(found.call))
    calls = np.fromiter(found.call.values(), np.int64, len(found.call))
    at = g.last_nodes(calls)
    ok = at >= 0
    colls, calls, at = colls[ok], calls[ok], at[ok]
    for lane in np.unique(g.lane[at]).tolist():
        mine = g.lane[at] == lane
        lo, hi = union(ev.end[calls[mine]], ev.end[colls[mine]])
        first, stop = np.searchsorted(g.lane, [lane, lane + 1])
        nodes = first + np.flatnonzero(g.gap[first:stop] > 0)
        began = g.ts[nodes] - g.gap[nodes]
        k = np.searchsorted(lo, began, side="right") - 1
        gap[nodes[(k >= 0) & (began < hi[np.maximum(k, 0)])]] = True
    return time, gap


def host_segments(ev: Events, rows: I64) -> I64:
    """The time of one thread's events (sorted by start, longest first) cut where each event is
    the innermost one: (owner row, start, end, outermost row) per piece, in time order.

    A child that sticks out of its parent (the clocks of CPU ops and CUPTI calls differ a
    little) is cut at the parent's end. Runtime calls keep a piece even when zero-length
    (device ops hang on them).

    An event's pieces: before its first child, between each child's end and the next
    child's start, and from its last child's end (or its start) to its end; a piece between
    children is laid down when the next child starts, an event's last one when the first
    event outside it starts, innermost first (the order a sweep with a stack gives).
    """
    n = len(rows)
    if not n:
        return np.zeros((0, 4), np.int64)
    start = ev.ts[rows]
    parent, bound = bounded_open_before(np.zeros(n, np.int64), start, ev.end[rows])
    at = np.arange(n, dtype=np.int64)
    kids = np.flatnonzero(parent >= 0)  # ascending, so each parent's children in order
    kids = kids[np.argsort(parent[kids], kind="stable")]
    first = np.ones(len(kids), bool)
    first[1:] = parent[kids[1:]] != parent[kids[:-1]]
    before = np.where(first, start[parent[kids]], bound[np.roll(kids, 1)])
    ends = np.ones(len(kids), bool)
    ends[:-1] = first[1:]
    last_kid = np.full(n, -1, np.int64)
    last_kid[parent[kids[ends]]] = kids[ends]
    final_lo = np.where(last_kid >= 0, bound[np.maximum(last_kid, 0)], start)
    gap = before < start[kids]
    # candidates: (owner, lo, hi, laid down at, then finals before gaps, finals innermost first)
    owner = np.concatenate([at, parent[kids][gap]])
    lo = np.concatenate([final_lo, before[gap]])
    hi = np.concatenate([bound, start[kids][gap]])
    when = np.concatenate([subtree_ends(parent), kids[gap]])
    phase = np.concatenate([np.zeros(n, np.int64), np.ones(int(gap.sum()), np.int64)])
    inner = np.concatenate([-at, np.zeros(int(gap.sum()), np.int64)])
    order = np.lexsort((inner, phase, when))
    owner, lo, hi = owner[order], lo[order], hi[order]
    kept = (hi > lo) | ev.of_kind("runtime", "driver")[rows[owner]]
    owner, lo, hi = owner[kept], lo[kept], hi[kept]
    return np.stack([rows[owner], lo, hi, rows[roots(parent)[owner]]], axis=1)


def _median(values: Sequence[int] | I64, default: int) -> int:
    arr = np.asarray(values, np.int64)
    return int(np.median(arr)) if len(arr) else default


def _pairs(pairs: Mapping[int, int]) -> tuple[I64, I64]:
    """A row -> row map as two arrays, by key."""
    keys = np.fromiter(pairs, np.int64, len(pairs))
    values = np.fromiter(pairs.values(), np.int64, len(pairs))
    order = np.argsort(keys, kind="stable")
    return keys[order], values[order]


@dataclass(frozen=True)
class _Pairs:
    """The dependencies the graph reads, as arrays by their first row, made once per graph."""

    ops: I64  # launched device ops
    calls: I64  # their launch calls
    prev: I64  # each launched op's predecessor on its stream, -1 for none
    synced: I64  # synchronizing calls
    targets: I64  # the device op each waited for

    @classmethod
    def of(cls, deps: Dependencies) -> _Pairs:
        ops, calls = deps.launch_of
        keys, values = deps.prev_on_stream
        at = np.minimum(np.searchsorted(keys, ops), max(len(keys) - 1, 0))
        prev = np.where(keys[at] == ops, values[at], -1) if len(keys) else np.full(len(ops), -1)
        return cls(ops, calls, prev, *_pairs(deps.sync_target))


def rank_lags(ev: Events, pairs: _Pairs, rank: int) -> Lags:
    mine = ev.rank[pairs.ops] == rank
    ops, calls, prev = pairs.ops[mine], pairs.calls[mine], pairs.prev[mine]
    prev_end = np.where(prev >= 0, ev.end[prev], 0)
    delay = ev.ts[ops] - ev.ts[calls]
    idle = (prev < 0) | (prev_end <= ev.ts[calls])  # the stream was idle at the launch
    queued = ~idle & (prev_end > ev.ts[calls] + delay // 2)  # queued behind `prev`
    synced, targets = pairs.synced, pairs.targets
    waited = (ev.rank[synced] == rank) & (ev.end[targets] > ev.ts[synced])
    clip = np.maximum
    return Lags(int(clip(_median(delay[idle], DEFAULT_LAUNCH_LAG_NS), 0)),
                int(clip(_median((ev.ts[ops] - prev_end)[queued], DEFAULT_STREAM_GAP_NS), 0)),
                int(clip(_median((ev.end[synced] - ev.end[targets])[waited],
                                 DEFAULT_SYNC_LAG_NS), 0)))


class _Builder:
    """Accumulates nodes lane by lane (a lane's nodes consecutive ids), then edges, in blocks."""

    def __init__(self, ev: Events) -> None:
        self.ev = ev
        self.nodes: list[tuple[I64, ...]] = []  # row, top, role, lane, ts, dur
        self.count = 0
        self.lanes: list[tuple[int, int]] = []  # each lane's node ids: range(first, stop)
        self.lane_is_host: list[bool] = []
        self.lane_rank: list[int] = []
        self.node_of = np.full(len(ev), -1, np.int64)  # row -> its (first) node
        self.last_of = np.full(len(ev), -1, np.int64)  # row -> its last node
        self.edges: list[tuple[I64, I8, I64, I8, I64]] = []

    def lane(self, is_host: bool, rank: int, rows: I64, top: I64, role: I64, ts: I64,
             dur: I64) -> I64:
        """A new lane of these nodes (rows -1 for anchors); their ids."""
        ids = self.count + np.arange(len(rows), dtype=np.int64)
        self.nodes.append((rows, top, role, np.full(len(rows), len(self.lanes), np.int64), ts, dur))
        self.lanes.append((self.count, self.count + len(rows)))
        self.lane_is_host.append(is_host)
        self.lane_rank.append(rank)
        self.count += len(rows)
        real = rows >= 0
        r, i = rows[real], ids[real]
        _, first = np.unique(r, return_index=True)
        _, last = np.unique(r[::-1], return_index=True)
        self.node_of[r[first]] = i[first]
        self.last_of[r[::-1][last]] = i[::-1][last]
        return ids

    def edge(self, src: I64, src_point: int, dst: I64, dst_point: int, lag: I64) -> None:
        """Edges from nodes `src` to nodes `dst`, each at least `lag` (clipped at 0) apart."""
        self.edges.append((src, np.full(len(src), src_point, np.int8), dst,
                           np.full(len(src), dst_point, np.int8), np.maximum(lag, 0)))

    def column(self, i: int) -> I64:
        return np.concatenate([np.asarray(b[i], np.int64) for b in self.nodes]) \
            if self.nodes else np.zeros(0, np.int64)


def _main_thread(ev: Events, host: I64, rank: int) -> int:
    """The thread of a rank with the most host time: the one that drives the loop."""
    mine = host[ev.rank[host] == rank]
    tids, inverse = np.unique(ev.tid[mine], return_inverse=True)
    busy = np.bincount(inverse, weights=ev.dur[mine])
    return int(tids[int(np.argmax(busy))])


def _host_lane(b: _Builder, thread: I64, windows: Sequence[StepWindow],
               anchors: list[tuple[int, int, int]]) -> None:
    """One thread's pieces as a lane, with the anchors of `windows` among them; each step
    whose start and end anchors are both there goes to `anchors` as (step, start, end)."""
    ev = b.ev
    pieces = host_segments(ev, thread[np.lexsort((-ev.dur[thread], ev.ts[thread]))])
    rank = int(ev.rank[thread[0]])
    step = np.array([w.step for w in windows], np.int64)
    # (time, order, index or step): anchors that end a step sort before what starts then
    time = np.concatenate([pieces[:, 1], np.array([w.start for w in windows], np.int64),
                           np.array([w.end for w in windows], np.int64)])
    order = np.repeat(np.array([2, 1, 0], np.int64), [len(pieces), len(step), len(step)])
    what = np.concatenate([np.arange(len(pieces)), -1 - step, -1 - step]).astype(np.int64)
    sort = np.lexsort((what, order, time))
    what, order = what[sort], order[sort]
    piece = np.where(order == 2, what, 0)
    is_piece = order == 2
    rows = np.where(is_piece, pieces[piece, 0], -1)
    ids = b.lane(True, rank, rows, np.where(is_piece, pieces[piece, 3], -1),
                 np.where(is_piece, HOST, ANCHOR), time[sort],
                 np.where(is_piece, pieces[piece, 2] - pieces[piece, 1], 0))
    open_steps: dict[int, int] = {}
    at = np.flatnonzero(~is_piece)
    for node, kind, s in zip(ids[at].tolist(), order[at].tolist(), (-1 - what[at]).tolist(),
                             strict=True):
        if kind == 1:
            open_steps[s] = node
        elif s in open_steps:
            anchors.append((s, open_steps.pop(s), node))


def build_graph(ev: Events, deps: Dependencies, steps: Mapping[int, Sequence[StepWindow]],
                handoffs: Sequence[tuple[int, int]] = ()) -> Graph:
    """The graph of every rank of `ev`; `steps` become anchors on each rank's main thread;
    `handoffs` (producer, consumer) rows, from the execution trace, join threads."""
    b = _Builder(ev)
    host = np.flatnonzero(ev.of_kind(*HOST_NODE_KINDS) & ~ev.is_step_marker
                          & ((ev.dur > 0) | ev.of_kind("runtime", "driver")))
    anchors: dict[int, list[tuple[int, int, int]]] = {}
    lane_of_thread: dict[int, int] = {}
    for key, thread in sorted(group_rows(lane_key(ev.rank[host], ev.tid[host]), host).items()):
        rank, tid = int(ev.rank[thread[0]]), int(ev.tid[thread[0]])
        lane_of_thread[key] = len(b.lanes)
        main = tid == _main_thread(ev, host, rank)
        _host_lane(b, thread, steps.get(rank, ()) if main else (), anchors.setdefault(rank, []))
    device = np.flatnonzero(ev.of_kind(*DEVICE_OPS))
    # Events are stored sorted by (rank, ts); grouping keeps that order.
    for _key, stream in sorted(group_rows(lane_key(ev.rank[device], ev.stream[device]),
                                          device).items()):
        b.lane(False, int(ev.rank[stream[0]]), stream, np.full(len(stream), -1),
               np.full(len(stream), DEVICE), ev.ts[stream], ev.dur[stream])
    pairs = _Pairs.of(deps)
    lags = {rank: rank_lags(ev, pairs, rank) for rank in ev.ranks}
    n = b.count
    ts, dur = b.column(4), b.column(5)
    prev = np.full(n, -1, np.int64)
    gap = np.zeros(n, np.int64)
    origin = int(ts.min()) if n else 0
    for lane, (first, stop) in enumerate(b.lanes):
        if stop == first:
            continue
        prev[first + 1:stop] = np.arange(first, stop - 1)
        gap[first + 1:stop] = ts[first + 1:stop] - (ts[first:stop - 1] + dur[first:stop - 1])
        gap[first] = ts[first] - origin
        if not b.lane_is_host[lane]:
            # A stream runs its next op a stream gap after the previous one, no sooner
            # than the trace shows (the gap cannot explain a later start: launches do).
            gap[first + 1:stop] = np.minimum(gap[first + 1:stop],
                                             lags[b.lane_rank[lane]].stream_gap_ns)
    measured_end = ts + dur  # before a collective's duration becomes its transfer's
    _device_edges(b, deps, pairs, lags, dur)
    _collective_edges(b, deps, issued(ev), dur, gap)
    _wake_edges(b, thread_wakes(ev), lane_of_thread, ts, measured_end, b.column(2) == HOST, dur,
                gap)
    if handoffs:
        producer, consumer = np.array(handoffs, np.int64).reshape(-1, 2).T
        ok = (b.last_of[producer] >= 0) & (b.node_of[consumer] >= 0)
        b.edge(b.last_of[producer[ok]], END, b.node_of[consumer[ok]], START,
               ev.ts[consumer[ok]] - ev.end[producer[ok]])
    src, src_point, dst, dst_point, lag = (
        np.concatenate([np.asarray(e[i], kind) for e in b.edges]) if b.edges
        else np.zeros(0, kind) for i, kind in enumerate(_EDGE_DTYPES))
    lanes = b.column(3).astype(np.int32)
    return Graph(b.column(0).astype(np.int32), b.column(1).astype(np.int32),
                 b.column(2).astype(np.int8), lanes,
                 tuple(b.lane_is_host), np.array(b.lane_rank, np.int32)[lanes],
                 ts, ts + b.column(5), dur, gap, prev.astype(np.int32), origin,
                 src, src_point, dst, dst_point, lag,
                 {r: tuple(sorted(a)) for r, a in sorted(anchors.items()) if a}, lags)


def _rank_lag(ev: Events, rows: I64, lags: Mapping[int, Lags], name: str) -> I64:
    """Each row's rank's typical latency `name` (a field of Lags)."""
    out = np.zeros(len(rows), np.int64)
    for rank, lag in lags.items():
        out[ev.rank[rows] == rank] = getattr(lag, name)
    return out


def _device_edges(b: _Builder, deps: Dependencies, pairs: _Pairs, lags: Mapping[int, Lags],
                  dur: I64) -> None:
    ev = b.ev
    ok = (b.node_of[pairs.ops] >= 0) & (b.node_of[pairs.calls] >= 0)
    ops, calls = pairs.ops[ok], pairs.calls[ok]  # launches whose both ends are nodes
    b.edge(b.node_of[calls], START, b.node_of[ops], START,
           np.minimum(_rank_lag(ev, ops, lags, "launch_ns"), ev.ts[ops] - ev.ts[calls]))
    _queue_edges(b, ops, calls)
    ops, recorded = _pairs(deps.waits_for)
    ok = (b.node_of[ops] >= 0) & (b.node_of[recorded] >= 0)
    ops, recorded = ops[ok], recorded[ok]
    b.edge(b.node_of[recorded], END, b.node_of[ops], START,
           np.minimum(_rank_lag(ev, ops, lags, "stream_gap_ns"), ev.ts[ops] - ev.end[recorded]))
    _sync_edges(b, pairs, lags, dur)


def _collective_edges(b: _Builder, deps: Dependencies, found: Issued, dur: I64, gap: I64
                      ) -> None:
    """A collective (a device's, or a CPU process group's on its host thread) ends no earlier
    than its transfer after each other rank entered it, and lasts its transfer: the rest of
    its measured time was a wait for the last rank. One on a host thread (gloo's) starts once
    the call that issued it has (as long after it as measured, or as long after its thread's
    previous piece where that was later: queued behind it), not after its thread's stretch
    before it: that was a wait for the issue, no Python of the thread's."""
    ev = b.ev
    for op, peers in sorted(deps.peers.items()):
        if b.node_of[op] < 0 or not peers:
            continue
        if ev.host_collective[op] and (b.last_of[op] != b.node_of[op]
                                       or max(ev.ts[peers]) > ev.end[op]):
            # kept as measured: a range around ops of its thread (gloo's all-gather copying
            # the shards in), whose wait the graph cannot place among them; or one that ended
            # before a peer entered, no instance of the same collective (its process group
            # unknown to the trace, the ranks' n-th all-reduces in different subgroups)
            continue
        # The transfer itself: from the moment the last member entered to this member's end
        # (the last arrival's whole duration: it waited for nobody); this member ends that
        # long after each other member entered, whenever they do.
        last = max(int(ev.ts[r]) for r in (op, *peers))
        transfer = max(int(ev.end[op]) - last, 0)
        dur[b.node_of[op]] = min(transfer, int(ev.dur[op]))
        theirs = b.node_of[np.array(peers, np.int64)]
        theirs = theirs[theirs >= 0]
        b.edge(theirs, START, np.full(len(theirs), b.node_of[op]), END,
               np.full(len(theirs), transfer))
    colls = np.fromiter(found.call, np.int64, len(found.call))
    calls = np.fromiter(found.call.values(), np.int64, len(found.call))
    ok = (b.node_of[colls] >= 0) & (b.node_of[calls] >= 0) if len(colls) else colls > 0
    colls, calls = colls[ok], calls[ok]
    nodes = b.node_of[colls]
    b.edge(b.node_of[calls], START, nodes, START,
           np.minimum(np.maximum(ev.ts[colls] - ev.ts[calls], 0), gap[nodes]))
    gap[nodes] = 0


def _queue_edges(b: _Builder, ops: I64, calls: I64) -> None:
    """A launch call waits while its rank's launch queue is full (the host ran that far
    ahead of the device): it starts no earlier than the end of the op launched `depth`
    launches before it, `depth` being FULL_QUEUE (HTA's default for CUDA's queue) or the
    deepest queue the rank's trace shows, if deeper."""
    ev = b.ev
    for rank in sorted_unique(ev.rank[ops]).tolist():
        mine = ev.rank[ops] == rank
        order = np.lexsort((calls[mine], ev.ts[calls[mine]]))
        o, c = ops[mine][order], calls[mine][order]
        depth = max(FULL_QUEUE, int(queue_steps(ev.ts[c], ev.end[o])[1].max()))
        b.edge(b.node_of[o[:-depth]], END, b.node_of[c[depth:]], START,
               np.zeros(max(len(c) - depth, 0), np.int64))


def _sync_edges(b: _Builder, pairs: _Pairs, lags: Mapping[int, Lags], dur: I64) -> None:
    """A sync call lasts its no-wait duration, and ends after the op it waited for."""
    ev = b.ev
    ok = b.node_of[pairs.synced] >= 0
    calls, targets = pairs.synced[ok], pairs.targets[ok]
    waited = ev.end[targets] > ev.ts[calls]
    for _key, group in sorted(group_rows(
            lane_key(ev.rank[calls], ev.name[calls]), np.arange(len(calls))).items()):
        self_ns = _median(ev.dur[calls[group[~waited[group]]]], DEFAULT_SYNC_SELF_NS)
        dur[b.node_of[calls[group]]] = np.minimum(self_ns, ev.dur[calls[group]])
    ok = b.node_of[targets] >= 0
    calls, targets = calls[ok], targets[ok]
    b.edge(b.node_of[targets], END, b.node_of[calls], END,
           np.minimum(_rank_lag(ev, calls, lags, "sync_ns"), ev.end[calls] - ev.end[targets]))


def _wake_edges(b: _Builder, wakes: Mapping[int, Wakes], lane_of_thread: Mapping[int, int],
                ts: I64, end: I64, piece: Mask, dur: I64, gap: I64) -> None:
    """A thread that another thread of its rank handed over to (dependencies.thread_wakes: the
    hand-overs the critical path follows) resumes no earlier than the node of the other thread
    that ended the work it waited for (plus the measured hand-over), and its blocked stretch
    no longer holds it back (`ts`, `end`: as measured): not the idle time before its first
    node after that, nor the pieces it sat blocked in (a range open around the wait, FSDP's
    all-gather: their time was the wait, as a sync call's beyond its own is) back to a step's
    anchor, which stays where it was measured. Kept in those pieces, their typical wait came
    on top of the hand-over (FSDP2 on two gloo ranks predicted 4-6% over its steps' mean at
    its own configuration)."""
    ev = b.ev
    for key, found in sorted(wakes.items()):
        if key not in lane_of_thread:
            continue
        first, stop = b.lanes[lane_of_thread[key]]
        resumed = first + np.searchsorted(ts[first:stop], found.resume, side="left")
        for v, resume, waker, waker_end, blocked in zip(
                resumed.tolist(), found.resume.tolist(), found.waker.tolist(),
                found.waker_end.tolist(), found.blocked.tolist(), strict=True):
            other = lane_of_thread.get(int(lane_key(int(ev.rank[waker]), int(ev.tid[waker]))))
            if v >= stop or other is None:
                continue
            theirs, their_stop = b.lanes[other]
            # a thread's pieces follow one another: their ends rise with their starts
            w = theirs + int(np.searchsorted(end[theirs:their_stop], waker_end, side="right")) - 1
            if w < theirs:
                continue
            b.edge(np.array([w]), END, np.array([v]), START, np.array([ts[v] - end[w]]))
            gap[v] = 0
            u = v - 1
            while u >= first and piece[u] and end[u] > blocked:  # latest first, and their gaps
                dur[u] = min(dur[u], end[u] - ts[u] - (min(end[u], resume) - max(ts[u], blocked)))
                if u > first:
                    gap[u] = min(gap[u], max(blocked - end[u - 1], 0))
                u -= 1
