"""Launch statistics: how device work waits on the host that launches it.

A device op (kernel, copy, set, collective) is joined to the runtime call that
launched it by (rank, correlation id). From the pairs: the launch-to-start delay,
the ops that ran shorter than their own launch call, how many launched ops were
queued but unfinished over time, and what each stretch of device idle time waited
on: the host had not launched the next op yet (host wait: until its launch call
returned), or it had and the device still did not start it (kernel wait:
dependencies, events, launch latency); an op whose launch is not in the trace leaves
its gap unexplained (other). The split is made per device (the device idle: no op
on any of its streams) and per stream, with the statistics of the idle intervals.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from perfswarm.analyze.frame import DEVICE_OPS, I64, Events, group_rows, lane_key
from perfswarm.analyze.intervals import gaps, sorted_unique

CORRELATION_BITS = 40
QUEUE_BINS = 100
# Launched, unfinished ops past which a launch call blocks until one finishes (HTA's default
# for CUDA's launch queue).
FULL_QUEUE = 1024


@dataclass(frozen=True)
class Distribution:
    count: int
    mean: float
    p50: float
    p90: float
    max: int

    @classmethod
    def of(cls, values: I64) -> Distribution:
        if len(values) == 0:
            return cls(0, 0.0, 0.0, 0.0, 0)
        return cls(len(values), float(values.mean()), float(np.percentile(values, 50)),
                   float(np.percentile(values, 90)), int(values.max()))

    def to_dict(self) -> dict[str, Any]:
        return {"count": self.count, "mean": self.mean, "p50": self.p50, "p90": self.p90,
                "max": self.max}


@dataclass(frozen=True)
class IdleSplit:
    host_wait_ns: int
    kernel_wait_ns: int
    other_ns: int

    @property
    def total_ns(self) -> int:
        return self.host_wait_ns + self.kernel_wait_ns + self.other_ns

    def to_dict(self) -> dict[str, Any]:
        return {"host_wait_ns": self.host_wait_ns, "kernel_wait_ns": self.kernel_wait_ns,
                "other_ns": self.other_ns, "total_ns": self.total_ns}


@dataclass(frozen=True)
class LaunchStats:
    rank: int
    device_ops: int
    launched: int  # device ops whose launch call is in the trace
    delay_ns: Distribution  # device op start - launch call start
    shorter_than_launch: int
    queue: Queue
    idle: IdleSplit
    streams: tuple[StreamStats, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "device_ops": self.device_ops, "launched": self.launched,
                "delay_ns": self.delay_ns.to_dict(),
                "shorter_than_launch": self.shorter_than_launch, "queue": self.queue.to_dict(),
                "idle": self.idle.to_dict(), "streams": [s.to_dict() for s in self.streams]}


def launch_pairs(ev: Events) -> tuple[I64, I64]:
    """(device rows, launch rows) of the device ops of `ev` that have a launch call, by device
    row; joined once per Events object (the launch statistics, the scopes, the dependencies
    and the launching ops each ask). The caller does not change what it gets."""
    return ev.derived("launch pairs", lambda: _launch_pairs(ev))


def _launch_pairs(ev: Events) -> tuple[I64, I64]:
    dev = np.flatnonzero(ev.of_kind(*DEVICE_OPS) & (ev.correlation >= 0))
    calls = np.flatnonzero(ev.of_kind("runtime", "driver") & (ev.correlation >= 0))
    key = (ev.rank << CORRELATION_BITS) | (ev.correlation & ((1 << CORRELATION_BITS) - 1))
    call_keys = key[calls]
    order = np.argsort(call_keys, kind="stable")
    sorted_keys = call_keys[order]
    at = np.clip(np.searchsorted(sorted_keys, key[dev]), 0, max(len(calls) - 1, 0))
    found = (sorted_keys[at] == key[dev]) if len(calls) else np.zeros(len(dev), bool)
    return dev[found], calls[order[at[found]]]


@dataclass(frozen=True)
class Queue:
    """Launched, unfinished device ops over time: max, time-weighted mean, per time bin, and
    the time it was full (the host blocked on launching)."""

    max: int
    mean: float  # over first launch .. last launched op end
    start: int
    bin_ns: int
    bins: tuple[float, ...]  # time-weighted mean length in each of QUEUE_BINS equal bins
    full_ns: int  # time with FULL_QUEUE or more ops launched and unfinished

    def to_dict(self) -> dict[str, Any]:
        return {"max": self.max, "mean": self.mean, "start": self.start, "bin_ns": self.bin_ns,
                "bins": list(self.bins), "full_ns": self.full_ns}


def queue_steps(launch_ts: I64, done_ts: I64) -> tuple[I64, I64]:
    """The queue's length from each time on: +1 at each launch, -1 at each finish (at equal
    times, finishes first)."""
    times = np.concatenate([launch_ts, done_ts])
    steps = np.concatenate([np.ones(len(launch_ts), np.int64), -np.ones(len(done_ts), np.int64)])
    order = np.lexsort((steps, times))
    return times[order], np.cumsum(steps[order])


def queue_length(launch_ts: I64, done_ts: I64, bins: int = QUEUE_BINS,
                 full: int = FULL_QUEUE) -> Queue:
    if len(launch_ts) == 0:
        return Queue(0, 0.0, 0, 0, (), 0)
    times, level = queue_steps(launch_ts, done_ts)
    start, span = int(times[0]), int(times[-1] - times[0])
    if span == 0:
        return Queue(int(level.max()), 0.0, start, 0, (), 0)
    # The integral of the queue length is piecewise linear in time: exact at any bin edge.
    area = np.concatenate([[0], np.cumsum(level[:-1] * np.diff(times))]).astype(np.float64)
    bin_ns = -(-span // bins)
    # times from the start: epoch ns as float64 are 256 ns apart, which moved the bins' edges
    edges = bin_ns * np.arange(bins + 1)
    at_edges = np.interp(edges, times - start, area)
    full_ns = int(np.diff(times)[level[:-1] >= full].sum())
    return Queue(int(level.max()), float(area[-1] / span), start, bin_ns,
                 tuple(float(x) for x in np.diff(at_edges) / bin_ns), full_ns)


def idle_gaps(ev: Events, rows: I64, launch_end: I64) -> tuple[I64, I64, I64]:
    """The idle gaps between device ops `rows` (one device or one stream), each split into
    (host wait, kernel wait, other) ns; `launch_end`: for each of `rows`, the end of its
    launch call, or -1 when the trace does not have it."""
    order = np.argsort(ev.ts[rows], kind="stable")
    rows, launch_end = rows[order], launch_end[order]
    starts, ends = ev.ts[rows], ev.end[rows]
    g_s, g_e = gaps(starts, ends, int(starts.min()), int(ends.max()))
    called = launch_end[np.searchsorted(starts, g_e, side="left")]
    length = g_e - g_s
    host = np.where(called >= 0, np.clip(called - g_s, 0, length), 0)
    kernel = np.where(called >= 0, length - host, 0)
    return host, kernel, np.where(called >= 0, 0, length)


def idle_split(ev: Events, dev_rows: I64, launch_end: I64) -> IdleSplit:
    """Split device idle gaps (per device: no op on any stream) by what they waited on
    (`launch_end` as in idle_gaps)."""
    host = kernel = other = 0
    for device in sorted_unique(ev.device[dev_rows]):
        mine = ev.device[dev_rows] == device
        h, k, o = idle_gaps(ev, dev_rows[mine], launch_end[mine])
        host, kernel, other = host + int(h.sum()), kernel + int(k.sum()), other + int(o.sum())
    return IdleSplit(host, kernel, other)


@dataclass(frozen=True)
class StreamStats:
    """One stream's idle time between its first op's start and its last op's end, split as
    the device's is, with the distribution of each kind of idle interval (intervals with
    none of that kind left out), and its queue of launched, unfinished ops."""

    device: int
    stream: int
    busy_ns: int
    idle: IdleSplit
    host_wait: Distribution
    kernel_wait: Distribution
    other: Distribution
    queue: Queue

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "stream": self.stream, "busy_ns": self.busy_ns,
                **self.idle.to_dict(),
                "intervals": {"host_wait": self.host_wait.to_dict(),
                              "kernel_wait": self.kernel_wait.to_dict(),
                              "other": self.other.to_dict()},
                "queue": self.queue.to_dict()}


def stream_stats(ev: Events, dev_rows: I64, launch_ts: I64,
                 launch_end: I64) -> tuple[StreamStats, ...]:
    """Each stream's idle split and queue (`launch_ts`, `launch_end`: of each of `dev_rows`,
    its launch call's start and end, -1 when the trace does not have it)."""
    out = []
    at = np.arange(len(dev_rows))
    streams = group_rows(lane_key(ev.device[dev_rows], ev.stream[dev_rows]), at)
    for _key, where in sorted(streams.items()):
        rows = dev_rows[where]
        h, k, o = idle_gaps(ev, rows, launch_end[where])
        span = int(ev.end[rows].max() - ev.ts[rows].min())
        split = IdleSplit(int(h.sum()), int(k.sum()), int(o.sum()))
        called = launch_ts[where] >= 0
        out.append(StreamStats(int(ev.device[rows[0]]), int(ev.stream[rows[0]]),
                               span - split.total_ns, split, Distribution.of(h[h > 0]),
                               Distribution.of(k[k > 0]), Distribution.of(o[o > 0]),
                               queue_length(launch_ts[where][called], ev.end[rows][called])))
    return tuple(out)


def rank_launch_stats(ev: Events, rank: int) -> LaunchStats:
    rows = np.arange(len(ev))[ev.rank_slice(rank)]
    dev_all = rows[ev.of_kind(*DEVICE_OPS)[rows]]
    dev, calls = launch_pairs(ev)
    mine = ev.rank[dev] == rank  # a launch and its call share a rank (the join's key)
    dev, calls = dev[mine], calls[mine]
    launch_ts = np.full(len(dev_all), -1, np.int64)  # per device op: its launch call's start,
    launch_end = launch_ts.copy()  # and end
    launch_ts[np.searchsorted(dev_all, dev)] = ev.ts[calls]
    launch_end[np.searchsorted(dev_all, dev)] = ev.end[calls]
    idle = idle_split(ev, dev_all, launch_end) if len(dev_all) else IdleSplit(0, 0, 0)
    return LaunchStats(
        rank=rank, device_ops=len(dev_all), launched=len(dev),
        delay_ns=Distribution.of(ev.ts[dev] - ev.ts[calls]),
        shorter_than_launch=int(np.count_nonzero(ev.dur[dev] < ev.dur[calls])),
        queue=queue_length(ev.ts[calls], ev.end[dev]), idle=idle,
        streams=stream_stats(ev, dev_all, launch_ts, launch_end) if len(dev_all) else ())


def launch_stats(ev: Events) -> tuple[LaunchStats, ...]:
    return tuple(rank_launch_stats(ev, rank) for rank in ev.ranks)
