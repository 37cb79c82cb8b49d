"""Frequent kernel sequences: the runs of kernels an iteration repeats, with their time.

Kernels are read per stream in start order; every run of 2 to MAX_LEN consecutive
kernels is an n-gram of their names. The n-grams seen at least twice are ranked by
the device time their occurrences took; a shorter one is left out where a longer one
that contains it occurs as often (the longer says more). A sequence whose kernels are
all elementwise or reductions is `fusable`: the kind torch.compile or a fused kernel
folds into one launch (see the fusion advice).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from perfswarm.analyze.frame import KIND, Events, group_rows, lane_key
from perfswarm.analyze.ops import CATEGORIES, categories

MAX_LEN: Final = 4
TOP: Final = 20
_FUSABLE: Final = frozenset({CATEGORIES.index("elementwise"), CATEGORIES.index("reduction")})


@dataclass(frozen=True)
class Sequence_:
    names: tuple[str, ...]
    count: int  # occurrences (they may overlap when a kernel repeats)
    total_ns: int  # summed durations of the kernels of every occurrence
    fusable: bool

    def to_dict(self) -> dict[str, Any]:
        return {"names": list(self.names), "length": len(self.names), "count": self.count,
                "total_ns": self.total_ns, "mean_ns": self.total_ns / self.count,
                "fusable": self.fusable}


def _contains(longer: tuple[str, ...], shorter: tuple[str, ...]) -> bool:
    n = len(shorter)
    return any(longer[i:i + n] == shorter for i in range(len(longer) - n + 1))


Counts = dict[tuple[str, ...], tuple[int, int, bool]]  # names -> count, total ns, fusable


def sequence_counts(ev: Events) -> Counts:
    """Every kernel n-gram seen twice or more on a stream of `ev`, summed over streams."""
    rows = np.flatnonzero(ev.kind == KIND["kernel"])
    # dense codes for the kernel names, so an n-gram is one int64 (base ** MAX_LEN < 2 ** 63)
    kernel_names, first, dense = np.unique(ev.name[rows], return_index=True,
                                           return_inverse=True)
    base = max(len(kernel_names), 2)
    if base ** MAX_LEN >= 2 ** 62:  # too many distinct kernels to pack: none reported
        return {}
    fusable = np.isin(categories(ev)[rows[first]], list(_FUSABLE))
    found: dict[tuple[int, ...], list[int]] = {}  # dense codes -> [count, total ns]
    order = np.arange(len(rows))
    for _key, where in group_rows(lane_key(ev.rank[rows], ev.stream[rows]), order).items():
        lane = where[np.argsort(ev.ts[rows[where]], kind="stable")]
        names, dur = dense[lane].astype(np.int64), ev.dur[rows[lane]]
        for n in range(2, MAX_LEN + 1):
            m = len(lane) - n + 1
            if m < 2:
                break
            keys = sum(names[i:m + i] * base ** (n - 1 - i) for i in range(n))
            ns = sum(dur[i:m + i] for i in range(n))
            uniq, inverse, counts = np.unique(keys, return_inverse=True, return_counts=True)
            totals = np.bincount(inverse, weights=ns, minlength=len(uniq))
            for key, c, t in zip(uniq[counts >= 2].tolist(), counts[counts >= 2].tolist(),
                                 totals[counts >= 2].tolist(), strict=True):
                gram = tuple(key // base ** (n - 1 - i) % base for i in range(n))
                entry = found.setdefault(gram, [0, 0])
                entry[0] += c
                entry[1] += int(t)
    return {tuple(ev.names[int(kernel_names[g])] for g in gram):
            (c, t, bool(all(fusable[g] for g in gram))) for gram, (c, t) in found.items()}


def merge(parts: list[Counts]) -> Counts:
    out: Counts = {}
    for part in parts:
        for gram, (c, t, f) in part.items():
            c0, t0, _ = out.get(gram, (0, 0, f))
            out[gram] = (c0 + c, t0 + t, f)
    return out


def top_sequences(found: Counts, top: int = TOP) -> tuple[Sequence_, ...]:
    """The sequences that took most time, without those a longer one as frequent contains."""
    ranked = sorted(found.items(), key=lambda kv: (-kv[1][1], -len(kv[0]), kv[0]))
    kept: list[Sequence_] = []
    for gram, (count, total, fusable) in ranked:
        if len(kept) >= top:
            break
        if any(len(g) == len(gram) + 1 and c == count and _contains(g, gram)
               for g, (c, _, _) in found.items()):
            continue
        kept.append(Sequence_(gram, count, total, fusable))
    return tuple(kept)


def kernel_sequences(ev: Events, top: int = TOP) -> tuple[Sequence_, ...]:
    return top_sequences(sequence_counts(ev), top)
