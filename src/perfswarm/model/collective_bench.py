"""Measure collectives with real torch.distributed across local processes, and fit alpha-beta links.

`sweep()` spawns `world_size` processes (gloo on CPU, NCCL when every rank has its own GPU), times
each (op, size) after warm-up at least `iters` times and until 50 ms of timed work, and keeps, per
size, the fastest sample's per-call time on its slowest rank: a collective ends when its last rank
does, and on a shared machine other load only ever adds time, so the minimum is the reproducible
figure. `fit()` turns a sweep into one fitted Link per op (per size regime) by non-negative least
squares on relative error through the op's model coefficients, so it plugs into
perfswarm.model.collectives.
"""

from __future__ import annotations

import importlib
import math
import tempfile
import time
from collections.abc import Callable, Sequence
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
MIN_BUSY_S = 0.05  # keep repeating a size until this much timed work ...
MAX_ITERS = 200    # ... or this many iterations
BATCH_S = 2e-3     # one timed sample of a small message: this long ...
MAX_REPS = 32      # ... or this many back-to-back calls


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
    # Sizes outside, ops inside: a burst of load from elsewhere then spreads over every op
    # instead of spoiling one op's whole curve.
    for nbytes in sizes:
        for op in ops:
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
            times: list[float] = []   # per call
            i, reps, busy = 0, 1, 0.0
            # Small messages are cheap: time `reps` back to back (nccl-tests style, so barrier
            # skew is spread over them) and repeat until MIN_BUSY_S of timed work. Every rank
            # takes the same decisions, since all see the same reduced times.
            while i < warmup + iters or (busy < MIN_BUSY_S and i < MAX_ITERS):
                i += 1
                dist.barrier()
                sync()
                t0 = time.perf_counter()
                for _ in range(reps):
                    step()
                sync()
                elapsed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
                dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
                per_op = float(elapsed.item()) / reps
                if i == warmup:
                    reps = max(1, min(MAX_REPS, int(BATCH_S / per_op)))
                if i > warmup:
                    times.append(per_op)
                    busy += per_op * reps
            results.append({"op": op, "nbytes": n * ELEMENT_BYTES, "seconds": min(times)})
    if rank == 0:
        results.sort(key=lambda r: (ops.index(r["op"]), r["nbytes"]))
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


def predict(link: Link, op: Op, nbytes: float, world_size: int,
            config: CollectiveConfig = RING) -> float:
    a, b = coefficients(op, world_size, config)
    return a * link.alpha_s + b * nbytes * link.beta_s_per_byte


@dataclass(frozen=True)
class FittedOp:
    """An op's fitted model: one alpha-beta Link per size regime.

    Real collectives change regime with size: NCCL switches protocol (LL, LL128, Simple) and a
    CPU backend falls out of cache, so one alpha-beta pair bends at a knee; `fit_op` finds it.
    """

    op: Op
    world_size: int
    regimes: tuple[tuple[float, Link], ...]   # (largest nbytes of the regime, its link)
    config: CollectiveConfig = RING

    def link_for(self, nbytes: float) -> Link:
        return next(link for bound, link in self.regimes if nbytes <= bound)

    def time(self, nbytes: float) -> float:
        return predict(self.link_for(nbytes), self.op, nbytes, self.world_size, self.config)

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "world_size": self.world_size,
                "regimes": [{"up_to_bytes": None if math.isinf(bound) else int(bound),
                             **link.to_dict()} for bound, link in self.regimes]}


MIN_REGIME = 4      # sizes per regime
SPLIT_GAIN = 0.5    # a knee must halve the squared log error to be believed


def _log_error(link: Link, ms: Sequence[Measurement], world_size: int,
               config: CollectiveConfig) -> float:
    return sum(math.log(max(predict(link, m.op, m.nbytes, world_size, config), 1e-12)
                        / m.seconds) ** 2 for m in ms)


def fit_op(measurements: Sequence[Measurement], world_size: int,
           config: CollectiveConfig = RING, name: str = "fitted") -> FittedOp:
    """One alpha-beta regime, or two split at the knee that best explains the sizes."""
    ms = sorted(measurements, key=lambda m: m.nbytes)
    whole = fit_link(tuple(ms), world_size, config, name)
    regimes: tuple[tuple[float, Link], ...] = ((math.inf, whole),)
    # (minus a hair: a split of an exact line must not win on rounding)
    best = _log_error(whole, ms, world_size, config) * SPLIT_GAIN - 1e-12
    for k in range(MIN_REGIME, len(ms) - MIN_REGIME + 1):
        low = fit_link(tuple(ms[:k]), world_size, config, name)
        high = fit_link(tuple(ms[k:]), world_size, config, name)
        error = (_log_error(low, ms[:k], world_size, config)
                 + _log_error(high, ms[k:], world_size, config))
        if error < best:
            best, regimes = error, ((float(ms[k - 1].nbytes), low), (math.inf, high))
    return FittedOp(ms[0].op, world_size, regimes, config)


def fit(result: Sweep, config: CollectiveConfig = RING) -> dict[Op, FittedOp]:
    """The fitted model of every op the sweep measured at two sizes or more."""
    return {op: fit_op(result.of(op), result.world_size, config, result.backend)
            for op in OPS if len(result.of(op)) >= 2}


def gmae(predicted: list[float], measured: list[float]) -> float:
    """Geometric-mean absolute error: exp(mean |ln(pred/meas)|) - 1 (0.15 = typically 15% off)."""
    if not predicted or len(predicted) != len(measured):
        raise PerfswarmError("gmae: needs equally many, at least one, predictions and measurements")
    if min(predicted) <= 0 or min(measured) <= 0:
        raise PerfswarmError("gmae: times must be positive")
    logs = [abs(math.log(p / m)) for p, m in zip(predicted, measured, strict=True)]
    return math.expm1(sum(logs) / len(logs))


def evaluate(models: dict[Op, FittedOp], result: Sweep) -> dict[Op, float]:
    """GMAE per op of the fitted models against another sweep's measurements."""
    return {op: gmae([model.time(m.nbytes) for m in result.of(op)],
                     [m.seconds for m in result.of(op)])
            for op, model in models.items() if result.of(op)}


def calibration(result: Sweep) -> dict[str, Any]:
    """JSON-ready calibration from one sweep: the measurements, each op's fitted regimes, and
    each fit's in-sample GMAE (what `calibrate --collectives` reports and stores)."""
    models = fit(result)
    return {"sweep": result.to_dict(),
            "models": {op: model.to_dict() for op, model in models.items()},
            "gmae_in_sample": evaluate(models, result)}
