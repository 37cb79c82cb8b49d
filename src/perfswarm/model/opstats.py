"""Per-op cost of a Run: FLOPs, bytes and arithmetic intensity from the recorded shapes, the time
the op took, what rate that achieved, and (with a device spec) its roofline time, bound and
efficiency; plus fusion candidates among consecutive memory-bound ops.

An op is counted at the innermost level that has a cost model (mkldnn_convolution, not the
conv2d that dispatched to it), so no work is counted twice. Its time is its own duration on
CPU runs, the duration of the device ops it launched (joined by External id) on GPU runs.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from perfswarm.analyze.dependencies import launching_ops
from perfswarm.analyze.frame import EVENT_COLUMNS, Events, group_rows
from perfswarm.analyze.intervals import total
from perfswarm.analyze.launch import DEVICE_OPS
from perfswarm.model.fusion import FusionCandidate, fusion_candidates
from perfswarm.model.opcost import (
    OpCost,
    Shapes,
    has_cost_model,
    roofline,
    shapes_cost,
    shapes_from_args,
)
from perfswarm.model.specs import spec_of_devices
from perfswarm.trace.store import Run

TOP: Final = 25


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
class OpCosts:
    device: str | None  # the spec rooflines are on, if the Run's device has one
    ops: tuple[OpStat, ...]  # largest total time first
    modelled_ns: int  # time of ops with a cost model
    op_ns: int  # time of all ops at the level counted
    fusion: tuple[FusionCandidate, ...]  # largest saving first

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "ops": [o.to_dict() for o in self.ops],
                "modelled_ns": self.modelled_ns, "op_ns": self.op_ns,
                "coverage": self.modelled_ns / self.op_ns if self.op_ns else 0.0,
                "fusion": [f.to_dict() for f in self.fusion]}


def _innermost_costed(ev: Events, costs: dict[int, OpCost]) -> list[int]:
    """Costed rows with no costed op inside them, per thread."""
    rows = np.flatnonzero(ev.of_kind("cpu_op"))
    order = rows[np.lexsort((-ev.dur[rows], ev.ts[rows], ev.tid[rows], ev.rank[rows]))]
    stack: list[tuple[int, int, tuple[int, int]]] = []  # (row, end, thread)
    inner: dict[int, bool] = {}
    for row in order.tolist():
        thread = (int(ev.rank[row]), int(ev.tid[row]))
        while stack and (stack[-1][2] != thread or stack[-1][1] <= ev.ts[row]):
            stack.pop()
        if row in costs:
            for above, _end, _thread in stack:
                if above in costs:
                    inner[above] = False
            inner.setdefault(row, True)
        stack.append((row, int(ev.end[row]), thread))
    return sorted(row for row, yes in inner.items() if yes)


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


def _rank_ops(run: Run, rank: int) -> _RankOps:
    """The costed ops of one rank, read alone (memory stays one rank's, however many)."""
    table = run.table("events", [*EVENT_COLUMNS, "args", "external_id"], rank=rank)
    ev = Events.from_table(table)
    cpu_ops = np.flatnonzero(ev.of_kind("cpu_op"))
    # only ops of a modelled name have their args parsed (most of a big trace's ops are not)
    named = [i for i, n in enumerate(ev.names) if has_cost_model(n)]
    candidates = cpu_ops[np.isin(ev.name[cpu_ops], named)]
    costs: dict[int, OpCost] = {}
    shapes: dict[int, Shapes] = {}
    args = table.column("args").take(candidates).to_pylist()
    for row, text in zip(candidates.tolist(), args, strict=True):
        found = shapes_from_args(text or "")
        cost = shapes_cost(ev.name_of(row), found) if found else None
        if cost is not None and found is not None:
            costs[row], shapes[row] = cost, found
    counted = _innermost_costed(ev, costs)
    device = np.flatnonzero(ev.of_kind(*DEVICE_OPS))
    time = {row: int(ev.dur[row]) for row in counted}
    if len(device):
        ext = np.asarray(table.column("external_id").to_numpy(), np.int64)
        launched: dict[int, int] = defaultdict(int)
        for dev_row, op_row in launching_ops(ev, ext, device).items():
            launched[op_row] += int(ev.dur[dev_row])
        time = {row: launched.get(row, 0) for row in counted}
        op_ns = int(ev.dur[device].sum())
    else:  # the threads' busy time in ops (nested ops counted once)
        op_ns = sum(total(ev.ts[rows], ev.end[rows]) for rows in
                    group_rows(ev.tid[cpu_ops], cpu_ops).values())
    groups: dict[tuple[str, str], tuple[OpCost, int, int]] = {}
    for row in counted:
        key = (ev.name_of(row), _shape_text(shapes[row]))
        _cost, count, ns = groups.get(key, (costs[row], 0, 0))
        groups[key] = (costs[row], count + 1, ns + time[row])
    rows: list[int] = []
    if counted:
        first = min(counted, key=lambda r: int(ev.ts[r]))
        rows = sorted((r for r in counted
                       if ev.step[r] == ev.step[first] and ev.tid[r] == ev.tid[first]),
                      key=lambda r: int(ev.ts[r]))
    return _RankOps(groups, sum(time.values()), op_ns, len(device) > 0,
                    [costs[r] for r in rows], [shapes[r] for r in rows])


def op_sequence(run: Run, rank: int) -> list[tuple[OpCost, Shapes]]:
    """The first iteration's costed ops of a rank's first thread, in order, with their shapes."""
    ops = _rank_ops(run, rank)
    return list(zip(ops.sequence, ops.shapes, strict=True))


def op_costs(run: Run, ranks: Sequence[int], top: int = TOP) -> OpCosts:
    """The op-cost table of `ranks` of the Run (its fusion candidates from the first rank)."""
    parts = [_rank_ops(run, rank) for rank in ranks]
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
    return OpCosts(spec.name if spec else None, tuple(stats[:top]), modelled,
                   max(sum(p.op_ns for p in parts), modelled), tuple(fusion[:10]))
