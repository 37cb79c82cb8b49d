"""Op and kernel breakdown: time per kernel and per category, overall and per iteration.

Categories come from the kind (communication, memory) and, for kernels, from the
name: the vendor libraries and PyTorch name their kernels consistently enough that
a few ordered patterns sort nearly all of them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from perfswarm.analyze.frame import KIND, Events
from perfswarm.analyze.iterations import StepWindow

# First match wins; order matters (a cuDNN implicit-GEMM conv is a conv, not a GEMM).
KERNEL_CATEGORIES: Final = (
    ("attention", re.compile(r"flash|fmha|attention|sdpa|mha_", re.I)),
    ("conv", re.compile(r"conv|scudnn|winograd|implicit_?gemm|fprop|dgrad|wgrad", re.I)),
    ("gemm", re.compile(r"gemm|cutlass|matmul|mma|cublas|sm\d+_xmma|Cijk_|_nn_|_nt_|_tn_", re.I)),
    ("reduction", re.compile(r"reduce|softmax|norm|bn_[fb]w|argmax|argmin|topk|sum_|mean"
                             r"|scan|sort", re.I)),
    ("elementwise", re.compile(r"elementwise|vectorized|unrolled|pointwise|functor|copy_kernel"
                               r"|fill|triton_poi", re.I)),
    ("embedding", re.compile(r"embedding|gather|scatter|index", re.I)),
)
CATEGORIES: Final = ("communication", "memory", *(c for c, _ in KERNEL_CATEGORIES), "other")
TOP = 20  # names listed per table


def kernel_category(name: str) -> str:
    for category, pattern in KERNEL_CATEGORIES:
        if pattern.search(name):
            return category
    return "other"


def categories(ev: Events) -> np.ndarray[Any, np.dtype[np.int64]]:
    """Index into CATEGORIES per event (device events; host rows get 'other')."""
    by_name = np.array([CATEGORIES.index(kernel_category(n)) for n in ev.names] or [0], np.int64)
    cat = by_name[ev.name] if len(ev.names) else np.zeros(len(ev), np.int64)
    cat = np.where(ev.kind == KIND["collective"], CATEGORIES.index("communication"), cat)
    return np.where(ev.of_kind("memcpy", "memset"), CATEGORIES.index("memory"), cat)


@dataclass(frozen=True)
class NameStat:
    name: str
    category: str
    count: int
    total_ns: int
    mean_ns: float
    min_ns: int
    max_ns: int

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "category": self.category, "count": self.count,
                "total_ns": self.total_ns, "mean_ns": self.mean_ns, "min_ns": self.min_ns,
                "max_ns": self.max_ns}


@dataclass(frozen=True)
class CategoryStat:
    category: str
    count: int
    total_ns: int
    share: float  # of all device-op time

    def to_dict(self) -> dict[str, Any]:
        return {"category": self.category, "count": self.count, "total_ns": self.total_ns,
                "share": self.share}


@dataclass(frozen=True)
class OpBreakdown:
    kernels: tuple[NameStat, ...]  # device ops by total time, largest first
    cpu_ops: tuple[NameStat, ...]  # host ops by total (inclusive) time
    categories: tuple[CategoryStat, ...]
    per_iteration: Mapping[int, Mapping[int, Mapping[str, int]]]  # rank -> step -> category -> ns

    def to_dict(self) -> dict[str, Any]:
        return {"kernels": [k.to_dict() for k in self.kernels],
                "cpu_ops": [k.to_dict() for k in self.cpu_ops],
                "categories": [c.to_dict() for c in self.categories],
                "per_iteration": {str(r): {str(s): dict(c) for s, c in steps.items()}
                                  for r, steps in self.per_iteration.items()}}


def name_stats(ev: Events, rows: np.ndarray[Any, np.dtype[np.int64]],
               category: Sequence[str] | None, limit: int | None = TOP) -> tuple[NameStat, ...]:
    """Per-name totals over `rows`, largest total first (ties by name), at most `limit`."""
    if len(rows) == 0:
        return ()
    names = ev.name[rows]
    dur = ev.dur[rows]
    uniq, inv = np.unique(names, return_inverse=True)
    count = np.bincount(inv)
    total = np.bincount(inv, weights=dur).astype(np.int64)
    lo = np.full(len(uniq), np.iinfo(np.int64).max)
    hi = np.zeros(len(uniq), np.int64)
    np.minimum.at(lo, inv, dur)
    np.maximum.at(hi, inv, dur)
    order = sorted(range(len(uniq)), key=lambda i: (-int(total[i]), ev.names[int(uniq[i])]))
    out = []
    for i in order[:limit]:
        name = ev.names[int(uniq[i])]
        out.append(NameStat(name, category[i] if category else "cpu", int(count[i]),
                            int(total[i]), float(total[i] / count[i]), int(lo[i]), int(hi[i])))
    return tuple(out)


def op_breakdown(ev: Events, steps: Mapping[int, Sequence[StepWindow]],
                 limit: int | None = TOP) -> OpBreakdown:
    device = np.flatnonzero(ev.of_kind("kernel", "collective", "memcpy", "memset"))
    cat = categories(ev)
    names_dev = np.unique(ev.name[device])
    cat_of_name = {int(n): CATEGORIES[int(c)] for n, c in
                   zip(ev.name[device], cat[device], strict=True)}
    kernels = name_stats(ev, device, [cat_of_name[int(n)] for n in names_dev], limit)
    host = np.flatnonzero(ev.of_kind("cpu_op"))
    cpu_ops = name_stats(ev, host, None, limit)

    dev_total = int(ev.dur[device].sum())
    cat_count = np.bincount(cat[device], minlength=len(CATEGORIES))
    cat_ns = np.bincount(cat[device], weights=ev.dur[device], minlength=len(CATEGORIES))
    cats = tuple(CategoryStat(c, int(cat_count[i]), int(cat_ns[i]),
                              float(cat_ns[i] / dev_total) if dev_total else 0.0)
                 for i, c in enumerate(CATEGORIES) if cat_count[i])
    per_iteration: dict[int, dict[int, dict[str, int]]] = {}
    for rank, windows in steps.items():
        rows = device[ev.rank[device] == rank]
        for w in windows:
            # Device ops belong to the iteration they start in.
            inside = rows[(ev.ts[rows] >= w.start) & (ev.ts[rows] < w.end)]
            ns = np.bincount(cat[inside], weights=ev.dur[inside], minlength=len(CATEGORIES))
            per_iteration.setdefault(rank, {})[w.step] = {
                c: int(ns[i]) for i, c in enumerate(CATEGORIES) if ns[i]}
    return OpBreakdown(kernels, cpu_ops, cats, per_iteration)
