"""The CPU-overhead model: how long the host spends around each op it calls, per op type.

Following the overhead breakdown of Lin et al. (performance models of DLRM training on
GPUs), every op a thread calls (its outermost event) is cut at its kernel points:
launches and other runtime calls on GPUs, the pieces of compute ops (kernels) on CPUs:
- T1: the thread's own time before the op (Python, outside any op);
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

import functools
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np

from perfswarm.analyze.frame import I64, KIND, Events, Mask
from perfswarm.errors import PerfswarmError
from perfswarm.model.graph import HOST, Graph
from perfswarm.userfiles import read_json

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


StepKey = tuple[int, int]  # (rank, step)
STEADY_MADS: Final = 3.0  # steps further than this many MADs from the median step are disturbed
MAD_FLOOR: Final = 0.02  # of the median step: steps that vary less than this all count


def steady_steps(durations: Mapping[StepKey, int]) -> set[StepKey]:
    """The steps the machine and the profiler did not disturb: within STEADY_MADS median
    absolute deviations of the median step, and not a rank's last one. The first profiled step
    starts the profiler, a burst of other load takes the cores from whole steps, stretching
    every op in them alike (nanoGPT on a shared machine: a 1.2 s step among 25 ms ones), and the
    last step's optimizer call holds the profiler's stop past the step's end (nanoGPT's: 18 ms
    in a 31 ms step); an op's typical time is read off the others."""
    if not durations:
        return set()
    values = np.array(list(durations.values()), np.float64)
    mid = float(np.median(values))
    mad = max(float(np.median(np.abs(values - mid))), MAD_FLOOR * mid)
    last = {max(k for k in durations if k[0] == rank) for rank, _ in durations}
    return {k for k, v in durations.items() if abs(v - mid) <= STEADY_MADS * mad} - last


def typical(values: Sequence[float], steps: Sequence[StepKey], steady: Set[StepKey]) -> float:
    """The typical value of a repeated op (or part of one): its mean over the steady steps.
    The mean keeps what the op costs a step: its instances vary with the cache's state, an op
    of many small instances has its slow ones in every step, and on a busy machine the time
    other processes take lands on some op in every step, a different one each time (trimmed
    means of the instances, or of each op's totals per step, cut those and came 7-13% under
    nanoGPT's framework and Python time, 20-25% under a contended LSTM's and ResNet's steps).
    The trimmed mean of all instances when no steady step holds it (a Run without steps): a
    window of 5 profiled steps often has 2 steady ones, and the others are the profiler's first
    step (45 ms against 9 on an H200) and one a burst stretched, which a trimmed mean of 5
    steps' instances keeps (nanoGPT's profiled steps predicted 39% long)."""
    kept = [v for v, s in zip(values, steps, strict=True) if s in steady]
    return float(np.mean(kept)) if kept else trimmed_mean(values)


@dataclass(frozen=True)
class Instance:
    """One op a thread called, cut at its kernel points (node ids of the graph)."""

    kind: str  # the op type
    first: int  # its first node (T1 is that node's gap)
    groups: tuple[tuple[str, tuple[int, ...]], ...]  # (t0 | t2 | t5 | t4, overhead nodes)
    kernel_points: tuple[int, ...]


def instances(g: Graph, ev: Events, kernel_point: np.ndarray[Any, np.dtype[np.bool_]]
              ) -> list[Instance]:
    """Every op instance of every host lane, in lane order (over lists of ints: a per-instance
    numpy slice cost more than the instance)."""
    host = np.flatnonzero(g.role == HOST)
    order = host[np.lexsort((g.ts[host], g.lane[host]))]
    if len(order) == 0:
        return []
    cuts = (np.flatnonzero((g.top[order][1:] != g.top[order][:-1])
                           | (g.lane[order][1:] != g.lane[order][:-1])) + 1).tolist()
    nodes, points, tops = order.tolist(), kernel_point[order].tolist(), g.top[order].tolist()
    kind = functools.cache(ev.name_of)
    return [_instance(kind(tops[lo]), nodes[lo:hi], points[lo:hi])
            for lo, hi in zip([0, *cuts], [*cuts, len(nodes)], strict=True)]


def _instance(kind: str, nodes: list[int], at_point: list[bool]) -> Instance:
    if True not in at_point:
        return Instance(kind, nodes[0], (("t0", tuple(nodes)),), ())
    groups: list[tuple[str, tuple[int, ...]]] = []
    current: list[int] = []
    found: list[int] = []
    for n, is_point in zip(nodes, at_point, strict=True):
        if is_point:
            groups.append(("t5" if found else "t2", tuple(current)))
            current = []
            found.append(n)
        else:
            current.append(n)
    groups.append(("t4", tuple(current)))
    return Instance(kind, nodes[0], tuple(groups), tuple(found))


@dataclass(frozen=True)
class OverheadModel:
    """Mean overheads (ns) per op type and part, and mean runtime-call durations per name."""

    ops: Mapping[str, Mapping[str, float]]  # op type -> part -> mean ns
    counts: Mapping[str, int]  # op type -> instances seen
    calls: Mapping[str, float]  # runtime call name -> mean duration (T3)
    overall: Mapping[str, float] = field(default_factory=dict)  # part -> mean over all types

    def part(self, kind: str, part: str) -> float | None:
        by_type = self.ops.get(kind)
        if by_type is not None and part in by_type:
            return by_type[part]
        return self.overall.get(part)

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
    for name in np.unique(names).tolist():
        mine = nodes[names == name]
        durations = g.dur[mine]
        typical = int(np.sort(durations)[(len(mine) - 1) // 2])
        out[mine] = (durations > STALL_FACTOR * typical) & (durations > typical + STALL_MIN_NS)
    return out


def measured_parts(dur: Sequence[int], gap: Sequence[int], inst: Instance) -> dict[str, float]:
    """An instance's T1 and overhead parts (ns) under these durations and gaps (lists: the
    callers walk every node of every instance, and a list reads an int without a numpy scalar)."""
    parts: dict[str, float] = {"t1": float(max(gap[inst.first], 0))}
    for name, nodes in inst.groups:
        # the gaps inside an op count with its pieces (clock jitter can make one negative: an
        # overlap, no time of the op's)
        total = sum(dur[n] + (max(gap[n], 0) if n != inst.first else 0) for n in nodes)
        parts.setdefault(name, 0.0)
        parts[name] += total
    return parts


def fit_overheads(g: Graph, ev: Events, insts: list[Instance], stalls: Mask,
                  steady: Set[StepKey] = frozenset()) -> OverheadModel:
    """Typical values (see `typical`) of every part over the run's op instances, per op type;
    runtime calls that stalled (`stalls`, per node: `stalled`) are left out of their name's."""
    rows, ranks, steps_of = g.row.tolist(), ev.rank.tolist(), ev.step.tolist()

    def step(node: int) -> StepKey:
        row = rows[node]
        return (ranks[row], steps_of[row]) if row >= 0 else (-1, -1)

    Samples = tuple[list[float], list[StepKey]]  # values, their steps
    samples: dict[str, dict[str, Samples]] = defaultdict(lambda: defaultdict(lambda: ([], [])))
    counts: dict[str, int] = defaultdict(int)
    dur, gap = g.dur.tolist(), g.gap.tolist()
    for inst in insts:
        counts[inst.kind] += 1
        parts = measured_parts(dur, gap, inst)
        five = sum(1 for name, _ in inst.groups if name == "t5")
        for name, value in parts.items():
            values, steps = samples[inst.kind][name]
            n = five if name == "t5" else 1  # t5: per interval
            values += [value / n] * n
            steps += [step(inst.first)] * n
    calls: dict[str, Samples] = defaultdict(lambda: ([], []))
    runtime = np.flatnonzero((g.role == HOST) & (g.row >= 0) & ~stalls)
    for n in runtime[np.isin(ev.kind[g.row[runtime]], [KIND["runtime"], KIND["driver"]])]:
        values, steps = calls[ev.name_of(int(g.row[n]))]
        values.append(float(g.dur[n]))
        steps.append(step(int(n)))
    ops = {k: {p: typical(*v, steady) for p, v in by_part.items()}
           for k, by_part in samples.items()}
    overall: dict[str, Samples] = defaultdict(lambda: ([], []))
    for by_part in samples.values():
        for p, (values, steps) in by_part.items():
            overall[p][0].extend(values)
            overall[p][1].extend(steps)
    return OverheadModel(ops, dict(counts), {k: typical(*v, steady) for k, v in calls.items()},
                         {p: typical(*v, steady) for p, v in overall.items()})


def apply_overheads(model: OverheadModel, g: Graph, ev: Events, insts: list[Instance],
                    dur: I64, gap: I64, keep: Mask) -> None:
    """Set every instance's overhead pieces and gaps (and runtime-call durations) to the model's
    means, in place. Nodes marked `keep` (sync calls: their time is waiting; calls that
    stalled) are left alone."""
    left = keep.tolist()
    is_call = ev.of_kind("runtime", "driver").tolist()
    rows = g.row.tolist()
    d, gp = dur.tolist(), gap.tolist()  # set as lists (ints without numpy scalars), then copied
    for inst in insts:
        have = measured_parts(d, gp, inst)
        t1 = model.part(inst.kind, "t1")
        if t1 is not None and gp[inst.first] > 0:
            gp[inst.first] = round(t1)
        for name, nodes in inst.groups:
            want = model.part(inst.kind, name)
            free = [n for n in nodes if not left[n]]
            if want is None or not free:
                continue
            total = have[name] / max(1, sum(1 for k, _ in inst.groups if k == name))
            if total <= 0:  # nothing measured to stretch
                continue
            factor = want / total
            for n in free:
                d[n] = round(d[n] * factor)
                if n != inst.first and gp[n] > 0:
                    gp[n] = round(gp[n] * factor)
        for n in inst.kernel_points:
            row = rows[n]
            mean = model.calls.get(ev.name_of(row)) if is_call[row] else None
            if mean is not None and not left[n]:
                d[n] = round(mean)
    dur[:] = d
    gap[:] = gp
