"""Op and kernel breakdown: time per kernel and per category, overall and per iteration.

Categories come from the kind (communication, memory) and, for kernels, from the
name: the vendor libraries and PyTorch name their kernels consistently enough that
a few ordered patterns sort nearly all of them.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from perfswarm.analyze.frame import DEVICE_OPS, KIND, Events
from perfswarm.analyze.iterations import StepWindow

# First match wins; order matters (a cuDNN implicit-GEMM conv is a conv, not a GEMM).
KERNEL_CATEGORIES: Final = (
    ("attention", re.compile(r"flash|fmha|attention|sdpa|mha_", re.I)),
    ("conv", re.compile(r"conv|scudnn|winograd|implicit_?gemm|fprop|dgrad|wgrad", re.I)),
    # mma only as a word's start (hmma, xmma, wgmma, _mma): not inside GammaBeta (layer norm's
    # weight gradient) or FusedAdamMathFunctor (fused AdamW), both GEMMs here once
    ("gemm", re.compile(r"gemm|cutlass|matmul|(?<![a-z])mma|[hwxi]mma|cublas|Cijk_|_nn_|_nt_"
                        r"|_tn_", re.I)),
    ("reduction", re.compile(r"reduce|softmax|norm|bn_[fb]w|gammabeta|argmax|argmin|topk|sum_"
                             r"|mean|scan|sort", re.I)),
    ("elementwise", re.compile(r"elementwise|vectorized|unrolled|pointwise|functor|copy_kernel"
                               r"|fill|triton_poi", re.I)),
    ("embedding", re.compile(r"embedding|gather|scatter|index", re.I)),
)
CATEGORIES: Final = ("communication", "memory", *(c for c, _ in KERNEL_CATEGORIES), "other")
TOP = 20  # names listed per table


# kernels that run on tensor cores, by the names cuBLAS, CUTLASS and cuDNN give them
TENSOR_CORE: Final = (r"(?i)(tf32|tfloat32|bf16|fp16|f16|h884|h1688|h16816|s1688|s16816|i8816|"
                      r"hmma|tensorop|wmma|tensor16x8|_16x8x)")
_TENSOR_CORE_RE: Final = re.compile(TENSOR_CORE)


@functools.lru_cache(maxsize=1 << 16)  # per distinct name: callers ask per kernel event
def is_tensor_core(name: str) -> bool:
    return _TENSOR_CORE_RE.search(name) is not None


@functools.lru_cache(maxsize=1 << 16)
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


@dataclass(frozen=True)
class NameTotal:
    count: int
    total_ns: int
    min_ns: int
    max_ns: int

    def plus(self, other: NameTotal) -> NameTotal:
        return NameTotal(self.count + other.count, self.total_ns + other.total_ns,
                         min(self.min_ns, other.min_ns), max(self.max_ns, other.max_ns))


def name_totals(ev: Events, rows: np.ndarray[Any, np.dtype[np.int64]]) -> dict[str, NameTotal]:
    if len(rows) == 0:
        return {}
    dur = ev.dur[rows]
    uniq, inv = np.unique(ev.name[rows], return_inverse=True)
    count = np.bincount(inv)
    total = np.bincount(inv, weights=dur).astype(np.int64)
    lo = np.full(len(uniq), np.iinfo(np.int64).max)
    hi = np.zeros(len(uniq), np.int64)
    np.minimum.at(lo, inv, dur)
    np.maximum.at(hi, inv, dur)
    return {ev.names[int(u)]: NameTotal(int(count[i]), int(total[i]), int(lo[i]), int(hi[i]))
            for i, u in enumerate(uniq.tolist())}


def name_stats(totals: Mapping[str, NameTotal], category: Mapping[str, str] | None,
               limit: int | None = TOP) -> tuple[NameStat, ...]:
    """Per-name totals, largest total first (ties by name), at most `limit`."""
    order = sorted(totals, key=lambda name: (-totals[name].total_ns, name))
    return tuple(NameStat(name, category[name] if category else "cpu", t.count, t.total_ns,
                          t.total_ns / t.count, t.min_ns, t.max_ns)
                 for name in order[:limit] for t in (totals[name],))


def _merged(parts: Sequence[Mapping[str, NameTotal]]) -> dict[str, NameTotal]:
    out: dict[str, NameTotal] = {}
    for part in parts:
        for name, total in part.items():
            out[name] = out[name].plus(total) if name in out else total
    return out


@dataclass(frozen=True)
class OpTotals:
    """What the breakdown is made of, as sums that add up across ranks."""

    kernels: Mapping[str, NameTotal]
    kernel_category: Mapping[str, str]
    cpu_ops: Mapping[str, NameTotal]
    category_count: tuple[int, ...]  # per CATEGORIES
    category_ns: tuple[int, ...]
    per_iteration: Mapping[int, Mapping[int, Mapping[str, int]]]  # rank -> step -> category -> ns

    @classmethod
    def of(cls, ev: Events, steps: Mapping[int, Sequence[StepWindow]]) -> OpTotals:
        device = np.flatnonzero(ev.of_kind(*DEVICE_OPS))
        cat = categories(ev)
        # a name seen as two kinds (a collective and a kernel) takes its last row's category
        kernel_category = {ev.names[n]: CATEGORIES[c] for n, c in
                           zip(ev.name[device].tolist(), cat[device].tolist(), strict=True)}
        count = np.bincount(cat[device], minlength=len(CATEGORIES))
        ns = np.bincount(cat[device], weights=ev.dur[device], minlength=len(CATEGORIES))
        per_iteration: dict[int, dict[int, dict[str, int]]] = {}
        for rank, windows in steps.items():
            rows = device[ev.rank[device] == rank]  # by start: events are sorted by (rank, ts)
            starts = ev.ts[rows]
            for w in windows:
                # Device ops belong to the iteration they start in.
                inside = rows[slice(*np.searchsorted(starts, [w.start, w.end]))]
                step_ns = np.bincount(cat[inside], weights=ev.dur[inside],
                                      minlength=len(CATEGORIES))
                per_iteration.setdefault(rank, {})[w.step] = {
                    c: int(step_ns[i]) for i, c in enumerate(CATEGORIES) if step_ns[i]}
        return cls(name_totals(ev, device), kernel_category,
                   name_totals(ev, np.flatnonzero(ev.of_kind("cpu_op"))),
                   tuple(int(x) for x in count), tuple(int(x) for x in ns), per_iteration)

    @classmethod
    def merge(cls, parts: Sequence[OpTotals]) -> OpTotals:
        """Parts of disjoint ranks, in rank order."""
        return cls(_merged([p.kernels for p in parts]),
                   {k: v for p in parts for k, v in p.kernel_category.items()},
                   _merged([p.cpu_ops for p in parts]),
                   tuple(int(sum(x)) for x in zip(*(p.category_count for p in parts),
                                                   strict=True)),
                   tuple(int(sum(x)) for x in zip(*(p.category_ns for p in parts), strict=True)),
                   {r: s for p in parts for r, s in p.per_iteration.items()})

    def breakdown(self, limit: int | None = TOP) -> OpBreakdown:
        total = sum(self.category_ns)
        cats = tuple(CategoryStat(c, self.category_count[i], self.category_ns[i],
                                  self.category_ns[i] / total if total else 0.0)
                     for i, c in enumerate(CATEGORIES) if self.category_count[i])
        return OpBreakdown(name_stats(self.kernels, self.kernel_category, limit),
                           name_stats(self.cpu_ops, None, limit), cats, self.per_iteration)


def op_breakdown(ev: Events, steps: Mapping[int, Sequence[StepWindow]],
                 limit: int | None = TOP) -> OpBreakdown:
    return OpTotals.of(ev, steps).breakdown(limit)
