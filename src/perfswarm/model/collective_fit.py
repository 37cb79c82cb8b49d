"""Collective models fitted to a sweep's measurements (recorder/bench/collectives.py takes them).

`fit()` turns a sweep into a FittedOp per op: the latency-bandwidth (alpha-beta) form of
perfswarm.model.collectives, whose bandwidth may change at up to two size knees, fitted by
non-negative least squares on relative error. `link_of_profile` reads a stored calibration back
as the intra-node link `project` uses.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from perfswarm.errors import PerfswarmError
from perfswarm.model.accuracy import gmae
from perfswarm.model.bandwidth_matrix import BandwidthMatrix
from perfswarm.model.collectives import OPS, RING, CollectiveConfig, Op, bus_factor, coefficients
from perfswarm.model.nnls import nnls
from perfswarm.model.topology import Link


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
    latency and the bandwidth of its largest-message regime (what gradient buckets see); with a
    bandwidth matrix (2 or more GPUs), its slowest device-to-device copy instead (a ring
    all-reduce runs at its slowest hop)."""
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
    source = f"fitted by perfswarm calibrate --collectives ({where})"
    bandwidth = bandwidths[-1]
    if isinstance(data, dict) and data.get("bandwidth_matrix"):
        pairs = BandwidthMatrix.from_dict(data["bandwidth_matrix"], where).between_devices()
        if pairs:
            bandwidth, name = min(pairs), f"{name}, slowest GPU pair"
            source += "; bandwidth: the slowest device-to-device copy of its matrix"
    return Link(name, latency, 1e-9 / bandwidth, "switch", source)
