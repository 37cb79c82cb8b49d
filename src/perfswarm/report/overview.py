"""The overview's step-time breakdown and model FLOP/s, as TensorBoard's profiler shows them.

Each instant of a step falls in one category by priority: device compute (a kernel runs),
communication (a collective), memory copy (memcpy/memset), data loading (a DataLoader span on
the host), host compute (any other op on a host thread), other (synchronization and the rest),
and idle (nothing). The categories partition the step, so they add up to its duration.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

import numpy as np

from perfswarm.analyze.frame import Events, Mask
from perfswarm.analyze.intervals import StateSums, covered, sorted_unique
from perfswarm.model.specs import spec_of_devices

CATEGORIES: Final = ("device compute", "communication", "memory copy", "data loading",
                     "host compute", "other", "idle")
LOADER: Final = re.compile(r"DataLoader")
_NOT_WORK: Final = ("instant", "trace_span", "profiler_range")


def _masks(ev: Events) -> list[Mask]:
    loader_codes = [i for i, n in enumerate(ev.names) if LOADER.search(n)]
    loading = ev.host_busy & np.isin(ev.name, loader_codes)
    work = (ev.dur > 0) & ~ev.of_kind(*_NOT_WORK) & ~ev.is_step_marker
    masks = [ev.of_kind("kernel"), ev.of_kind("collective"), ev.of_kind("memcpy", "memset"),
             loading, ev.host_busy & ~loading]
    taken = np.zeros(len(ev), bool)
    for m in masks:
        taken |= m
    return [*masks, work & ~taken]


def step_breakdown(ev: Events, steps: Mapping[str, Sequence[Mapping[str, Any]]],
                   ) -> list[dict[str, Any]]:
    """ns per category of every step (`steps`: the analysis's iterations per rank)."""
    rows: list[dict[str, Any]] = []
    for rank_key, windows in sorted(steps.items(), key=lambda kv: int(kv[0])):
        rank = int(rank_key)
        mine = ev.of_rank(rank)
        masks = _masks(mine)
        bounds = [np.asarray([w["start"] for w in windows] + [w["end"] for w in windows],
                             np.int64)]
        for m in masks:
            bounds += [mine.ts[m], mine.end[m]]
        points = sorted_unique(np.concatenate(bounds))
        codes = np.full(max(len(points) - 1, 0), len(CATEGORIES) - 1, np.int64)
        for i in range(len(masks) - 1, -1, -1):  # the first category covering wins
            m = masks[i]
            codes[covered(mine.ts[m], mine.end[m], points)] = i
        sums = StateSums(points, codes, len(CATEGORIES), len(CATEGORIES) - 1)
        for w in windows:
            ns = sums.between(int(w["start"]), int(w["end"]))
            rows.append({"rank": rank, "step": w["step"], "dur_ns": int(w["end"] - w["start"]),
                         "ns": {c: int(v) for c, v in zip(CATEGORIES, ns.tolist(), strict=True)}})
    return rows


def model_flops(op_cost: Mapping[str, Any], devices: Sequence[Mapping[str, Any]],
                profiled_ns: int, ranks: int) -> dict[str, Any] | None:
    """FLOPs of the costed ops over the profiled steps' time: achieved FLOP/s per rank and,
    on a GPU with a spec, model FLOPs utilization against its peak for the ops' dtype."""
    ops = op_cost["ops"]
    flops = sum(o["flops"] * o["count"] for o in ops)
    if not flops or profiled_ns <= 0:
        return None
    achieved = flops / ranks / (profiled_ns / 1e9)
    spec = spec_of_devices(devices) if op_cost["device"] else None
    dtype = max(ops, key=lambda o: o["flops"] * o["count"])["dtype"]
    peak = spec.peak_for(dtype) if spec is not None else None
    return {"flops": flops, "flops_per_s": achieved, "dtype": dtype,
            "peak_flops_per_s": peak, "mfu": achieved / peak if peak else None,
            "device": spec.name if spec is not None else None}
