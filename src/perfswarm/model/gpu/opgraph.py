"""A Run recorded on a CPU (or any op graph with shapes) forecast on a GPU: every innermost
aten op with shapes becomes the GPU kernels it would launch, priced by the learned model, and
the host launches them at the per-op time of a GPU host; the device runs them in order.

The host's time per op (`HOST_OP_NS`: a launching op's median duration, its launch call
included; `LAUNCH_NS` the call alone) is that of the corpus's GPU training trace, the A100
DDP run of ../shared/corpus (the MI250 one shows 39 us; `host_overheads` recomputes them from
a Run, and a test checks the constants against the corpus trace). A profiled op's host time:
the forecast carries the profiler's overhead, as the traces it compares with do.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np

from perfswarm.analyze.dependencies import enclosing_ops
from perfswarm.analyze.frame import Events
from perfswarm.model.gpu.forecast import op_seconds
from perfswarm.model.gpu.learned import KernelModel
from perfswarm.model.opcost import Shapes, data_cost
from perfswarm.model.specs import DeviceSpec

HOST_OP_NS: Final = 51_761
LAUNCH_NS: Final = 9_713
ZEROING: Final = frozenset({"aten::zero_", "aten::fill_"})  # an op setting up its output
LAUNCHES: Final = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "hipLaunchKernel",
                   "hipExtLaunchKernel")


def host_overheads(ev: Events) -> tuple[int, int]:
    """(median duration of the innermost ops that launch kernels, median launch call) of a
    GPU Run's events."""
    launch = [i for i, n in enumerate(ev.names) if n in LAUNCHES]
    calls = np.flatnonzero(ev.of_kind("runtime", "driver") & np.isin(ev.name, launch))
    ops = np.array(sorted(set(enclosing_ops(ev, calls).values())), np.int64)
    if len(calls) == 0 or len(ops) == 0:
        return 0, 0
    return int(np.median(ev.dur[ops])), int(np.median(ev.dur[calls]))


@dataclass(frozen=True)
class StepForecast:
    predicted_ns: int
    device_ns: int
    families_ns: dict[str, int]
    unpriced: Counter[str]


def innermost_ops(ev: Events, shapes: Callable[[int], Shapes | None], lo: int, hi: int
                  ) -> list[int]:
    """Rows of the aten ops in [lo, hi) with shapes and a cost model that enclose no other
    such op on their thread (aten::linear's addmm, not the linear), in start order; an op
    that encloses only the zeroing of its output (ZEROING: max_pool2d_with_indices_backward,
    nll_loss_backward) runs its own kernel after it, and counts too."""
    rows = np.flatnonzero(ev.of_kind("cpu_op") & (ev.ts >= lo) & (ev.ts < hi))
    costed = [r for r in rows.tolist() if ev.name_of(r).startswith("aten::")
              and (s := shapes(r)) is not None and data_cost(ev.name_of(r), s) is not None]
    lanes = sorted(costed, key=lambda r: (int(ev.rank[r]), int(ev.tid[r]), int(ev.ts[r]),
                                          -int(ev.end[r])))
    outer = set()
    for i, r in enumerate(lanes):
        for a in lanes[i + 1:]:
            if (ev.rank[a], ev.tid[a]) != (ev.rank[r], ev.tid[r]) or ev.ts[a] >= ev.end[r]:
                break  # past what r encloses
            if ev.name_of(r) in ZEROING or ev.name_of(a) not in ZEROING:
                outer.add(r)
                break
    return [r for r in costed if r not in outer]


def _top_level_ns(ev: Events, rows: Sequence[int]) -> int:
    """Time of the ops among `rows` that no other of them encloses (per thread)."""
    total, lane, end = 0, None, 0
    for r in sorted(rows, key=lambda r: (int(ev.rank[r]), int(ev.tid[r]), int(ev.ts[r]),
                                         -int(ev.end[r]))):
        if (ev.rank[r], ev.tid[r]) != lane:
            lane, end = (ev.rank[r], ev.tid[r]), 0
        if ev.ts[r] >= end:
            total += int(ev.dur[r])
            end = int(ev.end[r])
    return total


def forecast_step(ev: Events, shapes: Callable[[int], Shapes | None], lo: int, hi: int,
                  target: DeviceSpec, host_ns: int, model: KernelModel | None = None
                  ) -> StepForecast:
    """One iteration on `target`: the host's own time outside the ops (`host_ns`, as recorded)
    plus HOST_OP_NS per op, each op's kernels queued on one stream behind the ones before."""
    rows = innermost_ops(ev, shapes, lo, hi)
    priced = op_seconds([(ev.name_of(r), shapes(r) or Shapes((), ()), False) for r in rows],
                        target, model)
    unpriced: Counter[str] = Counter()
    families: Counter[str] = Counter()
    gap = host_ns / max(1, len(rows))
    host = 0.0 if rows else float(host_ns)
    device = busy = 0.0
    for row, found in zip(rows, priced, strict=True):
        host += gap + HOST_OP_NS
        if found is None:
            unpriced[ev.name_of(row)] += 1
            continue
        seconds, family = found
        device = max(device, host) + seconds * 1e9
        busy += seconds * 1e9
        families[family] += round(seconds * 1e9)
    return StepForecast(round(max(host, device)), round(busy), dict(families), unpriced)


def op_graph_steps(ev: Events, shapes: Callable[[int], Shapes | None],
                   steps: Sequence[tuple[int, int]], target: DeviceSpec,
                   model: KernelModel | None = None) -> list[StepForecast]:
    """Every (start, end) iteration of a CPU Run forecast on `target`: its host time outside
    ops is its length less its top-level ops' time."""
    out = []
    for lo, hi in steps:
        inside = np.flatnonzero(ev.of_kind("cpu_op") & (ev.ts >= lo) & (ev.ts < hi)).tolist()
        busy = _top_level_ns(ev, inside)
        out.append(forecast_step(ev, shapes, lo, hi, target, max(0, hi - lo - busy), model))
    return out
