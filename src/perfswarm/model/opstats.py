"""Per-op cost of a Run: FLOPs, bytes and arithmetic intensity from the recorded shapes, the time
the op took, what rate that achieved, and (with a device spec) its roofline time, bound and
efficiency; plus fusion candidates among consecutive memory-bound ops.

An op is counted at the innermost level that has a cost model (mkldnn_convolution, not the
conv2d that dispatched to it), so no work is counted twice, except that a FLOP-less op of
another family inside it is a detail of it (the bias copy_ inside an addmm). Its time is its
own duration on CPU runs, the duration of the device ops it and its details launched (joined
by External id) on GPU runs.

On GPU runs each kernel is priced too: an op's FLOPs, bytes and roofline time are split over
the kernels it launched in proportion to their time, so a kernel's row says what the ops
that launched it asked of it and how near its time came to their roofline. The FLOPs of
every counted op, by the pass it ran in (analyze.phases), give the hardware and the model
FLOPs behind HFU and MFU.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from perfswarm.analyze.dependencies import launching_op_rows
from perfswarm.analyze.frame import (
    DEVICE_OPS,
    I64,
    Events,
    Mask,
    detail_of,
    group_rows,
    lane_key,
    unique_rows,
)
from perfswarm.analyze.intervals import sorted_unique, total
from perfswarm.analyze.nesting import open_before
from perfswarm.analyze.ops import is_tensor_core
from perfswarm.analyze.phases import PHASES, phases
from perfswarm.model.fusion import FusionCandidate, fusion_candidates
from perfswarm.model.opcost import (
    OpCost,
    Shapes,
    has_cost_model,
    roofline,
    shapes_cost,
    shapes_from_args,
    tf32_if_fp32,
)
from perfswarm.model.specs import DeviceSpec, spec_of_devices
from perfswarm.trace.store import Run

TOP: Final = 25
T = TypeVar("T")
FORWARD_BACKWARD: Final = "fwdbwd"  # the profiler's flows from a forward op to its autograd node
# TorchScript's DifferentiableGraphOp's forward run (its GraphExecutor's name): it makes one
# autograd node for the ops inside it
SCRIPTED_FORWARD: Final = "<forward op>"


@dataclass(frozen=True)
class OpStat:
    name: str
    shapes: str  # e.g. "32x64, 64x10"
    family: str
    dtype: str
    count: int
    time_ns: int  # total
    flops: float  # per call
    bytes: float  # per call
    roofline_ns: float | None  # per call, on the spec
    bound: str | None

    @property
    def mean_ns(self) -> float:
        return self.time_ns / self.count

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes if self.bytes else 0.0

    def to_dict(self) -> dict[str, Any]:
        seconds = self.mean_ns * 1e-9
        return {"name": self.name, "shapes": self.shapes, "family": self.family,
                "dtype": self.dtype, "count": self.count, "time_ns": self.time_ns,
                "flops": self.flops, "bytes": self.bytes, "intensity": self.intensity,
                "achieved_gflops": self.flops / seconds / 1e9 if seconds else 0.0,
                "achieved_gbps": self.bytes / seconds / 1e9 if seconds else 0.0,
                "roofline_ns": self.roofline_ns, "bound": self.bound,
                "efficiency": (self.roofline_ns / self.mean_ns
                               if self.roofline_ns is not None and self.mean_ns else None)}


@dataclass(frozen=True)
class KernelStat:
    """One kernel name's calls launched by costed ops, with its share of their cost."""

    name: str
    count: int
    time_ns: int  # total
    flops: float  # total, the launching ops' FLOPs split by time
    bytes: float  # total, likewise
    roofline_ns: float | None  # total, on the spec
    bound: str | None  # that of the launching op with the most of this kernel's time
    ops: tuple[str, ...]  # the launching ops' names, most time first

    def to_dict(self) -> dict[str, Any]:
        seconds = self.time_ns * 1e-9
        return {"name": self.name, "count": self.count, "time_ns": self.time_ns,
                "flops": self.flops, "bytes": self.bytes,
                "intensity": self.flops / self.bytes if self.bytes else 0.0,
                "achieved_gflops": self.flops / seconds / 1e9 if seconds else 0.0,
                "achieved_gbps": self.bytes / seconds / 1e9 if seconds else 0.0,
                "roofline_ns": self.roofline_ns, "bound": self.bound,
                "efficiency": (self.roofline_ns / self.time_ns
                               if self.roofline_ns is not None and self.time_ns else None),
                "ops": list(self.ops)}


@dataclass(frozen=True)
class OpCosts:
    device: str | None  # the spec rooflines are on, if the Run's device has one
    ops: tuple[OpStat, ...]  # largest total time first
    modelled_ns: int  # time of ops with a cost model
    op_ns: int  # time of all ops at the level counted
    fusion: tuple[FusionCandidate, ...]  # largest saving first
    phase_flops: dict[str, float]  # FLOPs of every counted op (not only `ops`), by pass
    kernels: tuple[KernelStat, ...] = ()  # GPU runs: largest total time first
    no_grad_flops: float = 0.0  # of phase_flops' forward, those autograd made no node for

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "ops": [o.to_dict() for o in self.ops],
                "modelled_ns": self.modelled_ns, "op_ns": self.op_ns,
                "coverage": self.modelled_ns / self.op_ns if self.op_ns else 0.0,
                "fusion": [f.to_dict() for f in self.fusion],
                "flops": sum(self.phase_flops.values()), "phase_flops": self.phase_flops,
                "no_grad_flops": self.no_grad_flops,
                "kernels": [k.to_dict() for k in self.kernels]}


def _counted_ops(ev: Events, costed: CostedRows) -> tuple[I64, I64]:
    """Each costed row and the row whose work it counts as, per thread (two arrays, no
    object per op: this runs at a report's peak): itself for a counted op, its counted
    ancestor for an implementation detail. An op that has a costed op of its own
    family, or one doing FLOPs, inside it dispatched its work there and is not counted (the
    conv2d around mkldnn_convolution, an SDPA around its bmms); a FLOP-less op of another
    family inside a counted op is a detail of it (the bias copy_ inside an addmm, the
    index_select inside an embedding), its time the op's."""
    rows = np.flatnonzero(ev.of_kind("cpu_op"))
    order = rows[np.lexsort((-ev.dur[rows], ev.ts[rows], ev.tid[rows], ev.rank[rows]))]
    order = order[np.isin(order, costed.rows)]
    # positions in `order` from here: each costed op's innermost costed op around it
    parent = open_before(lane_key(ev.rank[order], ev.tid[order]), ev.ts[order], ev.end[order])
    pair_of = costed.pair_of(order)  # each cost read once a pair
    flops = np.array([c.flops > 0 for c, _ in costed.pairs], bool)[pair_of]
    family_of: dict[str, int] = {}
    family = np.array([family_of.setdefault(c.family, len(family_of)) for c, _ in costed.pairs],
                      np.int64)[pair_of]
    dispatched = np.zeros(len(order), bool)
    below = np.arange(len(order))  # each op, walked up its ancestors a level at a time
    at = parent.copy()
    while len(at := at[(up := at >= 0)]):
        below = below[up]
        dispatched[at[flops[below] | (family[at] == family[below])]] = True
        at = parent[at]
    # a counted op is its own; a detail counts as its innermost counted ancestor
    counted = np.flatnonzero(~dispatched)
    owner = counted.copy()
    at, mine = parent[counted], np.arange(len(counted))
    while len(at := at[(up := at >= 0)]):
        mine = mine[up]
        free = ~dispatched[at]
        owner[mine[free]] = at[free]
        at, mine = parent[at[~free]], mine[~free]
    return order[counted], order[owner]


def _shape_text(shapes: Shapes) -> str:
    return ", ".join("x".join(map(str, d)) for d in shapes.dims if d)


@dataclass
class _RankOps:
    """One rank's costed ops, before merging: (name, shapes) -> (cost, count, time)."""

    groups: dict[tuple[str, str], tuple[OpCost, int, int]]
    modelled_ns: int
    op_ns: int
    gpu: bool  # the rank ran device ops
    sequence: list[OpCost]  # the first iteration's costed ops on its first thread, in order
    shapes: list[Shapes]    # their recorded shapes
    phase_flops: list[float]  # FLOPs of the counted ops by pass (analyze.phases.PHASES)
    no_grad_flops: float  # of the forward's, those of ops autograd made no node for
    # (kernel, launching op, its shapes) -> (cost, the kernels' summed share of the op's
    # device time, their time, their count)
    kernels: dict[tuple[str, str, str], tuple[OpCost, float, int, int]]


@dataclass(frozen=True, eq=False)  # arrays: compared by identity
class CostedRows:
    """The CPU ops of an Events object that have a cost model and recorded shapes: their rows
    (ascending) and each one's index in `pairs`, the distinct (cost, shapes) they have. Arrays,
    no object per op: the op table counts and sums them by array (31.7k rows of 288 pairs at
    200k events)."""

    rows: I64
    pair: I64
    pairs: list[tuple[OpCost, Shapes]]

    def pair_of(self, rows: I64) -> I64:
        """The pair index of each of `rows` (costed rows)."""
        return self.pair[np.searchsorted(self.rows, rows)]


def costed_rows(run: Run, ev: Events, rank: int | None = None) -> CostedRows:
    """The CPU ops of `ev` (the Run's events, or `rank`'s: `rank` says which rows `ev` holds)
    that have a cost model and recorded shapes, once per Events object (the op table, the
    backward's FLOPs and the advice's launching ops read the same). Only ops of a modelled
    name have their shapes parsed (most of a big trace's ops are not)."""
    def make() -> CostedRows:
        cpu_ops = np.flatnonzero(ev.of_kind("cpu_op"))
        named = [i for i, n in enumerate(ev.names) if has_cost_model(n)]
        candidates = cpu_ops[np.isin(ev.name[cpu_ops], named)]
        parsed, index = RowShapes.of(run).indexed(candidates, rank)
        found, of_parsed = _distinct(parsed)  # one text in two parts of a call: one object
        shape_of = of_parsed[index]
        # each distinct (name, shapes) costed once, not each row (every iteration records its
        # ops again: 31.7k costed rows of 288 pairs at 200k events)
        head, pair_of = unique_rows(np.stack([ev.name[candidates], shape_of], axis=1))
        pairs: list[tuple[OpCost, Shapes]] = []
        kept = np.full(len(head), -1, np.int64)  # each distinct pair's in `pairs`, -1: none
        for at, (name, shapes) in enumerate(zip(ev.name[candidates[head]].tolist(),
                                                shape_of[head].tolist(), strict=True)):
            s = found[shapes]
            cost = shapes_cost(ev.names[name], s) if s is not None else None
            if cost is not None and s is not None:
                kept[at] = len(pairs)
                pairs.append((cost, s))
        pair = kept[pair_of]
        return CostedRows(candidates[pair >= 0], pair[pair >= 0], pairs)

    return ev.derived("costed rows", make)


def costed_ops(run: Run, ev: Events, rank: int | None = None) -> dict[int, tuple[OpCost, Shapes]]:
    """`costed_rows` by row, with each one's cost and shapes (the advice's rules read them a
    row at a time); once per Events object."""
    def make() -> dict[int, tuple[OpCost, Shapes]]:
        costed = costed_rows(run, ev, rank)
        return dict(zip(costed.rows.tolist(), map(costed.pairs.__getitem__, costed.pair.tolist()),
                        strict=True))

    return ev.derived("costed ops", make)


def backward_flops(run: Run, ev: Events) -> dict[tuple[int, int], float]:
    """(rank, step) -> the FLOPs of the counted ops (_counted_ops) its backward ran
    (analyze.phases): a step's training work, which a bigger batch or a longer sequence
    grows and an evaluation or other no-grad work in the step does not. Derived once per
    Events (advise's step rules each read it)."""
    def make() -> dict[tuple[int, int], float]:
        costed = costed_rows(run, ev)
        owned, owner = _counted_ops(ev, costed)
        counted = owned[owned == owner]
        counted = counted[phases(ev, counted) == PHASES.index("backward")]
        flops = np.array([cost.flops for cost, _ in costed.pairs], np.float64)
        out: dict[tuple[int, int], float] = {}
        for rank, step, f in zip(ev.rank[counted].tolist(), ev.step[counted].tolist(),
                                 flops[costed.pair_of(counted)].tolist(), strict=True):
            out[rank, step] = out.get((rank, step), 0.0) + f
        return out
    return ev.derived("backward flops", make)


def _rank_ops(run: Run, rank: int) -> _RankOps:
    """The costed ops of one rank, read alone (memory stays one rank's, however many)."""
    ev = Events.of_run_rank(run, rank)
    cpu_ops = np.flatnonzero(ev.of_kind("cpu_op"))
    costed = costed_rows(run, ev, rank)
    owned, owner = _counted_ops(ev, costed)
    at_counted = np.sort(owned[owned == owner])
    # each counted op's cost, an index in `listed`: its pair's, or that cost run as TF32 (below)
    listed = [cost for cost, _ in costed.pairs]
    pair_of = costed.pair_of(at_counted)
    cost_of = pair_of.copy()
    device = np.flatnonzero(ev.of_kind(*DEVICE_OPS))
    # each distinct recorded Shapes written out once (many pairs share one), each text an id
    objects, shape_of_pair = _distinct([shapes for _, shapes in costed.pairs])
    seen, shape_of = _first_seen(shape_of_pair[pair_of])  # in the counted ops' order
    distinct = [_shape_text(objects[i]) for i in shape_of_pair[pair_of[seen]].tolist()]
    text_id = {t: i for i, t in enumerate(dict.fromkeys(distinct))}
    text_of = list(text_id)
    op_text = np.full(len(ev), -1, np.int64)
    op_text[at_counted] = np.asarray([text_id[t] for t in distinct], np.int64)[shape_of]
    time = ev.dur[at_counted]  # each counted op's ns, as `counted`
    kernels: dict[tuple[str, str, str], tuple[OpCost, float, int, int]] = {}
    if len(device):
        ext = np.asarray(run.table("events", ["external_id"], rank=rank).column("external_id")
                         .to_numpy(), np.int64)
        dev_rows, op_rows = _launches(ev, ext, device, owned, owner)
        # an FP32 op whose kernels ran on tensor cores did TF32 work: its roofline, its dtype
        tensor_core = [i for i, n in enumerate(ev.names) if is_tensor_core(n)]
        on_tensor_cores = np.isin(at_counted, op_rows[np.isin(ev.name[dev_rows], tensor_core)])
        fp32, variant = np.unique(pair_of[on_tensor_cores], return_inverse=True)
        cost_of[on_tensor_cores] = len(listed) + variant
        listed += [tf32_if_fp32(listed[p]) for p in fp32.tolist()]
        dur = ev.dur[dev_rows]
        ops, op_of = np.unique(op_rows, return_inverse=True)
        launched = _sums(op_of, dur, len(ops))  # each op's kernels' time
        time = np.asarray(_lookup(ops, launched, at_counted), np.int64)
        op_ns = int(ev.dur[device].sum())
        mine = (op_text[op_rows] >= 0) & (launched[op_of] > 0)  # a counted op's kernels
        d, o = dev_rows[mine], op_rows[mine]
        keys = np.stack([ev.name[d], ev.name[o], op_text[o]], axis=1)
        head, group = unique_rows(keys)
        share = np.bincount(group, weights=dur[mine] / launched[op_of[mine]])
        group_ns = _sums(group, dur[mine], len(head))
        calls = np.bincount(group, minlength=len(head))
        # the cost of the group's last op (one of them may have run on tensor cores)
        last_cost = cost_of[np.searchsorted(at_counted, o[_last(group, len(head))])]
        for g, (at, c) in enumerate(zip(head.tolist(), last_cost.tolist(), strict=True)):
            kernels[(ev.names[int(ev.name[d[at]])], ev.names[int(ev.name[o[at]])],
                     text_of[int(op_text[o[at]])])] = (listed[c], float(share[g]),
                                                      int(group_ns[g]), int(calls[g]))
    else:  # the threads' busy time in ops (nested ops counted once)
        op_ns = sum(total(ev.ts[rows], ev.end[rows]) for rows in
                    group_rows(ev.tid[cpu_ops], cpu_ops).values())
    # (name, shapes) groups of the counted ops, each with its last op's cost
    head, group = unique_rows(np.stack([ev.name[at_counted], op_text[at_counted]], axis=1))
    groups = {(ev.names[int(ev.name[h])], text_of[int(op_text[h])]): (listed[c], int(n), int(ns))
              for h, c, n, ns in zip(at_counted[head].tolist(),
                                     cost_of[_last(group, len(head))].tolist(),
                                     np.bincount(group, minlength=len(head)).tolist(),
                                     _sums(group, time, len(head)).tolist(), strict=True)}
    sequence = at_counted[:0]
    if len(at_counted):  # the first op's step on its thread, in time order (positions)
        first = at_counted[np.argmin(ev.ts[at_counted])]
        same = np.flatnonzero((ev.step[at_counted] == ev.step[first])
                              & (ev.tid[at_counted] == ev.tid[first]))
        sequence = same[np.argsort(ev.ts[at_counted[same]], kind="stable")]
    flops = np.array([cost.flops for cost in listed], np.float64)[cost_of]
    phase = phases(ev, at_counted)
    phase_flops = np.bincount(phase, weights=flops, minlength=len(PHASES)).tolist()
    forward = phase == PHASES.index("forward")
    no_grad = float(flops[forward][_no_grad(run, ev, rank, at_counted[forward])].sum())
    return _RankOps(groups, int(time.sum()), op_ns, len(device) > 0,
                    [listed[c] for c in cost_of[sequence].tolist()],
                    [costed.pairs[p][1] for p in pair_of[sequence].tolist()], phase_flops,
                    no_grad, kernels)


def _no_grad(run: Run, ev: Events, rank: int, rows: I64) -> Mask:
    """Which of the forward ops at `rows` autograd made no node for, in them or around
    them (a no-grad evaluation inside a training step: Trainer's eval_steps, a validation
    pass; no backward follows them), where the trace links forward ops to their backward at
    all: the profiler's fwdbwd flows start at the op that made a node (aten::addmm inside
    aten::linear); without any, none."""
    out = np.zeros(len(rows), bool)
    flows = run.table("flows", ["cat", "phase", "tid", "ts"], rank=rank)
    links = pc.and_(pc.equal(flows.column("cat").cast(pa.string()), FORWARD_BACKWARD),
                    pc.equal(flows.column("phase").cast(pa.string()), "s"))
    flows = flows.filter(links)
    if not len(rows) or not flows.num_rows:
        return out
    graph = ev.names.index(SCRIPTED_FORWARD) if SCRIPTED_FORWARD in ev.names else -1
    flow_tid = np.asarray(flows.column("tid").to_numpy(), np.int64)
    flow_ts = np.asarray(flows.column("ts").to_numpy(), np.int64)
    cpu_ops = np.flatnonzero(ev.of_kind("cpu_op"))
    for tid in np.unique(ev.tid[rows]).tolist():
        mine = ev.tid[rows] == tid
        ops = cpu_ops[ev.tid[cpu_ops] == tid]
        # ops that made a node: a flow's, or TorchScript's differentiable graph run (its
        # DifferentiableGraphBackward node has no flow from it: a scripted block's ops had
        # read as no-grad, its GEMMs counted once in model FLOPs)
        made = ops[np.isin(ev.ts[ops], flow_ts[flow_tid == tid]) | (ev.name[ops] == graph)]
        order = np.argsort(ev.ts[made], kind="stable")
        start, reach = ev.ts[made][order], np.maximum.accumulate(ev.end[made][order])
        # an op overlaps one that made a node (ops on a thread nest): one starts by its end
        # and reaches its start
        before = np.searchsorted(start, ev.end[rows[mine]], side="right")
        linked = (before > 0) & (reach[np.maximum(before - 1, 0)] >= ev.ts[rows[mine]]) \
            if len(made) else np.zeros(int(mine.sum()), bool)
        out[mine] = ~linked
    return out


def _launches(ev: Events, external_id: I64, device: I64, rows: I64, heads: I64
              ) -> tuple[I64, I64]:
    """(device rows, the counted op each counts under), in device-row order: the op that
    launched it (dependencies.launching_op_rows), or the counted op it is a detail of
    (`heads`, of the costed `rows`: _counted_ops)."""
    found = launching_op_rows(ev, external_id, device)
    dev, ops = device[found >= 0], found[found >= 0]  # `device`: ascending
    if len(rows):
        ops = np.where(np.isin(ops, rows), _lookup(rows, heads, ops), ops)
    return dev, ops


def _lookup(keys: I64, values: npt.NDArray[Any], want: Sequence[int] | I64) -> npt.NDArray[Any]:
    """values[i] where keys[i] == each wanted key (keys unique; a key not found gives 0)."""
    order = np.argsort(keys, kind="stable")
    keys, values = keys[order], values[order]
    at = np.clip(np.searchsorted(keys, want), 0, max(len(keys) - 1, 0))
    found = keys[at] == np.asarray(want) if len(keys) else np.zeros(len(want), bool)
    return np.where(found, values[at] if len(keys) else 0, 0)


def _distinct(objects: Sequence[T]) -> tuple[list[T], I64]:
    """The distinct objects of `objects` by identity, in order of first appearance, and each
    one's index among them: RowShapes gives one object per distinct recorded shapes, so the
    work per shapes is done once, not per row (hashing a Shapes walks all its tuples)."""
    first, index = _first_seen(np.fromiter(map(id, objects), np.int64, len(objects)))
    return [objects[i] for i in first.tolist()], index


def _first_seen(keys: I64) -> tuple[I64, I64]:
    """The position of each distinct key's first appearance, in that order, and each key's
    index among them."""
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    order = np.argsort(first)
    index = np.empty(len(order), np.int64)
    index[order] = np.arange(len(order))
    return first[order], index[inverse.reshape(-1)]


def _last(group: I64, count: int) -> I64:
    """The position of each group's last member (`group`: each item's group of `count`)."""
    last = np.zeros(count, np.int64)
    last[group] = np.arange(len(group))  # a repeated index keeps its last assignment
    return last


def _sums(groups: I64, values: I64, count: int) -> I64:
    """The int64 sum of `values` per group (exact: no float accumulation)."""
    out = np.zeros(count, np.int64)
    np.add.at(out, groups, values)
    return out


PARSE_ROWS: Final = 1 << 16  # rows whose detail text RowShapes holds at once


class RowShapes:
    """The recorded shapes of a Run's events by row, each parsed once per Run whoever asks
    (a report's op table, its prediction, its advice and its views each read the same ops).
    Held as arrays: each row's index in the list of shapes parsed (a dict by row had been
    40k entries at 200k events, made and read a row at a time)."""

    def __init__(self, run: Run) -> None:
        self.run = run
        # by the row in the whole events table: its shapes' index in `found`, -1 not yet read
        self.index = np.zeros(0, np.int64)
        self.found: list[Shapes | None] = []

    @classmethod
    def of(cls, run: Run) -> RowShapes:
        return run.memo(("row shapes",), lambda: cls(run))

    def get(self, rows: I64, rank: int | None = None) -> list[Shapes | None]:
        """The shapes of the events at `rows` (ascending) of the Run, or of `rank`'s rows."""
        found, index = self.indexed(rows, rank)
        return [found[i] for i in index.tolist()]

    def indexed(self, rows: I64 | Sequence[int], rank: int | None = None
                ) -> tuple[list[Shapes | None], I64]:
        """`get` as the shapes parsed so far and each of `rows`' index among them (any order;
        one object per distinct text parsed in one call; the op table counts rows by it)."""
        base = 0
        if rank is not None:
            ranks = self.run.table("events", ["rank"]).column("rank")
            base = max(pc.index(ranks, rank).as_py(), 0)
        at = np.asarray(rows, np.int64) + base
        if len(at) and int(at.max()) >= len(self.index):
            self.index = np.concatenate([self.index, np.full(int(at.max()) + 1 - len(self.index),
                                                             -1, np.int64)])
        todo = sorted_unique(at[self.index[at] < 0]) - base  # a read gives rows in order
        # each distinct text once: every iteration records its ops' shapes again (detail_of
        # gives one string object a text)
        parse = functools.cache(shapes_from_args)
        for part in np.array_split(todo, -(-len(todo) // PARSE_ROWS)) if len(todo) else ():
            # a part at a time: the detail text of a part's rows is held, not of all of them
            texts = detail_of(self.run, part, rank)
            first, index = _first_seen(np.fromiter(map(id, texts), np.int64, len(texts)))
            self.index[part + base] = len(self.found) + index
            self.found += [parse(texts[i]) for i in first.tolist()]
        return self.found, self.index[at]


def _kernel_stats(parts: Sequence[_RankOps], spec: DeviceSpec | None) -> list[KernelStat]:
    """Each kernel name's share of the cost of the ops that launched it, largest time first."""
    totals: dict[str, list[float]] = {}  # kernel -> [calls, ns, flops, bytes, roofline ns]
    op_ns: dict[str, dict[str, int]] = {}  # kernel -> launching op -> its kernels' ns
    bounds: dict[str, dict[str, int]] = {}  # kernel -> bound -> ns
    for part in parts:
        for (kernel, op, _shapes), (cost, share, ns, calls) in sorted(part.kernels.items()):
            roof = roofline(cost, spec) if spec is not None else None
            t = totals.setdefault(kernel, [0, 0, 0.0, 0.0, 0.0])
            for i, v in enumerate((calls, ns, cost.flops * share, cost.bytes * share,
                                   roof.time_s * 1e9 * share if roof else 0.0)):
                t[i] += v
            ops = op_ns.setdefault(kernel, {})
            ops[op] = ops.get(op, 0) + ns
            if roof is not None:
                b = bounds.setdefault(kernel, {})
                b[roof.bound] = b.get(roof.bound, 0) + ns
    stats = [KernelStat(kernel, int(t[0]), int(t[1]), t[2], t[3],
                        t[4] if spec is not None else None,
                        max(bounds[kernel], key=lambda x: (bounds[kernel][x], x))
                        if kernel in bounds else None,
                        tuple(sorted(op_ns[kernel], key=lambda o: (-op_ns[kernel][o], o))))
             for kernel, t in totals.items()]
    stats.sort(key=lambda k: (-k.time_ns, k.name))
    return stats


def _rank_ops_once(run: Run, rank: int) -> _RankOps:
    """`_rank_ops` once per Run object (a report's op table and its advice both want them)."""
    return run.memo(("rank_ops", rank), lambda: _rank_ops(run, rank))


def op_sequence(run: Run, rank: int) -> list[tuple[OpCost, Shapes]]:
    """The first iteration's costed ops of a rank's first thread, in order, with their shapes."""
    ops = _rank_ops_once(run, rank)
    return list(zip(ops.sequence, ops.shapes, strict=True))


def op_costs(run: Run, ranks: Sequence[int], top: int = TOP) -> OpCosts:
    """The op-cost table of `ranks` of the Run (its fusion candidates from the first rank)."""
    parts = [_rank_ops_once(run, rank) for rank in ranks]
    gpu = any(p.gpu for p in parts)
    spec = spec_of_devices(run.manifest()["devices"]) if gpu else None
    merged: dict[tuple[str, str], tuple[OpCost, int, int]] = {}
    for part in parts:
        for key, (cost, count, ns) in part.groups.items():
            _cost, c0, n0 = merged.get(key, (cost, 0, 0))
            merged[key] = (cost, c0 + count, n0 + ns)
    stats = []
    for (name, text), (cost, count, ns) in merged.items():
        roof = roofline(cost, spec) if spec is not None else None
        stats.append(OpStat(name, text, cost.family, cost.dtype, count, ns, cost.flops,
                            cost.bytes, roof.time_s * 1e9 if roof else None,
                            roof.bound if roof else None))
    stats.sort(key=lambda s: (-s.time_ns, s.name, s.shapes))
    fusion: list[FusionCandidate] = []
    if spec is not None and parts:
        fusion = sorted(fusion_candidates(parts[0].sequence, spec), key=lambda f: -f.saving_s)
    modelled = sum(p.modelled_ns for p in parts)
    phase_flops = {phase: sum(p.phase_flops[i] for p in parts)
                   for i, phase in enumerate(PHASES)}
    return OpCosts(spec.name if spec else None, tuple(stats[:top]), modelled,
                   max(sum(p.op_ns for p in parts), modelled), tuple(fusion[:10]),
                   phase_flops, tuple(_kernel_stats(parts, spec)[:top]),
                   sum(p.no_grad_flops for p in parts))
