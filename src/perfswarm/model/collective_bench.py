"""Measure collectives with real torch.distributed across local processes, and fit their models.

`sweep()` spawns `world_size` processes (gloo on CPU, NCCL when every rank has its own GPU) and
makes `passes` passes over the sizes, each in its own shuffled order; in a pass, each (op, size)
gets `iters` timed samples of back-to-back calls (as many as fill BATCH_S, at least two). A
sample's figure is its median call (the first call absorbs the ranks' skew out of the barrier
and is left out) on its slowest rank, and a point keeps its fastest sample over all passes: on a
shared machine other load only ever adds time, a preemption spoils a call but not a median, and a
burst of load that lasts seconds spoils a pass, not every sample of a point.

`fit()` turns a sweep into a FittedOp per op: the latency-bandwidth (alpha-beta) form of
perfswarm.model.collectives, whose bandwidth may change at up to two size knees, fitted by
non-negative least squares on relative error.
"""

from __future__ import annotations

import importlib
import itertools
import math
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, Literal

import numpy as np

from perfswarm.errors import PerfswarmError
from perfswarm.model.collectives import OPS, RING, CollectiveConfig, Op, bus_factor, coefficients
from perfswarm.model.topology import Link

Backend = Literal["auto", "gloo", "nccl"]
SWEEP_OPS: tuple[Op, ...] = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                             "broadcast")
ELEMENT_BYTES = 4  # float32
BATCH_S = 2e-3     # one timed sample of a small message: this long ...
MAX_REPS = 64      # ... or this many back-to-back calls
PASSES = 12        # over every size, in shuffled orders; a point keeps its fastest sample


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
            sizes: tuple[int, ...], iters: int, warmup: int, passes: int, out: str) -> None:
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

    def call_seconds(step: Callable[[], object], reps: int) -> list[float]:
        """Seconds of each of `reps` back-to-back calls but the first, which absorbs the skew
        with which the ranks left the barrier (on the GPU: between events on the stream)."""
        if backend == "nccl":
            marks = [torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
                     for _ in range(reps)]
            for mark in marks:
                step()
                mark.record()
            torch.cuda.synchronize(device)
            return [a.elapsed_time(b) * 1e-3 for a, b in itertools.pairwise(marks)]
        ends = []
        for _ in range(reps):
            step()
            ends.append(time.perf_counter())
        return [b - a for a, b in itertools.pairwise(ends)]

    def fastest(step: Callable[[], object], best: float) -> float:
        """Per-call seconds of `step`: over samples, the fastest median call of a sample, on
        the sample's slowest rank (a preemption spoils a call, not the sample's median), or
        `best` (of an earlier pass) if that was faster."""
        guess = best
        # A first sample of two calls tells how many make BATCH_S (small messages are cheap).
        # Every rank takes the same decisions, since all see the same reduced times.
        for i in range(warmup + iters + math.isinf(best)):
            reps = 2 if math.isinf(guess) else 1 + max(1, min(MAX_REPS, int(BATCH_S / guess)))
            dist.barrier()
            median = torch.tensor([statistics.median(call_seconds(step, reps))],
                                  dtype=torch.float64, device=device)   # (NCCL: no CPU)
            dist.all_reduce(median, op=dist.ReduceOp.MAX)
            guess = min(guess, float(median.item()))
            if i >= warmup:
                best = min(best, float(median.item()))
        return best

    best: dict[tuple[Op, int], float] = {}
    order = list(sizes)
    # Several passes over the sizes, each in its own shuffled order (the same on every rank):
    # on a shared machine a burst of other work lasts from milliseconds to seconds, and spread
    # over passes it spoils one pass of a few points instead of every sample of one point.
    for k in range(passes):
        random.Random(k).shuffle(order)
        for nbytes in order:
            n = max(world_size, nbytes // ELEMENT_BYTES) // world_size * world_size
            full = torch.zeros(n, device=device)   # (sums of zeros stay finite)
            part = torch.zeros(n // world_size, device=device)
            spare = torch.empty(n, device=device)
            calls: dict[str, Callable[[], object]] = {
                "all_reduce": partial(dist.all_reduce, full),
                "all_gather": partial(all_gather, full, part),
                "reduce_scatter": partial(reduce_scatter, part, full),
                "all_to_all": partial(dist.all_to_all_single, spare, full),
                "broadcast": partial(dist.broadcast, full, 0)}
            for op in ops:
                key = (op, n * ELEMENT_BYTES)
                best[key] = fastest(calls[op], best.get(key, math.inf))
    if rank == 0:
        rows = [{"op": op, "nbytes": nb, "seconds": t}
                for (op, nb), t in sorted(best.items(), key=lambda kv: (ops.index(kv[0][0]),
                                                                        kv[0][1]))]
        Path(out).write_bytes(orjson.dumps(rows))
    dist.destroy_process_group()


def sweep(ops: tuple[Op, ...] = SWEEP_OPS, sizes: tuple[int, ...] | None = None,
          world_size: int = 2, backend: Backend = "auto", iters: int = 2,
          warmup: int = 0, passes: int = PASSES) -> Sweep:
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
    if world_size < 2 or iters < 1 or warmup < 0 or passes < 1:
        raise PerfswarmError("collective sweep: needs world_size >= 2, iters >= 1, warmup >= 0, "
                             "passes >= 1")
    sizes = sizes or default_sizes()
    chosen = _resolve_backend(backend, world_size)
    with tempfile.TemporaryDirectory(prefix="perfswarm-sweep-") as tmp:
        out = Path(tmp) / "result.json"
        init = f"file://{Path(tmp) / 'rendezvous'}"
        try:
            mp.spawn(_worker, args=(world_size, chosen, init, tuple(ops), tuple(sizes), iters,
                                    warmup, passes, str(out)), nprocs=world_size, join=True)
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
    from scipy.optimize import nnls  # fitting only: projecting with a fitted link needs none

    (alpha, beta), _ = nnls(design, np.ones_like(t))
    return Link(f"{name}:{op}", float(alpha), float(beta), "switch",
                f"fitted to {len(measurements)} measurements of {op} among {world_size} ranks")


@dataclass(frozen=True)
class FittedOp:
    """An op's fitted model: one latency, and a link bandwidth that changes at size knees.

    t(n) = a*alpha + b*beta(n) integrated over n: piecewise linear in the bytes, continuous (a
    message one byte larger never takes less time) and never decreasing. Real collectives bend:
    a CPU backend falls out of cache and, past glibc's 32 MiB mmap threshold, page-faults the
    buffers it allocates per call (bandwidth falls: the curve turns up); NCCL switches from the
    low-latency protocols to Simple (bandwidth rises: the curve turns down). `fit_op` finds the
    knees.
    """

    op: Op
    world_size: int
    alpha_s: float
    knees: tuple[float, ...]    # bytes where the bandwidth changes, ascending
    betas: tuple[float, ...]    # s/byte of the link below the first knee, between knees, above
    config: CollectiveConfig = RING

    def time(self, nbytes: float) -> float:
        a, b = coefficients(self.op, self.world_size, self.config)
        return a * self.alpha_s + b * float(np.dot(_segments([nbytes], self.knees)[0],
                                                   self.betas))

    def to_dict(self) -> dict[str, Any]:
        bounds = [*self.knees, math.inf]
        return {"op": self.op, "world_size": self.world_size, "latency_us": self.alpha_s * 1e6,
                "regimes": [{"up_to_bytes": None if math.isinf(bound) else int(bound),
                             "bandwidth_gbps": 1e-9 / beta if beta > 0 else None}
                            for bound, beta in zip(bounds, self.betas, strict=True)]}


MAX_KNEES = 2       # three bandwidth regimes: in cache, in memory, page-faulting (or protocols)
SPLIT_GAIN = 0.7    # a knee must cut the squared log error by 30% to be believed
MIN_BEYOND = 2      # sizes above a knee (so one stray point cannot make its own regime)


def _segments(nbytes: Sequence[float], knees: Sequence[float]) -> np.ndarray[Any, Any]:
    """Bytes of each message that fall in each regime: the columns beta multiplies."""
    n = np.asarray(nbytes, dtype=np.float64)[:, None]
    lows = np.array([0.0, *knees])
    highs = np.array([*knees, math.inf])
    segments: np.ndarray[Any, Any] = np.clip(n - lows, 0.0, highs - lows)
    return segments


def _fit_knees(ms: Sequence[Measurement], world_size: int, config: CollectiveConfig,
               knees: tuple[float, ...]) -> tuple[FittedOp, float]:
    """Alpha and the regimes' betas (non-negative: least squared relative error), and the
    fit's squared log error."""
    op = ms[0].op
    a, b = coefficients(op, world_size, config)
    t = np.array([m.seconds for m in ms])
    design = np.column_stack([np.full_like(t, a), b * _segments([m.nbytes for m in ms], knees)])
    from scipy.optimize import nnls

    coef, _ = nnls(design / t[:, None], np.ones_like(t))
    model = FittedOp(op, world_size, float(coef[0]), knees, tuple(float(c) for c in coef[1:]),
                     config)
    error = float(np.sum(np.log(np.maximum(design @ coef, 1e-300) / t) ** 2))
    return model, error


def fit_op(measurements: Sequence[Measurement], world_size: int,
           config: CollectiveConfig = RING) -> FittedOp:
    """One alpha-beta line, bent at up to MAX_KNEES measured sizes: greedily, the knee that
    lowers the squared log error most, while it cuts it by 30% or more."""
    ms = sorted(measurements, key=lambda m: m.nbytes)
    if len(ms) < 2:
        raise PerfswarmError("fit: needs at least two sizes of one op")
    model, error = _fit_knees(ms, world_size, config, ())
    candidates = [float(m.nbytes) for m in ms[1:len(ms) - MIN_BEYOND]]
    while len(model.knees) < MAX_KNEES:
        trials = [_fit_knees(ms, world_size, config, tuple(sorted((*model.knees, c))))
                  for c in candidates if c not in model.knees]
        # (minus a hair: a knee in an exact line must not win on rounding)
        best = min(trials, key=lambda tr: tr[1], default=None)
        if best is None or best[1] >= error * SPLIT_GAIN - 1e-12:
            break
        model, error = best
    return model


def fit(result: Sweep, config: CollectiveConfig = RING) -> dict[Op, FittedOp]:
    """The fitted model of every op the sweep measured at two sizes or more."""
    return {op: fit_op(result.of(op), result.world_size, config)
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


def split_sizes(result: Sweep) -> tuple[Sweep, Sweep]:
    """The sweep's every other size (the first, third, ...: the ends included) and the rest:
    a fit on the first judged on the second is judged on sizes it never saw."""
    sizes = sorted({m.nbytes for m in result.measurements})
    kept = set(sizes[::2])
    return (replace(result, measurements=tuple(m for m in result.measurements
                                               if m.nbytes in kept)),
            replace(result, measurements=tuple(m for m in result.measurements
                                               if m.nbytes not in kept)))


def calibration(result: Sweep) -> dict[str, Any]:
    """JSON-ready calibration from one sweep (what `calibrate --collectives` reports and
    stores): the measurements, each op's model fitted on every size, its in-sample GMAE, and
    the GMAE on the sizes left out of a fit on every other size."""
    models = fit(result)
    train, test = split_sizes(result)
    return {"sweep": result.to_dict(),
            "models": {op: model.to_dict() for op, model in models.items()},
            "gmae_in_sample": evaluate(models, result),
            "gmae_held_out": evaluate(fit(train), test)}


def link_of_profile(data: Any, where: str) -> Link:
    """The intra-node link a `calibrate --collectives` profile measured: its all-reduce's fitted
    latency and the bandwidth of its largest-message regime (what gradient buckets see)."""
    try:
        model = data["models"]["all_reduce"]
        sweep = data["sweep"]
        latency = float(model["latency_us"]) * 1e-6
        bandwidths = [float(r["bandwidth_gbps"]) for r in model["regimes"]
                      if r["bandwidth_gbps"] is not None]
        name = f"measured {sweep['backend']} x{int(sweep['world_size'])}"
    except (KeyError, TypeError, ValueError) as exc:
        raise PerfswarmError(f"{where}: not a collectives profile ({exc})") from None
    if not bandwidths or not bandwidths[-1] > 0 or not latency >= 0:
        raise PerfswarmError(f"{where}: its all-reduce has no positive bandwidth to use")
    return Link(name, latency, 1e-9 / bandwidths[-1], "switch",
                f"fitted by perfswarm calibrate --collectives ({where})")
