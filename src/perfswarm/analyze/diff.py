"""Diff of two runs (or two ranks): ops and kernels aligned by name, steps by position.

Each side's time per (kind, name) is compared in total and, when both sides have
iterations, per iteration (total over the iterations / their count), so a run
with more steps does not look slower just for being longer. Largest regression first, and the
largest improvements apart (a fix that saves seconds shows however many ops got slower). Each
per-iteration change carries a noise band: twice the standard error of the difference of the
two sides' per-iteration means, from how much the op's time varies from step to step.

Only the ops of the rank's loop process are compared (Events.loop_thread's: a DataLoader
worker's fetches run beside the loop, not in its steps), and beside them the time of each step
no op of that process covers (NO_OP: Python, or a wait: a sleep, a batch), which no op
comparison shows. The headline is each side's step time (iterations.step_time: after the
profiler's window where the recorder timed steps there, the program's own speed) with its band.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from perfswarm.analyze.frame import DEVICE_OPS, I64, WORK_KINDS, Events
from perfswarm.analyze.intervals import Coverage, Mask, union
from perfswarm.analyze.iterations import (
    StepTime,
    StepWindow,
    batch_sizes,
    iterations,
    step_time,
    unprofiled_gaps,
    within_gaps,
)
from perfswarm.analyze.summary import load
from perfswarm.analyze.system import F64, others_delay
from perfswarm.errors import PerfswarmError
from perfswarm.trace.schema import KINDS, PROFILED
from perfswarm.trace.store import Run

COMPARED_KINDS = ("cpu_op", "user_annotation", "runtime", "driver", "kernel", "collective",
                  "memcpy", "memset")
TOP = 30
NO_OP = ("no op", "Python, or waiting")  # (kind, name) of a step's time no op covers
CONTENDED = 0.1  # others' run delay (cores) over a side's compared steps worth a note


@dataclass(frozen=True)
class OpDelta:
    kind: str
    name: str
    a_count: int
    b_count: int
    a_ns: int
    b_ns: int
    per_iteration_delta_ns: float | None
    noise_ns: float | None = None  # the band around per_iteration_delta_ns (None: no steps)

    @property
    def delta_ns(self) -> int:
        return self.b_ns - self.a_ns

    @property
    def beyond_noise(self) -> bool:
        """The change is larger than its noise band (always, without steps to measure it, and
        for an op present on one side only)."""
        if (self.per_iteration_delta_ns is None or self.noise_ns is None
                or not (self.a_count and self.b_count)):
            return self.delta_ns != 0
        return abs(self.per_iteration_delta_ns) > self.noise_ns

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "a_count": self.a_count,
                "b_count": self.b_count, "a_ns": self.a_ns, "b_ns": self.b_ns,
                "delta_ns": self.delta_ns,
                "per_iteration_delta_ns": self.per_iteration_delta_ns,
                "noise_ns": self.noise_ns, "beyond_noise": self.beyond_noise}


@dataclass(frozen=True)
class StepDelta:
    index: int
    a_step: int
    b_step: int
    a_ns: int
    b_ns: int

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "a_step": self.a_step, "b_step": self.b_step,
                "a_ns": self.a_ns, "b_ns": self.b_ns, "delta_ns": self.b_ns - self.a_ns}


@dataclass(frozen=True)
class StepTimeDelta:
    """Each side's step time (iterations.StepTime) and the change, with its band: twice the
    standard error of the difference of the two medians."""

    a: StepTime
    b: StepTime

    @property
    def delta_ns(self) -> float:
        return self.b.median_ns - self.a.median_ns

    @property
    def noise_ns(self) -> float:
        return 2.0 * float(np.hypot(self.a.median_error_ns, self.b.median_error_ns))

    def to_dict(self) -> dict[str, Any]:
        def side(t: StepTime) -> dict[str, Any]:
            return {"median_ns": t.median_ns, "steps": t.steps, "outside": t.outside,
                    "profiled_ns": t.profiled_ns, "spread_ns": t.spread_ns}
        return {"a": side(self.a), "b": side(self.b), "delta_ns": self.delta_ns,
                "noise_ns": self.noise_ns, "beyond_noise": abs(self.delta_ns) > self.noise_ns}


@dataclass(frozen=True)
class RunDiff:
    a_span_ns: int
    b_span_ns: int
    steps: tuple[StepDelta, ...]
    ops: tuple[OpDelta, ...]  # largest regression (b slower) first
    only_a: tuple[tuple[str, str], ...]  # (kind, name) pairs present on one side only, sorted
    only_b: tuple[tuple[str, str], ...]
    improvements: tuple[OpDelta, ...] = ()  # b faster, largest first
    step_time: StepTimeDelta | None = None  # None: a side without timed steps
    # each side's run delay caused by other processes over its compared steps, in cores'
    # worth (system.others_delay of the sampler's proc counters; None: not sampled)
    contention: tuple[float | None, float | None] = (None, None)

    @property
    def waited_for_others(self) -> list[tuple[int, float]]:
        """(side: 0 for A, 1 for B, others' run delay) of the sides whose compared steps
        waited CONTENDED cores' worth or more for other processes."""
        return [(i, held) for i, held in enumerate(self.contention)
                if held is not None and held >= CONTENDED]

    @property
    def unsampled_beside_waits(self) -> list[int]:
        """The sides (0 for A, 1 for B) no sampler read where the other waited for other
        processes: whether they waited too is unknown (a defaults recording against a
        `-c torch` one had noted A's wait alone, B's 3.6x slower steps said nothing of)."""
        if not self.waited_for_others:
            return []
        return [i for i, held in enumerate(self.contention) if held is None]

    @property
    def regressions(self) -> tuple[OpDelta, ...]:
        """The ops B is slower at, in total or per iteration, largest first."""
        return tuple(o for o in self.ops
                     if o.delta_ns > 0 or (o.per_iteration_delta_ns or 0) > 0)

    def to_dict(self) -> dict[str, Any]:
        return {"a_span_ns": self.a_span_ns, "b_span_ns": self.b_span_ns,
                "span_delta_ns": self.b_span_ns - self.a_span_ns,
                "step_time": self.step_time.to_dict() if self.step_time else None,
                "others_delay_cores": {"a": self.contention[0], "b": self.contention[1]},
                "steps": [s.to_dict() for s in self.steps], "ops": [o.to_dict() for o in self.ops],
                "improvements": [o.to_dict() for o in self.improvements],
                "only_a": [{"kind": k, "name": n} for k, n in self.only_a],
                "only_b": [{"kind": k, "name": n} for k, n in self.only_b]}


def _compared(ev: Events, pid: int | None) -> Mask:
    """The rows compared: the compared kinds (no step marker), of process `pid` where given,
    and the device's (a GPU's ops carry its own pid)."""
    rows: Mask = ev.of_kind(*COMPARED_KINDS) & ~ev.is_step_marker
    if pid is not None:
        rows &= (ev.pid == pid) | ev.of_kind(*DEVICE_OPS)
    return rows


def step_index(ev: Events, steps: Sequence[StepWindow]) -> I64:
    """Each event's step, as an index into `steps` (-1: none). Marked steps are the events'
    own (a device op's is its launch's); detected ones hold the events that start in them (a
    trace without markers has no step of its own: its side had counted 0 a step, every op a
    change of its whole time)."""
    if all(w.source == PROFILED for w in steps):
        index = {w.step: i for i, w in enumerate(steps)}
        seen, at = np.unique(ev.step, return_inverse=True)
        return np.array([index.get(int(n), -1) for n in seen], np.int64)[at]
    starts = np.array([w.start for w in steps], np.int64)
    ends = np.array([w.end for w in steps], np.int64)
    at = np.searchsorted(starts, ev.ts, side="right") - 1
    inside = (at >= 0) & (ev.ts < ends[np.maximum(at, 0)]) if len(steps) else at >= 0
    return np.where(inside, at, -1)


def totals(ev: Events, pid: int | None = None, where: I64 | None = None
           ) -> dict[tuple[str, str], tuple[int, int, int]]:
    """(kind, name) -> (count, total ns, ns inside steps) over the compared rows; `where`:
    each event's step (step_index), else the events' own."""
    rows = np.flatnonzero(_compared(ev, pid))
    key = ev.kind[rows] * (len(ev.names) + 1) + ev.name[rows]
    uniq, inv = np.unique(key, return_inverse=True)
    count = np.bincount(inv, minlength=len(uniq))
    total = np.bincount(inv, weights=ev.dur[rows], minlength=len(uniq))
    stepped_rows = (where if where is not None else ev.step)[rows] >= 0
    stepped = np.bincount(inv, weights=np.where(stepped_rows, ev.dur[rows], 0),
                          minlength=len(uniq))
    out = {}
    for k, c, t, s in zip(uniq.tolist(), count.tolist(), total.tolist(), stepped.tolist(),
                          strict=True):
        kind, name = divmod(k, len(ev.names) + 1)
        out[(KINDS[kind], ev.names[name])] = (c, int(t), int(s))
    return out


def span(ev: Events, gaps: Sequence[tuple[int, int]] = ()) -> int:
    """From the first compared event to the last, less `gaps` (the time between profiling
    windows, iterations.unprofiled_gaps: nothing traced there)."""
    busy = ev.of_kind(*COMPARED_KINDS)
    if not busy.any():
        return 0
    lo, hi = int(ev.ts[busy].min()), int(ev.end[busy].max())
    return hi - lo - within_gaps(gaps, lo, hi)


def per_step(ev: Events, steps: Sequence[StepWindow], pid: int | None = None
             ) -> dict[tuple[str, str], F64]:
    """(kind, name) -> its time in each of `steps` (0 where it did not run)."""
    where = step_index(ev, steps)
    rows = np.flatnonzero(_compared(ev, pid) & (where >= 0))
    col = where[rows]
    key = ev.kind[rows] * (len(ev.names) + 1) + ev.name[rows]
    uniq, inv = np.unique(key, return_inverse=True)
    grid = np.zeros((len(uniq), len(steps)))
    np.add.at(grid, (inv, col), ev.dur[rows])
    out = {}
    for k, line in zip(uniq.tolist(), grid, strict=True):
        kind, name = divmod(k, len(ev.names) + 1)
        out[(KINDS[kind], ev.names[name])] = line
    return out


def uncovered(ev: Events, steps: Sequence[StepWindow], pid: int | None) -> F64:
    """Each step's time that no op or runtime call of process `pid` (any, without one)
    covers, nor any device op."""
    rows = ev.of_kind(*WORK_KINDS, *DEVICE_OPS)
    if pid is not None:
        rows &= (ev.pid == pid) | ev.of_kind(*DEVICE_OPS)
    covered = Coverage(*union(ev.ts[rows], ev.end[rows]))
    lo = np.array([w.start for w in steps], np.int64)
    hi = np.array([w.end for w in steps], np.int64)
    return np.asarray(hi - lo - covered.between(lo, hi), np.float64)


def noise(a: F64, b: F64) -> float:
    """Twice the standard error of mean(b) - mean(a) (0 for a side of one step)."""
    var = [float(np.var(x, ddof=1)) / len(x) if len(x) > 1 else 0.0 for x in (a, b)]
    return 2.0 * float(np.sqrt(sum(var)))


def diff(a: Events, a_steps: Sequence[StepWindow], b: Events, b_steps: Sequence[StepWindow],
         top: int | None = TOP, pids: tuple[int | None, int | None] = (None, None),
         step_time: StepTimeDelta | None = None,
         contention: tuple[float | None, float | None] = (None, None),
         gaps: tuple[Sequence[tuple[int, int]], Sequence[tuple[int, int]]] = ((), ())
         ) -> RunDiff:
    """Compare b against a; steps are each side's iterations (one rank's), in time order;
    `pids`, each side's loop process (None: every process's ops); `gaps`, each side's time
    between its profiling windows, no part of its span."""
    both_steps = bool(a_steps) and bool(b_steps)
    ta = totals(a, pids[0], step_index(a, a_steps) if both_steps else None)
    tb = totals(b, pids[1], step_index(b, b_steps) if both_steps else None)
    pa_, pb_ = ((per_step(a, a_steps, pids[0]), per_step(b, b_steps, pids[1])) if both_steps
                else ({}, {}))
    if both_steps:
        ua, ub = uncovered(a, a_steps, pids[0]), uncovered(b, b_steps, pids[1])
        ta[NO_OP] = (len(a_steps), int(ua.sum()), int(ua.sum()))
        tb[NO_OP] = (len(b_steps), int(ub.sum()), int(ub.sum()))
        pa_[NO_OP], pb_[NO_OP] = ua, ub
    deltas = []
    for key in sorted(set(ta) | set(tb)):
        ca, na, sa = ta.get(key, (0, 0, 0))
        cb, nb, sb = tb.get(key, (0, 0, 0))
        per_it = sb / len(b_steps) - sa / len(a_steps) if both_steps else None
        band = (noise(pa_.get(key, np.zeros(len(a_steps))), pb_.get(key, np.zeros(len(b_steps))))
                if both_steps else None)
        deltas.append(OpDelta(key[0], key[1], ca, cb, na, nb, per_it, band))

    def regression(d: OpDelta) -> tuple[float, int, str, str]:
        primary = d.per_iteration_delta_ns if d.per_iteration_delta_ns is not None else 0.0
        return (-primary, -d.delta_ns, d.kind, d.name)

    deltas.sort(key=regression)
    better = [d for d in reversed(deltas)
              if (d.per_iteration_delta_ns if d.per_iteration_delta_ns is not None
                  else d.delta_ns) < 0]
    steps = tuple(StepDelta(i, x.step, y.step, x.dur, y.dur)
                  for i, (x, y) in enumerate(zip(a_steps, b_steps, strict=False)))
    return RunDiff(span(a, gaps[0]), span(b, gaps[1]), steps, tuple(deltas[:top]),
                   tuple(sorted(set(ta) - set(tb))),
                   tuple(sorted(set(tb) - set(ta))), tuple(better[:top]), step_time,
                   contention)


def contended(counters: pa.Table, steps: Sequence[StepWindow], cores: int) -> float | None:
    """Others' run delay (system.others_delay) over [the first step's start, the last one's
    end), from the sampler's proc.cpu_cores and proc.run_delay_cores readings there; None
    without them."""
    if not steps:
        return None
    lo, hi = steps[0].start, steps[-1].end
    ts = np.asarray(counters.column("ts").to_numpy(), np.int64)
    value = np.asarray(counters.column("value").to_numpy(), np.float64)
    inside = (ts >= lo) & (ts <= hi)
    names = counters.column("name").cast(pa.string())

    def mean(name: str) -> float | None:
        picked = inside & np.asarray(pc.equal(names, name).to_numpy(zero_copy_only=False), bool)
        return float(value[picked].mean()) if picked.any() else None

    got, waited = mean("proc.cpu_cores"), mean("proc.run_delay_cores")
    return None if got is None or waited is None else others_delay(got, waited, cores)


def diff_runs(a: Run, b: Run, *, rank_a: int | None = None, rank_b: int | None = None,
              ignore_markers: bool = False) -> RunDiff:
    """Diff one rank of b against one rank of a (each Run's lowest rank unless given)."""
    sides = []
    for run, rank in ((a, rank_a), (b, rank_b)):
        timed = run.table("steps")
        # a Run that timed steps and traced nothing (its program ran its own torch profiler)
        # compares its step time alone
        ev = Events.load(run) if timed.num_rows else load(run)
        ranks = ev.ranks or sorted(set(timed.column("rank").to_pylist()))
        chosen = ranks[0] if rank is None else rank
        if chosen not in ranks:
            raise PerfswarmError(f"{run.path}: no rank {chosen} (ranks: {ranks})")
        steps = iterations(run, ev, ignore_markers=ignore_markers).steps.get(chosen, [])
        mine = ev.of_rank(chosen)
        loop = mine.loop_thread(chosen)
        timed = timed.filter(pc.equal(timed.column("rank"), chosen))
        if steps and steps[0].source != PROFILED:  # detected: the steps the trace covers
            timed = pa.table({"rank": [chosen] * len(steps), "start": [w.start for w in steps],
                              "end": [w.end for w in steps], "source": [PROFILED] * len(steps)})
        cores = int(run.manifest().get("host", {}).get("cores") or 1)
        sides.append((mine, list(steps), None if loop is None else loop[0],
                      step_time(timed, batch_sizes(run)),
                      contended(run.table("counters", ["ts", "name", "value"]), steps, cores),
                      unprofiled_gaps(run).get(chosen, [])))
    (ea, sa, pa_, ta, ca, ga), (eb, sb, pb_, tb, cb, gb) = sides
    return diff(ea, sa, eb, sb, pids=(pa_, pb_),
                step_time=StepTimeDelta(ta, tb) if ta is not None and tb is not None else None,
                contention=(ca, cb), gaps=(ga, gb))
