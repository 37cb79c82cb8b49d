"""Embedding-table sharding: three placement plans over a cost model (model/embedding.py).

A device's time is the sum over its tables; a plan's time is its slowest device, and its
imbalance is slowest / mean. Plans: size-greedy (largest table to the device with the fewest
bytes), lookup-greedy (most lookups to the device with the fewest), and predicted-time-balanced
(longest predicted table to the least-loaded device, then single-table moves off the slowest
device while they lower the maximum). The tables come from a YAML file (`load_workload`);
`measure_plan()` times a plan on this machine (recorder/bench/embedding.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from perfswarm.errors import ParameterError, PerfswarmError
from perfswarm.model.embedding import EmbeddingCost, Table, hit_fraction, lookups
from perfswarm.userfiles import read_yaml

Strategy = Literal["size_greedy", "lookup_greedy", "time_balanced"]
STRATEGIES: tuple[Strategy, ...] = ("size_greedy", "lookup_greedy", "time_balanced")
DEFAULT_COST: Final = EmbeddingCost()  # the constants measured on the machine it names

@dataclass(frozen=True)
class Workload:
    tables: tuple[Table, ...]
    batch: int


LIMITS: Final = {"rows": 2**48, "dim": 2**24, "pooling": 2**31, "dtype_bytes": 64}


def _table(path: Path, i: int, spec: object) -> Table:
    where = f"{path}: tables[{i}]"
    if not isinstance(spec, dict):
        raise PerfswarmError(f"{where}: expected a mapping")
    dist = str(spec.get("distribution", "uniform"))
    try:
        zipf = 0.0 if dist == "uniform" else float(dist.removeprefix("zipf:"))
        table = Table(str(spec.get("name", f"table{i}")), int(spec["rows"]), int(spec["dim"]),
                      float(spec.get("pooling", 1)), zipf, int(spec.get("dtype_bytes", 4)))
    except KeyError as exc:
        raise PerfswarmError(f"{where}: missing {exc}") from None
    except (TypeError, ValueError, OverflowError):
        raise PerfswarmError(f"{where}: rows, dim, pooling, dtype_bytes must be numbers and "
                             f"distribution 'uniform' or 'zipf:S', got {spec}") from None
    where = f"{where} ({table.name})"
    if not (math.isfinite(table.pooling) and math.isfinite(zipf)):
        raise PerfswarmError(f"{where}: pooling and distribution must be finite")
    if min(table.rows, table.dim, table.dtype_bytes) < 1 or table.pooling <= 0 or zipf < 0:
        raise PerfswarmError(f"{where}: rows, dim, pooling, dtype_bytes must be positive")
    for key, top in LIMITS.items():
        if getattr(table, key) > top:
            raise PerfswarmError(f"{where}: {key} must be at most {top:,}")
    return table


def load_workload(path: Path, batch: int | None = None) -> Workload:
    """TABLES.yaml: `batch_size` and `tables` (name, rows, dim, pooling, distribution)."""
    data = read_yaml(path)
    if not isinstance(data, dict) or not isinstance(data.get("tables"), list) \
            or not data["tables"]:
        raise PerfswarmError(f"{path}: expected a mapping with a non-empty 'tables' list")
    tables = tuple(_table(path, i, t) for i, t in enumerate(data["tables"]))
    if len({t.name for t in tables}) != len(tables):
        raise PerfswarmError(f"{path}: table names must be unique")
    size = batch if batch is not None else data.get("batch_size", 512)
    if not isinstance(size, int) or not 0 < size < 2**31:
        raise PerfswarmError(f"{path}: batch_size must be an integer from 1 to {2**31 - 1:,}, "
                             f"got {size!r}")
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
            raise ParameterError(None, f"{sizes[i]:,} bytes fit on no device "
                                 f"({{memory_gb}} {capacity / 1e9:g})", subject=f"table {i}")
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
        raise ParameterError("devices", f"must be at least 1, got {devices}")
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


def shard(work: Workload, devices: int, cost: EmbeddingCost = DEFAULT_COST,
          memory_bytes: float = math.inf) -> ShardResult:
    return ShardResult(work, devices, cost,
                       tuple(plan(work, devices, s, cost, memory_bytes) for s in STRATEGIES))


def measure_plan(work: Workload, p: Plan, iters: int = 10) -> tuple[float, ...]:
    """Measured seconds per iteration of each device's tables (see time_devices)."""
    from perfswarm.recorder.bench.embedding import time_devices

    return time_devices([tuple(t for t, k in zip(work.tables, p.device_of, strict=True) if k == d)
                         for d in range(len(p.device_s))], work.batch, iters)
