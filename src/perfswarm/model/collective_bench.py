"""Measure collectives with real torch.distributed across local processes, and fit alpha-beta links.

`sweep()` spawns `world_size` processes (gloo on CPU, NCCL when every rank has its own GPU), times
each (op, size) a few times after warm-up, and keeps, per size, the fastest iteration's time of
its slowest rank: a collective ends when its last rank does, and on a shared machine other load only
ever adds time, so the minimum is the reproducible figure. `fit()` turns a sweep into one
fitted Link per op by non-negative least squares on relative error through the op's model
coefficients, so the fitted model plugs into perfswarm.model.collectives unchanged.
"""

from __future__ import annotations

import importlib
import math
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal

import numpy as np
from scipy.optimize import nnls

from perfswarm.errors import PerfswarmError
from perfswarm.model.collectives import OPS, RING, CollectiveConfig, Op, bus_factor, coefficients
from perfswarm.model.topology import Link

Backend = Literal["auto", "gloo", "nccl"]
SWEEP_OPS: tuple[Op, ...] = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                             "broadcast")
ELEMENT_BYTES = 4  # float32


def default_sizes(low: int = 1 << 10, high: int = 64 << 20) -> tuple[int, ...]:
    """Powers of two from `low` to `high` bytes (1 KB..64 MB)."""
    if low < ELEMENT_BYTES or high < low:
        raise PerfswarmError(f"sizes: need {ELEMENT_BYTES} <= low <= high, got {low}..{high}")
    return tuple(1 << k for k in range(low.bit_length() - 1, high.bit_length()))


@dataclass(frozen=True)
class Measurement:
    op: Op
    nbytes: int
    seconds: float

    def busbw_gbps(self, world_size: int) -> float:
        """nccl-tests bus bandwidth: comparable to the link's bandwidth whatever the op."""
        return self.nbytes / self.seconds * bus_factor(self.op, world_size) / 1e9


@dataclass(frozen=True)
class Sweep:
    backend: str
    world_size: int
    iters: int
    measurements: tuple[Measurement, ...]

    def of(self, op: Op) -> tuple[Measurement, ...]:
        return tuple(m for m in self.measurements if m.op == op)

    def to_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "world_size": self.world_size, "iters": self.iters,
                "measurements": [{"op": m.op, "nbytes": m.nbytes, "seconds": m.seconds,
                                  "busbw_gbps": m.busbw_gbps(self.world_size)}
                                 for m in self.measurements]}


def _resolve_backend(backend: Backend, world_size: int) -> str:
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if backend == "nccl" and gpus < world_size:
        raise PerfswarmError(f"--backend nccl: needs {world_size} GPUs, found {gpus}")
    if backend == "auto":
        return "nccl" if gpus >= world_size else "gloo"
    return backend


def _worker(rank: int, world_size: int, backend: str, init: str, ops: tuple[Op, ...],
            sizes: tuple[int, ...], iters: int, warmup: int, out: str) -> None:
    import orjson
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=init, rank=rank, world_size=world_size)
    all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

    def sync() -> None:
        if backend == "nccl":
            torch.cuda.synchronize(device)

    results: list[dict[str, Any]] = []
    for op in ops:
        for nbytes in sizes:
            n = max(world_size, nbytes // ELEMENT_BYTES) // world_size * world_size
            full = torch.ones(n, device=device)
            part = torch.ones(n // world_size, device=device)
            spare = torch.empty(n, device=device)
            calls: dict[str, Callable[[], object]] = {
                "all_reduce": partial(dist.all_reduce, full),
                "all_gather": partial(all_gather, full, part),
                "reduce_scatter": partial(reduce_scatter, part, full),
                "all_to_all": partial(dist.all_to_all_single, spare, full),
                "broadcast": partial(dist.broadcast, full, 0)}
            step = calls[op]
            times = []
            for i in range(warmup + iters):
                dist.barrier()
                sync()
                t0 = time.perf_counter()
                step()
                sync()
                elapsed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
                dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
                if i >= warmup:
                    times.append(float(elapsed.item()))
            results.append({"op": op, "nbytes": n * ELEMENT_BYTES,
                            "seconds": min(times)})
    if rank == 0:
        Path(out).write_bytes(orjson.dumps(results))
    dist.destroy_process_group()


def sweep(ops: tuple[Op, ...] = SWEEP_OPS, sizes: tuple[int, ...] | None = None,
          world_size: int = 2, backend: Backend = "auto", iters: int = 5,
          warmup: int = 2) -> Sweep:
    """Time each op at each size among `world_size` local processes; see the module docstring."""
    try:
        mp = importlib.import_module("torch.multiprocessing")
    except ImportError:
        raise PerfswarmError("collective sweep: needs torch (pip install 'perfswarm[torch]')") \
            from None
    for op in ops:
        if op not in SWEEP_OPS:
            raise PerfswarmError(f"collective sweep: cannot measure {op!r}; "
                                 f"choose from {', '.join(SWEEP_OPS)}")
    if world_size < 2 or iters < 1 or warmup < 0:
        raise PerfswarmError("collective sweep: needs world_size >= 2, iters >= 1, warmup >= 0")
    sizes = sizes or default_sizes()
    chosen = _resolve_backend(backend, world_size)
    with tempfile.TemporaryDirectory(prefix="perfswarm-sweep-") as tmp:
        out = Path(tmp) / "result.json"
        init = f"file://{Path(tmp) / 'rendezvous'}"
        try:
            mp.spawn(_worker, args=(world_size, chosen, init, tuple(ops), tuple(sizes), iters,
                                    warmup, str(out)), nprocs=world_size, join=True)
        except Exception as exc:  # a rank died: report it as one line, not a child's traceback
            raise PerfswarmError(f"collective sweep ({chosen}): a rank failed: "
                                 f"{str(exc).strip().splitlines()[-1]}") from None
        import orjson

        rows = orjson.loads(out.read_bytes())
    return Sweep(chosen, world_size, iters,
                 tuple(Measurement(r["op"], int(r["nbytes"]), float(r["seconds"])) for r in rows))


def fit_link(measurements: tuple[Measurement, ...], world_size: int,
             config: CollectiveConfig = RING, name: str = "fitted") -> Link:
    """Alpha and beta minimizing the squared relative error of t = a*alpha + b*n*beta."""
    if len(measurements) < 2:
        raise PerfswarmError("fit: needs at least two sizes of one op")
    op = measurements[0].op
    a, b = coefficients(op, world_size, config)
    t = np.array([m.seconds for m in measurements])
    n = np.array([float(m.nbytes) for m in measurements])
    design = np.column_stack([np.full_like(t, a) / t, b * n / t])
    (alpha, beta), _ = nnls(design, np.ones_like(t))
    return Link(f"{name}:{op}", float(alpha), float(beta), "switch",
                f"fitted to {len(measurements)} measurements of {op} among {world_size} ranks")


def fit(result: Sweep, config: CollectiveConfig = RING) -> dict[Op, Link]:
    """One fitted Link per measured op."""
    return {op: fit_link(result.of(op), result.world_size, config, result.backend)
            for op in OPS if len(result.of(op)) >= 2}


def predict(link: Link, op: Op, nbytes: float, world_size: int,
            config: CollectiveConfig = RING) -> float:
    a, b = coefficients(op, world_size, config)
    return a * link.alpha_s + b * nbytes * link.beta_s_per_byte


def gmae(predicted: list[float], measured: list[float]) -> float:
    """Geometric-mean absolute error: exp(mean |ln(pred/meas)|) - 1 (0.15 = typically 15% off)."""
    if not predicted or len(predicted) != len(measured):
        raise PerfswarmError("gmae: needs equally many, at least one, predictions and measurements")
    if min(predicted) <= 0 or min(measured) <= 0:
        raise PerfswarmError("gmae: times must be positive")
    logs = [abs(math.log(p / m)) for p, m in zip(predicted, measured, strict=True)]
    return math.expm1(sum(logs) / len(logs))


def evaluate(links: dict[Op, Link], result: Sweep,
             config: CollectiveConfig = RING) -> dict[Op, float]:
    """GMAE per op of the links' predictions against another sweep's measurements."""
    return {op: gmae([predict(link, op, m.nbytes, result.world_size, config)
                      for m in result.of(op)], [m.seconds for m in result.of(op)])
            for op, link in links.items() if result.of(op)}
