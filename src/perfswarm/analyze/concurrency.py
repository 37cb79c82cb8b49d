"""Concurrency breakdown: what the device and host were doing at every instant of a rank's span.

Each instant falls in exactly one state, by priority: compute and communication
overlapped, compute only, communication only, memory (memcpy/memset with no compute
or communication), host busy with the device idle, and fully idle. The states
partition the span, so their nanoseconds sum to it exactly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from perfswarm.analyze.dependencies import blocked_in_collectives
from perfswarm.analyze.frame import WORK_KINDS, Events, group_rows, lane_key
from perfswarm.analyze.intervals import (
    I64,
    Coverage,
    Mask,
    covered,
    first_covering,
    sorted_unique,
    state_sweep,
    total,
    union,
)
from perfswarm.analyze.iterations import StepWindow

STATES: Final = ("overlapped", "compute_only", "comm_only", "memory", "host_busy_device_idle",
                 "idle")


@dataclass(frozen=True)
class Breakdown:
    """Nanoseconds per state over [start, end)."""

    start: int
    end: int
    ns: Mapping[str, int]
    # of the span, the time a host thread ran ops or runtime calls (frame.Events.host_work):
    # host_busy_device_idle also counts annotations and Python frames around no op (a
    # DataLoader's wait for its workers)
    host_ops_ns: int = 0
    # between [start, end), the time between the rank's profiling windows, where nothing was
    # traced: no part of the span or of any state
    unprofiled_ns: int = 0

    @property
    def span_ns(self) -> int:
        return self.end - self.start - self.unprofiled_ns

    @property
    def device_idle_ns(self) -> int:
        """Time no device work ran (host busy or not): the one definition of device idle."""
        return self.ns["host_busy_device_idle"] + self.ns["idle"]

    def share(self, state: str) -> float:
        return self.ns[state] / self.span_ns if self.span_ns else 0.0

    @property
    def comm_overlap_pct(self) -> float:
        """Share of communication time hidden under compute, in percent."""
        comm = self.ns["overlapped"] + self.ns["comm_only"]
        return 100.0 * self.ns["overlapped"] / comm if comm else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"start": self.start, "end": self.end, "span_ns": self.span_ns,
                "ns": dict(self.ns), "share": {s: self.share(s) for s in STATES},
                "comm_overlap_pct": self.comm_overlap_pct, "host_ops_ns": self.host_ops_ns,
                "host_ops_share": self.host_ops_ns / self.span_ns if self.span_ns else 0.0,
                "unprofiled_ns": self.unprofiled_ns}


@dataclass(frozen=True)
class IterationBreakdown:
    step: int
    breakdown: Breakdown
    host_comm: HostComm | None = None  # over the iteration (a rank with host collectives)

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, **self.breakdown.to_dict(),
                **({"host_comm": self.host_comm.to_dict()} if self.host_comm else {})}


HOST_COMM_STATES: Final = ("overlapped", "compute_only", "comm_only", "neither")


@dataclass(frozen=True)
class HostComm:
    """A CPU process group's communication on one rank against its compute, over the rank's
    span: its collectives on host threads (frame.Events.host_collective: gloo's all-reduce of
    a DDP rank's gradients) and its work (ops and runtime calls, not an annotation around a
    wait nor the calls that issue the collectives), each instant in one of
    HOST_COMM_STATES (both, compute only, communication only, neither)."""

    ns: Mapping[str, int]

    @property
    def compute_ns(self) -> int:
        return self.ns["overlapped"] + self.ns["compute_only"]

    @property
    def comm_ns(self) -> int:
        return self.ns["overlapped"] + self.ns["comm_only"]

    @property
    def comm_overlap_pct(self) -> float:
        """Share of communication time hidden under compute, in percent."""
        return 100.0 * self.ns["overlapped"] / self.comm_ns if self.comm_ns else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"ns": dict(self.ns), "compute_ns": self.compute_ns, "comm_ns": self.comm_ns,
                "comm_overlap_pct": self.comm_overlap_pct}

    @classmethod
    def of_rank(cls, ev: Events, rank: int, spans: Sequence[tuple[int, int]]
                ) -> list[HostComm] | None:
        """One per span (from one sweep), or None when the rank ran no collective on host
        threads."""
        rows = np.arange(len(ev))[ev.rank_slice(rank)]
        comm = rows[ev.host_collective[rows]]
        if not len(comm):
            return None
        sums = state_sweep([host_compute(ev, rank), (ev.ts[comm], ev.end[comm])],
                           lambda c: first_covering([c[0] & c[1], c[0], c[1]]),
                           len(HOST_COMM_STATES), HOST_COMM_STATES.index("neither"))
        bounds = np.array(spans, np.int64).reshape(-1, 2)
        return [cls(dict(zip(HOST_COMM_STATES, ns, strict=True)))
                for ns in sums.between(bounds[:, 0], bounds[:, 1]).tolist()]


def host_compute(ev: Events, rank: int) -> tuple[I64, I64]:
    """ev.working, where that is the rank's host work less, on each thread, the calls that
    issue collectives (with the ops around them: _c10d_functional::all_reduce around
    c10d::allreduce_) and the stretches it sat in an op waiting for a collective it issued
    (dependencies.blocked_in_collectives): the ops covering a tensor-parallel all-reduce on
    gloo's thread are its call and its wait_tensor, no work that hides it (had read 99.5%
    hidden). Once per rank of an Events object."""
    return ev.derived(("host compute", rank), lambda: _host_compute(ev, rank))


def _host_compute(ev: Events, rank: int) -> tuple[I64, I64]:
    rows = np.arange(len(ev))[ev.rank_slice(rank)]
    if ev.of_kind("kernel")[rows].any():
        return ev.working(rank)
    work = rows[ev.of_kind(*WORK_KINDS)[rows]]
    calls = rows[ev.collective_call[rows]]
    blocked = blocked_in_collectives(ev)
    by_thread = group_rows(lane_key(ev.rank[calls], ev.tid[calls]), calls)
    starts, ends = [], []
    for key, mine in group_rows(lane_key(ev.rank[work], ev.tid[work]), work).items():
        call = by_thread.get(key, calls[:0])
        lo, hi = blocked[key].stretches() if key in blocked else (call[:0], call[:0])
        s, e = _less(union(ev.ts[mine], ev.end[mine]),
                     union(np.concatenate([ev.ts[call], lo]), np.concatenate([ev.end[call], hi])))
        starts.append(s)
        ends.append(e)
    return union(np.concatenate(starts), np.concatenate(ends)) if starts else (rows[:0], rows[:0])


def _less(a: tuple[I64, I64], b: tuple[I64, I64]) -> tuple[I64, I64]:
    """The time of span set `a` outside span set `b` (each disjoint), as its segments."""
    points = sorted_unique(np.concatenate([*a, *b]))
    keep = covered(*a, points) & ~covered(*b, points)
    return points[:-1][keep], points[1:][keep]


@dataclass(frozen=True)
class RankConcurrency:
    rank: int
    total: Breakdown
    iterations: tuple[IterationBreakdown, ...]
    host_comm: HostComm | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "total": self.total.to_dict(),
                "iterations": [i.to_dict() for i in self.iterations],
                "host_comm": self.host_comm.to_dict() if self.host_comm else None}


@dataclass(frozen=True)
class Concurrency:
    ranks: tuple[RankConcurrency, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"states": list(STATES), "ranks": [r.to_dict() for r in self.ranks]}


@dataclass(frozen=True)
class Activity:
    """The four interval sets the states are made of, for one rank, and its collectives on
    host threads (in its span, in no state: HostComm's)."""

    compute: tuple[I64, I64]
    comm: tuple[I64, I64]
    memory: tuple[I64, I64]
    host: tuple[I64, I64]
    host_comm: tuple[I64, I64] = field(default_factory=lambda: (np.zeros(0, np.int64),
                                                                np.zeros(0, np.int64)))
    host_ops: tuple[I64, I64] = field(default_factory=lambda: (np.zeros(0, np.int64),
                                                               np.zeros(0, np.int64)))

    @classmethod
    def of_rank(cls, ev: Events, rank: int) -> Activity:
        rows = ev.rank_slice(rank)

        def spans(mask: np.ndarray[Any, np.dtype[np.bool_]]) -> tuple[I64, I64]:
            sel = mask[rows]
            return ev.ts[rows][sel], ev.end[rows][sel]

        return cls(compute=spans(ev.of_kind("kernel")), comm=spans(ev.of_kind("collective")),
                   memory=spans(ev.of_kind("memcpy", "memset")),
                   # a host thread running a collective waits for the other ranks: not host
                   # work (HostComm sets it against the rank's compute)
                   host=spans(ev.host_busy & ~ev.host_collective),
                   host_comm=spans(ev.host_collective), host_ops=ev.host_work(rank))

    def span(self) -> tuple[int, int]:
        starts = np.concatenate([s for s, _ in (*self.sets(), self.host_comm)])
        ends = np.concatenate([e for _, e in (*self.sets(), self.host_comm)])
        if len(starts) == 0:
            return 0, 0
        return int(starts.min()), int(ends.max())

    def sets(self) -> tuple[tuple[I64, I64], ...]:
        return (self.compute, self.comm, self.memory, self.host)


def _state(covers: list[Mask]) -> I64:
    """Index into STATES of each segment, from the coverage of Activity.sets()."""
    compute, comm, memory, host = covers
    return first_covering([compute & comm, compute, comm, memory, host])


def breakdowns(activity: Activity, windows: Sequence[tuple[int, int]]) -> list[Breakdown]:
    """One Breakdown per window, from a single sweep over the rank's boundaries."""
    sums = state_sweep(activity.sets(), _state, len(STATES), STATES.index("idle"))
    bounds = np.array(windows, np.int64).reshape(-1, 2)
    ops = Coverage(*activity.host_ops).between(bounds[:, 0], bounds[:, 1])
    ns = sums.between(bounds[:, 0], bounds[:, 1]).tolist()
    return [Breakdown(lo, hi, dict(zip(STATES, n, strict=True)), int(o))
            for (lo, hi), n, o in zip(windows, ns, ops.tolist(), strict=True)]


def rank_concurrency(ev: Events, rank: int, windows: Sequence[StepWindow],
                     gaps: Sequence[tuple[int, int]] = ()) -> RankConcurrency:
    """One rank's breakdown over its whole span and over each of its iterations; `gaps`: the
    time between its profiling windows (iterations.unprofiled_gaps), no part of the whole
    span's breakdown (two cycles of a schedule had read "untraced 72.2%" where their steps
    were 87-90% busy)."""
    activity = Activity.of_rank(ev, rank)
    span = activity.span()
    spans = [span, *((w.start, w.end) for w in windows)]
    inside = [(max(lo, span[0]), min(hi, span[1])) for lo, hi in gaps if lo < span[1] and
              hi > span[0]]
    total, *per_step = breakdowns(activity, [*spans, *inside])
    per_step, outside = per_step[:len(windows)], per_step[len(windows):]
    if outside:
        total = Breakdown(total.start, total.end,
                          {k: v - sum(b.ns[k] for b in outside) for k, v in total.ns.items()},
                          total.host_ops_ns - sum(b.host_ops_ns for b in outside),
                          sum(b.span_ns for b in outside))
    found: Sequence[HostComm | None] = HostComm.of_rank(ev, rank, spans) or [None] * len(spans)
    host_total, *host_steps = found
    return RankConcurrency(
        rank, total,
        tuple(IterationBreakdown(w.step, b, h)
              for w, b, h in zip(windows, per_step, host_steps, strict=True)), host_total)


@dataclass(frozen=True)
class OnCpu:
    """A rank's loop thread on the CPU over the rank's span, from perf's cpu-clock samples:
    perf turns its rate into a fixed period of the sampled thread's own CPU time (a sample
    every period_ns that the thread ran, none while it waits, for a core or anything else),
    so its samples times the period are its CPU time, to a period."""

    span_ns: int
    loop_ns: int  # the loop's threads: those of the rank's step markers, else the longest's
    others_ns: int  # the other threads of its process (intra-op threads) together
    ops_ns: int  # the loop threads' ops and runtime calls, wall time (waits for a core too)
    period_ns: int
    threads: int = 1  # the loop's threads (a server's pool takes its steps in turn)


def on_cpu(ev: Events, rank: int, span: tuple[int, int], samples: tuple[I64, I64, I64],
           period_ns: int) -> OnCpu | None:
    """The rank's loop threads' (Events.loop_threads) time on the CPU over its `span` (the
    concurrency breakdown's) from perf's samples (ts, pid, tid: the Run's, any rank), None
    when the rank has no host work."""
    rows = np.arange(len(ev))[ev.rank_slice(rank)]
    work = rows[(ev.of_kind(*WORK_KINDS) & ~ev.collective_call)[rows]]
    loop = ev.loop_threads(rank)
    if not len(work) or loop is None:
        return None
    pid, threads = loop
    mine = work[np.isin(ev.tid[work], threads)]
    lo, hi = span
    ts, pids, tids = samples
    inside = (ts >= lo) & (ts < hi) & (pids == pid)
    ours = np.isin(tids, threads)
    return OnCpu(hi - lo, int(np.count_nonzero(inside & ours)) * period_ns,
                 int(np.count_nonzero(inside & ~ours)) * period_ns,
                 total(ev.ts[mine], ev.end[mine]), period_ns, len(threads))


def concurrency(ev: Events, steps: Mapping[int, Sequence[StepWindow]],
                gaps: Mapping[int, Sequence[tuple[int, int]]] | None = None) -> Concurrency:
    """Breakdown per rank over its whole span (less `gaps`, see rank_concurrency) and over
    each iteration in `steps`."""
    return Concurrency(tuple(rank_concurrency(ev, rank, list(steps.get(rank, ())),
                                              (gaps or {}).get(rank, ()))
                             for rank in ev.ranks))
