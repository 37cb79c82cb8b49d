"""The CPU-overhead model: how long the host spends around each op it calls, per op type.

Following the overhead breakdown of Lin et al. (performance models of DLRM training on
GPUs), every op a thread calls (its outermost event) is cut at its kernel points:
launches and other runtime calls on GPUs, the pieces of compute ops (kernels) on CPUs:
- T1: the thread's own time before the op (Python, outside any op; not a gap in which the
  thread sat out whole steps, idle, as an RPC server's pool threads do: Graph.idle_gaps);
- T2: op start to its first kernel point; T5: between kernel points (per interval);
  T4: last kernel point to op end; an op without kernel points is all overhead (T0);
- T3: a runtime call's own duration, per call name; a call that stalled (far longer than
  its name's typical call: the driver's one-off work, such as creating the context, loading
  a kernel's module at its first launch, handing cached memory back in cudaFree) is an event
  of the program, not an overhead of its type: left out of the mean, kept where it happened.
Means per op type (the op's name), so a model from one run prices the host side of
another run, or of the same run at another batch size, whose ops are the same.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np

from perfswarm.analyze.frame import I64, KIND, Events, Mask
from perfswarm.analyze.intervals import sorted_unique
from perfswarm.analyze.iterations import StepKey
from perfswarm.errors import PerfswarmError
from perfswarm.model.accuracy import gmae
from perfswarm.model.graph import HOST, Graph
from perfswarm.userfiles import read_json

F64 = np.ndarray[Any, np.dtype[np.float64]]
PARTS: Final = ("t0", "t1", "t2", "t4", "t5")
TRIM: Final = 0.1  # each tail trimmed off before averaging: one-off stalls are not overhead
STALL_FACTOR: Final = 20  # a runtime call this many times its name's typical one ...
STALL_MIN_NS: Final = 1_000_000  # ... and longer by this much stalled


def trimmed_mean(values: Iterable[float]) -> float:
    """The mean without the tails: a tenth of each, and at least one value each from five on
    (an op seen once per iteration of a short window has one stall too many to keep: the
    profiler's own export runs inside the last optimizer step it saw)."""
    arr = np.sort(np.fromiter(values, np.float64))
    if len(arr) == 0:
        return 0.0
    cut = max(int(len(arr) * TRIM), 1 if len(arr) >= 5 else 0)
    return float(arr[cut:len(arr) - cut].mean()) if len(arr) > 2 * cut else float(arr.mean())


STEADY_MADS: Final = 3.0  # steps further than this many MADs from the median step are disturbed
MAD_FLOOR: Final = 0.02  # of the median step: steps that vary less than this all count


def undisturbed_steps(durations: Mapping[StepKey, int]) -> set[StepKey]:
    """The steps within STEADY_MADS median absolute deviations of the median step: neither the
    profiler's start nor a burst of other load stretched them (`steady_steps`)."""
    if not durations:
        return set()
    values = np.array(list(durations.values()), np.float64)
    mid = float(np.median(values))
    mad = max(float(np.median(np.abs(values - mid))), MAD_FLOOR * mid)
    return {k for k, v in durations.items() if abs(v - mid) <= STEADY_MADS * mad}


def steady_steps(durations: Mapping[StepKey, int]) -> set[StepKey]:
    """The steps the machine and the profiler did not disturb: within STEADY_MADS median
    absolute deviations of the median step (`undisturbed_steps`), and not a rank's last one.
    The first profiled step
    starts the profiler, a burst of other load takes the cores from whole steps, stretching
    every op in them alike (nanoGPT on a shared machine: a 1.2 s step among 25 ms ones), and the
    last step's optimizer call holds the profiler's stop past the step's end (nanoGPT's: 18 ms
    in a 31 ms step); an op's typical time is read off the others."""
    last = {max(k for k in durations if k[0] == rank) for rank, _ in durations}
    return undisturbed_steps(durations) - last


@dataclass(frozen=True)
class Steady:
    """A Run's steady steps (`steady_steps`) and how long they took."""

    keys: frozenset[StepKey]
    undisturbed: frozenset[StepKey]  # the steps within the MADs, a rank's last too
    median_ns: int  # their median length (of every step, when none is steady)
    spread: float  # GMAE of those lengths around it: how much alike they ran


def steady_of(lengths: Mapping[StepKey, int], keys: Set[StepKey] | None = None) -> Steady:
    """The steady steps among `lengths` (each step's ns): `keys` when known, else found."""
    found = frozenset(steady_steps(lengths) if keys is None else keys)
    kept = [v for k, v in lengths.items() if k in found] or list(lengths.values())
    median = int(statistics.median(kept)) if kept else 0
    return Steady(found, frozenset(undisturbed_steps(lengths)), median,
                  gmae(kept, [median] * len(kept)))


# how far a step's instances are from typical (`typical_of`'s levels): in a steady step, in an
# undisturbed one (a rank's last among them), in another
STEADY, UNDISTURBED, OTHER = 2, 1, 0


def typical(values: Sequence[float], steps: Sequence[StepKey], steady: Set[StepKey],
            undisturbed: Set[StepKey] = frozenset()) -> float:
    """The typical value of a repeated op (or part of one): its mean over the steady steps.
    The mean keeps what the op costs a step: its instances vary with the cache's state, an op
    of many small instances has its slow ones in every step, and on a busy machine the time
    other processes take lands on some op in every step, a different one each time (trimmed
    means of the instances, or of each op's totals per step, cut those and came 7-13% under
    nanoGPT's framework and Python time, 20-25% under a contended LSTM's and ResNet's steps).
    When no steady step holds it, its mean over the `undisturbed` steps that do (a rank's last
    step: its optimizer call holds the profiler's stop, the op is its own): the trimmed mean of
    every instance had kept the profiler's first step, whose first calls are one-off (an
    encoder's padded batch in its first and last steps of three, 450 ms of compute in the
    first, 0.9 ms in the last: the last predicted 26.7 ms for a measured 10.1).
    A Run without steps, one window a rank, has that window undisturbed: the mean over it (of
    the corpus's and tests/data's such Runs, 5 predicted 0.01-0.78 points nearer their measured
    window than by the trimmed mean, 4 the same). The trimmed mean of all instances where no
    undisturbed step holds it either (an op of no step): a window of 5 profiled steps often has
    2 steady ones, and the others are the profiler's first step (45 ms against 9 on an H200)
    and one a burst stretched, which a trimmed mean of 5 steps' instances keeps (nanoGPT's
    profiled steps predicted 39% long)."""
    return typical_of(np.asarray(values, np.float64), np.array(
        [STEADY if s in steady else UNDISTURBED if s in undisturbed else OTHER for s in steps],
        np.int64))


def typical_of(values: F64, level: I64) -> float:
    """`typical` of values whose steps' levels (STEADY, UNDISTURBED, OTHER) are given."""
    for wanted in (STEADY, UNDISTURBED):
        kept = values[level == wanted]
        if len(kept):
            return float(np.mean(kept))
    return trimmed_mean(values)


GROUPS: Final = ("t0", "t2", "t5", "t4")  # the parts an op's pieces between kernel points make
T0, T2, T5, T4 = range(len(GROUPS))


@dataclass(frozen=True)
class Instances:
    """Every op instance of every host lane, cut at its kernel points, as arrays: the host
    nodes in lane order, each op's nodes together (`nodes`), each node's instance (`of`) and,
    unless it is a kernel point, its group of overhead pieces (`group`); per instance its op
    type and first node (T1 is that node's gap); per group its instance and part (GROUPS): an
    op without kernel points is one T0 group, else T2 up to its first point, T5 between points,
    T4 after its last (each there, if empty)."""

    nodes: I64
    of: I64
    group: I64  # -1: a kernel point
    kinds: list[str]  # the op types, by first appearance
    kind: I64  # per instance: its index in `kinds`
    first: I64
    group_of: I64
    part: I64

    def __len__(self) -> int:
        return len(self.first)

    def nodes_of(self, instance: int) -> I64:
        starts = np.searchsorted(self.of, [instance, instance + 1])
        return self.nodes[starts[0]:starts[1]]

    def totals(self, dur: I64, gap: I64) -> tuple[F64, F64]:
        """Each instance's T1 (its first node's gap, none if negative) and each group's time:
        its pieces and the gaps before them but the first node's (clock jitter can make a gap
        negative: an overlap, no time of the op's)."""
        nodes, piece = self.nodes, self.group >= 0
        own = dur[nodes] + np.where(nodes != self.first[self.of], np.maximum(gap[nodes], 0), 0)
        groups = np.bincount(self.group[piece], weights=own[piece], minlength=len(self.part))
        return (np.maximum(gap[self.first], 0).astype(np.float64),
                np.asarray(groups, np.float64))

    def parts(self, groups: F64) -> tuple[F64, I64]:
        """Per instance and part (a column per GROUPS), the time of its groups (t5: over all
        its intervals; NaN where the op has no such part) and how many groups it has."""
        count = np.zeros((len(self), len(GROUPS)), np.int64)
        np.add.at(count, (self.group_of, self.part), 1)
        total = np.zeros((len(self), len(GROUPS)), np.float64)
        np.add.at(total, (self.group_of, self.part), groups)
        return np.where(count > 0, total, np.nan), count


def instances(g: Graph, ev: Events, kernel_point: np.ndarray[Any, np.dtype[np.bool_]]
              ) -> Instances:
    """Every op instance of every host lane, in lane order."""
    host = np.flatnonzero(g.role == HOST)
    order = host[np.lexsort((g.ts[host], g.lane[host]))]
    new = np.ones(len(order), bool)
    new[1:] = (g.top[order][1:] != g.top[order][:-1]) | (g.lane[order][1:] != g.lane[order][:-1])
    of = np.cumsum(new) - 1
    starts = np.flatnonzero(new)
    point: I64 = kernel_point[order].astype(np.int64)
    before: I64 = np.cumsum(point) - point  # kernel points before each node
    within: I64 = before - before[starts][of]  # ... in its own instance
    points = np.bincount(of, weights=point, minlength=len(starts)).astype(np.int64)
    size = np.where(points == 0, 1, points + 1)  # its groups
    base = np.cumsum(size) - size
    group_of = np.repeat(np.arange(len(starts)), size)
    j = np.arange(len(group_of)) - base[group_of]
    n = points[group_of]
    part = np.where(n == 0, T0, np.where(j == 0, T2, np.where(j == n, T4, T5)))
    # the op type: the name of the instance's outermost event, numbered by first appearance
    codes, at, kind = np.unique(ev.name[g.top[order][starts]], return_index=True,
                                return_inverse=True)
    seen = np.argsort(at, kind="stable")
    number = np.empty(len(seen), np.int64)
    number[seen] = np.arange(len(seen))
    return Instances(order, of, np.where(point > 0, -1, base[of] + within),
                     [ev.names[int(codes[i])] for i in seen.tolist()],
                     number[kind.reshape(-1)], order[starts], group_of, part)


@dataclass(frozen=True)
class OverheadModel:
    """Mean overheads (ns) per op type and part, and mean runtime-call durations per name."""

    ops: Mapping[str, Mapping[str, float]]  # op type -> part -> mean ns
    counts: Mapping[str, int]  # op type -> instances seen
    calls: Mapping[str, float]  # runtime call name -> mean duration (T3)
    overall: Mapping[str, float] = field(default_factory=dict)  # part -> mean over all types
    # T1 per rank of the Run it was fitted on, where it has several: each process runs Python
    # of its own (a rank that does more before an op, DDP's straggler, keeps it); not saved,
    # another Run is priced with `ops`'
    t1_of_rank: Mapping[int, Mapping[str, float]] = field(default_factory=dict)

    def part(self, kind: str, part: str) -> float | None:
        by_type = self.ops.get(kind)
        if by_type is not None and part in by_type:
            return by_type[part]
        return self.overall.get(part)

    def t1_of(self, kinds: Sequence[str], kind: I64, rank: I64) -> F64:
        """Each instance's T1 (its type's `kind` in `kinds`, its `rank`), NaN for none: its
        rank's where fitted, else its type's."""
        pooled = np.array([np.nan if (v := self.part(k, "t1")) is None else v for k in kinds],
                          np.float64)
        out = pooled[kind]
        for r, by_type in self.t1_of_rank.items():
            own = np.array([by_type.get(k, np.nan) for k in kinds], np.float64)[kind]
            mine = (rank == r) & ~np.isnan(own)
            out[mine] = own[mine]
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"ops": {k: dict(v) for k, v in sorted(self.ops.items())},
                "counts": dict(sorted(self.counts.items())),
                "calls": dict(sorted(self.calls.items())), "overall": dict(self.overall)}

    @classmethod
    def from_dict(cls, data: Any, where: str = "overheads") -> OverheadModel:
        try:
            ops = {str(k): {p: float(x) for p, x in dict(v).items() if p in PARTS}
                   for k, v in dict(data["ops"]).items()}
            counts = {str(k): int(v) for k, v in dict(data.get("counts", {})).items()}
            calls = {str(k): float(v) for k, v in dict(data["calls"]).items()}
            overall = {p: float(x) for p, x in dict(data.get("overall", {})).items()
                       if p in PARTS}
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise PerfswarmError(f"{where}: not an overhead model ({exc})") from None
        if any(not math.isfinite(x) or x < 0 for v in ops.values() for x in v.values()):
            raise PerfswarmError(f"{where}: overheads must be finite and non-negative")
        return cls(ops, counts, calls, overall)

    @classmethod
    def load(cls, path: Path) -> OverheadModel:
        data = read_json(path)
        return cls.from_dict(data.get("overheads", data) if isinstance(data, dict) else data,
                             str(path))


def stalled(g: Graph, ev: Events) -> Mask:
    """Per node: a runtime call that stalled, against the lower median of its name's calls."""
    out = np.zeros(len(g), bool)
    nodes = np.flatnonzero((g.role == HOST) & (g.row >= 0))
    nodes = nodes[ev.of_kind("runtime", "driver")[g.row[nodes]]]
    names = ev.name[g.row[nodes]]
    for name in sorted_unique(names).tolist():
        mine = nodes[names == name]
        durations = g.dur[mine]
        typical = int(np.sort(durations)[(len(mine) - 1) // 2])
        out[mine] = (durations > STALL_FACTOR * typical) & (durations > typical + STALL_MIN_NS)
    return out


def _step_codes(g: Graph, ev: Events, step: I64) -> I64:
    """Per node, its (rank, step) as one int (-1, -1 for a node of no event); `step`: each
    event's."""
    row = np.maximum(g.row, 0)
    rank = np.where(g.row >= 0, ev.rank[row], -1)
    return np.asarray(_code(rank, np.where(g.row >= 0, step[row], -1)), np.int64)


def _code(rank: Any, step: Any) -> Any:
    return (np.asarray(rank, np.int64) + 1) * (1 << 32) + (np.asarray(step, np.int64) + 1)


def _by_key(keys: I64, values: F64, level: I64) -> list[tuple[int, float]]:
    """(key, typical value) per key in ascending order, each from its values in their order
    and their steps' levels (`typical_of`)."""
    if len(keys) == 0:
        return []
    order = np.argsort(keys, kind="stable")
    keys, values, level = keys[order], values[order], level[order]
    cuts = np.flatnonzero(keys[1:] != keys[:-1]) + 1
    return [(int(keys[lo]), typical_of(values[lo:hi], level[lo:hi]))
            for lo, hi in zip([0, *cuts.tolist()], [*cuts.tolist(), len(keys)], strict=True)]


def fit_overheads(g: Graph, ev: Events, insts: Instances, stalls: Mask, idle: Mask,
                  waits: Mask, step: I64, steady: Steady) -> OverheadModel:
    """Typical values (see `typical`) of every part over the run's op instances, per op type
    (T1 of those whose thread was working before them: not `idle`, Graph.idle_gaps; and
    per rank, where the Run has several); runtime calls that stalled (`stalls`, per node:
    `stalled`) are left out of their name's, and ops whose time is a wait on other ranks
    (`waits`, per node: graph.collective_waits, gloo's collectives, which the graph prices)
    out of every part; `step`: each event's (iterations.event_steps), what `steady`'s steady and
    undisturbed steps are of.
    T5 counts once per interval (an op's T5 time over its intervals, as many times)."""
    code = _step_codes(g, ev, step)
    calm = np.where(np.isin(code, [_code(r, s) for r, s in steady.keys]), STEADY, np.where(
        np.isin(code, [_code(r, s) for r, s in steady.undisturbed]), UNDISTURBED, OTHER))
    t1, groups = insts.totals(g.dur, g.gap)
    parts, count = insts.parts(groups)
    own = ~waits[insts.first]
    busy = np.flatnonzero(own & ~idle[insts.first])  # T1 where the thread was working
    samples: dict[str, tuple[I64, F64, I64]] = {
        "t1": (insts.kind[busy], t1[busy], calm[insts.first[busy]])}
    for i, name in enumerate(GROUPS):
        has = np.flatnonzero((count[:, i] > 0) & own)
        times = count[has, i] if name == "t5" else np.ones(len(has), np.int64)
        at = np.repeat(has, times)
        samples[name] = (insts.kind[at], np.repeat(parts[has, i] / times, times),
                         calm[insts.first[at]])
    ops: dict[str, dict[str, float]] = {k: {} for k in insts.kinds}
    for name, (kind, values, in_steady) in samples.items():
        for k, value in _by_key(kind, values, in_steady):
            ops[insts.kinds[k]][name] = value
    runtime = np.flatnonzero((g.role == HOST) & (g.row >= 0) & ~stalls)
    runtime = runtime[np.isin(ev.kind[g.row[runtime]], [KIND["runtime"], KIND["driver"]])]
    calls = _by_key(ev.name[g.row[runtime]], g.dur[runtime].astype(np.float64), calm[runtime])
    counts = np.bincount(insts.kind, minlength=len(insts.kinds))
    kind, values, in_steady = samples["t1"]
    rank = ev.rank[g.row[insts.first[busy]]]
    ranks = sorted_unique(rank).tolist()
    of_rank = {r: {insts.kinds[k]: v for k, v in _by_key(kind[rank == r], values[rank == r],
                                                          in_steady[rank == r])}
               for r in (ranks if len(ranks) > 1 else [])}
    # over all types: each type's values in turn, types by first appearance
    overall = {name: typical_of(values[order := np.argsort(kind, kind="stable")],
                                in_steady[order])
               for name, (kind, values, in_steady) in samples.items() if len(kind)}
    return OverheadModel({k: v for k, v in ops.items() if v},
                         dict(zip(insts.kinds, counts.tolist(), strict=True)),
                         {ev.names[c]: v for c, v in calls}, overall, of_rank)


def apply_overheads(model: OverheadModel, g: Graph, ev: Events, insts: Instances,
                    dur: I64, gap: I64, keep: Mask, idle: Mask) -> None:
    """Set every instance's overhead pieces and gaps (and runtime-call durations) to the model's
    means, in place. Nodes marked `keep` (sync calls: their time is waiting; calls that
    stalled) are left alone, and so are the gaps in which a thread sat `idle` (Graph.idle_gaps:
    a wait for work from another thread or process, which no op type's T1 prices). A part's
    pieces and the gaps inside it are stretched together to the mean (a T5 interval to the
    mean interval); T1 is set as it is."""
    _, groups = insts.totals(dur, gap)
    parts, count = insts.parts(groups)
    want = np.array([[np.nan if (v := model.part(k, name)) is None else v
                      for name in ("t1", *GROUPS)] for k in insts.kinds], np.float64
                    ).reshape(len(insts.kinds), 1 + len(GROUPS))
    # every new value from the measured ones, then set in place: no copy of dur and gap
    # beside the graph (2.5 MB at 200k trace events, at the prediction's peak)
    first = insts.first
    want_t1 = model.t1_of(insts.kinds, insts.kind, ev.rank[g.row[first]])
    set_t1 = ~np.isnan(want_t1) & (gap[first] > 0) & ~idle[first]
    t1 = np.rint(want_t1[set_t1])
    inst, part = insts.group_of, insts.part
    total = parts[inst, part] / count[inst, part]
    factor = np.divide(want[insts.kind[inst], 1 + part], total, out=np.full(len(total), np.nan),
                       where=total > 0)  # nothing measured: nothing to stretch
    stretch = ~np.isnan(factor)
    nodes, group = insts.nodes, insts.group
    piece = np.flatnonzero((group >= 0) & ~keep[nodes])
    piece = piece[stretch[group[piece]]]
    n, f = nodes[piece], factor[group[piece]]
    stretched = np.rint(dur[n] * f)
    inner = (n != first[insts.of[piece]]) & (gap[n] > 0)
    stretched_gap = np.rint(gap[n[inner]] * f[inner])
    points = nodes[(group < 0) & ~keep[nodes]]
    points = points[ev.of_kind("runtime", "driver")[g.row[points]]]
    mean = np.array([model.calls.get(name, np.nan) for name in ev.names], np.float64)
    gap[first[set_t1]] = t1
    gap[n[inner]] = stretched_gap
    dur[n] = stretched
    if len(mean):
        called = mean[ev.name[g.row[points]]]
        dur[points[~np.isnan(called)]] = np.rint(called[~np.isnan(called)])
