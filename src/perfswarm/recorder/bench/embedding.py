"""Embedding-bag timings on this machine: torch.nn.EmbeddingBag forwards over tables, the
probe set the cost model (model/embedding.py) is calibrated on, and a plan's devices timed one
local process each."""

from __future__ import annotations

import importlib
import itertools
import math
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import numpy as np
import orjson

from perfswarm.errors import PerfswarmError
from perfswarm.model.embedding import EmbeddingCost, Table, fit_cost, lookups


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
    saved = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread, as the cost model's defaults were measured
    try:
        return _fastest(torch, dtypes, tables, batch, iters, seed)
    finally:
        torch.set_num_threads(saved)  # the caller's setting, as it was


def _fastest(torch: Any, dtypes: dict[int, Any], tables: Sequence[Table], batch: int,
             iters: int, seed: int) -> float:
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


def probe_tables() -> tuple[Table, ...]:
    return tuple(Table(f"probe{i}", rows, dim, pooling, zipf)
                 for i, ((rows, dim), pooling, zipf) in enumerate(
                     itertools.product(PROBE_SHAPES, PROBE_POOLING, (0.0, 1.1))))


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


def time_devices(devices: Sequence[tuple[Table, ...]], batch: int, iters: int = 10
                 ) -> tuple[float, ...]:
    """Measured seconds per iteration of each device's tables: one local process per device,
    holding only its tables, run one after another (concurrent processes would measure how
    they share this machine's cores and memory, which separate devices do not)."""
    mp = importlib.import_module("torch.multiprocessing")
    seconds = []
    with tempfile.TemporaryDirectory(prefix="perfswarm-shard-") as tmp:
        for d, mine in enumerate(devices):
            out = Path(tmp, f"{d}.json")
            mp.spawn(_device_worker, args=(mine, batch, iters, d, str(out)), nprocs=1,
                     join=True)
            seconds.append(float(orjson.loads(out.read_bytes())))
    return tuple(seconds)
