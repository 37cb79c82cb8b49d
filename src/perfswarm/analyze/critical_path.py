"""Critical path: the chain of work that decided when the last event ended.

Walked backwards from the event that ends last ("last arrival"): a device op waits
for whichever of its dependencies became ready last (the previous op on its
stream, its launch call, the op recorded by an event its stream waits on); a
collective also waits for the same collective on the rank that entered it last; a
host thread runs back to back, except where a synchronizing call (device, stream
or event sync) waited for the device, where the path continues at the device op it
waited for. Every nanosecond from the path's start to its end is attributed to one
category, so the composition sums to the path length exactly.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from perfswarm.analyze.dependencies import Dependencies, SyncEvent, dependencies
from perfswarm.analyze.frame import I64, KIND, Events, group_rows, lane_key
from perfswarm.analyze.intervals import StateSums, covered, sorted_unique
from perfswarm.analyze.launch import DEVICE_OPS

CATEGORIES: Final = ("cpu", "runtime", "host_idle", "sync", "launch_latency", "kernel",
                     "collective", "memcpy", "memset")
HOST_STATES: Final = ("cpu", "runtime", "host_idle")
TOP = 20


@dataclass(frozen=True)
class CriticalPath:
    start: int
    end: int
    ns: dict[str, int]  # category -> ns on the path
    device_ops: int  # device ops with time on the path
    rank_switches: int
    top: tuple[tuple[str, str, int], ...]  # (category, name, ns), largest first

    @property
    def length_ns(self) -> int:
        return self.end - self.start

    def to_dict(self) -> dict[str, Any]:
        return {"start": self.start, "end": self.end, "length_ns": self.length_ns,
                "ns": dict(self.ns), "share": {c: (v / self.length_ns if self.length_ns else 0.0)
                                               for c, v in self.ns.items()},
                "device_ops": self.device_ops, "rank_switches": self.rank_switches,
                "top": [{"category": c, "name": n, "ns": v} for c, n, v in self.top]}


@dataclass
class _Graph:
    """Dependencies of every device op and host sync call, and each host thread's states."""

    ev: Events
    deps: Dependencies
    # keyed by lane_key(rank, tid)
    thread_syncs: dict[int, tuple[I64, I64]] = field(default_factory=dict)
    thread_sums: dict[int, StateSums] = field(default_factory=dict)
    thread_start: dict[int, int] = field(default_factory=dict)


def _build(ev: Events, syncs: list[SyncEvent]) -> _Graph:
    g = _Graph(ev, dependencies(ev, syncs))
    _threads(g)
    return g


def _threads(g: _Graph) -> None:
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
        g.thread_start[key] = int(starts.min())
        target = g.deps.sync_target
        waited = [c for c in rows[calls].tolist() if c in target
                  and ev.end[target[c]] > ev.ts[c] and ev.ts[target[c]] < ev.end[c]]
        waited.sort(key=lambda c: int(ev.end[c]))
        g.thread_syncs[key] = (np.array(waited, np.int64),
                               np.array([ev.end[c] for c in waited], np.int64))


class _Walk:
    def __init__(self, g: _Graph) -> None:
        self.g = g
        self.ns = dict.fromkeys(CATEGORIES, 0)
        self.by_name: dict[tuple[str, int], int] = defaultdict(int)
        self.device_ops = 0
        self.switches = 0

    def add(self, category: str, lo: int, hi: int, row: int = -1) -> None:
        if hi <= lo:
            return
        self.ns[category] += hi - lo
        if row >= 0:
            self.by_name[(category, int(self.g.ev.name[row]))] += hi - lo

    def device(self, row: int, t: int) -> tuple[str, int, int] | None:
        """Account device op `row` up to t; return the next state."""
        ev, g = self.g.ev, self.g
        start = int(ev.ts[row])
        peers = [p for p in g.deps.peers.get(row, []) if ev.ts[p] > start]
        if peers:
            late = max(peers, key=lambda p: (int(ev.ts[p]), -p))
            self.add("collective", int(ev.ts[late]), t, row)
            self.device_ops += 1
            self.switches += 1
            return ("dev", late, int(ev.ts[late]))
        self.add(_device_category(ev, row), start, t, row)
        self.device_ops += int(t > start)
        preds: list[tuple[int, int, str]] = []  # (ready, row, where)
        for dep in (g.deps.prev_on_stream.get(row), g.deps.waits_for.get(row)):
            if dep is not None and ev.ts[dep] <= start:
                preds.append((min(int(ev.end[dep]), start), dep, "dev"))
        call = g.deps.launch_of.get(row)
        if call is not None and ev.ts[call] <= start:
            preds.append((min(int(ev.end[call]), start), call, "host"))
        if not preds:
            return None
        ready, dep, where = max(preds)
        self.add("launch_latency", ready, start)
        if where == "host":
            return ("host", dep, ready)
        return ("dev", dep, ready)

    def host(self, row: int, t: int) -> tuple[str, int, int] | None:
        """Walk host thread of `row` back from t; return the device op a sync waited on."""
        ev, g = self.g.ev, self.g
        key = int(lane_key(int(ev.rank[row]), int(ev.tid[row])))
        calls, call_ends = g.thread_syncs[key]
        i = int(np.searchsorted(call_ends, t, side="right")) - 1
        sums = g.thread_sums[key]
        if i < 0:
            lo = min(g.thread_start[key], t)
            for state, ns in zip(HOST_STATES, sums.between(lo, t).tolist(), strict=True):
                self.ns[state] += ns
            return None
        call = int(calls[i])
        for state, ns in zip(HOST_STATES, sums.between(int(ev.end[call]), t).tolist(),
                             strict=True):
            self.ns[state] += ns
        target = g.deps.sync_target[call]
        done = min(int(ev.end[target]), int(ev.end[call]))
        self.add("sync", done, int(ev.end[call]), call)
        return ("dev", target, done)


def _device_category(ev: Events, row: int) -> str:
    kind = int(ev.kind[row])
    return next(k for k in ("collective", "memcpy", "memset", "kernel") if KIND[k] == kind)


def critical_path(ev: Events, syncs: list[SyncEvent], top: int = TOP) -> CriticalPath | None:
    """The critical path over all ranks, or None when the Run has no host or device work."""
    # The path ends with the last device op or the last host work of a thread that
    # launches device work; helper threads that outlive both are not what the run waited for.
    g = _build(ev, syncs)
    calls = np.fromiter(g.deps.launch_of.values(), np.int64, len(g.deps.launch_of))
    host = np.flatnonzero(ev.host_busy)
    if len(calls):
        host = host[np.isin(lane_key(ev.rank[host], ev.tid[host]),
                            lane_key(ev.rank[calls], ev.tid[calls]))]
    work = np.concatenate([np.flatnonzero(ev.of_kind(*DEVICE_OPS)), host])
    if len(work) == 0:
        return None
    last = int(work[np.argmax(ev.end[work])])
    end = int(ev.end[last])
    walk = _Walk(g)
    state: tuple[str, int, int] | None = (
        ("dev", last, end) if ev.kind[last] in [KIND[k] for k in DEVICE_OPS]
        else ("host", last, end))
    start = end
    seen: set[tuple[str, int, int]] = set()
    while state is not None and state not in seen:
        seen.add(state)
        where, row, t = state
        start = t
        state = walk.device(row, t) if where == "dev" else walk.host(row, t)
    if state is None or state in seen:
        start = end - sum(walk.ns.values())
    ranked = sorted(walk.by_name.items(), key=lambda kv: (-kv[1], kv[0][0], ev.names[kv[0][1]]))
    return CriticalPath(start, end, walk.ns, walk.device_ops, walk.switches,
                        tuple((c, ev.names[n], v) for (c, n), v in ranked[:top]))
