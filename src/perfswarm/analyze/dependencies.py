"""What each device op and host sync call waited for, resolved once from a Run's events.

A device op waits for the previous op on its stream, for the runtime call that
launched it (joined by rank and correlation id), and for the op recorded by a CUDA
event its stream was told to wait on (cudaStreamWaitEvent). A synchronizing host
call (device, stream or event sync, synchronous memcpy, a copy from or to pageable
memory) waits for the device op it synchronized with. A collective waits for the same
collective on every other rank of its process group (the n-th occurrence of a name in
the group matches the n-th elsewhere: stragglers.Instance). A host thread that sat blocked
and resumed right after another thread of its rank finished a stretch of work waited for
that thread (a hand-over: the main thread for the autograd thread, the autograd thread for
the main thread's backward call, a DataLoader or comm thread). The critical path walks these
backwards; the simulator (model/graph.py) replays them forwards.
"""

from __future__ import annotations

import functools
import re
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, NamedTuple

import msgspec
import numpy as np
import numpy.typing as npt

from perfswarm.analyze.frame import (
    DEVICE_OPS,
    I64,
    KIND,
    WORK_KINDS,
    Events,
    detail_of,
    group_rows,
    lane_key,
)
from perfswarm.analyze.groups import NO_GROUPS, Groups
from perfswarm.analyze.intervals import Coverage, innermost, sorted_unique, union
from perfswarm.analyze.launch import launch_pairs
from perfswarm.analyze.nesting import LOWEST, open_before
from perfswarm.analyze.stragglers import instances_of
from perfswarm.trace.store import Run

# Runtime calls that block the host until the device has done the work before them: the
# synchronizes, and a synchronous cudaMemcpy (not ...Async), which returns only when its copy is
# complete. The one definition of a sync: the dependency graph and the advice both read it.
SYNC_CALLS: Final = frozenset({"cudaDeviceSynchronize", "cudaStreamSynchronize",
                               "cudaEventSynchronize", "cudaMemcpy", "hipDeviceSynchronize",
                               "hipStreamSynchronize", "hipEventSynchronize", "hipMemcpy",
                               "hipMemcpyWithStream"})
PAGEABLE: Final = "Pageable"  # in the name of a copy from or to pageable host memory

# Hand-overs between threads: a thread blocked this long may have been waiting on another
WAKE_MIN_GAP_NS: Final = 20_000
WAKE_MAX_LAG_NS: Final = 50_000  # ... that finished at most this long before it resumed,
WAKE_MAX_LAG_SHARE: Final = 0.05  # or this share of the blocked stretch,
WAKE_MIN_BUSY_SHARE: Final = 0.5  # and that worked through this much of the stretch at least
# ... or, when no other thread of the rank began anything between the two, finished at most this
# share of the stretch before it resumed: the blocked thread's own untraced Python after it woke
# (nanoGPT on an H200, profiled: 0.6 ms from the autograd thread's last op to clip_grad_norm_'s
# first, after a 9.5 ms backward)
WAKE_QUIET_LAG_SHARE: Final = 0.25
# torch's range around the wait for a DataLoader's next batch (its iterator's __next__, which
# torch.profiler records as `enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__`).
# A thread blocked there waits for the worker (or pin-memory thread) that made the batch,
# however long the batch then takes to arrive: the worker pickles it into shared memory and
# queues it after its fetch, and the waiting thread rebuilds it, none of which is traced.
LOADER_WAIT: Final = re.compile(r"^enumerate\(DataLoader\)#.*\.__next__$")
# A functional collective's wait (DTensor's redistributions, torch.compile's collectives): the
# calling thread sits in this op, no op inside, until its process group's work is done; on a
# CPU process group (gloo) that work is a collective on a comm thread of the rank, which ends
# inside the wait. The thread is blocked there, not working, however late it returns (on a
# loaded machine, milliseconds after the collective: tp_mlp's rank 0 once 4.0 ms): its time
# was the wait for the collective, and so for the last rank to enter it.
COLLECTIVE_WAIT: Final = re.compile(r"^_c10d_functional::wait_tensor$")
# TorchScript's inter-op parallelism (torch.jit.fork): the forked function runs on an inter-op
# thread inside a range of this name, started from inside the op of the thread that forked it
# (a scripted `forward`, one op over the whole function); its wait (torch.jit.wait) is not
# traced: the forking thread sits inside that op with no op of its own until the fork's work
# is done (or, where the interpreter suspended at the wait, until the rest of the function,
# continued on another inter-op thread, is)
FORKED: Final = "<forked function>"
# torch.distributed.autograd.backward: one op on the calling thread, which hands its graph to
# the distributed engine's thread (its first node there the graph's root, GRAPH_ROOT) and waits
# for it and for the other workers' backwards (analyze/rpc.py)
DIST_BACKWARD: Final = "torch::distributed::autograd::backward"
GRAPH_ROOT: Final = "torch::autograd::GraphRoot"


class SyncArgs(msgspec.Struct):
    cuda_sync_kind: str = ""
    stream: int = -1
    wait_on_stream: int = -1
    wait_on_cuda_event_record_corr_id: int = -1


@dataclass(frozen=True)
class SyncEvent:
    row: int
    kind: str  # "Stream Wait Event", "Event Sync", "Stream Sync", "Context Sync"
    stream: int
    wait_on_stream: int
    record_correlation: int


def sync_events(run: Run, ev: Events, rank: int | None = None) -> list[SyncEvent]:
    """The `sync` rows with the fields of their args that say what they waited on (`ev` is
    the Run's events, or those of `rank`)."""
    rows = np.flatnonzero(ev.of_kind("sync"))
    if len(rows) == 0:
        return []
    args = detail_of(run, rows, rank)
    out = []
    for row, text in zip(rows.tolist(), args, strict=True):
        a = msgspec.json.decode(text or "{}", type=SyncArgs)
        out.append(SyncEvent(row, a.cuda_sync_kind, a.stream, a.wait_on_stream,
                             a.wait_on_cuda_event_record_corr_id))
    return out


Rows = tuple[I64, I64]  # a row -> row map: keys ascending, each key's value
_NO_ROWS: Rows = (np.zeros(0, np.int64), np.zeros(0, np.int64))


@dataclass(frozen=True)
class RowMap:
    """A row -> row map (Rows) that a walk looks up a row at a time, kept as its arrays: the
    critical path asks for the few thousand device ops it passes of a trace's 40k, whose
    maps as dicts had been 7.8 MB of a 200k-event trace at analyze's peak."""

    keys: I64 = field(default_factory=lambda: _NO_ROWS[0])  # ascending
    values: I64 = field(default_factory=lambda: _NO_ROWS[1])

    def get(self, row: int) -> int | None:
        i = int(np.searchsorted(self.keys, row))
        return int(self.values[i]) if i < len(self.keys) and int(self.keys[i]) == row else None

    def __contains__(self, row: int) -> bool:
        return self.get(row) is not None


@dataclass
class Dependencies:
    """Event rows -> the rows they waited for (see the module docstring)."""

    # the two maps of every device op as arrays, by the op's row (ascending): 40k launches of
    # a 200k-event trace had been 7.8 MB of dicts, held to the prediction's peak
    prev_on_stream: Rows = field(default_factory=lambda: _NO_ROWS)  # -> previous start
    launch_of: Rows = field(default_factory=lambda: _NO_ROWS)  # device op -> launch call
    waits_for: dict[int, int] = field(default_factory=dict)  # device op -> recorded op
    sync_target: dict[int, int] = field(default_factory=dict)  # host call -> device op
    peers: dict[int, list[int]] = field(default_factory=dict)  # collective -> same on others


def _last_launched_before(ops: I64, launch_ts: I64, t: int) -> int | None:
    """Of `ops` (sorted by launch time), the last launched before t."""
    i = int(np.searchsorted(launch_ts, t, side="left")) - 1
    return int(ops[i]) if i >= 0 else None


class _LatestEnd:
    """Of a pool of device ops (not empty), the one that ends last among those launched and
    started before t (the first in the pool's order of that end), for many t: each op is
    eligible from the later of its launch and its start, so a running maximum over the ops in
    that order, one binary search per t (not a pass over the pool per sync)."""

    def __init__(self, ev: Events, pool: I64, launch_ts: I64) -> None:
        n = len(pool)
        eligible = np.maximum(launch_ts[pool], ev.ts[pool])
        order = np.argsort(eligible, kind="stable")
        self.eligible = eligible[order]
        # the latest end, ties to the earliest in the pool: one int to maximize
        end_rank = np.unique(ev.end[pool], return_inverse=True)[1].reshape(-1)
        score = end_rank.astype(np.int64) * n + (n - 1 - np.arange(n))
        best = np.maximum.accumulate(score[order])
        self.rows = pool[n - 1 - best % n]

    def before(self, t: int) -> int | None:
        i = int(np.searchsorted(self.eligible, t, side="left"))
        return int(self.rows[i - 1]) if i else None


def dependencies(ev: Events, syncs: list[SyncEvent], groups: Groups = NO_GROUPS) -> Dependencies:
    """`groups`: the named process groups of `ev`'s collectives (groups.process_groups)."""
    d = Dependencies()
    dev_all = np.flatnonzero(ev.of_kind(*DEVICE_OPS))
    dev, calls = launch_pairs(ev)
    d.launch_of = dev, calls
    launch_ts = ev.ts.copy()
    launch_ts[dev] = ev.ts[calls]
    by_stream: dict[int, I64] = {}  # device ops of a (rank, stream), by launch time
    stream_launch: dict[int, I64] = {}  # and their launch times
    later, earlier = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    for key, lane in group_rows(lane_key(ev.rank[dev_all], ev.stream[dev_all]), dev_all).items():
        rows = lane[np.argsort(ev.ts[lane], kind="stable")]
        by_stream[key] = rows[np.argsort(launch_ts[rows], kind="stable")]
        stream_launch[key] = launch_ts[by_stream[key]]
        later.append(rows[1:])
        earlier.append(rows[:-1])
    ops = np.concatenate(later)
    order = np.argsort(ops, kind="stable")
    d.prev_on_stream = ops[order], np.concatenate(earlier)[order]
    all_calls = np.flatnonzero(ev.of_kind("runtime", "driver") & (ev.correlation >= 0))
    call_keys = lane_key(ev.rank[all_calls], ev.correlation[all_calls])
    order = np.argsort(call_keys, kind="stable")
    call_keys, all_calls = call_keys[order], all_calls[order]

    def call_of_corr(rank: int, correlation: int) -> int | None:
        key = int(lane_key(rank, correlation))
        i = int(np.searchsorted(call_keys, key))
        return int(all_calls[i]) if i < len(call_keys) and call_keys[i] == key else None

    def recorded(rank: int, stream: int, record_corr: int) -> int | None:
        call = call_of_corr(rank, record_corr)
        key = int(lane_key(rank, stream))
        ops = by_stream.get(key)
        if call is None or ops is None:
            return None
        return _last_launched_before(ops, stream_launch[key], int(ev.ts[call]))

    rank_dev = {r: dev_all[ev.rank[dev_all] == r] for r in ev.ranks}

    @functools.cache
    def latest_end(pool_key: tuple[str, int]) -> _LatestEnd | None:
        kind, key = pool_key
        pool = by_stream.get(key) if kind == "stream" else rank_dev.get(key)
        return _LatestEnd(ev, pool, launch_ts) if pool is not None and len(pool) else None

    def latest_end_before(pool_key: tuple[str, int], t: int) -> int | None:
        found = latest_end(pool_key)
        return found.before(t) if found is not None else None

    for s in syncs:
        rank = int(ev.rank[s.row])
        call = call_of_corr(rank, int(ev.correlation[s.row]))
        if s.kind == "Stream Wait Event":
            target = recorded(rank, s.wait_on_stream, s.record_correlation)
            key = int(lane_key(rank, s.stream))
            waiting = by_stream.get(key)
            if target is None or waiting is None or call is None:
                continue
            after = int(np.searchsorted(stream_launch[key], ev.ts[call], side="right"))
            if after < len(waiting):  # the first op launched after the call
                d.waits_for[int(waiting[after])] = target
            continue
        if call is None:
            continue
        if s.kind == "Event Sync":
            target = recorded(rank, s.wait_on_stream, s.record_correlation)
        else:
            pool = (("stream", int(lane_key(rank, s.stream))) if s.kind == "Stream Sync"
                    else ("rank", rank))
            target = latest_end_before(pool, int(ev.end[call]))
        if target is not None:
            d.sync_target[call] = target
    # A copy from or to pageable memory holds its call until it is done (it is staged through
    # a bounce buffer; CUDA's API notes on sync behaviour): the call waits for its own copy.
    pageable = [i for i, n in enumerate(ev.names) if PAGEABLE in n]
    copies = (ev.kind[dev] == KIND["memcpy"]) & np.isin(ev.name[dev], pageable)
    for op, call in zip(dev[copies].tolist(), calls[copies].tolist(), strict=True):
        d.sync_target.setdefault(call, op)
    # Old traces have no sync events: a synchronizing call waits for everything launched.
    sync_names = [i for i, n in enumerate(ev.names) if n in SYNC_CALLS]
    for call in np.flatnonzero(ev.of_kind("runtime") & np.isin(ev.name, sync_names)).tolist():
        if call not in d.sync_target:
            target = latest_end_before(("rank", int(ev.rank[call])), int(ev.end[call]))
            if target is not None:
                d.sync_target[call] = target
    _collective_peers(ev, d, groups)
    return d


def launching_op_rows(ev: Events, external_id: I64, device_rows: I64) -> I64:
    """Of each of `device_rows`, the CPU op that launched it, -1 for none: the innermost CPU op
    on the launch call's thread around the call (the call joined by correlation id); for a
    device op without a launch call in the trace, the op of its External id (Kineto gives the
    External id of that innermost op, except where it numbers kernels by their correlation
    instead, a range no CPU op has). `external_id` is the events' column; the join of every
    device op is made once per Events object (the op table and the prediction both ask), as
    arrays (no dict of them all: 40k rows at 200k events)."""
    rows, ops = ev.derived("launching ops", lambda: _launching_ops(
        ev, external_id, np.flatnonzero(ev.of_kind(*DEVICE_OPS))))
    return looked_up(rows, ops, device_rows)


def looked_up(keys: I64, values: I64, want: I64) -> I64:
    """values[i] where keys[i] (ascending, unique) is each of `want`, -1 for one not there."""
    want = np.asarray(want, np.int64)
    at = np.clip(np.searchsorted(keys, want), 0, max(len(keys) - 1, 0))
    found = keys[at] == want if len(keys) else np.zeros(len(want), bool)
    return np.where(found, values[at] if len(keys) else -1, -1).astype(np.int64)


def _launching_ops(ev: Events, external_id: I64, device_rows: I64) -> tuple[I64, I64]:
    """(device rows with a launching op, ascending; those ops): by launch call, else by
    External id. Arrays, no dict of rows: a dict of 40k rows is 3.6 MB of int objects,
    made and turned back into arrays (5-7 CPU ms at 200k events)."""
    dev, calls = launch_pairs(ev)
    op = looked_up(*enclosing_rows(ev, calls), calls)
    joined, joined_op = dev[op >= 0], op[op >= 0]
    rest = device_rows[~np.isin(device_rows, joined)]
    ops = np.flatnonzero(ev.of_kind("cpu_op") & (external_id >= 0))
    keys = lane_key(ev.rank[ops], external_id[ops])
    order = np.argsort(keys, kind="stable")
    keys, ops = keys[order], ops[order]
    rest = rest[external_id[rest] >= 0]
    want = lane_key(ev.rank[rest], external_id[rest])
    at = np.clip(np.searchsorted(keys, want), 0, max(len(keys) - 1, 0))
    found = (keys[at] == want) if len(keys) else np.zeros(len(rest), bool)
    rows = np.concatenate([joined, rest[found]])
    order = np.argsort(rows, kind="stable")
    return rows[order], np.concatenate([joined_op, ops[at[found]]])[order]


def enclosing_ops(ev: Events, calls: I64, ops: I64 | None = None) -> dict[int, int]:
    """Call row -> the innermost of `ops` around it (enclosing_rows) as a dict."""
    inner, outer = enclosing_rows(ev, calls, ops)
    return dict(zip(inner.tolist(), outer.tolist(), strict=True))


def enclosing_rows(ev: Events, calls: I64, ops: I64 | None = None) -> tuple[I64, I64]:
    """The rows of `calls` that lie in one of `ops` (rows of CPU ops; default all of them),
    ascending, and for each the innermost of `ops` on its rank and thread that starts no later
    and ends no earlier than the call: arrays, not a dict of Python ints (a dict of the 100k
    calls of a 200k-event trace was 14 MB, made and dropped by each of its users).

    The definition is a sweep per thread (by start, longer first, a call before an op of the
    same span) with a stack of open ops: each event first closes the ops on top that ended by
    its start and before its end (a zero-length call at an op's end stays inside it); an op
    is then pushed, and a call takes the top if that ends no earlier than the call. The top
    is found without the sweep: the nearest earlier op ending after the event's bound, its
    start, or one less while only zero-length events began there (the bounds of a thread's
    events never fall, but for those). No event since has reached that op's end, so it is
    open; every op after it ended by the bound, and was closed when it was on top, or with
    what was above it.
    """
    ops = np.flatnonzero(ev.of_kind("cpu_op")) if ops is None else ops
    if len(ops) == 0 or len(calls) == 0:  # no sweep over the calls when nothing holds them
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    rows = np.concatenate([ops, sorted_unique(calls)])
    call = np.zeros(len(rows), bool)
    call[len(ops):] = True
    order = np.lexsort((~call, -ev.end[rows], ev.ts[rows], ev.tid[rows], ev.rank[rows]))
    rows, call = rows[order], call[order]
    # each array of the sweep is freed once read: the prediction's launching ops sweep 100k
    # calls beside its whole graph, at a command's peak
    del order
    lane = lane_key(ev.rank[rows], ev.tid[rows])
    end = ev.end[rows]
    closes = np.where(call, LOWEST, end)
    top = open_before(lane, _sweep_bounds(lane, ev.ts[rows], end), closes)
    del lane, closes
    take = np.flatnonzero(call & (top >= 0))
    take = take[end[top[take]] >= end[take]]
    inner, outer = rows[take], rows[top[take]]
    order = np.argsort(inner, kind="stable")
    return inner[order], outer[order]


def _sweep_bounds(lane: I64, start: I64, end: I64) -> I64:
    """Each event's bound in `enclosing_rows`' sweep (events by lane, then start): its start,
    or one less while only zero-length events began there on its lane."""
    at = np.arange(len(start), dtype=np.int64)
    new_group = np.ones(len(start), bool)  # a thread's events of one start
    new_group[1:] = (lane[1:] != lane[:-1]) | (start[1:] != start[:-1])
    group_start = np.maximum.accumulate(np.where(new_group, at, 0))
    del new_group
    spans = np.concatenate([[0], np.cumsum(end > start)])  # events with a length, before each
    return np.where(spans[at + 1] > spans[group_start], start, start - 1)


def tensor_handoffs(run: Run, ev: Events) -> list[tuple[int, int]]:
    """(producer row, consumer row) of the execution trace's tensor edges that cross threads:
    an op on one thread consumed a tensor an op on another thread produced (ET nodes join
    events by rank and rf_id). Edges within a thread are implied by its order."""
    edges = run.table("graph_edges")
    if edges.num_rows == 0:
        return []
    nodes = run.table("graph_nodes", columns=["rank", "node_id", "rf_id"]).to_pydict()
    rf = run.table("events", columns=["rf_id"]).column("rf_id").to_numpy()
    ops = np.flatnonzero(ev.of_kind("cpu_op") & (rf >= 0))
    row_of_rf = {(int(ev.rank[i]), int(rf[i])): int(i) for i in ops}
    row_of_node = {(r, n): row_of_rf.get((r, f)) for r, n, f in
                   zip(nodes["rank"], nodes["node_id"], nodes["rf_id"], strict=True)}
    out = []
    for rank, src, dst, kind in zip(*(edges.column(c).to_pylist() for c in
                                      ("rank", "src", "dst", "kind")), strict=True):
        a, b = row_of_node.get((rank, src)), row_of_node.get((rank, dst))
        if kind == "data" and a is not None and b is not None and ev.tid[a] != ev.tid[b]:
            out.append((a, b))
    return sorted(set(out))


def _collective_peers(ev: Events, d: Dependencies, groups: Groups) -> None:
    """Each collective's row -> the same collective on the other ranks (stragglers' instances,
    of names that pair): a device's, or a CPU process group's on its host threads (gloo's)."""
    for peers in instances_of(ev, groups).values():
        rows = [row for _, row, _ in peers]
        for row in rows:
            d.peers[row] = [r for r in rows if r != row]


@dataclass(frozen=True)
class Issued:
    """Each host collective's (frame.Events.host_collective) row -> what it waited for to start:
    the call that issued it (frame.COLLECTIVE_CALL) and the collective before it on its
    thread."""

    call: dict[int, int]
    prev_on_thread: dict[int, int]


def issued(ev: Events) -> Issued:
    """The rank's collectives are taken up in the order they were issued: the n-th (by start)
    was issued by the earliest call not yet matched, when that call began before it (a
    collective whose call was before the trace's window has none, and takes none). Once per
    Events object (the critical path's graphs, one per rank or all, each ask)."""
    return ev.derived("issued", lambda: _issued(ev))


def _issued(ev: Events) -> Issued:
    rows = np.flatnonzero(ev.host_collective)
    calls = np.flatnonzero(ev.collective_call)
    out = Issued({}, {})
    for rank in ev.ranks:
        mine = rows[ev.rank[rows] == rank]
        mine = mine[np.argsort(ev.ts[mine], kind="stable")]
        theirs = calls[ev.rank[calls] == rank]
        theirs = theirs[np.argsort(ev.ts[theirs], kind="stable")].tolist()
        i = 0
        for row in mine.tolist():
            if i < len(theirs) and ev.ts[theirs[i]] <= ev.ts[row]:
                out.call[row] = theirs[i]
                i += 1
        for lane in group_rows(ev.tid[mine], mine).values():
            out.prev_on_thread.update(zip(lane[1:].tolist(), lane[:-1].tolist(), strict=True))
    return out


@dataclass(frozen=True)
class CollectiveWaits:
    """One thread's waits for collectives it issued, by the collective's end (sorted): where
    the wait began, the collective's row and end (what woke it), and where the thread resumed
    (its next event boundary)."""

    blocked: I64
    collective: I64
    done: I64
    resume: I64

    def stretches(self) -> tuple[I64, I64]:
        """The time the thread sat blocked, as disjoint sorted spans."""
        return union(self.blocked, self.done)


def blocked_in_collectives(ev: Events) -> dict[int, CollectiveWaits]:
    """lane_key(rank, tid) -> where the thread sat waiting for a collective it issued
    (`issued`: its call's thread), woken by the collective's end: from its last event
    boundary before that end (none before the call's end) to the end, where it then sat in a
    functional collective's wait (COLLECTIVE_WAIT, an op that only waits: however late it
    returned) or its next boundary came within thread_wakes' lag (WAKE_MAX_LAG_NS, or
    WAKE_MAX_LAG_SHARE of the stretch: a wait no op names, FSDP2's for its all-gather in the
    pre-backward and for its reduce-scatter in the post-backward, DDP's loop for the
    reducer's all-reduce). Of collectives ending in one such stretch, the last woke it. The
    one definition of the idea: the concurrency breakdown leaves these stretches out of the
    work hiding communication, thread_wakes hands over at those inside an op (a wait in a
    gap is its own rules'). Once per Events object."""
    return ev.derived("blocked in collectives", lambda: _blocked_in_collectives(ev))


def _blocked_in_collectives(ev: Events) -> dict[int, CollectiveWaits]:
    found = issued(ev)
    colls = np.fromiter(found.call, np.int64, len(found.call))
    calls = np.fromiter(found.call.values(), np.int64, len(found.call))
    keys = lane_key(ev.rank[calls], ev.tid[calls])
    host = np.flatnonzero(ev.host_busy)
    threads = group_rows(lane_key(ev.rank[host], ev.tid[host]), host)
    waiting = np.isin(ev.name, [i for i, n in enumerate(ev.names) if COLLECTIVE_WAIT.match(n)])
    waiting &= ev.of_kind("cpu_op")
    out: dict[int, CollectiveWaits] = {}
    for key in sorted_unique(keys).tolist():
        rows = threads.get(key, host[:0])
        points = sorted_unique(np.concatenate([ev.ts[rows], ev.end[rows]]))
        mine = keys == key
        order = np.argsort(ev.end[colls[mine]], kind="stable")
        coll, call = colls[mine][order], calls[mine][order]
        done = ev.end[coll]
        after = np.searchsorted(points, done, side="right")
        before = np.searchsorted(points, done, side="left") - 1
        ok = (after < len(points)) & (before >= 0)
        lo = np.maximum(points[np.maximum(before, 0)], ev.end[call])
        resume = points[np.minimum(after, len(points) - 1)]
        waits = rows[waiting[rows]]
        in_wait = _inside(union(ev.ts[waits], ev.end[waits]), done)[0]
        ok &= (lo < done) & (in_wait | (
            resume - done <= np.maximum(WAKE_MAX_LAG_NS, WAKE_MAX_LAG_SHARE * (done - lo))))
        lo, coll, done, resume = lo[ok], coll[ok], done[ok], resume[ok]
        last = np.ones(len(resume), bool)  # ... of those ending in one stretch
        last[:-1] = resume[1:] != resume[:-1]
        if last.any():
            out[key] = CollectiveWaits(lo[last], coll[last], done[last], resume[last])
    return out


@dataclass(frozen=True)
class Wakes:
    """One thread's hand-overs, by the time it resumed (sorted): the other thread's event it
    waited for (its row and end), and where the thread's blocked stretch began (the end of
    its work before)."""

    resume: I64
    waker: I64
    waker_end: I64
    blocked: I64


def thread_wakes(ev: Events) -> Mapping[int, Wakes]:
    """lane_key(rank, tid) -> the hand-overs into that thread.

    A thread is blocked between two stretches of its work (WORK_KINDS, and a process group's
    collectives on its comm threads) at least WAKE_MIN_GAP_NS apart, and before its first work
    since the rank's first host event. It was handed over to when another thread of its rank
    ended two or more events in that stretch (or one collective: a DDP loop waiting for gloo's
    all-reduce of its gradients), worked through WAKE_MIN_BUSY_SHARE of it (a watchdog polling
    now and then hands over nothing), and the last of its events ended shortly before the
    blocked thread's next event boundary (its resumption): at most WAKE_MAX_LAG_NS, or
    WAKE_MAX_LAG_SHARE of the stretch or of the stretch the other thread then sat blocked
    (one thread stops and the other starts: backward() handing its work to the autograd
    thread), or, where no other thread of the rank began anything in between (nothing else
    can have woken it), WAKE_QUIET_LAG_SHARE of the stretch. Inside a wait for a DataLoader's
    next batch (LOADER_WAIT), the thread's first work is the batch arriving, however long
    after the other thread finished; its later
    pauses in that wait are its own (rebuilding the batch), no hand-over. A thread that sat
    in an op waiting for a collective it issued (blocked_in_collectives) was handed over to by
    the collective, though the op is work. A thread of another
    process (a DataLoader worker) hands over only there, the batch being all it passes. Of
    several such threads, the one that finished last. TorchScript's forks (FORKED, _forks): a
    thread sitting in the op that forked, with no op inside it, after one of its ops, is
    blocked too, and handed over to by the same rules by another thread of its process (the
    fork's, or the one the function's rest continued on), however little of the stretch it
    worked (a fork can wait for a thread to take it up); a thread that takes a fork up waited
    for the forking op, and one that starts work after sitting idle, while another thread of
    its process waits so, for the fork that ended last before (the function that waited for
    it continued there). A thread that takes a distributed backward's graph up (its root,
    GRAPH_ROOT, inside a DIST_BACKWARD op of another thread of its process) waited for that
    op, as for a forking one, however little the op's thread worked before (an RPC trainer's
    loop sits in its requests' waits)."""
    return ev.derived("thread wakes", lambda: _thread_wakes(ev))  # once per Events object


def _thread_wakes(ev: Events) -> dict[int, Wakes]:
    host = np.flatnonzero(ev.host_busy)
    threads = group_rows(lane_key(ev.rank[host], ev.tid[host]), host)
    out: dict[int, Wakes] = {}
    collective = ev.host_collective
    work_kind = ev.of_kind(*WORK_KINDS) | collective
    loader_codes = [i for i, n in enumerate(ev.names) if LOADER_WAIT.match(n)]
    loader_wait = np.isin(ev.name, loader_codes) if loader_codes else np.zeros(len(ev), bool)
    on_collectives = blocked_in_collectives(ev)
    by_rank: dict[int, list[int]] = defaultdict(list)
    for key, rows in threads.items():
        by_rank[int(ev.rank[rows[0]])].append(key)
    ends: dict[int, tuple[I64, I64]] = {}
    busy: dict[int, Coverage] = {}
    works: dict[int, tuple[I64, I64]] = {}  # union of the thread's work
    forks = _forks(ev, threads)
    taken = _backwards_taken(ev)
    for key, rows in threads.items():
        order = np.argsort(ev.end[rows], kind="stable")
        ends[key] = (ev.end[rows][order], rows[order])
        busy[key] = Coverage(*union(ev.ts[rows], ev.end[rows]))
        work = rows[work_kind[rows]]
        works[key] = union(ev.ts[work], ev.end[work])
    for keys in by_rank.values():
        if len(keys) < 2:
            continue
        # every start on the rank's threads: the first after a thread's end, if before the
        # blocked thread resumes, is another thread's (its own next point is its resumption)
        starts = np.sort(np.concatenate([ev.ts[threads[k]] for k in keys]))
        origin = int(starts[0])
        finish = max(int(ev.end[threads[k]].max()) for k in keys)
        for key in keys:
            rows = threads[key]
            s, e = works[key]
            if len(s) == 0:
                continue
            lo = np.concatenate([[origin], e[:-1]]).astype(np.int64)
            keep = s - lo >= WAKE_MIN_GAP_NS
            lo, hi = lo[keep], s[keep]
            bare_lo, bare_hi = forks.waits.get(key, (lo[:0], hi[:0]))
            order = np.argsort(np.concatenate([hi, bare_hi]), kind="stable")
            lo, hi = np.concatenate([lo, bare_lo])[order], np.concatenate([hi, bare_hi])[order]
            # waiting for a fork: handed over by another thread of the process (the fork's, or
            # the one the function continued on), however long the fork waited for a thread
            forking = np.concatenate([np.zeros(len(lo) - len(bare_lo), bool),
                                      np.ones(len(bare_lo), bool)])[order]
            process = (int(ev.rank[rows[0]]), int(ev.pid[rows[0]]))
            mates = [forks.waits[k] for k in keys if k != key and k in forks.waits
                     and ev.pid[threads[k][0]] == process[1]]
            continued = _inside(union(*(np.concatenate(x) for x in zip(*mates, strict=True))),
                                hi)[0] if mates else np.zeros(len(hi), bool)
            waits = rows[loader_wait[rows]]
            in_wait, began = _inside(union(ev.ts[waits], ev.end[waits]), hi)
            for_batch = in_wait & (began >= lo)  # the first work in the wait: the batch came
            rebuilding = in_wait & (began < lo)  # its later pauses there are its own
            points = sorted_unique(np.concatenate([ev.ts[rows], ev.end[rows]]))
            best_end = np.full(len(lo), -1, np.int64)
            best_row = np.full(len(lo), -1, np.int64)
            for other in keys:
                if other == key:
                    continue
                # a thread of another process (a DataLoader worker) hands over only through
                # the batch it queues
                same_process = ev.pid[threads[other][0]] == ev.pid[rows[0]]
                other_end, other_rows = ends[other]
                last = np.searchsorted(other_end, hi, side="right") - 1
                first = np.searchsorted(other_end, lo, side="right")
                # a comm thread's collective is its whole stretch of work: one suffices
                ended = (last - first >= 1) | ((last >= first) & collective[
                    other_rows[np.maximum(last, 0)]])
                worked = busy[other].between(lo, hi) >= WAKE_MIN_BUSY_SHARE * (hi - lo)
                ok = ended & (forking | worked)
                end = np.where(ok, other_end[np.maximum(last, 0)], -1)
                resume = points[np.searchsorted(points, end)]
                stretch = np.maximum(hi - lo, _blocked_after(works[other], end, finish))
                lag = resume - end
                after = np.searchsorted(starts, end, side="right")
                quiet = np.append(starts, np.iinfo(np.int64).max)[after] >= resume
                ok &= for_batch | (same_process & (
                    (lag <= np.maximum(WAKE_MAX_LAG_NS, WAKE_MAX_LAG_SHARE * stretch))
                    | (quiet & (lag <= WAKE_QUIET_LAG_SHARE * (hi - lo)))))
                ok &= ~rebuilding
                better = ok & (end > best_end)
                best_end[better] = end[better]
                best_row[better] = other_rows[last[better]]
            if continued.any():  # resuming while a thread of its process waits for a fork:
                done, by = forks.done[process]  # it continues the function whose fork ended
                j = np.searchsorted(done, hi, side="right") - 1
                continued &= (j >= 0) & (done[np.maximum(j, 0)] > lo)
                best_end[continued] = done[j[continued]]
                best_row[continued] = by[j[continued]]
            # an idle thread takes a fork or a distributed backward's graph up
            for at, op in [*forks.launched.get(key, []), *taken.get(key, [])]:
                launch = hi == at
                best_end[launch], best_row[launch] = at, op
            found = best_end >= 0
            resume = points[np.searchsorted(points, best_end[found])]
            waker, waker_end, blocked = best_row[found], best_end[found], lo[found]
            if key in on_collectives:  # in an op (a gap's wait is the rules' above), woken by
                waits = on_collectives[key]  # the collective it issued
                in_op = _inside(works[key], waits.done)[0]
                order = np.argsort(np.concatenate([resume, waits.resume[in_op]]), kind="stable")
                resume, waker, waker_end, blocked = (
                    np.concatenate([a, b[in_op]])[order] for a, b in (
                        (resume, waits.resume), (waker, waits.collective),
                        (waker_end, waits.done), (blocked, waits.blocked)))
            out[key] = Wakes(resume, waker, waker_end, blocked)
    return out



@dataclass(frozen=True)
class _Forks:
    """TorchScript's forks (FORKED) in some threads, by lane_key: where a forking thread sat in
    its forking op alone after the fork (lo, hi: waiting for it, if another thread then hands
    over by thread_wakes' rules), where an idle thread took a fork up (its start, the
    forking op's row: the fork's launch), and, by (rank, pid), when the forks of the process
    ended their work (sorted) and the row that ended it: a thread that starts work after
    sitting idle while another thread of its process waits continues the function that waited
    for the last of them (the interpreter, suspended at the wait, resumes on a pool thread)."""

    waits: dict[int, tuple[I64, I64]]
    launched: dict[int, list[tuple[int, int]]]
    done: dict[tuple[int, int], tuple[I64, I64]]


class _Timeline(NamedTuple):
    """One thread's host rows by start (the outer first at a tie) and their starts, its event
    boundaries, the innermost row over each segment between them (intervals.innermost), and
    the segments by that row (`owners` their rows, sorted)."""

    rows: I64
    starts: I64
    points: I64
    owner: I64
    segments: I64
    owners: I64


def _forks(ev: Events, threads: Mapping[int, I64]) -> _Forks:
    """The forks of `threads` (lane_key -> its host rows). A fork's forking op is, on another
    thread of its process, the innermost op over the fork's start that outlasts the fork's work
    (its last event inside FORKED; FORKED itself may end later): a function waits for the forks
    it makes, its own ops meanwhile end first. Of the threads with one, the one whose last
    event boundary before the fork's start came last (it was running its own code). The wait
    is one of that op's stretches with no op inside it that begin after one of its ops (the
    fork is launched before the forking thread's own work, the wait follows it: not the
    stretch from the op's start, where a thread off the CPU looks the same) and end after the
    fork began."""
    forked = np.flatnonzero(np.isin(ev.name, [i for i, n in enumerate(ev.names) if n == FORKED])
                            & ev.of_kind("cpu_op"))
    waits: dict[int, set[tuple[int, int]]] = defaultdict(set)  # a function may fork often
    launched: dict[int, list[tuple[int, int]]] = defaultdict(list)
    ended: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)  # by rank, pid
    up = np.full(len(ev), -1, np.int64)  # each row's innermost enclosing row on its thread
    timelines: dict[int, _Timeline] = {}
    processes: dict[tuple[int, int], list[int]] = defaultdict(list)  # by rank, pid: threads
    for key, rows in threads.items():
        processes[(int(ev.rank[rows[0]]), int(ev.pid[rows[0]]))].append(key)

    def timeline(key: int) -> _Timeline:
        if key not in timelines:
            rows = threads[key]
            order = rows[np.lexsort((-ev.end[rows], ev.ts[rows]))]  # the outer first at a tie
            parent = open_before(np.zeros(len(order), np.int64), ev.ts[order], ev.end[order])
            up[order[parent >= 0]] = order[parent[parent >= 0]]
            points = sorted_unique(np.concatenate([ev.ts[rows], ev.end[rows]]))
            owner = innermost(ev.ts[rows], ev.end[rows], points, rows)
            segments = np.argsort(owner, kind="stable")
            timelines[key] = _Timeline(order, ev.ts[order], points, owner, segments,
                                       owner[segments])
        return timelines[key]

    for f in forked.tolist():
        at, mine = int(ev.ts[f]), int(lane_key(int(ev.rank[f]), int(ev.tid[f])))
        own = timeline(mine)
        inside = own.rows[np.searchsorted(own.starts, at):
                          np.searchsorted(own.starts, ev.end[f], side="right")]
        inside = inside[(ev.end[inside] <= ev.end[f]) & (inside != f)]
        last_row = int(inside[np.argmax(ev.end[inside])]) if len(inside) else f
        done = int(ev.end[last_row])
        ended[(int(ev.rank[f]), int(ev.pid[f]))].append((done, last_row))
        best: tuple[int, int, int] | None = None  # (last boundary, key, forking op)
        for key in processes[(int(ev.rank[f]), int(ev.pid[f]))]:
            if key == mine:
                continue
            other = timeline(key)
            i = int(np.searchsorted(other.points, at, side="right")) - 1
            forking = int(other.owner[i]) if 0 <= i < len(other.owner) else -1
            while forking >= 0 and ev.end[forking] < done:  # out to the op that outlasts it
                forking = int(up[forking])
            if forking >= 0 and (best is None or other.points[i] > best[0]):
                best = (int(other.points[i]), key, forking)
        if best is None:
            continue
        _, key, forking = best
        launched[mine].append((at, forking))
        found = timeline(key)
        bare = found.segments[np.searchsorted(found.owners, forking):
                              np.searchsorted(found.owners, forking, side="right")]
        lo, hi = found.points[bare], found.points[bare + 1]
        keep = (lo > ev.ts[forking]) & (hi > at) & (hi - lo >= WAKE_MIN_GAP_NS)
        waits[key].update(zip(lo[keep].tolist(), hi[keep].tolist(), strict=True))

    def pairs(found: list[tuple[int, int]]) -> tuple[I64, I64]:
        return (np.array([a for a, _ in found], np.int64),
                np.array([b for _, b in found], np.int64))

    return _Forks({key: pairs(sorted(found)) for key, found in waits.items()}, dict(launched),
                  {process: pairs(sorted(found)) for process, found in ended.items()})


def _backwards_taken(ev: Events) -> dict[int, list[tuple[int, int]]]:
    """lane_key -> (start, op) where the thread took a distributed backward's graph up: its
    root (GRAPH_ROOT) run inside a DIST_BACKWARD op of another thread of its process."""
    code = {n: i for i, n in enumerate(ev.names) if n in (DIST_BACKWARD, GRAPH_ROOT)}
    ops = np.flatnonzero(ev.name == code.get(DIST_BACKWARD, -1))
    out: dict[int, list[tuple[int, int]]] = defaultdict(list)
    if not len(ops):
        return out
    for root in np.flatnonzero(ev.name == code.get(GRAPH_ROOT, -1)).tolist():
        at = int(ev.ts[root])
        holding = ops[(ev.rank[ops] == ev.rank[root]) & (ev.pid[ops] == ev.pid[root])
                      & (ev.tid[ops] != ev.tid[root]) & (ev.ts[ops] <= at) & (ev.end[ops] > at)]
        if len(holding):
            key = int(lane_key(int(ev.rank[root]), int(ev.tid[root])))
            out[key].append((at, int(holding[np.argmax(ev.ts[holding])])))
    return out


def _inside(intervals: tuple[I64, I64], t: I64) -> tuple[npt.NDArray[np.bool_], I64]:
    """Whether each t is inside one of `intervals` (disjoint, sorted; t after its start),
    and when that interval began."""
    starts, ends = intervals
    if not len(starts):
        return np.zeros(len(t), bool), np.zeros(len(t), np.int64)
    i = np.searchsorted(starts, t, side="left") - 1  # the last interval starting before t
    j = np.maximum(i, 0)
    return np.asarray((i >= 0) & (t < ends[j]), bool), starts[j]


def _blocked_after(work: tuple[I64, I64], t: I64, finish: int) -> I64:
    """How long a thread sat without work from each t on: 0 inside its work (disjoint sorted
    intervals), else until its next work starts (or `finish`)."""
    starts, ends = work
    i = np.searchsorted(starts, t, side="right")  # the interval starting at or before t: i - 1
    inside = (i > 0) & (t < ends[np.maximum(i - 1, 0)]) if len(starts) else t < 0
    nxt = np.append(starts, finish)[i]
    return np.asarray(np.where(inside, 0, np.maximum(nxt - t, 0)), np.int64)
