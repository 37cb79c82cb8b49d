"""Embedding-table sharding: a per-table cost model and three placement plans.

Cost of one table's pooled lookup per iteration (forward, one device):
    t = overhead + B * per_bag + L * (per_lookup + row_bytes * (per_byte + m ** (1 - e) * miss))
with B = batch bags, L = batch * pooling lookups and m the share of lookups that miss the cache,
which holds the `cache_bytes / row_bytes` hottest rows under the table's access distribution
(uniform, or Zipf with exponent s); e > 0 makes sparse misses dearer each (see fit_cost). A
device's time is the sum over its tables; a plan's time is its slowest device, and its
imbalance is slowest / mean.

Plans: size-greedy (largest table to the device with the fewest bytes), lookup-greedy (most
lookups to the device with the fewest), and predicted-time-balanced (longest predicted table to
the least-loaded device, then single-table moves off the slowest device while they lower the
maximum). `calibrate()` fits the constants, cache size included, to torch.nn.EmbeddingBag timings
of a probe set of tables on this machine; `measure_plan()` times a plan with one local process
per device.
"""

from __future__ import annotations

import importlib
import itertools
import math
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final, Literal

import numpy as np
import orjson
from scipy.optimize import nnls

from perfswarm.errors import PerfswarmError
from perfswarm.userfiles import read_yaml

Strategy = Literal["size_greedy", "lookup_greedy", "time_balanced"]
STRATEGIES: tuple[Strategy, ...] = ("size_greedy", "lookup_greedy", "time_balanced")


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


@dataclass(frozen=True)
class Workload:
    tables: tuple[Table, ...]
    batch: int


def _table(i: int, spec: object) -> Table:
    if not isinstance(spec, dict):
        raise PerfswarmError(f"tables[{i}]: expected a mapping")
    dist = str(spec.get("distribution", "uniform"))
    try:
        zipf = 0.0 if dist == "uniform" else float(dist.removeprefix("zipf:"))
        table = Table(str(spec.get("name", f"table{i}")), int(spec["rows"]), int(spec["dim"]),
                      float(spec.get("pooling", 1)), zipf, int(spec.get("dtype_bytes", 4)))
    except KeyError as exc:
        raise PerfswarmError(f"tables[{i}]: missing {exc}") from None
    except (TypeError, ValueError, OverflowError):
        raise PerfswarmError(f"tables[{i}]: rows, dim, pooling, dtype_bytes must be numbers and "
                             f"distribution 'uniform' or 'zipf:S', got {spec}") from None
    if not (math.isfinite(table.pooling) and math.isfinite(zipf)):
        raise PerfswarmError(f"tables[{i}] ({table.name}): pooling and distribution must be "
                             "finite")
    if min(table.rows, table.dim, table.dtype_bytes) < 1 or table.pooling <= 0 or zipf < 0:
        raise PerfswarmError(f"tables[{i}] ({table.name}): rows, dim, pooling, dtype_bytes "
                             "must be positive")
    return table


def load_workload(path: Path, batch: int | None = None) -> Workload:
    """TABLES.yaml: `batch_size` and `tables` (name, rows, dim, pooling, distribution)."""
    data = read_yaml(path)
    if not isinstance(data, dict) or not isinstance(data.get("tables"), list) \
            or not data["tables"]:
        raise PerfswarmError(f"{path}: expected a mapping with a non-empty 'tables' list")
    tables = tuple(_table(i, t) for i, t in enumerate(data["tables"]))
    if len({t.name for t in tables}) != len(tables):
        raise PerfswarmError(f"{path}: table names must be unique")
    size = batch if batch is not None else data.get("batch_size", 512)
    if not isinstance(size, int) or size < 1:
        raise PerfswarmError(f"{path}: batch_size must be a positive integer, got {size!r}")
    return Workload(tables, size)


@dataclass(frozen=True)
class Plan:
    strategy: Strategy
    device_of: tuple[int, ...]        # per table, in workload order
    device_s: tuple[float, ...]       # predicted time per device

    @property
    def max_s(self) -> float:
        return max(self.device_s)

    @property
    def imbalance(self) -> float:
        mean = sum(self.device_s) / len(self.device_s)
        return self.max_s / mean if mean > 0 else 1.0

    def to_dict(self, work: Workload) -> dict[str, Any]:
        devices = []
        for d, t in enumerate(self.device_s):
            mine = [tb for tb, dev in zip(work.tables, self.device_of, strict=True) if dev == d]
            devices.append({"device": d, "tables": [tb.name for tb in mine],
                            "bytes": sum(tb.nbytes for tb in mine),
                            "lookups": sum(lookups(tb, work.batch) for tb in mine),
                            "predicted_ms": t * 1e3})
        return {"strategy": self.strategy, "devices": devices, "max_ms": self.max_s * 1e3,
                "imbalance": self.imbalance}


def _greedy(weights: Sequence[float], load: Sequence[float], devices: int,
            capacity: float, sizes: Sequence[int]) -> list[int]:
    """Heaviest first onto the device with the least `load` so far that still has room."""
    totals, used = [0.0] * devices, [0] * devices
    device_of = [0] * len(weights)
    for i in sorted(range(len(weights)), key=lambda i: (-weights[i], i)):
        fits = [d for d in range(devices) if used[d] + sizes[i] <= capacity]
        if not fits:
            raise PerfswarmError(f"table {i}: {sizes[i]:,} bytes fit on no device "
                                 f"(--memory-gb {capacity / 1e9:g})")
        d = min(fits, key=lambda d: (totals[d], d))
        device_of[i] = d
        totals[d] += load[i]
        used[d] += sizes[i]
    return device_of


def _refine(device_of: list[int], times: Sequence[float], devices: int, capacity: float,
            sizes: Sequence[int]) -> list[int]:
    """Move single tables off the slowest device while that lowers the maximum."""
    def loads() -> list[float]:
        out = [0.0] * devices
        for i, d in enumerate(device_of):
            out[d] += times[i]
        return out

    while True:
        load = loads()
        worst = max(range(devices), key=lambda d: (load[d], -d))
        used = [sum(s for s, d in zip(sizes, device_of, strict=True) if d == k)
                for k in range(devices)]
        best: tuple[float, int, int] | None = None
        for i in (i for i, d in enumerate(device_of) if d == worst):
            for d in range(devices):
                if d == worst or used[d] + sizes[i] > capacity:
                    continue
                peak = max(load[worst] - times[i], load[d] + times[i],
                           *(load[k] for k in range(devices) if k not in (worst, d)))
                if peak < load[worst] - 1e-15 and (best is None or peak < best[0]):
                    best = (peak, i, d)
        if best is None:
            return device_of
        device_of[best[1]] = best[2]


def plan(work: Workload, devices: int, strategy: Strategy, cost: EmbeddingCost,
         memory_bytes: float = math.inf) -> Plan:
    if devices < 1:
        raise PerfswarmError(f"--devices: must be at least 1, got {devices}")
    times = [cost.table_time(t, work.batch) for t in work.tables]
    sizes = [t.nbytes for t in work.tables]
    weight: dict[Strategy, Callable[[Table, float], float]] = {
        "size_greedy": lambda t, _: float(t.nbytes),
        "lookup_greedy": lambda t, _: float(lookups(t, work.batch)),
        "time_balanced": lambda _, s: s}
    w = [weight[strategy](t, s) for t, s in zip(work.tables, times, strict=True)]
    device_of = _greedy(w, w, devices, memory_bytes, sizes)
    if strategy == "time_balanced":
        device_of = _refine(device_of, times, devices, memory_bytes, sizes)
    device_s = [0.0] * devices
    for i, d in enumerate(device_of):
        device_s[d] += times[i]
    return Plan(strategy, tuple(device_of), tuple(device_s))


@dataclass(frozen=True)
class ShardResult:
    work: Workload
    devices: int
    cost: EmbeddingCost
    plans: tuple[Plan, ...]

    @property
    def best(self) -> Plan:
        return min(self.plans, key=lambda p: (p.max_s, STRATEGIES.index(p.strategy)))

    def to_dict(self) -> dict[str, Any]:
        return {"devices": self.devices, "batch_size": self.work.batch,
                "tables": [{"name": t.name, "rows": t.rows, "dim": t.dim, "pooling": t.pooling,
                            "zipf": t.zipf, "bytes": t.nbytes,
                            "predicted_ms": self.cost.table_time(t, self.work.batch) * 1e3,
                            "hit_fraction": hit_fraction(t, self.cost.cache_bytes)}
                           for t in self.work.tables],
                "cost_model": self.cost.to_dict(),
                "plans": [p.to_dict(self.work) for p in self.plans],
                "best": self.best.strategy}


def shard(work: Workload, devices: int, cost: EmbeddingCost = EmbeddingCost(),
          memory_bytes: float = math.inf) -> ShardResult:
    return ShardResult(work, devices, cost,
                       tuple(plan(work, devices, s, cost, memory_bytes) for s in STRATEGIES))


# --- measurement with torch.nn.EmbeddingBag -------------------------------------------------

def _indices(table: Table, lookups: int, rng: np.random.Generator) -> np.ndarray[Any, Any]:
    if table.zipf == 0:
        return rng.integers(0, table.rows, lookups)
    ranks = np.arange(1, table.rows + 1, dtype=np.float64) ** -table.zipf
    return rng.choice(table.rows, size=lookups, p=ranks / ranks.sum())


def time_tables(tables: Sequence[Table], batch: int, iters: int = 10, seed: int = 0) -> float:
    """Seconds per iteration of sum-pooled EmbeddingBag forwards over `tables`, in this process:
    the fastest of `iters` iterations after one warm-up, each on fresh indices (a training step
    looks up new ids; the same ids again would find their rows in cache)."""
    try:
        torch = importlib.import_module("torch")
    except ImportError:
        raise PerfswarmError("shard measurement: needs torch (pip install 'perfswarm[torch]')") \
            from None
    dtypes = {2: torch.float16, 4: torch.float32, 8: torch.float64}
    torch.set_num_threads(1)
    rng = np.random.default_rng(seed)
    bags, inputs = [], []
    for t in tables:
        if t.dtype_bytes not in dtypes:
            raise PerfswarmError(f"shard measurement: table {t.name}: dtype_bytes "
                                 f"{t.dtype_bytes} has no EmbeddingBag dtype (2, 4 or 8)")
        weight = torch.empty(t.rows, t.dim, dtype=dtypes[t.dtype_bytes])
        weight.uniform_(-0.1, 0.1)   # every page touched, as a trained table's are
        bags.append(torch.nn.EmbeddingBag.from_pretrained(weight, mode="sum"))
        n = lookups(t, batch)
        # empty bags where pooling < 1 (an optional feature)
        offsets = torch.from_numpy((np.arange(batch) * n) // batch)
        inputs.append([(torch.from_numpy(_indices(t, n, rng)), offsets)
                       for _ in range(iters + 1)])
    best = math.inf
    with torch.no_grad():
        for i in range(iters + 1):
            t0 = time.perf_counter()
            for bag, per_iter in zip(bags, inputs, strict=True):
                bag(*per_iter[i])
            if i:
                best = min(best, time.perf_counter() - t0)
    return best


# The calibration probe: tables from 64 kB (in L2) to 256 MB (in memory), one to 32 lookups a
# bag, uniform and Zipf access, two batch sizes (so call and bag costs are told apart).
PROBE_SHAPES: Final = ((1_000, 16), (2_000, 128), (16_000, 64), (40_000, 64), (200_000, 32),
                       (100_000, 128), (250_000, 128), (500_000, 128))
PROBE_POOLING: Final = (1.0, 8.0, 32.0)
PROBE_BATCHES: Final = (64, 512)
CACHE_CANDIDATES: Final = tuple(float(1 << k) for k in range(14, 29))   # 16 kB..256 MB
MISS_EXPONENTS: Final = (0.0, 0.25, 0.5, 0.75)


def probe_tables() -> tuple[Table, ...]:
    return tuple(Table(f"probe{i}", rows, dim, pooling, zipf)
                 for i, ((rows, dim), pooling, zipf) in enumerate(
                     itertools.product(PROBE_SHAPES, PROBE_POOLING, (0.0, 1.1))))


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


def calibrate(tables: Sequence[Table] | None = None, batches: Sequence[int] = PROBE_BATCHES,
              iters: int = 10) -> EmbeddingCost:
    """Fit the cost constants to EmbeddingBag timings on this machine: each table (the probe
    set unless given) timed alone at each batch size."""
    tables = probe_tables() if tables is None else tables
    return fit_cost([(t, b, time_tables([t], b, iters)) for t in tables for b in batches])


def _device_worker(_: int, tables: tuple[Table, ...], batch: int, iters: int, seed: int,
                   out: str) -> None:
    seconds = time_tables(tables, batch, iters, seed) if tables else 0.0
    Path(out).write_bytes(orjson.dumps(seconds))


def measure_plan(work: Workload, p: Plan, iters: int = 10) -> tuple[float, ...]:
    """Measured seconds per iteration of each device's tables: one local process per device,
    holding only its tables, run one after another (concurrent processes would measure how
    they share this machine's cores and memory, which separate devices do not)."""
    mp = importlib.import_module("torch.multiprocessing")
    devices = len(p.device_s)
    seconds = []
    with tempfile.TemporaryDirectory(prefix="perfswarm-shard-") as tmp:
        for d in range(devices):
            mine = tuple(t for t, k in zip(work.tables, p.device_of, strict=True) if k == d)
            out = Path(tmp, f"{d}.json")
            mp.spawn(_device_worker, args=(mine, work.batch, iters, d, str(out)), nprocs=1,
                     join=True)
            seconds.append(float(orjson.loads(out.read_bytes())))
    return tuple(seconds)
