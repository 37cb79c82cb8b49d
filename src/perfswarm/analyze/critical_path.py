"""Critical path: the chain of work that decided when the last event ended.

Walked backwards from the event that ends last ("last arrival"): a device op waits
for whichever of its dependencies became ready last (the previous op on its
stream, its launch call, the op recorded by an event its stream waits on); a
collective also waits for the same collective on the rank that entered it last; a
host thread runs back to back, except where a synchronizing call (device, stream
or event sync) waited for the device, where the path continues at the device op it
waited for, and where another thread handed over to it (dependencies.thread_wakes:
the main thread blocked in backward until the autograd thread finished, the autograd
thread until the main thread called backward, a DDP loop until gloo's thread ran its
all-reduce), where it continues on that thread. A collective on a host thread (gloo's) is a
collective as a device's is, and waited to start for the call that issued it. A gloo receive
whose thread had blocked, no work of its own left, before its send was issued
(analyze.transfers) waited for the sender: the path goes on at the sender's call, the transfer
from there to the receive's completion a collective.
Every nanosecond from the path's start to its end is attributed to one category, so
the composition sums to the path length exactly. Each iteration has its own path too: walked
back from the last work of the step (its host events, the device ops launched in it) to the
step's start, so its length is the step's time from its start to the end of its last work:

- cpu, runtime, host_idle: a host thread on the path in an op, in a runtime call, or
  in neither (no work and no known hand-over);
- sync: a synchronizing call returning after the device op it waited for ended;
- thread_wait: a thread resuming after the thread that handed over to it finished;
- launch_overhead: a device op starting after its launch call returned, when that call
  was the last thing it waited for;
- stream_queue: a device op starting after the previous op on its stream ended (it had
  been launched earlier and queued behind it);
- device_idle: a device op starting after the previous op on its stream ended, with no launch
  in the trace (nothing says it was queued: its stream idled for a cause the trace lacks; a
  gloo collective whose issuing call is not traced leaves its thread's wait `host_idle`);
- event_wait: a device op starting after the op recorded by the event its stream waited
  on (cudaStreamWaitEvent) ended;
- kernel, memcpy, memset, collective: device ops running (a collective from the moment
  the last rank entered it; waiting on another rank moves the path to that rank).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from perfswarm.analyze.dependencies import (
    Issued,
    RowMap,
    SyncEvent,
    Wakes,
    dependencies,
    issued,
    thread_wakes,
)
from perfswarm.analyze.frame import DEVICE_OPS, I64, KIND, Events, group_rows, lane_key
from perfswarm.analyze.groups import NO_GROUPS, Groups
from perfswarm.analyze.intervals import (
    StateSums,
    covered,
    innermost,
    key_sums,
    sorted_unique,
    spread,
)
from perfswarm.analyze.iterations import StepWindow, within_gaps
from perfswarm.analyze.rpc import rpc_hand_overs
from perfswarm.analyze.stragglers import Peer, instances_of

CATEGORIES: Final = ("cpu", "runtime", "host_idle", "sync", "thread_wait", "launch_overhead",
                     "stream_queue", "event_wait", "device_idle", "kernel", "collective",
                     "memcpy", "memset")
HOST_STATES: Final = ("cpu", "runtime", "host_idle")
TOP = 20
STEP_TOP = 5
NO_FLOOR: Final = -(1 << 62)
# what a device op waited for last (DeviceWaits.wait): its stream's previous op, the op recorded
# by the event its stream waited on, its launch call; its stream's previous op where it has no
# launch in the trace (device_idle)
WAITS: Final = ("stream_queue", "event_wait", "launch_overhead", "device_idle")


@dataclass(frozen=True)
class Handover:
    """Where the path moved from one host thread to another: `to_tid` resumed at `at`, `wait_ns`
    after `from_tid` (of the same rank) finished the work it waited for."""

    rank: int
    from_tid: int
    to_tid: int
    at: int
    wait_ns: int

    def to_dict(self) -> dict[str, int]:
        return {"rank": self.rank, "from_tid": self.from_tid, "to_tid": self.to_tid,
                "at": self.at, "wait_ns": self.wait_ns}


@dataclass(frozen=True)
class CriticalPath:
    start: int
    end: int
    ns: dict[str, int]  # category -> ns on the path
    device_ops: int  # device ops with time on the path
    rank_switches: int
    handovers: tuple[Handover, ...]  # between host threads on the path, in time order
    top: tuple[tuple[str, str, int], ...]  # (category, name, ns), largest first
    step: int | None = None  # the iteration of a step's path
    steps: tuple[CriticalPath, ...] = ()  # each iteration's own path (the whole Run's only)
    step_end: int | None = None  # a step's path: where its window ends (its last rank's)
    ranks: tuple[int, ...] = ()  # a step's path: the ranks whose step it is (step_windows)
    # the Run's path: its time between profiling windows, where nothing was traced (no part of
    # its length nor of any category)
    unprofiled_ns: int = 0

    @property
    def beyond_step_ns(self) -> int:
        """How long after its window a step's last work ended (its device work still running
        in the next step: the steps' paths then overlap), 0 for the Run's path."""
        return max(0, self.end - self.step_end) if self.step_end is not None else 0

    @property
    def length_ns(self) -> int:
        return self.end - self.start - self.unprofiled_ns

    @property
    def thread_switches(self) -> int:
        return len(self.handovers)

    def to_dict(self) -> dict[str, Any]:
        return {**({"step": self.step, "ranks": list(self.ranks),
                    "beyond_step_ns": self.beyond_step_ns} if self.step is not None else {}),
                "start": self.start, "end": self.end, "length_ns": self.length_ns,
                **({"unprofiled_ns": self.unprofiled_ns} if self.step is None else {}),
                "ns": dict(self.ns), "share": {c: (v / self.length_ns if self.length_ns else 0.0)
                                               for c, v in self.ns.items()},
                "device_ops": self.device_ops, "rank_switches": self.rank_switches,
                "thread_switches": self.thread_switches,
                "handovers": [h.to_dict() for h in self.handovers],
                "top": [{"category": c, "name": n, "ns": v} for c, n, v in self.top],
                **({} if self.step is not None else
                   {"steps": [s.to_dict() for s in self.steps]})}


# Where the walk is: rank, "dev" or "host", row (in the graph holding the rank), time
State = tuple[int, str, int, int]
# Host time the walk crossed, counted after it (counted): thread (lane_key), [lo, hi)
HostSpan = tuple[int, int, int]


@dataclass(frozen=True)
class DeviceWaits:
    """Of each device op that waited for something, what it waited for last (the dependency
    that became ready last of those started by its start), resolved for every op at once
    (device_waits), by the op's row: the walk's step at a device op is one search, where it
    had been three maps' look-ups and their candidates compared in Python (~2,800 steps at
    200k events)."""

    rows: I64  # ascending
    dep: I64  # the row it waited for
    ready: I64  # when that was ready (its end, at most the op's start)
    wait: npt.NDArray[np.int8]  # the wait's category: its index in WAITS

    def get(self, row: int) -> tuple[int, int, str] | None:
        """(dep, ready, category) of device op `row`, None where it waited for nothing."""
        i = int(np.searchsorted(self.rows, row))
        if i == len(self.rows) or int(self.rows[i]) != row:
            return None
        return int(self.dep[i]), int(self.ready[i]), WAITS[int(self.wait[i])]


def device_waits(ev: Events, prev_on_stream: RowMap, waits_for: RowMap,
                 launch_of: RowMap) -> DeviceWaits:
    """Every device op's last wait at once. Of its dependencies started by its start, the one
    ready last; ties: the higher row, then its launch call before the recorded op before the
    stream's previous op (the order of (ready, row, where, category) as tuples). Each map is
    spread over every row (a scatter and a gather, not a sort or a search: 8.0 CPU ms -> 2.5 at
    200k events)."""
    maps = (waits_for, prev_on_stream, launch_of)
    has_any = np.zeros(len(ev), bool)
    for found in maps:
        has_any[found.keys] = True
    rows = np.flatnonzero(has_any)
    start = ev.ts[rows]
    value_of = np.full(len(ev), -1, np.int64)
    best_dep = np.full(len(rows), -1, np.int64)
    best_ready = np.zeros(len(rows), np.int64)
    wait = np.zeros(len(rows), np.int8)
    launched = np.zeros(len(rows), bool)
    # in increasing order of (where, category): a later one wins a tie of (ready, row)
    for found, category in zip(maps, ("event_wait", "stream_queue", "launch_overhead"),
                               strict=True):
        value_of[found.keys] = found.values
        dep = value_of[rows]
        value_of[found.keys] = -1
        has = dep >= 0
        launched |= has & (category == "launch_overhead")
        ok = has & (ev.ts[dep] <= start)
        ready = np.minimum(ev.end[dep], start)
        better = ok & ((best_dep < 0) | (ready > best_ready)
                       | ((ready == best_ready) & (dep >= best_dep)))
        best_dep[better], best_ready[better] = dep[better], ready[better]
        wait[better] = WAITS.index(category)
    # not known to be launched before its stream freed
    wait[(wait == WAITS.index("stream_queue")) & ~launched] = WAITS.index("device_idle")
    keep = best_dep >= 0
    return DeviceWaits(rows[keep], best_dep[keep], best_ready[keep], wait[keep])


@dataclass
class Graph:
    """Dependencies of every device op and host sync call of some ranks, resolved once."""

    ev: Events
    waits: DeviceWaits
    launch_of: RowMap = field(default_factory=RowMap)
    sync_target: dict[int, int] = field(default_factory=dict)  # host call -> device op
    peers: dict[int, list[Peer]] = field(default_factory=dict)  # collective -> on others
    # a receive's completion -> the send it waited for (transfers.hand_overs), an RPC reply's
    # arrival -> the callee's work, work for an RPC request -> the request (rpc.hand_overs)
    received: dict[int, Peer] = field(default_factory=dict)
    # keyed by lane_key(rank, tid)
    thread_received: dict[int, tuple[I64, I64]] = field(default_factory=dict)  # arrivals, rows
    thread_syncs: dict[int, tuple[I64, I64]] = field(default_factory=dict)
    thread_sums: dict[int, StateSums] = field(default_factory=dict)
    # per thread, the innermost op over each segment of its timeline (-1 where none)
    thread_owner: dict[int, I64] = field(default_factory=dict)
    thread_start: dict[int, int] = field(default_factory=dict)
    wakes: Mapping[int, Wakes] = field(default_factory=dict)
    issued: Issued = field(default_factory=lambda: Issued({}, {}))
    # each state walked so far, what walking it adds (Step.of): the Run's walk and its steps'
    # cross the same states (all 667 of the Run's of 865 at 200k events), each worked out once
    steps: dict[State, Step] = field(default_factory=dict)


def collective_peers(instances: Iterable[Sequence[Peer]]) -> dict[int, dict[int, list[Peer]]]:
    """rank -> collective row -> the same collective on the other ranks, from the ranks'
    instances (each: where every rank that ran it ran it)."""
    out: dict[int, dict[int, list[Peer]]] = defaultdict(dict)
    for peers in instances:
        for rank, row, _ in peers:
            out[rank][row] = [p for p in peers if p[0] != rank]
    return out


def build(ev: Events, syncs: list[SyncEvent], peers: dict[int, list[Peer]],
          received: dict[int, Peer], requested: Mapping[int, Peer] | None = None) -> Graph:
    """The graph of `ev` (one rank or all); `peers`: its collectives' rows -> their peers;
    `received`: rows whose end waited for another rank (receives' completions -> the sends,
    RPC replies' arrivals -> the callees' work); `requested`: rows whose start did (work for
    an RPC request -> the request)."""
    d = dependencies(ev, syncs)
    launch_of = RowMap(*d.launch_of)
    waited = np.array(sorted(d.waits_for.items()), np.int64).reshape(-1, 2)
    g = Graph(ev, device_waits(ev, RowMap(*d.prev_on_stream), RowMap(*waited.T), launch_of),
              launch_of, d.sync_target, peers, {**received, **(requested or {})},
              wakes=thread_wakes(ev), issued=issued(ev))
    _threads(g)
    done = np.fromiter(g.received, np.int64, len(g.received))
    arrived = np.where(np.isin(done, list(requested or {})), ev.ts[done], ev.end[done])
    for key, at in group_rows(lane_key(ev.rank[done], ev.tid[done]),
                              np.arange(len(done))).items():
        by_arrival = at[np.argsort(arrived[at], kind="stable")]
        g.thread_received[key] = (arrived[by_arrival], done[by_arrival])
    return g


def _threads(g: Graph) -> None:
    """Per host thread: its busy-state timeline and its sync calls that really waited."""
    ev = g.ev
    host = np.flatnonzero(ev.host_busy)
    runtime = ev.of_kind("runtime", "driver")
    for key, rows in group_rows(lane_key(ev.rank[host], ev.tid[host]), host).items():
        starts, ends = ev.ts[rows], ev.end[rows]
        points = sorted_unique(np.concatenate([starts, ends]))
        calls = runtime[rows]
        in_call = covered(starts[calls], ends[calls], points)
        busy = covered(starts, ends, points)
        codes = np.where(in_call, 1, np.where(busy, 0, 2)).astype(np.int64)
        g.thread_sums[key] = StateSums(points, codes, len(HOST_STATES), 2)
        g.thread_owner[key] = innermost(starts, ends, points, rows)
        g.thread_start[key] = int(starts.min())
        waited = [c for c in rows[calls].tolist() if c in g.sync_target
                  and ev.end[g.sync_target[c]] > ev.ts[c] and ev.ts[g.sync_target[c]] < ev.end[c]]
        waited.sort(key=lambda c: int(ev.end[c]))
        g.thread_syncs[key] = (np.array(waited, np.int64),
                               np.array([ev.end[c] for c in waited], np.int64))


@dataclass
class Step:
    """What walking one state adds to a walk, whatever its floor (_Walk.apply cuts it there),
    and where the walk goes on."""

    # (category, lo, hi, name or -1): time on the path, the part after the floor counted
    time: list[tuple[str, int, int, int]] = field(default_factory=list)
    device_ops: int | None = None  # a device op on the path where this is after the floor
    always: int = 0  # device ops on the path whatever the floor
    switches: list[int] = field(default_factory=list)  # a rank switch each, after the floor
    handovers: list[Handover] = field(default_factory=list)  # those at after the floor
    host: list[HostSpan] = field(default_factory=list)  # lo cut at the floor
    next: State | None = None


class _Walk:
    """Accounts the path from where it is back to `floor` (a step's start), no further."""

    def __init__(self, floor: int) -> None:
        self.floor = floor
        self.ns = dict.fromkeys(CATEGORIES, 0)
        self.by_name: dict[tuple[str, int], int] = defaultdict(int)
        self.device_ops = 0
        self.switches = 0
        self.handovers: list[Handover] = []
        self.host_spans: list[HostSpan] = []

    def apply(self, step: Step) -> None:
        floor = self.floor
        for category, lo, hi, name in step.time:
            ns = hi - max(lo, floor)
            if ns > 0:
                self.ns[category] += ns
                if name >= 0:
                    self.by_name[(category, name)] += ns
        self.device_ops += step.always + int(step.device_ops is not None
                                             and step.device_ops > floor)
        self.switches += sum(1 for at in step.switches if at > floor)
        self.handovers += [h for h in step.handovers if h.at > floor]
        self.host_spans += [(key, max(lo, floor), hi) for key, lo, hi in step.host]


class _Step:
    """Works out what walking a state of `g` adds (Step): the same for every walk crossing it."""

    def __init__(self, g: Graph) -> None:
        self.g = g
        self.step = Step()

    def of(self, state: State) -> Step:
        self.step = Step()
        _, where, row, t = state
        self.step.next = (self.device(row, t) if where == "dev" else
                          self.host_collective(row, t) if self.g.ev.host_collective[row] else
                          self.host(row, t))
        return self.step

    def add(self, category: str, lo: int, hi: int, row: int = -1) -> None:
        if hi > lo:
            self.step.time.append((category, lo, hi, int(self.g.ev.name[row]) if row >= 0 else -1))

    def _late_peer(self, row: int, t: int, where: str) -> State | None:
        """Of a collective `row` (up to t) that another rank entered after this one: the time
        since that rank entered, spent in the collective, and that rank's entry, where the
        path goes on; None when this rank entered last."""
        start = int(self.g.ev.ts[row])
        peers = [p for p in self.g.peers.get(row, []) if p[2] > start]
        if not peers:
            return None
        late_rank, late, late_ts = max(peers, key=lambda p: (p[2], -p[0]))
        self.add("collective", late_ts, t, row)
        self.step.switches.append(late_ts)
        return (late_rank, where, late, late_ts)

    def device(self, row: int, t: int) -> State | None:
        """Account device op `row` up to t; return the next state."""
        ev, g = self.g.ev, self.g
        start = int(ev.ts[row])
        rank = int(ev.rank[row])
        moved = self._late_peer(row, t, "dev")
        if moved is not None:
            self.step.always += 1
            return moved
        self.add(_device_category(ev, row), start, t, row)
        if t > start:
            self.step.device_ops = t
        waited = g.waits.get(row)
        if waited is None:
            return None
        dep, ready, category = waited
        self.add(category, ready, start)
        return (rank, "host" if category == "launch_overhead" else "dev", dep, ready)

    def host_collective(self, row: int, t: int) -> State | None:
        """Account a collective on a host thread (`row`: gloo's range on its worker thread)
        up to t, as a device's: from the moment the last rank took it up; waiting on another
        rank moves the path there. Taken up last here, it waited to start for the call that
        issued it (a hand-over from the issuing thread) or, queued, for the collective before
        it on its thread."""
        ev, g = self.g.ev, self.g
        start = int(ev.ts[row])
        rank = int(ev.rank[row])
        moved = self._late_peer(row, t, "host")
        if moved is not None:
            return moved
        self.add("collective", start, t, row)
        preds: list[tuple[int, int, str]] = []  # (ready, row, category of the wait)
        for dep, category in ((g.issued.prev_on_thread.get(row), "stream_queue"),
                              (g.issued.call.get(row), "thread_wait")):
            if dep is not None:
                preds.append((min(int(ev.end[dep]), start), dep, category))
        if not preds:
            return None
        ready, dep, category = max(preds)
        if category == "stream_queue" and row not in g.issued.call:
            category = "host_idle"  # not known to be issued before its thread freed
        self.add(category, ready, start, dep)
        if category == "thread_wait":
            self.step.handovers.append(Handover(rank, int(ev.tid[dep]), int(ev.tid[row]), start,
                                                start - ready))
        return (rank, "host", dep, ready)

    def host(self, row: int, t: int) -> State | None:
        """Walk host thread of `row` back from t to its last sync call that waited (return
        the device op it waited on) or hand-over (return the thread that handed over)."""
        ev, g = self.g.ev, self.g
        rank = int(ev.rank[row])
        key = int(lane_key(rank, int(ev.tid[row])))
        calls, call_ends = g.thread_syncs[key]
        i = int(np.searchsorted(call_ends, t, side="right")) - 1
        sync_end = int(call_ends[i]) if i >= 0 else None
        wakes = g.wakes.get(key)
        j = int(np.searchsorted(wakes.resume, t, side="right")) - 1 if wakes else -1
        got = g.thread_received.get(key)
        k = int(np.searchsorted(got[0], t, side="right")) - 1 if got else -1

        def states(lo: int) -> None:
            self.step.host.append((key, lo, t))

        if got is not None and k >= 0 and int(got[0][k]) > max(
                NO_FLOOR if sync_end is None else sync_end,
                int(wakes.resume[j]) if wakes is not None and j >= 0 else NO_FLOOR):
            # a receive that waited for its send: the path goes on at the sender's call, the
            # transfer from there to the receive's completion
            arrived, done = int(got[0][k]), int(got[1][k])
            sender, call, sent = g.received[done]
            states(arrived)
            self.add("collective", sent, arrived, done)
            self.step.switches.append(sent)
            return (sender, "host", call, sent)
        if wakes is not None and j >= 0 and (sync_end is None
                                            or int(wakes.resume[j]) > sync_end):
            resume, waker, waker_end = (int(wakes.resume[j]), int(wakes.waker[j]),
                                        int(wakes.waker_end[j]))
            states(resume)
            self.add("thread_wait", waker_end, resume, waker)
            self.step.handovers.append(Handover(rank, int(ev.tid[waker]), int(ev.tid[row]),
                                                resume, resume - waker_end))
            return (rank, "host", waker, waker_end)
        if i < 0:
            states(min(g.thread_start[key], t))
            return None
        call = int(calls[i])
        states(int(ev.end[call]))
        target = g.sync_target[call]
        done = min(int(ev.end[target]), int(ev.end[call]))
        self.add("sync", done, int(ev.end[call]), call)
        return (rank, "dev", target, done)


def _device_category(ev: Events, row: int) -> str:
    kind = int(ev.kind[row])
    return next(k for k in ("collective", "memcpy", "memset", "kernel") if KIND[k] == kind)


@dataclass(frozen=True)
class Segment:
    """A stretch of the path walked in one graph. As walked, the time it spent on host threads
    is in `host`, not yet in `ns` and `by_name`: `counted` counts every walk's at once."""

    ns: dict[str, int]
    by_name: dict[tuple[str, str], int]  # (category, name) -> ns
    device_ops: int
    switches: int
    handovers: list[Handover]
    visited: list[State]
    next: State | None  # where it goes on: another graph's rank, a repeat, or None at its start
    host: list[HostSpan] = field(default_factory=list)  # spans not yet counted


def walk(g: Graph, state: State, ranks: frozenset[int], stop: int | None = None,
         floor: int = NO_FLOOR) -> Segment:
    """Walk back from `state` while it is on one of `ranks` (the graph's), after `floor`, no
    state repeats and (with `stop`) fewer than `stop` states were walked."""
    w, worked = _Walk(floor), _Step(g)
    visited: list[State] = []
    seen: set[State] = set()
    current: State | None = state
    while (current is not None and current[0] in ranks and current[3] > floor
           and current not in seen and (stop is None or len(visited) < stop)):
        seen.add(current)
        visited.append(current)
        step = g.steps.get(current)
        if step is None:
            step = g.steps[current] = worked.of(current)
        w.apply(step)
        current = step.next
    by_name = {(c, g.ev.names[n]): v for (c, n), v in w.by_name.items()}
    return Segment(w.ns, by_name, w.device_ops, w.switches, w.handovers, visited,
                   current if current is not None and current[3] > floor else None,
                   w.host_spans)


def counted(g: Graph, walks: Sequence[Segment]) -> list[Segment]:
    """The walks' segments, the time of each host span they crossed counted per state and by
    the innermost op over it (by name): every span of a thread at once, one vectorized pass
    over their segments of its timeline. Span by span, each was ~20 numpy calls on a few
    hundred segments, ~0.2 ms: 598 spans, two thirds of the walk at 200k events."""
    ns = np.zeros((len(walks), len(HOST_STATES)), np.int64)
    by_name = [defaultdict(int, w.by_name) for w in walks]
    per_thread: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
    for i, w in enumerate(walks):
        for key, start, end in w.host:
            per_thread[key].append((i, start, end))
    for key, spans in per_thread.items():
        which, lo, hi = np.array(spans, np.int64).reshape(-1, 3).T
        thread_ns, named = _host_time(g, key, which, lo, hi, len(walks))
        ns += thread_ns
        for i, state, name, v in named:
            by_name[i][(HOST_STATES[state], g.ev.names[name])] += v
    return [replace(w, ns={c: v + (int(ns[i, HOST_STATES.index(c)]) if c in HOST_STATES else 0)
                           for c, v in w.ns.items()}, by_name=dict(by_name[i]), host=[])
            for i, w in enumerate(walks)]


def _host_time(g: Graph, key: int, which: I64, lo: I64, hi: I64,
               walks: int) -> tuple[I64, list[tuple[int, int, int, int]]]:
    """Of a thread's spans [lo, hi) (`which`: each one's walk): ns per host state, walk by walk
    (StateSums.between of each span, summed; time outside the thread's points is host_idle),
    and (walk, state, name, ns) of their op and runtime time, named by the innermost op."""
    sums, owner = g.thread_sums[key], g.thread_owner[key]
    points, states, names = sums.points, len(HOST_STATES), len(g.ev.names)
    # each span's segments of the timeline: the span, the segment, the overlap (> 0 but where
    # lo == hi)
    first = np.maximum(np.searchsorted(points, lo, side="right") - 1, 0)
    count = np.maximum(np.minimum(np.searchsorted(points, hi), len(points) - 1) - first, 0)
    span, segment = spread(first, count)
    length = (np.minimum(points[segment + 1], hi[span])
              - np.maximum(points[segment], lo[span]))
    state, who = sums.codes[segment], owner[segment]
    ns = np.bincount(which[span] * states + state, length, walks * states)
    outside = (np.maximum(np.minimum(hi, int(points[0])) - lo, 0)
               + np.maximum(hi - np.maximum(lo, int(points[-1])), 0))
    ns = ns.astype(np.int64).reshape(walks, states)
    ns[:, sums.outside] += np.bincount(which, outside, walks).astype(np.int64)
    keep = (length > 0) & (who >= 0) & (state < HOST_STATES.index("host_idle"))
    found, sums_of = key_sums((which[span[keep]] * states + state[keep]) * names
                              + g.ev.name[who[keep]], length[keep], walks * states * names)
    walk_state, name = np.divmod(found, names)
    i, state_of = np.divmod(walk_state, states)
    return ns, list(zip(i.tolist(), state_of.tolist(), name.tolist(), sums_of.tolist(),
                        strict=True))


def path_of(start: State, walk_from: Callable[[State, int | None], Segment]
            ) -> list[Segment]:
    """The whole path from `start`, stretch by stretch: `walk_from(state, stop)` walks the graph
    that holds the state's rank. A state seen in an earlier stretch ends the path there, as
    a repeat inside one walk does."""
    segments: list[Segment] = []
    seen: set[State] = set()
    state: State | None = start
    while state is not None and state not in seen:
        segment = walk_from(state, None)
        cut = next((i for i, s in enumerate(segment.visited) if s in seen), None)
        if cut is not None:
            segment = walk_from(state, cut)
        seen.update(segment.visited)
        segments.append(segment)
        state = segment.next
    return segments


@dataclass(frozen=True)
class Ends:
    """Where the path can end in some events: the last device op, the last host work of a
    thread that launches device work, the last host work of the loop's threads (those that
    hold the step markers; every thread when none does): (end, rank, row). An RPC request's
    reply arriving counts as its thread's work ending (the thread resumes)."""

    device: tuple[int, int, int] | None
    launching_host: tuple[int, int, int] | None
    any_host: tuple[int, int, int] | None
    launches: bool  # any device op has its launch call


# An iteration: rank -> its [start, end) there
Window = Mapping[int, tuple[int, int]]


class _Latest:
    """Of some rows, the one that ends last among those started (`since`: launched) in each of
    some windows, every window at once: each rank's windows' rows (by bisection) laid end to end,
    a max and a min over each window's (reduceat). Window by window, a search, a concatenation
    and a max each had been 14 of the critical path's ~125 CPU ms at 200k events (600
    windows, three kinds of work)."""

    def __init__(self, ev: Events, rows: I64, since: I64) -> None:
        self.ev = ev
        self.rows = rows
        self.by_rank: dict[int, tuple[I64, I64]] = {}
        for rank, group in group_rows(ev.rank[rows], rows).items():
            mine = group[np.argsort(since[group], kind="stable")]
            self.by_rank[rank] = (mine, since[mine])

    def __call__(self, windows: Sequence[Window | None]) -> list[tuple[int, int, int] | None]:
        ev = self.ev
        found: list[list[tuple[int, int]]] = [[] for _ in windows]  # (end, -row) per rank
        for k, window in enumerate(windows):
            if window is None and len(self.rows):
                last = ev.end[self.rows]
                found[k].append((int(last.max()), -int(self.rows[last == last.max()].min())))
        for rank, (mine, at) in self.by_rank.items():
            which = [(k, w[rank]) for k, w in enumerate(windows) if w is not None and rank in w]
            bounds = np.array([lo_hi for _, lo_hi in which], np.int64).reshape(-1, 2)
            first = np.searchsorted(at, bounds[:, 0])
            count = np.searchsorted(at, bounds[:, 1]) - first
            has = np.flatnonzero(count > 0)
            if not len(has):
                continue
            _, index = spread(first[has], count[has])
            at_run = np.cumsum(count[has]) - count[has]
            last = ev.end[mine[index]]
            latest = np.maximum.reduceat(last, at_run)
            tied = np.where(last == np.repeat(latest, count[has]), mine[index], len(ev))
            for k, end, row in zip([which[i][0] for i in has.tolist()], latest.tolist(),
                                   np.minimum.reduceat(tied, at_run).tolist(), strict=True):
                found[k].append((end, -row))
        # ties: the first row
        return [(best[0], int(ev.rank[-best[1]]), -best[1]) if (best := max(f, default=None))
                else None for f in found]


def ends(g: Graph, windows: Sequence[Window | None] = (None,)) -> list[Ends]:
    """The Ends of the graph's work in each window (None: all of it). A window's work is the
    host events starting in it and the device ops launched in it (their launch call starts
    in it; without one, they start in it)."""
    ev = g.ev
    calls = g.launch_of.values
    host = np.flatnonzero(ev.host_busy | ev.rpc_request)  # a reply's arrival resumes the thread
    threads = lane_key(ev.rank[host], ev.tid[host])
    launching = host[np.isin(threads, lane_key(ev.rank[calls], ev.tid[calls]))]
    marked = np.flatnonzero(ev.is_step_marker)
    loop = np.isin(threads, lane_key(ev.rank[marked], ev.tid[marked]))
    if loop.any():  # a DataLoader worker fetching the next batches is not what a step waited for
        host = host[loop]
    device = np.flatnonzero(ev.of_kind(*DEVICE_OPS))
    launched = ev.ts.copy()
    launched[g.launch_of.keys] = ev.ts[calls]
    on_device, on_launching, on_host = (_Latest(ev, rows, launched)
                                        for rows in (device, launching, host))
    return [Ends(*latest, len(calls) > 0) for latest in zip(
        on_device(windows), on_launching(windows), on_host(windows), strict=True)]


def linked_ranks(ranks: Iterable[int], peers: Mapping[int, Mapping[int, Sequence[Peer]]],
                 received: Mapping[int, Mapping[int, Peer]]) -> list[frozenset[int]]:
    """The ranks in groups that wait for one another: linked by a collective they share
    (`peers`: rank -> collective row -> the same collective on the others) or a receive that
    waited for a send (`received`: rank -> receive -> the send), by rank."""
    group = {r: frozenset({r}) for r in ranks}
    links = [(rank, p[0]) for rank, rows in peers.items() for found in rows.values()
             for p in found] + [(rank, p[0]) for rank, rows in received.items()
                                for p in rows.values()]
    for a, b in links:
        if group.setdefault(b, frozenset({b})) is not group.setdefault(a, frozenset({a})):
            joined = group[a] | group[b]
            group.update(dict.fromkeys(joined, joined))
    return sorted(set(group.values()), key=min)


def step_windows(steps: Mapping[int, Sequence[StepWindow]],
                 linked: Sequence[frozenset[int]]) -> list[tuple[int, Window]]:
    """(step, its window on each rank that ran it), by step, one for each group of `linked`
    (linked_ranks, of every rank with steps) that ran it, in the groups' order: ranks that wait
    for none of the others (Hogwild's processes, each its own optimizer) each have their own
    path, their steps k as far apart as they ran."""
    by_step: dict[int, dict[int, tuple[int, int]]] = defaultdict(dict)
    for rank, windows in steps.items():
        for w in windows:
            by_step[w.step][rank] = (w.start, w.end)
    return [(step, part) for step, window in sorted(by_step.items()) for ranks in linked
            if (part := {r: w for r, w in window.items() if r in ranks})]


def last_work(parts: Sequence[Ends]) -> State | None:
    """The event that ends last, from each graph's Ends (in rank order). The path ends with
    the last device op or the last host work of a thread that launches device work; helper
    threads that outlive both are not what the run waited for (unless no thread launches)."""
    launches = any(p.launches for p in parts)
    devices = [p.device for p in parts if p.device]
    hosts = [h for p in parts if (h := p.launching_host if launches else p.any_host)]
    latest = max((e for e, _, _ in [*devices, *hosts]), default=None)
    if latest is None:
        return None
    # ties: device ops before host work, then the lowest rank (the first row of the table)
    for where, found in (("dev", devices), ("host", hosts)):
        for end, rank, row in found:
            if end == latest:
                return (rank, where, row, end)
    return None


def path(end: int, segments: Sequence[Segment], top: int = TOP, step: int | None = None,
         steps: Sequence[CriticalPath] = ()) -> CriticalPath:
    ns = dict.fromkeys(CATEGORIES, 0)
    by_name: dict[tuple[str, str], int] = defaultdict(int)
    for segment in segments:
        for category, v in segment.ns.items():
            ns[category] += v
        for key, v in segment.by_name.items():
            by_name[key] += v
    ranked = sorted(by_name.items(), key=lambda kv: (-kv[1], kv[0][0], kv[0][1]))
    handovers = sorted((h for s in segments for h in s.handovers), key=lambda h: h.at)
    return CriticalPath(end - sum(ns.values()), end, ns,
                        sum(s.device_ops for s in segments), sum(s.switches for s in segments),
                        tuple(handovers), tuple((c, n, v) for (c, n), v in ranked[:top]),
                        step, tuple(steps))


def paths(parts: Sequence[Sequence[Ends]], steps: Sequence[tuple[int, Window]],
          walk_from: Callable[[State, int | None, int], Segment],
          count: Callable[[list[Segment]], list[Segment]]) -> CriticalPath | None:
    """The Run's path and each step's, from each graph's Ends (`ends(g, [None, *windows])`,
    in rank order), `walk_from(state, stop, floor)`, which walks the graph holding the
    state's rank back to `floor` (in a step, that rank's own start of it: the earliest rank's
    would count the other ranks' head start as the path's, a step's path longer than every
    rank's step), and `count`, which makes every path's walks segments at once (counted)."""
    def back_to(window: Window | None) -> Callable[[State, int | None], Segment]:
        def floor(rank: int) -> int:
            if window is None:
                return NO_FLOOR
            return window[rank][0] if rank in window else min(lo for lo, _ in window.values())
        return lambda state, stop: walk_from(state, stop, floor(state[0]))

    start = last_work([p[0] for p in parts])
    if start is None:
        return None
    ended = [(step, window, last) for i, (step, window) in enumerate(steps, 1)
             if (last := last_work([p[i] for p in parts])) is not None]
    walked = [path_of(start, back_to(None)),
              *(path_of(last, back_to(window)) for _, window, last in ended)]
    segments = iter(count([w for path_walks in walked for w in path_walks]))
    whole, *per_step = [[next(segments) for _ in path_walks] for path_walks in walked]
    return path(start[3], whole, steps=[
        replace(path(last[3], found, STEP_TOP, step),
                step_end=max(hi for _, hi in window.values()), ranks=tuple(sorted(window)))
        for (step, window, last), found in zip(ended, per_step, strict=True)])


def critical_path(ev: Events, syncs: list[SyncEvent],
                  steps: Mapping[int, Sequence[StepWindow]] | None = None,
                  gaps: Mapping[int, Sequence[tuple[int, int]]] | None = None,
                  groups: Groups = NO_GROUPS,
                  received: Mapping[int, Mapping[int, Peer]] | None = None
                  ) -> CriticalPath | None:
    """The critical path over all ranks, with each of `steps`' own, or None when the Run has
    no host or device work; `gaps`: each rank's time between its profiling windows
    (without_gaps); `groups`: the named process groups of its collectives
    (groups.process_groups); `received`: each rank's receives that waited for their sends
    (transfers.hand_overs); its RPC requests and the work they asked for wait for one another
    too (rpc.hand_overs)."""
    peers = collective_peers(instances_of(ev, groups).values())
    rpc = rpc_hand_overs(ev)
    g = build(ev, syncs, {row: p for by_row in peers.values() for row, p in by_row.items()},
              {row: p for by_row in merged(received or {}, rpc.replies).values()
               for row, p in by_row.items()},
              {row: p for by_row in rpc.requested.values() for row, p in by_row.items()})
    windows = step_windows(steps or {}, linked_ranks(
        [*ev.ranks, *(steps or {})], peers, merged(received or {}, *rpc)))
    # one rank a segment: each walks back to its own rank's floor
    return without_gaps(paths([ends(g, [None, *(w for _, w in windows)])], windows,
                              lambda s, stop, floor: walk(g, s, frozenset({s[0]}), stop, floor),
                              lambda walks: counted(g, walks)), gaps or {})


def merged(*waits: Mapping[int, Mapping[int, Peer]]) -> dict[int, dict[int, Peer]]:
    """rank -> row -> the peer it waited for, of several such (transfers.hand_overs' receives,
    rpc.hand_overs' replies and requests: each links its ranks)."""
    out: dict[int, dict[int, Peer]] = defaultdict(dict)
    for found in waits:
        for rank, rows in found.items():
            out[rank].update(rows)
    return dict(out)


def without_gaps(found: CriticalPath | None, gaps: Mapping[int, Sequence[tuple[int, int]]]
                 ) -> CriticalPath | None:
    """The Run's path less the time every rank spent between its profiling windows
    (iterations.unprofiled_gaps): nothing was traced there, and the walk crosses it as idle
    (three cycles of a schedule had read "host_idle 99.2%" of 1.8 s, 19 ms of it traced),
    taken from host_idle, then device_idle."""
    if found is None or not gaps:
        return found
    common: list[tuple[int, int]] | None = None
    for spans in gaps.values():
        common = list(spans) if common is None else [
            (max(a, c), min(b, d)) for a, b in common for c, d in spans if max(a, c) < min(b, d)]
    left = within_gaps(common or [], found.start, found.end)
    if not left:
        return found
    ns, unprofiled = dict(found.ns), left
    for category in ("host_idle", "device_idle"):
        taken = min(ns[category], left)
        ns[category] -= taken
        left -= taken
    return replace(found, ns=ns, unprofiled_ns=unprofiled - left)
