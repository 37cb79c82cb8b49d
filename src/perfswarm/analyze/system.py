"""System counters against the device: what dominates each window, and what tracks utilization.

Counter names follow the Run store's convention: `cpu.<core>.usr|sys|iowait`,
`gpu<N>.sm_util` (or `.util`), `disk.read|write_bytes`, `net.<...>` (not the per-flow `net.flow.`).
Utilizations are fractions or percents (a series whose values exceed 1.5 is read as
percent). Disk and network series that never decrease are cumulative counters and are
turned into rates. Host-wide counters (rank -1, as a recorder's samplers write them) count
for every rank.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from perfswarm.analyze.frame import I64
from perfswarm.analyze.intervals import Covered
from perfswarm.analyze.iterations import UNUSUAL, StepWindow, hook_deltas
from perfswarm.trace.schema import EXPORT, HOOK_DELAY, NONE, PROFILED, TAIL

F64 = np.ndarray[Any, np.dtype[np.float64]]
GROUPS: Final = ("usr", "sys", "iowait", "gpu")
PATTERNS: Final = {
    "usr": re.compile(r"^cpu\.[^.]+\.usr$"),
    "sys": re.compile(r"^cpu\.[^.]+\.sys$"),
    "iowait": re.compile(r"^cpu\.[^.]+\.iowait$"),
    "gpu": re.compile(r"^gpu\d+\.(sm_)?util$"),
    "disk": re.compile(r"^disk\.(read|write)_bytes$"),  # not the per-disk latency and queue
    "net": re.compile(r"^net\.(?!flow\.)"),  # host totals; per-flow counters would count twice
}


@dataclass(frozen=True)
class WindowLoad:
    step: int
    mean: Mapping[str, float]  # group -> mean utilization (fraction) in the window
    dominator: str | None
    # usr, sys, iowait -> the busiest core's share, at each reading, averaged over the window
    busiest: Mapping[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "mean": dict(self.mean), "busiest": dict(self.busiest),
                "dominator": self.dominator}


@dataclass(frozen=True)
class SystemLoad:
    rank: int
    windows: tuple[WindowLoad, ...]
    gpu_correlation: Mapping[str, float]  # cpu/disk/net -> Pearson r with device utilization

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "windows": [w.to_dict() for w in self.windows],
                "gpu_correlation": dict(self.gpu_correlation)}


def _series(ts: I64, values: F64) -> tuple[I64, F64]:
    """One counter on a strictly increasing time axis (repeated timestamps averaged)."""
    order = np.argsort(ts, kind="stable")
    ts, values = ts[order], values[order]
    uniq, start = np.unique(ts, return_index=True)
    sums = np.add.reduceat(values, start) if len(values) else values
    return uniq, sums / np.diff(np.append(start, len(values)))


def _as_rate(ts: I64, values: F64) -> tuple[I64, F64]:
    if len(values) > 1 and np.all(np.diff(values) >= 0):
        return ts[1:], np.diff(values) / (np.diff(ts) / 1e9)
    return ts, values


def _groups(counters: pa.Table, rank: int) -> dict[str, list[tuple[I64, F64]]]:
    rows = np.flatnonzero(np.asarray(counters.column("rank").to_numpy()) == rank)
    names = counters.column("name").cast(pa.string()).to_numpy(zero_copy_only=False)[rows]
    ts = np.asarray(counters.column("ts").to_numpy(), np.int64)[rows]
    values = np.asarray(counters.column("value").to_numpy(), np.float64)[rows]
    out: dict[str, list[tuple[I64, F64]]] = {g: [] for g in PATTERNS}
    for name in sorted(set(names.tolist())):
        group = next((g for g, p in PATTERNS.items() if p.match(name)), None)
        if group is None:
            continue
        mine = names == name
        s_ts, s_val = _series(ts[mine], values[mine])
        if group in ("disk", "net"):
            s_ts, s_val = _as_rate(s_ts, s_val)
        elif len(s_val) and s_val.max() > 1.5:
            s_val = s_val / 100.0
        if len(s_ts):
            out[group].append((s_ts, s_val))
    return out


def _on(axis: I64, series: Sequence[tuple[I64, F64]]) -> F64 | None:
    """The mean of several series, each interpolated onto `axis`."""
    if not series:
        return None
    return np.asarray(np.mean([np.interp(axis, s_ts, s_val) for s_ts, s_val in series], axis=0),
                      np.float64)


def _busiest(series: Sequence[tuple[I64, F64]], start: int, end: int) -> float:
    """The mean over the readings in [start, end) of the largest of the cores' values at each
    (every core's series interpolated onto those readings' times)."""
    axis = np.unique(np.concatenate([t[(t >= start) & (t < end)] for t, _ in series]))
    return float(np.mean(np.max([np.interp(axis, t, v) for t, v in series], axis=0)))


def _pearson(a: F64, b: F64) -> float | None:
    if len(a) < 3 or a.std() == 0 or b.std() == 0:
        return None
    return float(np.corrcoef(a, b)[0, 1])


def system_load(counters: pa.Table,
                steps: Mapping[int, Sequence[StepWindow]]) -> tuple[SystemLoad, ...]:
    """Per rank: its own counters and the host's (rank -1: a recorder's system and GPU
    samplers), against that rank's iterations."""
    ranks = {int(r) for r in counters.column("rank").to_pylist()}
    host = _groups(counters, NONE) if NONE in ranks else None
    ranks.discard(NONE)
    if host is not None:
        ranks |= set(steps) or {NONE}  # host counters alone: analyzed as the host
    out = []
    for rank in sorted(ranks):
        groups = _groups(counters, rank) if rank != NONE else {g: [] for g in PATTERNS}
        if host is not None:
            groups = {g: groups[g] + host[g] for g in PATTERNS}
        windows = []
        for w in steps.get(rank, ()):
            mean, busiest = {}, {}
            for g in GROUPS:
                vals = [v[(t >= w.start) & (t < w.end)] for t, v in groups[g]]
                vals = [v for v in vals if len(v)]
                if vals:
                    mean[g] = float(np.mean(np.concatenate(vals)))
                if vals and g != "gpu":
                    busiest[g] = _busiest(groups[g], w.start, w.end)
            # a CPU group's load is its busiest core's: a training loop's Python holds one
            # core (the GIL), a 16th of the host's however hard it works; a device its own
            load = {g: busiest.get(g, v) for g, v in mean.items()}
            dominator = max(load, key=lambda g: (load[g], g)) if load else None
            windows.append(WindowLoad(w.step, mean, dominator, busiest))
        corr: dict[str, float] = {}
        gpu = groups["gpu"]
        if gpu:
            axis = np.unique(np.concatenate([t for t, _ in gpu]))
            util = _on(axis, gpu)
            others = {"cpu": groups["usr"] + groups["sys"], "disk": groups["disk"],
                      "net": groups["net"]}
            for name, series in others.items():
                other = _on(axis, series)
                r = _pearson(util, other) if util is not None and other is not None else None
                if r is not None:
                    corr[name] = r
        if windows or corr:
            out.append(SystemLoad(rank, tuple(windows), corr))
    return tuple(out)


def others_delay(got: float, waited: float, cores: int) -> float:
    """Of a process tree's run delay (`waited`, cores' worth of its threads runnable on a
    runqueue, beside the `got` cores they ran on), the part other processes caused: its
    threads beyond the machine's cores wait for each other (more DataLoader workers than
    cores), the rest for the others."""
    return max(0.0, min(got + waited, float(cores)) - got)


def host_cores(manifest: Mapping[str, Any]) -> int | None:
    """The recording host's cores; None for an imported trace, which does not say (the
    importing machine's had been taken: the same trace advised up to 2 or 64 cores)."""
    cores = manifest["host"].get("cores")
    return int(cores) if cores else None


# A process on a busy machine that got less than this share of the CPU it had in its usual
# step was held back in that step.
CONTENDED_SHARE: Final = 0.5
BUSY: Final = 0.9  # the host's cores this busy (usr + sys) count as saturated


def others_held(cores: int) -> float:
    """The cores other processes must hold, on a saturated host, to hold the recorded ones
    back: half a core, or a quarter of the cores. A loop whose ops run on every core waits at
    each parallel region for its slowest thread: on 2 cores, another process taking one made
    a DataLoader loop's steps 5-10x slower while the loop still got 1.1 of the 2 cores."""
    return max(0.5, 0.25 * cores)


def saturated(busy_cores: float, cores: int) -> bool:
    """Whether the host's cores were busy enough (usr + sys) to hold a process back."""
    return busy_cores >= BUSY * cores


def readings(counters: pa.Table, name: str) -> tuple[I64, F64]:
    """The readings of the counter `name` (ts, value) in time order."""
    mine = pc.equal(counters.column("name").cast(pa.string()), name)
    found = counters.filter(mine)
    ts = np.asarray(found.column("ts").to_numpy(), np.int64)
    order = np.argsort(ts, kind="stable")
    return ts[order], np.asarray(found.column("value").to_numpy(), np.float64)[order]


PLACED: Final = 10  # sampler readings a step holds for its share of waiting to be its own


def descheduled(counters: pa.Table, cores: int, slow: pa.Table, steps: pa.Table) -> list[bool]:
    """Which of the `slow` steps (rank, start, end) the process sat descheduled in, against
    the usual `steps` (a recording's counters, on a host of `cores`): those that ran while the
    host's cores were at least BUSY busy and the
    recorded process got under CONTENDED_SHARE of the CPU it had in its median step (the
    sampler's proc.cpu_cores), or other processes held others_held more cores than in the
    median step, or its threads' run delay (proc.run_delay_cores, over the threads that wanted
    a core), less the wait its running time would have brought at the median step's share of
    waiting, is half its time beyond the median step or more: it waited for the cores more
    than its own work explains. (Where others hold the cores throughout, every step waits
    alike, and a step that does more waits more: a loop on the CPU 45% of the time, its
    threads half of it on a runqueue in every step, had its checkpoint-writing steps, 2.3-2.6x
    the median, all read as descheduled; and where they wait most of the time, 87% of an
    encoder's steps, a step's wait of 246 ms over 18 ms of running is another process's time
    slices, not the step's work.) The loop thread's own run delay
    in each step, where the recorder read it at its step hooks (HOOK_DELAY), stands for the
    sampler's: a reading's average cannot place a time slice lost to another process in a
    step of 0.4 ms (an inference loop's steps of 7-31 ms among them, each a preemption, had
    read as the loop's own outliers, the waits spread evenly over the readings). Without it
    (a Run recorded before), the readings at a step's ends smear a reading's wait into it or
    out of it: only a step that holds PLACED readings or more (those two under a fifth of
    them) is set against the usual share; a shorter one's share of waiting counts alone, as
    before (a 105 ms encoder step of 2 readings, its 31 ms of running its batch's usual 26,
    had read as an outlier).) Without the sampler's readings (a Run recorded without the
    system sampler) the hooks' run delay alone judges a step, against that share: who held
    the cores is unknown, but a step's wait for one is not its work."""
    pts, pvalue = readings(counters, "proc.cpu_cores")
    dts, dvalue = readings(counters, "proc.run_delay_cores")
    names = counters.column("name").cast(pa.string())
    busy = np.asarray(pc.match_substring_regex(names, r"^cpu\.core\d+\.(usr|sys)$").to_numpy(
        zero_copy_only=False), bool)
    # the loop thread's share of each step on a runqueue, where its hooks read it
    hooked, hooked_slow = (hook_deltas(counters, t, HOOK_DELAY) / np.maximum(
        1, np.asarray(t.column("end").to_numpy(), np.int64)
        - np.asarray(t.column("start").to_numpy(), np.int64)) for t in (steps, slow))
    by_hooks = not np.isnan(hooked).all()
    s_start, s_end = (np.asarray(steps.column(c).to_numpy(), np.int64) for c in ("start", "end"))
    median = float(np.median(s_end - s_start)) if steps.num_rows else 0.0
    if not len(pts) or not busy.any():
        # no system sampler (`record -c torch`): the hooks' run delay alone, a wait for a core
        # whoever held it (a diffusion U-Net's last step 2,227 ms, 2,041 of them on a
        # runqueue, had been read as the program's periodic work, HIGH)
        if not by_hooks:
            return [False] * slow.num_rows
        brought = _brought(float(np.nanmedian(hooked)))
        return [not np.isnan(own) and _waited(own, brought, hi - lo, median) for lo, hi, own in zip(
            slow.column("start").to_pylist(), slow.column("end").to_pylist(),
            hooked_slow.tolist(), strict=True)]
    # busy cores at each reading
    bts, at = np.unique(np.asarray(counters.column("ts").to_numpy(), np.int64)[busy],
                        return_inverse=True)
    bvalue = np.bincount(at, weights=np.asarray(counters.column("value").to_numpy(),
                                                np.float64)[busy]).astype(np.float64)

    def mean(ts: I64, value: F64, lo: int, hi: int) -> float | None:
        # each reading covers the time since the one before: those in the step and the next
        inside = value[int(np.searchsorted(ts, lo)):int(np.searchsorted(ts, hi)) + 1]
        return float(inside.mean()) if len(inside) else None

    def queued(lo: int, hi: int, got: float) -> float | None:
        # the share of the step its threads sat on a runqueue, over the threads that wanted
        # a core
        waited = mean(dts, dvalue, lo, hi) if len(dts) else None
        return None if waited is None else waited / max(1.0, got + waited)

    usual = [(v, h - v, queued(lo, hi, v)) for lo, hi in zip(
        s_start.tolist(), s_end.tolist(), strict=True)
             if (v := mean(pts, pvalue, lo, hi)) is not None
             and (h := mean(bts, bvalue, lo, hi)) is not None]
    if not usual:
        return [False] * slow.num_rows
    typical = float(np.median([v for v, _, _ in usual]))
    others_typical = float(np.median([o for _, o, _ in usual]))
    delays = [q for _, _, q in usual if q is not None]
    brought = _brought(float(np.nanmedian(hooked)) if by_hooks else
                       float(np.median(delays)) if delays else 0.0)
    out = []
    for lo, hi, own in zip(slow.column("start").to_pylist(), slow.column("end").to_pylist(),
                           hooked_slow.tolist(), strict=True):
        got, host = mean(pts, pvalue, lo, hi), mean(bts, bvalue, lo, hi)
        share = ((None if np.isnan(own) else own) if by_hooks else
                 None if got is None else queued(lo, hi, got))
        placed = by_hooks or \
            int(np.searchsorted(dts, hi)) - int(np.searchsorted(dts, lo)) >= PLACED
        out.append(got is not None and host is not None and saturated(host, cores) and (
            got < CONTENDED_SHARE * typical
            or host - got - others_typical >= others_held(cores)
            or (share is not None and _waited(share, brought * placed, hi - lo, median))))
    return out


def _brought(queued_typical: float) -> float:
    """The wait a step's running brings at the usual share of waiting, per ns of running."""
    return queued_typical / max(1.0 - queued_typical, 0.01)


def _waited(share: float, brought: float, dur: int, median: float) -> bool:
    """A step of `dur` ns, `share` of it on a runqueue, waited for a core half its time
    beyond the `median` step or more, past the wait its running brings (`brought` a ns)."""
    return (share - (1 - share) * brought) * dur >= (dur - median) / 2


def profiler_start(steps: pa.Table, counters: pa.Table, cores: int) -> set[tuple[int, int]]:
    """(rank, step) of each rank's first profiled step where it takes over UNUSUAL times the
    median of the rank's other profiled steps, and no later step the run timed (profiled or
    not; the export step aside) took half its excess over that median, but one the process
    sat descheduled in while the first step did not (`descheduled`, of the recording's
    `counters` on its `cores`, against the rank's other timed steps): it starts the profiler
    (kineto's buffers, the recorder's execution trace observer, which runs in it alone: an
    Adam loop's 146 ms among profiled steps of 27-30 ms), and times that, not the program.
    Work that comes back (a 60 ms stall every fifth step, which the default window's first
    step, the fifth, holds too) is the program's; a wait for a core another process held is
    no work (an int8 inference loop's 9.7 ms first step among steps of 0.67 ms had been kept
    for 12 later steps of 5.4-11.3 ms, each 4.0-10.6 ms on a runqueue at its hooks), unless
    the first step waited as they did (a checkpoint-writing first step among later ones, all
    read as descheduled from the sampler alone, whose readings cannot place a wait in a short
    step). Part of `recorder_steps`, which advice's shares and outlier_steps both leave out;
    a first step as usual as the others stays."""
    rows = steps.select(["rank", "step", "start", "end", "source"]).to_pylist()
    out = set()
    for rank, mine in itertools.groupby(sorted(rows, key=lambda r: (r["rank"], r["start"])),
                                        key=lambda r: r["rank"]):
        timed = [r for r in mine if r["source"] != EXPORT]
        marked = [r for r in timed if r["source"] == PROFILED]
        if len(marked) < 2:
            continue
        first, dur = marked[0], marked[0]["end"] - marked[0]["start"]
        usual = float(np.median([r["end"] - r["start"] for r in marked[1:]]))
        if dur <= UNUSUAL * usual:
            continue
        again = [r for r in timed if r["start"] >= first["end"]
                 and r["end"] - r["start"] >= usual + (dur - usual) / 2]
        if again:
            *later, itself = descheduled(counters, cores, pa.Table.from_pylist([*again, first]),
                                         pa.Table.from_pylist([r for r in timed
                                                               if r is not first]))
            if itself or not all(later):
                continue
        out.add((int(rank), int(first["step"])))
    return out


def recorder_steps(steps: pa.Table, counters: pa.Table, cores: int) -> set[tuple[int, int]]:
    """(rank, step) of the steps that time the recorder, not the program: each rank's first
    profiled step that starts its profiler (`profiler_start`), and each timed step of a rank,
    over UNUSUAL times its median timed step, that another process's recorder held for half
    its time beyond that median or more, the recorder starting or ending inside it (a wait for
    it begins or ends with it). A process's recorder holds it from the end of its last
    timed step before its window to its first profiled step (the profiler's start: kineto's
    buffers, the execution trace observer), through that step where `profiler_start` sets it
    aside, and through its export step (the profiler's stop and the trace's write): a process
    that waits for it meanwhile (an RPC server for its trainer's requests: 2,600.7 ms across
    the trainer's profiler start, 944.2 ms across its export, among steps of 63.2 ms) waits for
    the recorder. One definition for what advice's shares leave out and for the steps
    outlier_steps weighs."""
    own = profiler_start(steps, counters, cores)
    rows = steps.select(["rank", "step", "start", "end", "source"]).to_pylist()
    ranks = {int(rank): list(mine) for rank, mine in itertools.groupby(
        sorted(rows, key=lambda r: (r["rank"], r["start"])), key=lambda r: r["rank"])}
    held: dict[int, list[tuple[int, int]]] = {}
    for rank, mine in ranks.items():
        spans = [(r["start"], r["end"]) for r in mine if r["source"] == EXPORT]
        marked = [r for r in mine if r["source"] == PROFILED]
        if marked:
            first = marked[0]
            lo = max((r["end"] for r in mine if r["end"] <= first["start"]),
                     default=first["start"])
            spans.append((lo, first["end"] if (rank, first["step"]) in own else first["start"]))
        held[rank] = spans
    out = set(own)
    for rank, mine in ranks.items():
        others = [s for other, spans in held.items() if other != rank for s in spans]
        timed = [r for r in mine if r["source"] not in (EXPORT, TAIL)]
        if not others or not timed:
            continue
        usual = float(np.median([r["end"] - r["start"] for r in timed]))
        for r in timed:
            lo, hi = r["start"], r["end"]
            # a step that waits for the other process begins waiting as its recorder starts,
            # or ends as it ends: one that lies wholly inside a recorder's span only shared the
            # cores with it (Hogwild's processes, none waiting for another, each step of 1-36
            # ms inside another's export of 1.0-1.3 s)
            edged = [(a, b) for a, b in others if lo < a < hi or lo < b < hi]
            if hi - lo <= UNUSUAL * usual or not edged:
                continue
            starts, ends = (np.array(side, np.int64) for side in zip(*edged, strict=True))
            if Covered(starts, ends).within(lo, hi) >= (hi - lo - usual) / 2:
                out.add((int(rank), int(r["step"])))
    return out
