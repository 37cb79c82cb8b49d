"""The cost of embedding-table lookups: one table's pooled lookup per iteration (forward, one
device)
    t = overhead + B * per_bag + L * (per_lookup + row_bytes * (per_byte + m ** (1 - e) * miss))
with B = batch bags, L = batch * pooling lookups and m the share of lookups that miss the cache,
which holds the `cache_bytes / row_bytes` hottest rows under the table's access distribution
(uniform, or Zipf with exponent s); e > 0 makes sparse misses dearer each (see fit_cost).
`fit_cost` fits the constants to timings (recorder/bench/embedding.py takes them on this machine).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Final

import numpy as np

from perfswarm.errors import PerfswarmError
from perfswarm.model.nnls import nnls


@dataclass(frozen=True)
class Table:
    name: str
    rows: int
    dim: int
    pooling: float            # lookups per sample
    zipf: float = 0.0         # access-distribution exponent; 0 = uniform
    dtype_bytes: int = 4

    @property
    def row_bytes(self) -> int:
        return self.dim * self.dtype_bytes

    @property
    def nbytes(self) -> int:
        return self.rows * self.row_bytes


def _harmonic(n: int, s: float) -> float:
    """Generalized harmonic number H(n, s): exact to 10 000 terms, Euler-Maclaurin beyond."""
    head = min(n, 10_000)
    total = float(np.sum(np.arange(1, head + 1, dtype=np.float64) ** -s))
    if n > head:
        a, b = head + 0.5, n + 0.5
        total += math.log(b / a) if s == 1 else (b ** (1 - s) - a ** (1 - s)) / (1 - s)
    return total


def hit_fraction(table: Table, cache_bytes: float) -> float:
    """Share of lookups that go to the rows the cache can hold (the hottest ones)."""
    cached = min(table.rows, int(cache_bytes // table.row_bytes))
    if cached >= table.rows:
        return 1.0
    if table.zipf == 0:
        return cached / table.rows
    return _harmonic(cached, table.zipf) / _harmonic(table.rows, table.zipf)


def lookups(table: Table, batch: int) -> int:
    """Ids looked up in one iteration: `pooling` a bag, at least one in all."""
    return max(1, round(batch * table.pooling))


# EmbeddingCost's fitted constants, in the order of its features
COEFFICIENTS: Final = ("overhead_s", "per_bag_s", "per_lookup_s", "per_byte_s", "miss_s_per_byte")


@dataclass(frozen=True)
class EmbeddingCost:
    # Defaults: calibrate() (the probe tables, batches 64 and 512) on a 2-core Intel Xeon VM
    # (2 MB L2 a core), torch 2.13 CPU, float32 sum-pooled bags, one thread.
    overhead_s: float = 7.9e-6
    per_bag_s: float = 3.3e-9
    per_lookup_s: float = 0.97e-9
    per_byte_s: float = 0.0064e-9
    miss_s_per_byte: float = 0.136e-9
    miss_exponent: float = 0.5
    cache_bytes: float = 8 << 20

    def features(self, table: Table, batch: int) -> tuple[float, float, float, float, float]:
        n = lookups(table, batch)
        moved = n * table.row_bytes
        miss = 1 - hit_fraction(table, self.cache_bytes)
        return 1.0, float(batch), float(n), float(moved), moved * miss ** (1 - self.miss_exponent)

    def table_time(self, table: Table, batch: int) -> float:
        coef = [getattr(self, name) for name in COEFFICIENTS]
        return float(np.dot(coef, self.features(table, batch)))

    def to_dict(self) -> dict[str, float]:
        return {"overhead_us": self.overhead_s * 1e6, "per_bag_ns": self.per_bag_s * 1e9,
                "per_lookup_ns": self.per_lookup_s * 1e9, "ns_per_byte": self.per_byte_s * 1e9,
                "miss_ns_per_byte": self.miss_s_per_byte * 1e9,
                "miss_exponent": self.miss_exponent, "cache_bytes": self.cache_bytes}


CACHE_CANDIDATES: Final = tuple(float(1 << k) for k in range(14, 29))   # 16 kB..256 MB
MISS_EXPONENTS: Final = (0.0, 0.25, 0.5, 0.75)


def fit_cost(samples: Sequence[tuple[Table, int, float]]) -> EmbeddingCost:
    """Constants minimizing the squared relative error (non-negative) over (table, batch,
    seconds) samples, at the cache size (a power of two) and miss exponent that fit best.

    The miss exponent: a lookup that misses costs a memory latency, of which the core overlaps
    more the more misses there are in flight; sparse misses (a skewed table's tail) overlap
    less and cost more each, so missed bytes count as miss_rate ** (1 - exponent).
    """
    if len({(t.rows, t.dim, t.pooling, t.zipf, b) for t, b, _ in samples}) < 6:
        raise PerfswarmError("shard calibration: needs at least 6 distinct tables or batches")
    measured = np.array([s for _, _, s in samples])
    best: tuple[float, EmbeddingCost] | None = None
    for cache, exponent in itertools.product(CACHE_CANDIDATES, MISS_EXPONENTS):
        probe = EmbeddingCost(cache_bytes=cache, miss_exponent=exponent)
        design = np.array([probe.features(t, b) for t, b, _ in samples])
        coef, _ = nnls(design / measured[:, None], np.ones(len(samples)))
        error = float(np.sum(np.log(np.maximum(design @ coef, 1e-300) / measured) ** 2))
        if best is None or error < best[0]:
            best = (error, replace(probe, **{name: float(c) for name, c in
                                             zip(COEFFICIENTS, coef, strict=True)}))
    assert best is not None
    return best[1]
