"""Iterations: from ProfilerStep markers, or detected from the repeating structure of the ops.

Detection works on one host thread's sequence of top-level op names (interned to ints;
kernels when there are no host ops): the thread holding the step markers, else the one whose
work spans longest; a collective call is named by its gloo range's process group too
(by_group). The period is the lag at which the sequence best matches a shifted copy of
itself, tried at the lags between repeated occurrences of each name. An iteration then starts at
each occurrence of an anchor: a name that occurs once per period, at steady
spacing, and earliest in the sequence, moved back over the ops before it that precede every
anchor alike (two `randint`s, a name twice a step, before the forward); the first iteration
begins at its start, each later one where the step before it ended: its last op's end, or
the end of another thread's work that its thread waited for after it
(dependencies.thread_wakes: backward() on the autograd thread). When no lag matches well
enough, or none has such a name (iterations whose op counts differ: logging every other step
repeats at two steps), the anchor is the earliest of the names that occur the same number of
times at steady spacing, that number being the one most names share. One op repeated back to
back is a loop only when it fills most of its stretch, and what repeats only when its
iterations last LOOP_SHARE of the thread's span (a step's two `randn`, `to` pairs are no
loop). The last iteration counts when it reaches the op that closes every other iteration
(the latest name found once in each) and ends with it and the ops right after it that the
other iterations hold after theirs (a pipeline stage's compute after its receive), or with
the work another thread handed back after it (an `Optimizer.step#...` range the profiler
stopped inside ends with the trace window: frame.Events clips it). Where the iterations do
not each hold one cycle of optimizer calls, the steps end at the calls, whose cycle the
calls' own ops tell where they carry shapes (optimizer_kinds).

A torch.distributed.rpc server has no loop of its own: its pool runs each request on whichever
thread takes it up. Its steps are the requests it serves (analyze/rpc.py pairs them), one
step of the rank that sent them each (served_steps).
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final, Literal

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from perfswarm.analyze.dependencies import Wakes, thread_wakes
from perfswarm.analyze.frame import DEVICE_OPS, I64, Events, lane_key
from perfswarm.analyze.groups import NO_GROUPS, Groups, process_groups
from perfswarm.analyze.intervals import Coverage, union
from perfswarm.analyze.optimizer_kinds import (
    CYCLE_MATCH,
    MAX_CYCLE,
    call_kinds,
    identified_cycle,
    multiset_ids,
    skips_frozen,
)
from perfswarm.analyze.phases import BACKWARD, OPTIMIZER, nested, scopes, step_calls
from perfswarm.analyze.rpc import Request, Served, paired, rpc_work
from perfswarm.trace.schema import FAULTS, PROFILED, STEP_BATCH
from perfswarm.trace.store import Run

Source = Literal["marker", "detected", "window"]  # window: a time window (analyze.aisi)
StepKey = tuple[int, int]  # (rank, step)
MIN_MATCH = 0.8  # a training loop repeats closely; weaker agreement is chance
MAX_LAGS = 64  # candidate periods tried (the most frequent inter-occurrence lags)


@dataclass(frozen=True)
class StepWindow:
    step: int
    start: int
    end: int
    source: Source

    @property
    def dur(self) -> int:
        return self.end - self.start

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "start": self.start, "end": self.end, "dur_ns": self.dur,
                "source": self.source}


def profiled(steps: pa.Table) -> pa.Table:
    """The rows of a steps table that a trace covers (see PROFILED)."""
    return steps.filter(pc.equal(steps.column("source").cast(pa.string()), PROFILED))


UNUSUAL: Final = 2.0  # a step over this many times the usual one is not a usual step


UNPROFILED: Final = "detected"  # a steps table's rows the recorder's hooks timed outside its window
MIN_AFTER = 3  # steps after the window that time the program, warmed up and unprofiled
SHIFT = 0.1  # steps after the window and before it differing by more: said, both shown


@dataclass(frozen=True)
class StepTime:
    """How long a step of the program takes: `median_ns`, of the `steps` the recorder timed
    after its profiling window (`outside`) where there are MIN_AFTER (those before it are the
    warm-up), else of the profiled ones; `profiled_ns`, the profiled steps' median (the
    profiler slows a step: 1.05-1.5x on real CPU scripts)."""

    median_ns: float
    steps: int
    outside: bool
    profiled_ns: float | None
    # the median of the steps before the window, its first (the warm-up) left out, of
    # MIN_AFTER or more: a window can leave the program's heap otherwise (its buffers freed
    # raise glibc's dynamic mmap threshold, so the 4 MB tensors a step frees and allocates
    # again stop page-faulting: an MLP's steps ran 20.9 ms after the window, 29-32 before it
    # and alone)
    before_ns: float | None = None
    spread_ns: float = 0.0  # the steps' robust standard deviation (1.4826 x their MAD)
    # of a forward-driven loop (the recorder's STEP_FORWARD), the median of the same steps'
    # forwards, their busy work (the rest of a step, up to the next forward, is a wait: an
    # inference server's for requests), and the steps' mean, what their rate is over
    busy_ns: float | None = None
    mean_ns: float | None = None

    @property
    def which(self) -> str:
        """Which steps these are, in words: the profiled ones, those after the profiling
        window, or those the recorder timed where it profiled none (the program ran its own
        torch profiler)."""
        if not self.outside:
            return "profiled"
        return ("after the profiler's window" if self.profiled_ns is not None
                else "timed, none profiled")

    @property
    def rate_ns(self) -> float:
        """The step time rates are over: the median step, or a forward-driven loop's mean
        (its waits for input differ from step to step)."""
        return self.median_ns if self.mean_ns is None else self.mean_ns

    @property
    def median_error_ns(self) -> float:
        """The standard error of the median (1.2533 x spread / sqrt(steps))."""
        return 1.2533 * self.spread_ns / float(np.sqrt(max(1, self.steps)))

    @property
    def heap_shift(self) -> float | None:
        """The steps after the window over those before it, where both were timed and they
        differ by more than SHIFT (else None)."""
        if not self.outside or not self.before_ns:
            return None
        ratio = self.median_ns / self.before_ns
        return ratio if abs(ratio - 1.0) > SHIFT else None

    @property
    def profiler_slowdown(self) -> float:
        """The profiled median over the unprofiled one (at least 1; 1 without both)."""
        if not self.outside or not self.profiled_ns or self.median_ns <= 0:
            return 1.0
        return max(1.0, self.profiled_ns / self.median_ns)


def step_batches(rank: I64, start: I64, end: I64, sizes: pa.Table) -> I64:
    """Each step's batch, of steps (rank, start, end) and the recorder's STEP_BATCH counters
    (`sizes`: rank, ts, value; or another counter of the step a hook begins): the earliest of
    its rank in [start, end) (a marked step can end past the next hook, the profiler's stop),
    else the last before it (the first marked step begins once the profiler has started, after
    its hook); 0: none."""
    out = np.zeros(len(rank), np.int64)
    c_rank = np.asarray(sizes.column("rank").to_numpy(), np.int64)
    c_ts = np.asarray(sizes.column("ts").to_numpy(), np.int64)
    c_value = np.asarray(sizes.column("value").to_numpy(), np.float64).astype(np.int64)
    for r in np.unique(c_rank):
        mine = np.flatnonzero(c_rank == r)
        mine = mine[np.argsort(c_ts[mine], kind="stable")]
        ts, value = c_ts[mine], c_value[mine]
        at = np.flatnonzero(rank == r)
        i = np.searchsorted(ts, start[at], side="left")  # the first at or after the start
        last = np.minimum(i, len(ts) - 1)
        inside = (i < len(ts)) & (ts[last] < end[at])
        out[at] = np.where(inside, value[last], np.where(i > 0, value[np.maximum(i - 1, 0)], 0))
    return out


def batch_sizes(run: Run) -> pa.Table:
    """The recorder's STEP_BATCH counters of a Run (rank, ts, value)."""
    return step_counters(run, STEP_BATCH)


def step_counters(run: Run, name: str) -> pa.Table:
    """The recorder's counters `name` of a Run (rank, ts, value)."""
    counters = run.table("counters", ["rank", "ts", "name", "value"])
    return counters.filter(pc.equal(counters.column("name").cast(pa.string()), name)
                           ).select(["rank", "ts", "value"])


def step_time(steps: pa.Table, sizes: pa.Table | None = None,
              forwards: pa.Table | None = None,
              aside: Collection[tuple[int, int]] = frozenset()) -> StepTime | None:
    """The step time of a steps table (see StepTime); None without steps. With the recorder's
    batch of each step (`sizes`, batch_sizes), the steps after the window are those of the
    profiled steps' batch (a sweep of batches: the others' steps are another program's); with
    its forwards' time (`forwards`, step_counters of STEP_FORWARD), their busy work. The
    profiled steps' median leaves out those (rank, step) `aside` (the steps that time the
    recorder, analyze.system.recorder_steps: a first step starting the profiler had stood in
    the median profiled step the profiler's slowdown divides, 64.59 ms for 61.53)."""
    rows = steps.select(["rank", "start", "end", "source"] + (["step"] if aside else [])
                        ).to_pylist()
    def column(name: str) -> I64:
        return np.asarray([r[name] for r in rows], np.int64)

    batch = (step_batches(column("rank"), column("start"), column("end"), sizes)
             if sizes is not None and sizes.num_rows else np.zeros(len(rows), np.int64))
    marked_at = [i for i, r in enumerate(rows) if r["source"] == PROFILED]
    marked = [rows[i]["end"] - rows[i]["start"] for i in marked_at
              if (rows[i]["rank"], rows[i].get("step")) not in aside]
    window_end: dict[int, int] = {}  # each rank's last profiled step's end
    for r in rows:
        if r["source"] == PROFILED:
            window_end[r["rank"]] = max(window_end.get(r["rank"], r["end"]), r["end"])
    profiled_batches = {int(batch[i]) for i in marked_at}
    after_at = [i for i, r in enumerate(rows) if r["source"] == UNPROFILED
                and r["start"] >= window_end.get(r["rank"], r["start"])
                and (len(profiled_batches) != 1 or int(batch[i]) in profiled_batches)]
    after = [rows[i]["end"] - rows[i]["start"] for i in after_at]
    profiled_ns = float(np.median(marked)) if marked else None
    window_start: dict[int, int] = {}  # each rank's first profiled step's start
    first: dict[int, int] = {}  # each rank's first step's start: the warm-up's
    for r in rows:
        first[r["rank"]] = min(first.get(r["rank"], r["start"]), r["start"])
        if r["source"] == PROFILED:
            window_start[r["rank"]] = min(window_start.get(r["rank"], r["start"]), r["start"])
    before = [r["end"] - r["start"] for r in rows if r["source"] == UNPROFILED
              and r["rank"] in window_start and r["end"] <= window_start[r["rank"]]
              and r["start"] > first[r["rank"]]]
    if len(after) >= MIN_AFTER:
        busy = (step_batches(column("rank"), column("start"), column("end"), forwards)[
            after_at] if forwards is not None and forwards.num_rows else np.zeros(0, np.int64))
        busy = busy[busy > 0]
        return StepTime(float(np.median(after)), len(after), True, profiled_ns,
                        float(np.median(before)) if len(before) >= MIN_AFTER else None,
                        _spread(after), float(np.median(busy)) if len(busy) else None,
                        float(np.mean(after)) if len(busy) else None)
    if marked:
        return StepTime(float(np.median(marked)), len(marked), False, profiled_ns,
                        spread_ns=_spread(marked))
    return None


def _spread(durations: Sequence[int]) -> float:
    """A robust standard deviation: 1.4826 x the median absolute deviation."""
    values = np.asarray(durations, np.float64)
    return float(1.4826 * np.median(np.abs(values - np.median(values))))


@dataclass(frozen=True)
class StepFaults:
    """Minor page faults a step takes, from the recorder's FAULTS counter (read at each
    optimizer hook: the difference between two readings is the step between them, placed by
    its middle in the steps table): the median over the profiled steps, and over the steps
    after the window (None with fewer than MIN_AFTER; the step holding the trace export left
    out). A window's own allocations share glibc's heap with the program's, which changes
    whether the heap's top is handed back and faulted in again each step:
    benchmarks/page_faults.py measured a transformer encoder at 0 a step bare and 896 to
    2,048 profiled, about 2 us each on the development VM."""

    profiled: float
    outside: float | None


def step_faults(run: Run, left_out: Collection[StepKey] = ()) -> StepFaults | None:
    """The Run's StepFaults; None without the counter or a profiled step. The steps
    `left_out` (rank, step) count on neither side: another program's, as steps at other
    intra-op threads are (each thread's buffers its own pages)."""
    steps = run.table("steps", columns=["rank", "step", "start", "end", "source"])
    source = np.asarray(steps.column("source").cast(pa.string()).to_pylist(), object)
    delta = hook_deltas(run.table("counters", columns=["rank", "ts", "name", "value"]),
                        steps, FAULTS)
    s_rank, s_start, s_end = (np.asarray(steps.column(c).to_numpy(), np.int64)
                              for c in ("rank", "start", "end"))
    if left_out:
        left = set(left_out)
        delta[[k in left for k in zip(s_rank.tolist(), steps.column("step").to_pylist(),
                                      strict=True)]] = np.nan
    found: dict[str, list[float]] = {PROFILED: [], UNPROFILED: []}
    for r in np.unique(s_rank[source == PROFILED]).tolist():
        mine = s_rank == r
        window_end = s_end[mine & (source == PROFILED)].max()
        counted = mine & ~np.isnan(delta)
        found[PROFILED] += delta[counted & (source == PROFILED)].tolist()
        found[UNPROFILED] += delta[counted & (source == UNPROFILED)
                                   & (s_start >= window_end)].tolist()
    if not found[PROFILED]:
        return None
    after = found[UNPROFILED]
    return StepFaults(float(np.median(found[PROFILED])),
                      float(np.median(after)) if len(after) >= MIN_AFTER else None)


def hook_deltas(counters: pa.Table, steps: pa.Table, name: str) -> npt.NDArray[np.float64]:
    """Per row of `steps` (rank, start, end), what the recorder's counter `name`, read at each
    step hook (FAULTS, HOOK_DELAY), grew by across it (`hook_readings`: the reading at the hook
    ending it less the one before). NaN where no pair of readings falls on the step."""
    before, at = hook_readings(counters, steps, name)
    return at - before


def hook_readings(counters: pa.Table, steps: pa.Table, name: str
                  ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Per row of `steps` (rank, start, end), the recorder's counter `name`, read at each step
    hook, at the hook before the step and at the one ending it: two consecutive readings
    are of the step between them, placed by their middle (a marked step's bounds lie within a
    fraction of a millisecond of its hooks, on either side). NaN where none falls in the step."""
    table = counters.filter(pc.equal(counters.column("name").cast(pa.string()), name))
    table = table.sort_by([("rank", "ascending"), ("ts", "ascending")])
    rank, ts = (np.asarray(table.column(c).to_numpy(), np.int64) for c in ("rank", "ts"))
    value = np.asarray(table.column("value").to_numpy(), np.float64)
    s_rank, s_start, s_end = (np.asarray(steps.column(c).to_numpy(), np.int64)
                              for c in ("rank", "start", "end"))
    before, after = np.full(len(s_rank), np.nan), np.full(len(s_rank), np.nan)
    for r in np.unique(s_rank).tolist():
        readings = np.flatnonzero(rank == r)
        if len(readings) < 2:
            continue
        mine = np.flatnonzero(s_rank == r)
        mine = mine[np.argsort(s_start[mine], kind="stable")]
        middle = (ts[readings[:-1]] + ts[readings[1:]]) // 2  # each pair's step, by it
        at = mine[np.clip(np.searchsorted(s_start[mine], middle, side="right") - 1, 0, None)]
        inside = (s_start[at] <= middle) & (middle < s_end[at])
        before[at[inside]] = value[readings[:-1]][inside]
        after[at[inside]] = value[readings[1:]][inside]
    return before, after


def unprofiled_steps(steps: pa.Table, windows: Mapping[int, Sequence[StepWindow]]
                     ) -> Mapping[int, Sequence[StepWindow]]:
    """The steps the recorder's hooks timed outside the profiler's window (UNPROFILED rows of
    a steps table), per rank in time order, where it timed MIN_AFTER or more: the program as
    it runs unprofiled (in the window the profiler's own work takes a large share: an RL
    loop's samples 27% in its begin_op); else `windows`, the iterations analyses use."""
    out: dict[int, list[StepWindow]] = {}
    for row in steps.filter(pc.equal(steps.column("source").cast(pa.string()),
                                     UNPROFILED)).to_pylist():
        out.setdefault(int(row["rank"]), []).append(
            StepWindow(int(row["step"]), int(row["start"]), int(row["end"]), UNPROFILED))
    if sum(len(ws) for ws in out.values()) < MIN_AFTER:
        return windows
    return {r: sorted(ws, key=lambda w: w.start) for r, ws in sorted(out.items())}


def marker_steps(steps: pa.Table) -> dict[int, list[StepWindow]]:
    """The profiled steps of a steps table as windows per rank, one per (rank, step), in time
    order."""
    by_rank: dict[int, dict[int, StepWindow]] = {}
    for row in profiled(steps).to_pylist():
        seen = by_rank.setdefault(int(row["rank"]), {})
        prev = seen.get(row["step"])
        # A step marked twice on a rank (two traces of it) keeps its first window.
        if prev is None:
            seen[row["step"]] = StepWindow(int(row["step"]), int(row["start"]), int(row["end"]),
                                           "marker")
    return {r: sorted(s.values(), key=lambda w: w.start) for r, s in sorted(by_rank.items())}


def top_level(starts: I64, ends: I64) -> I64:
    """Rows (of time-sorted spans on one thread) not nested inside an earlier span."""
    if len(starts) == 0:
        return np.zeros(0, np.int64)
    reach = np.maximum.accumulate(ends)
    keep = np.ones(len(starts), dtype=bool)
    keep[1:] = starts[1:] >= reach[:-1]
    return np.flatnonzero(keep)


def _op_rows(ev: Events, rows: I64) -> I64:
    """Of `rows`, the host's ops and annotations that detection reads (Events.loop_ops)."""
    return rows[ev.loop_ops[rows]]


def sequence(ev: Events, rank: int) -> tuple[I64, I64, I64, int | None]:
    """(names, starts, ends) of the op sequence that detection looks at, for one rank, and
    the host thread it is of (None: the device ops)."""
    rows = np.arange(len(ev))[ev.rank_slice(rank)]
    loop = ev.loop_thread(rank)  # the thread of the step markers, else the longest
    if loop is None:  # no host ops: the device's
        dev = rows[ev.of_kind(*DEVICE_OPS)[rows]]
        dev = dev[np.argsort(ev.ts[dev], kind="stable")]
        return ev.name[dev], ev.ts[dev], ev.end[dev], None
    ops = _op_rows(ev, rows)
    mine = ops[ev.tid[ops] == loop[1]]
    mine = mine[np.lexsort((-ev.dur[mine], ev.ts[mine]))]
    best = mine[top_level(ev.ts[mine], ev.end[mine])]
    return ev.name[best], ev.ts[best], ev.end[best], int(ev.tid[best[0]])


def period(names: I64) -> int:
    """Lag (in ops) at which the sequence repeats best; 0 when it does not repeat."""
    n = len(names)
    order = np.lexsort((np.arange(n), names))
    same = names[order][1:] == names[order][:-1]
    lags = (order[1:] - order[:-1])[same]
    lags = lags[(lags > 0) & (lags <= n // 2)]
    if len(lags) == 0:
        return 0
    values, counts = np.unique(lags, return_counts=True)
    candidates = values[np.argsort(-counts, kind="stable")[:MAX_LAGS]]
    match = np.array([np.mean(names[:-p] == names[p:]) for p in candidates])
    best = float(match.max())
    if best < MIN_MATCH:
        return 0
    # Multiples of the true period match as well; take the shortest lag that is nearly as good.
    good = candidates[match >= best - 0.02]
    return int(good.min())


def _occurrences(names: I64) -> list[I64]:
    """The positions of each name in the sequence, name by name."""
    order = np.argsort(names, kind="stable")
    cuts = np.flatnonzero(np.diff(names[order])) + 1
    return np.split(order, cuts)


def _steady(pos: I64, lag: int) -> bool:
    """Occurrences at least two, spaced between half and one and a half `lag` ops apart."""
    if len(pos) < 2:
        return False
    spacing = np.diff(pos)
    return bool(spacing.min() >= lag // 2 and spacing.max() <= lag + lag // 2)


def anchor_positions(names: I64, lag: int) -> I64:
    """Positions where iterations start: occurrences of the earliest once-per-period name."""
    n = len(names)
    best: I64 = np.zeros(0, np.int64)
    for pos in _occurrences(names):
        if len(pos) > n // lag + 1 or not _steady(pos, lag):
            continue
        if len(pos) > len(best) or (len(pos) == len(best) and pos[0] < best[0]):
            best = pos
    return best


def counted_anchors(names: I64) -> I64:
    """Iteration starts from occurrence counts alone: of the names at steady spacing (each
    against its own mean spacing, two ops or more: a run of one repeated op is no loop),
    the count most of them share is the iteration count (ties: the larger; two names at
    least), and the earliest name with that count starts each iteration."""
    steady = [pos for pos in _occurrences(names)
              if len(pos) >= 2 and (lag := int(np.diff(pos).mean())) >= 2 and _steady(pos, lag)]
    counts, freq = np.unique([len(p) for p in steady], return_counts=True)
    if len(freq) == 0 or freq.max() < 2:
        return np.zeros(0, np.int64)
    count = int(counts[np.flatnonzero(freq == freq.max())[-1]])
    return min((p for p in steady if len(p) == count), key=lambda p: int(p[0]))


def closing_position(names: I64, anchors: I64) -> int | None:
    """Where the iteration from the last anchor ends: the position, after it, of the name
    found exactly once in every other iteration that comes latest in them; None when the
    last iteration does not reach it (the trace stopped first)."""
    windows = np.searchsorted(anchors, np.arange(len(names)), side="right") - 1
    full = len(anchors) - 1
    best: tuple[float, int] | None = None
    for pos in _occurrences(names):
        where = windows[pos]
        inside = where[(where >= 0) & (where < full)]
        if len(inside) != full or len(np.unique(inside)) != full:
            continue
        offset = float(np.median(pos[(where >= 0) & (where < full)] - anchors[inside]))
        if best is None or offset > best[0]:
            tail = pos[where == full]
            best = (offset, int(tail[0]) if len(tail) == 1 else -1)
    return best[1] if best is not None and best[1] >= 0 else None


def through_tail(names: I64, anchors: I64, close: int) -> int:
    """The last op of the iteration from the last anchor, which reached its closing op at
    `close`: the ops right after it that the other iterations hold after theirs (a pipeline
    stage's compute after its receive, the latest name found once in each), no more of them
    than the longest of those tails, up to the first name no tail holds (the loop's end)."""
    windows = np.searchsorted(anchors, np.arange(len(names)), side="right") - 1
    closing = np.flatnonzero((names == names[close]) & (windows >= 0)
                             & (windows < len(anchors) - 1))
    tails = [names[c + 1:anchors[windows[c] + 1]] for c in closing.tolist()]
    held = np.unique(np.concatenate(tails)) if tails else names[:0]
    longest = max((len(t) for t in tails), default=0)
    after = names[close + 1:close + 1 + longest]
    outside = np.flatnonzero(~np.isin(after, held))
    return close + (int(outside[0]) if len(outside) else len(after))


def _sparse(starts: I64, ends: I64) -> bool:
    """Ops that repeat one by one are a loop's steps only when they fill most of their span
    (a `train_step` annotation around each step), not a burst of small calls."""
    return bool((ends - starts).sum() < 0.5 * (ends.max() - starts.min()))


def detect(names: I64, starts: I64, ends: I64, *, after_last_op: bool = True,
           handed: Wakes | None = None) -> list[tuple[int, int]]:
    """(start, end) ns of each whole iteration found in an op sequence. `after_last_op`: each
    boundary after the first lies where the step before it ended (its last op's end), as in a
    traced loop; else at the next step's first entry (a sequence of samples or syscalls, where
    nothing says which step the time between them is). `handed`: the hand-overs into the
    sequence's thread (dependencies.thread_wakes): a step's last work may be another thread's
    that this one waited for (backward() runs on the autograd thread on CUDA)."""
    lag = period(names)
    anchors = anchor_positions(names, lag) if lag else np.zeros(0, np.int64)
    if len(anchors) < 2:
        anchors = counted_anchors(names)
    if len(anchors) < 2 or (lag == 1 and _sparse(starts[anchors], ends[anchors])):
        return []
    anchors = anchors - _lead_in(names, anchors)
    # A traced loop calls prof.step() (or steps its optimizer) right after a step's last op:
    # the untraced time before the next step's first op is that next step's.
    reach = np.maximum.accumulate(ends)
    if handed is not None:
        reach = np.maximum(reach, _handed_until(handed, reach, np.append(starts[1:], _NEVER)))
    bounds = [int(starts[anchors[0]])] + [
        int(min(reach[a - 1], starts[a]) if after_last_op else starts[a]) for a in anchors[1:]]
    windows = list(itertools.pairwise(bounds))
    close = closing_position(names, anchors)
    if close is not None:
        last, close = int(anchors[-1]), through_tail(names, anchors, close)
        windows.append((bounds[-1], int(max(ends[last:close + 1].max(), reach[close]))))
    return windows


_NEVER = np.iinfo(np.int64).max
LOOP_SHARE = 0.2  # a loop lasts at least this share of its thread's span of calls or samples


def lasts(lo: int, hi: int, starts: I64, ends: I64) -> bool:
    """Whether what repeats from `lo` to `hi` (ns) lasts LOOP_SHARE of the span of the calls
    (`starts`, `ends`) it was found in: a repeat inside one part of the program is not its
    loop (an import's tight loop of syscalls; a step's two `randn`, `to` pairs, 0.7 ms of the
    only step's 9.3 ms in HTA's MI250 trace)."""
    return hi - lo >= LOOP_SHARE * (int(ends.max()) - int(starts.min()))


def _lead_in(names: I64, anchors: I64) -> int:
    """How many of the ops before the first anchor begin every iteration: the longest run of
    them, up to the anchor, that comes before each later anchor too (a name that occurs twice
    an iteration cannot anchor it: two `randint`s before the forward)."""
    limit = min(int(anchors[0]), int(np.diff(anchors).min()) - 1)
    j = 0
    while j < limit and np.all(names[anchors - j - 1] == names[anchors[0] - j - 1]):
        j += 1
    return j


def _handed_until(handed: Wakes, after: I64, until: I64) -> I64:
    """For each gap of the thread (from `after` to `until`, its next op's start), the end of
    the other thread's work it was handed back from within that gap: the last hand-over it
    resumed from by `until` whose work ended after `after` (else -1)."""
    i = np.searchsorted(handed.resume, until, side="right") - 1
    end = handed.waker_end[np.maximum(i, 0)] if len(handed.resume) else np.full(len(until), -1)
    return np.asarray(np.where((i >= 0) & (end > after), end, -1), np.int64)


def detected_windows(ev: Events, rank: int, wakes: Mapping[int, Wakes],
                     run: Run | None = None, groups: Groups = NO_GROUPS) -> list[StepWindow]:
    """The rank's iterations detected on its driving thread's ops, its hand-overs from other
    threads of `wakes` (dependencies.thread_wakes) included; where they do not each hold the
    same number of its optimizer's step() calls, one cycle of them (one call a training step,
    two a GAN's), the steps between those calls (optimizer_windows): iterations of several
    training steps each (steps of varying length, an evaluation every k-th step, where the op
    sequence repeats at k steps) had been taken for the steps. With the `run` of `ev`, the
    cycle is of the optimizers its calls' ops tell apart (optimizer_kinds.identified_cycle);
    with its collectives' process `groups`, a collective call is of its group (by_group)."""
    names, starts, ends, tid = sequence(ev, rank)
    names, ends = by_group(ev, groups, rank, names, starts, ends)
    handed = wakes.get(int(lane_key(rank, tid))) if tid is not None else None
    found = detect(names, starts, ends, handed=handed)
    if found and not lasts(found[0][0], found[-1][1], starts, ends):
        found = []
    if tid is not None and len(starts):
        calls = step_calls(ev)
        calls = calls[(ev.rank[calls] == rank) & (ev.tid[calls] == tid)]
        calls = calls[~nested(ev, calls, inner=False)]  # the outermost: as the recorder times
        order = np.argsort(ev.end[calls], kind="stable")
        done, began = ev.end[calls][order], ev.ts[calls][order]
        if len(done) >= 2:
            held = [int(np.count_nonzero((done > lo) & (done <= hi))) for lo, hi in found]
            ops = np.sort(ev.ts[(ev.tid == tid) & (ev.rank == rank) & ev.of_kind("cpu_op")])
            cycle = call_cycle(np.diff(np.searchsorted(ops, done)),
                               np.searchsorted(ops, done) - np.searchsorted(ops, began))
            if run is not None:
                backward = _backwards(ev, rank, done, began)
                frozen = skips_frozen(backward, _others(ev, rank, tid, done, began))
                cycle = identified_cycle(call_kinds(run, ev, calls[order]),
                                         _apart(ev, rank, tid, done, began),
                                         multiset_ids(backward), frozen, cycle)
            if not held or min(held) == 0 or len(set(held)) > 1 or held[0] != cycle:
                found = optimizer_windows(int(starts.min()), done, cycle)
    return [StepWindow(i, lo, hi, "detected") for i, (lo, hi) in enumerate(found)]


def by_group(ev: Events, groups: Groups, rank: int, names: I64, starts: I64, ends: I64
             ) -> tuple[I64, I64]:
    """The sequence's names and ends (`names`, `starts`, `ends`: sequence's) with each
    collective call (frame.COLLECTIVE_CALL) named by the process group of the gloo range it
    takes up, the rank's first to start at or after it (`groups`: process_groups of `ev`),
    and lasting until that range ends: an all-reduce in a subgroup is another operation than
    one in the world, and its step holds the collective it issued (the trace's last step ends
    with it, no later op resuming after it). A loop of three all-reduces a step, the middle
    one in a subgroup (tests/data/subgroups_gloo.py), is one name nine times by op name alone,
    no loop; by group it repeats at three. Unchanged where no gloo range of the rank names a
    group (one group, or a device's collectives)."""
    rows = np.arange(len(ev))[ev.rank_slice(rank)]
    host = rows[ev.host_collective[rows]]
    named = np.isin(host, groups.rows)
    if not named.any():
        return names, ends
    code = np.full(len(host), -1, np.int64)  # each range's group (-1: none named)
    code[named] = groups.code[np.searchsorted(groups.rows, host[named])]
    calls = np.flatnonzero(np.isin(names, np.unique(ev.name[ev.collective_call])))
    at = np.searchsorted(ev.ts[host], starts[calls], side="left")
    calls, at = calls[at < len(host)], at[at < len(host)]
    out, until = names.copy(), ends.copy()
    out[calls] += len(ev.names) * (1 + code[at])
    until[calls] = np.maximum(ends[calls], ev.end[host[at]])
    return out, until


def _apart(ev: Events, rank: int, tid: int, done: I64, began: I64) -> I64:
    """How many ops of the thread lie between each optimizer call's end (`done`) and the next
    one's start (`began`, of the calls in that order) outside the optimizers' calls (the
    `zero_grad()` between them is theirs)."""
    mine = (ev.tid == tid) & (ev.rank == rank)
    calls = scopes(ev, OPTIMIZER)
    free = np.sort(ev.ts[_outside(ev, np.flatnonzero(mine & ev.of_kind("cpu_op")),
                                  calls[mine[calls]])])
    return np.asarray(np.searchsorted(free, began[1:], side="left")
                      - np.searchsorted(free, done[:-1], side="right"), np.int64)


def _outside(ev: Events, ops: I64, spans: I64) -> I64:
    """The rows of `ops` that start outside every span at `spans` (rows)."""
    lo, hi = union(ev.ts[spans], ev.end[spans])
    if len(lo) == 0:
        return ops
    at = np.searchsorted(lo, ev.ts[ops], side="right") - 1
    return ops[(at < 0) | (ev.ts[ops] >= hi[np.maximum(at, 0)])]


def _backwards(ev: Events, rank: int, done: I64, began: I64) -> list[tuple[int, ...]]:
    """The autograd nodes (their names) that start on the rank (any thread: CUDA's backward
    runs on its own) between each optimizer call's end (`done`) and the next one's start
    (`began`)."""
    nodes = scopes(ev, BACKWARD)
    return _names_between(ev, nodes[ev.rank[nodes] == rank], done, began)


def _others(ev: Events, rank: int, tid: int, done: I64, began: I64) -> list[tuple[int, ...]]:
    """The thread's ops (their names) between each optimizer call's end and the next one's
    start outside the optimizers' calls and the autograd nodes: the forward, its loss, its
    batch."""
    mine = (ev.tid == tid) & (ev.rank == rank)
    spans = np.concatenate([scopes(ev, OPTIMIZER), scopes(ev, BACKWARD)])
    return _names_between(ev, _outside(ev, np.flatnonzero(mine & ev.of_kind("cpu_op")),
                                       spans[mine[spans]]), done, began)


def _names_between(ev: Events, rows: I64, done: I64, began: I64) -> list[tuple[int, ...]]:
    """The names (codes, sorted: a multiset) of the events at `rows` that start between each
    optimizer call's end (`done`) and the next one's start (`began`)."""
    rows = rows[np.argsort(ev.ts[rows], kind="stable")]
    ts = ev.ts[rows]
    return [tuple(np.sort(ev.name[rows[np.searchsorted(ts, lo, side="left"):
                                       np.searchsorted(ts, hi, side="left")]]).tolist())
            for lo, hi in zip(done[:-1].tolist(), began[1:].tolist(), strict=True)]


def call_cycle(between: I64, inside: I64) -> int:
    """How many optimizer calls make one step, from the ops between consecutive calls
    (`between`): the shortest cycle at which their counts repeat (a GAN's discriminator and
    generator steps: 433 and 529 ops in turn, a cycle of 2; two optimizers stepped back to
    back, nothing between them), 1 where none does. A cycle of three or more alike calls
    (`inside`: as many ops in 90% of them) whose stretches are all alike but one is one
    optimizer's steps with extra work every k-th (an evaluation pass after every third step
    had made a cycle of 3, and 12 steps read as 4): a cycle of 1. With two, alike calls are
    as likely two optimizers of as many parameters (a GAN's, alike in size: each call its own
    step had halved the step time) as one with extra work every second step: a cycle of 2
    (optimizer_kinds.identified_cycle tells them apart by the calls' shapes and scalars and
    the backward passes between them)."""
    for k in range(1, MAX_CYCLE + 1):
        if len(between) >= 2 * k and np.mean(between[k:] == between[:-k]) >= CYCLE_MATCH:
            # alike: as many ops in (nearly) every call, the first perhaps more (Adam's state
            # made at its first step: 318 ops, then 208; a cold start had read 12 steps as 4)
            counts = np.unique(inside, return_counts=True)[1] if len(inside) else np.zeros(1)
            alike = len(inside) > 0 and counts.max() >= CYCLE_MATCH * len(inside)
            phases = np.unique(between[:k], return_counts=True)[1]
            return 1 if k >= 3 and alike and sorted(phases.tolist()) == [1, k - 1] else k
    return 1


def optimizer_windows(first: int, done: I64, cycle: int = 1) -> list[tuple[int, int]]:
    """Steps that each end where the last optimizer.step() call of a cycle of `cycle` calls
    returned, the first from the sequence's first op (a profiled window opens at a step's
    start): a loop whose op sequence does not repeat (Lightning's: five top-level spans a
    training step, a validation pass of 211 every tenth, where its validation batches had
    been found as the steps), or repeats at each of a GAN's two optimizers."""
    bounds = [first, *done[cycle - 1::cycle].tolist()]
    return list(itertools.pairwise(bounds))


def first_op_ns(ev: Events, rank: int) -> int | None:
    """When the rank's first traced op began (a recorded window's first step marker opens
    earlier: the profiler starts inside it, and nothing is traced until then)."""
    starts = ev.ts[_op_rows(ev, np.arange(len(ev))[ev.rank_slice(rank)])]
    return int(starts.min()) if len(starts) else None


def detected_steps(ev: Events, profiled: Mapping[int, Sequence[tuple[int, int]]] | None = None,
                   run: Run | None = None) -> dict[int, list[StepWindow]]:
    """Each rank's detected iterations; `profiled`: each rank's profiling windows
    (profiled_windows), see after_gaps; `run`: the Run of `ev`, whose ops' shapes tell its
    optimizers apart and whose process groups its collective calls' (detected_windows)."""
    wakes = thread_wakes(ev)
    groups = (process_groups(run, ev, ev.ranks) if run is not None and ev.host_collective.any()
              else NO_GROUPS)
    return served_steps({rank: found for rank in ev.ranks if (found := after_gaps(
        detected_windows(ev, rank, wakes, run, groups), (profiled or {}).get(rank, ())))},
        *rpc_work(ev))


def served_steps(found: Mapping[int, Sequence[StepWindow]],
                 sent: Mapping[int, Sequence[Request]], ran: Mapping[int, Sequence[Served]]
                 ) -> dict[int, list[StepWindow]]:
    """`found` (each rank's detected iterations) with those of an RPC server among `sent` and
    `ran` (each rank's requests and its work for requests, rpc.rpc_work): a rank with none
    found, whose work for requests all pairs with requests of one rank that has steps, and
    with some in each of them: its step k from its first work for a request sent in that
    rank's step k to its first for step k + 1 (it waits for the next request), the last to
    its last work's end."""
    out = {rank: list(windows) for rank, windows in found.items()}
    asked: dict[int, list[tuple[Served, Request | None]]] = {}
    for s, request in paired(sent, {r: w for r, w in ran.items() if r not in found}):
        asked.setdefault(s.rank, []).append((s, request))
    for rank, work in asked.items():
        by = {r.rank if r is not None else None for _, r in work}
        if len(by) != 1 or (caller := by.pop()) is None or caller not in found:
            continue
        steps = found[caller]
        starts = np.array([w.start for w in steps], np.int64)
        ends = np.array([w.end for w in steps], np.int64)
        sends = np.array([r.sent for _, r in work if r is not None], np.int64)
        k = np.searchsorted(starts, sends, side="right") - 1
        inside = (k >= 0) & (sends < ends[np.maximum(k, 0)])
        if not inside.all() or len(np.unique(k)) != len(steps):
            continue
        first = [min(s.start for (s, _), j in zip(work, k, strict=True) if j == i)
                 for i in range(len(steps))]
        last = max(s.end for s, _ in work)
        out[rank] = [StepWindow(w.step, lo, hi, "detected") for w, lo, hi in zip(
            steps, first, [*first[1:], last], strict=True)]
    return out


def event_steps(ev: Events, steps: Mapping[int, Sequence[StepWindow]]) -> I64:
    """Each event's step in `steps` (an Iterations' steps: what analyze calls the steps), -1
    for none: the events' own where their rank's steps are marked (a device op's is its
    launch's), else the step of their rank that they start in. A trace without markers holds
    no step of its own (every event's -1): a prediction that read the events' own took none
    of them for a steady step's, and averaged every op over the whole window, its tails
    trimmed (a twin GAN's steps predicted 54% short)."""
    out = np.full(len(ev), -1, np.int64)
    for rank, windows in steps.items():
        rows = ev.rank_slice(rank)
        if all(w.source == PROFILED for w in windows):
            out[rows] = ev.step[rows]
            continue
        starts = np.array([w.start for w in windows], np.int64)
        ends = np.array([w.end for w in windows], np.int64)
        ts = ev.ts[rows]
        at = np.searchsorted(starts, ts, side="right") - 1
        inside = (at >= 0) & (ts < ends[np.maximum(at, 0)])
        numbers = np.array([w.step for w in windows], np.int64)
        out[rows] = np.where(inside, numbers[np.maximum(at, 0)], -1)
    return out


def after_gaps(found: Sequence[StepWindow], windows: Sequence[tuple[int, int]]
               ) -> list[StepWindow]:
    """Steps found across the time between two profiling windows of their rank (`windows`:
    nothing traced between them: a schedule's cycles, a program's separate windows) start
    at the later one's start (one had begun at the earlier window's last step's end: 22 ms
    for steps of 1.5)."""
    starts = np.asarray(sorted(lo for lo, _ in windows), np.int64)
    if len(starts) < 2:
        return list(found)
    at = np.searchsorted(starts, [w.end - 1 for w in found], side="right") - 1
    return [replace(w, start=max(w.start, int(starts[k]))) if k >= 0 else w
            for w, k in zip(found, at.tolist(), strict=True)]


def profiled_windows(run: Run) -> dict[int, list[tuple[int, int]]]:
    """Each rank's profiling windows: its trace files' spans (the manifest's sources), those
    that overlap (a rank's DataLoader workers' files beside its own) one. Once per Run."""
    def found() -> dict[int, list[tuple[int, int]]]:
        spans: dict[int, list[tuple[int, int]]] = {}
        for source in run.manifest()["sources"]:
            if "span_ns" in source:
                spans.setdefault(int(source["rank"]), []).append(tuple(source["span_ns"]))
        out = {}
        for rank, pairs in spans.items():
            lo, hi = union(*(np.array(side, np.int64) for side in zip(*pairs, strict=True)))
            out[rank] = list(zip(lo.tolist(), hi.tolist(), strict=True))
        return out
    return run.memo(("profiled windows",), found)


def unprofiled_gaps(run: Run) -> dict[int, list[tuple[int, int]]]:
    """Each rank's time between its profiling windows (profiled_windows), where nothing was
    traced."""
    return {rank: gaps_between(windows) for rank, windows in profiled_windows(run).items()
            if len(windows) > 1}


def gaps_between(windows: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """The time between consecutive windows (sorted, apart)."""
    return [(a[1], b[0]) for a, b in itertools.pairwise(windows)]


def within_gaps(gaps: Sequence[tuple[int, int]], lo: int, hi: int) -> int:
    """How much of [lo, hi) lies in `gaps` (unprofiled_gaps' disjoint, sorted intervals)."""
    if not gaps:
        return 0
    starts, ends = (np.array(side, np.int64) for side in zip(*gaps, strict=True))
    return int(Coverage(starts, ends).between(np.array([lo]), np.array([hi]))[0])


@dataclass(frozen=True)
class Agreement:
    """How detected iterations line up with the markers of the same rank."""

    rank: int
    marker_count: int
    detected_count: int
    max_boundary_error_ns: int
    mean_step_ns: float

    @property
    def count_matches(self) -> bool:
        return self.marker_count == self.detected_count

    @property
    def max_error_pct(self) -> float:
        return 100.0 * self.max_boundary_error_ns / self.mean_step_ns if self.mean_step_ns else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "marker_count": self.marker_count,
                "detected_count": self.detected_count, "count_matches": self.count_matches,
                "max_boundary_error_ns": self.max_boundary_error_ns,
                "max_error_pct_of_mean_step": self.max_error_pct}


def _off(t: int, lo: int, hi: int) -> int:
    """How far `t` lies outside [lo, hi]."""
    return max(lo - t, t - hi, 0)


def agreement(rank: int, markers: Sequence[StepWindow],
              detected: Sequence[StepWindow], first_op: int | None = None) -> Agreement:
    """The worst boundary's distance from the markers' own. Between two markers that do not
    touch (torch's prof.step() closes one, then opens the next: tens of us) no step ran, so a
    boundary anywhere in that gap agrees with both; likewise between the first marker's start
    and the rank's first traced op (`first_op`), where the profiler was starting and nothing is
    traced (2.2-3.0 ms of 4-9 ms steps in realworld_models.py's runs on an H200)."""
    mean = float(np.mean([w.dur for w in markers])) if markers else 0.0
    err = 0
    if markers and detected:
        opened = markers[0].start
        bounds = [(opened, max(opened, first_op if first_op is not None else opened))] + [
            (min(a.end, b.start), max(a.end, b.start)) for a, b in itertools.pairwise(markers)]
        err = max(_off(d.start, *b) for d, b in zip(detected, bounds, strict=False))
        if len(markers) == len(detected):
            err = max(err, abs(markers[-1].end - detected[-1].end))
    return Agreement(rank, len(markers), len(detected), err, mean)


@dataclass(frozen=True)
class Iterations:
    """The iterations analyses use (markers unless ignored), and both views when both exist."""

    used: Source | None
    steps: Mapping[int, Sequence[StepWindow]]
    markers: Mapping[int, Sequence[StepWindow]]
    detected: Mapping[int, Sequence[StepWindow]]
    agreement: tuple[Agreement, ...]

    def to_dict(self) -> dict[str, Any]:
        def dump(m: Mapping[int, Sequence[StepWindow]]) -> dict[str, Any]:
            return {str(r): [w.to_dict() for w in ws] for r, ws in m.items()}

        return {"used": self.used, "steps": dump(self.steps), "markers": dump(self.markers),
                "detected": dump(self.detected),
                "agreement": [a.to_dict() for a in self.agreement]}


def run_markers(run: Run, *, ignore_markers: bool = False) -> dict[int, list[StepWindow]]:
    return {} if ignore_markers else marker_steps(run.table("steps"))


def combine(markers: Mapping[int, Sequence[StepWindow]],
            detected: Mapping[int, Sequence[StepWindow]],
            first_ops: Mapping[int, int | None] | None = None) -> Iterations:
    """Markers are used where the Run has any; detected iterations otherwise (`first_ops`:
    each rank's first_op_ns, for their agreement)."""
    agree = tuple(agreement(r, markers[r], detected.get(r, []), (first_ops or {}).get(r))
                  for r in markers)
    used: Source | None = "marker" if markers else ("detected" if detected else None)
    return Iterations(used, markers if markers else detected, markers, detected, agree)


@dataclass(frozen=True)
class SteadyState:
    """The steps a throughput rests on, of one rank."""

    rank: int
    steps: tuple[int, ...]
    dur_ns: tuple[int, ...]

    @property
    def median_ns(self) -> float:
        return float(np.median(self.dur_ns))

    @property
    def throughput(self) -> float:
        """Steps per second from the median step: one step slowed by another process on a
        shared machine does not move it."""
        return 1e9 / self.median_ns if self.median_ns > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "steps": list(self.steps), "dur_ns": list(self.dur_ns),
                "median_ns": self.median_ns, "throughput": self.throughput}


def steady_state(steps: pa.Table, warmup: int) -> SteadyState | None:
    """The steady-state steps of a Run's steps table: numbered `warmup` or later and timed by
    the optimizer hooks (source `detected`), i.e. outside the profiling window, whose steps the
    profiler slows, and not the one holding the trace export; the window's marker steps only
    when a rank has no others. With several
    ranks, the slowest rank's (the others wait for it at every collective). None when no rank
    has a step past the warm-up."""
    found: list[SteadyState] = []
    rows = [r for r in steps.to_pylist() if r["step"] >= warmup]
    for rank in sorted({int(r["rank"]) for r in rows}):
        mine = [r for r in rows if r["rank"] == rank]
        hooked = [r for r in mine if r["source"] == "detected"]
        marked = [r for r in mine if r["source"] == PROFILED]
        by_step: dict[int, dict[str, Any]] = {}
        for r in sorted(hooked or marked, key=lambda r: (r["step"], r["start"])):
            by_step.setdefault(r["step"], r)  # a step marked on host and device: the host's
        use = list(by_step.values())
        found.append(SteadyState(rank, tuple(int(r["step"]) for r in use),
                                 tuple(int(r["end"] - r["start"]) for r in use)))
    return max(found, key=lambda s: (s.median_ns, -s.rank), default=None)


def iterations(run: Run, ev: Events, *, ignore_markers: bool = False) -> Iterations:
    """The iterations of `ev`, the events of `run`: once per Events object (the analysis and
    the prediction's graph both read them)."""
    def make() -> Iterations:
        markers = run_markers(run, ignore_markers=ignore_markers)
        return combine(markers, detected_steps(ev, profiled_windows(run), run),
                       {r: first_op_ns(ev, r) for r in markers})

    return ev.derived(("iterations", ignore_markers), make)
