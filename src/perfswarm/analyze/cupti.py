"""CUPTI range-profiler counters: what each profiled kernel executed.

With the range profiler on, Kineto writes one `cuda_profiler_range` span per kernel,
named by it, its args the metric values (e.g. `smsp__sass_thread_inst_executed_op_ffma_
pred_on.sum`). Per kernel name: the ranges and each metric summed; over the Run, each
metric summed; and floating-point operations by precision from the SASS instruction
counts as Nsight Compute counts them (add + mul + 2 x fma).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import msgspec
import numpy as np

from perfswarm.analyze.frame import Events, args_of
from perfswarm.trace.store import Run

TOP: Final = 20
_FLOP_METRIC: Final = "smsp__sass_thread_inst_executed_op_{}{}_pred_on.sum"
PRECISIONS: Final = {"fp64": "d", "fp32": "f", "fp16": "h"}


def flops(metrics: dict[str, float]) -> dict[str, float]:
    """FLOPs per precision from the SASS add/mul/fma instruction counts that are present."""
    out = {}
    for precision, p in PRECISIONS.items():
        names = [_FLOP_METRIC.format(p, op) for op in ("add", "mul", "fma")]
        if any(n in metrics for n in names):
            add, mul, fma = (metrics.get(n, 0.0) for n in names)
            out[precision] = add + mul + 2 * fma
    return out


@dataclass(frozen=True)
class KernelCounters:
    name: str
    ranges: int
    metrics: dict[str, float]  # summed over its ranges

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "ranges": self.ranges, "metrics": dict(self.metrics),
                "flops": flops(self.metrics)}


@dataclass(frozen=True)
class CuptiCounters:
    ranges: int
    totals: dict[str, float]  # metric -> sum over every range
    kernels: tuple[KernelCounters, ...]  # top by total FLOPs, then by ranges

    def to_dict(self) -> dict[str, Any]:
        return {"ranges": self.ranges, "totals": dict(self.totals), "flops": flops(self.totals),
                "kernels": [k.to_dict() for k in self.kernels]}

    @classmethod
    def merge(cls, parts: Sequence[CuptiCounters | None],
              top: int | None = TOP) -> CuptiCounters | None:
        """Ranks' full (untruncated) counters summed."""
        found = [p for p in parts if p is not None]
        if not found:
            return None
        return _counters([(k.name, k.ranges, k.metrics) for p in found for k in p.kernels], top)


def _counters(ranges: Sequence[tuple[str, int, Mapping[str, float]]],
              top: int | None) -> CuptiCounters:
    """From (kernel name, ranges, metrics summed) entries, several per name allowed."""
    by_name: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    count: dict[str, int] = defaultdict(int)
    totals: dict[str, float] = defaultdict(float)
    for name, n, metrics in ranges:
        count[name] += n
        for metric, value in metrics.items():
            by_name[name][metric] += value
            totals[metric] += value
    kernels = [KernelCounters(n, count[n], dict(sorted(by_name[n].items()))) for n in count]
    kernels.sort(key=lambda k: (-sum(flops(k.metrics).values()), -k.ranges, k.name))
    return CuptiCounters(sum(count.values()), dict(sorted(totals.items())),
                         tuple(kernels[:top]))


def cupti_counters(run: Run, ev: Events, rank: int | None = None,
                   top: int | None = TOP) -> CuptiCounters | None:
    """The range profiler's counters of `ev` (the Run's events, or those of `rank`), or None
    without any."""
    rows = np.flatnonzero(ev.of_kind("profiler_range"))
    if len(rows) == 0:
        return None
    entries = []
    for row, text in zip(rows.tolist(), args_of(run, rows, rank), strict=True):
        values = msgspec.json.decode(text)
        entries.append((ev.names[int(ev.name[row])], 1,
                        {m: float(v) for m, v in values.items()
                         if isinstance(v, int | float) and not isinstance(v, bool)}))
    return _counters(entries, top)
