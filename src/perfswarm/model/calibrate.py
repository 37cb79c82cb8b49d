"""Kernel-model calibration: time ops on the local device over a shape sweep, fit a per-family
power-law roofline (log time linear in log FLOPs and log bytes: an efficiency curve that varies with
size), and score it by GMAE on held-out sweep points."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from perfswarm.model.opcost import OpCost, op_cost

Case = tuple[str, list[list[int]], list[str]]  # aten op, input dims, input types


def _sweep(family: str) -> Iterator[Case]:
    """A deterministic shape grid per family, small to a few MB, so a sweep fits in seconds."""
    f = ["float", "float"]
    sizes = [16, 32, 48, 64, 96, 128, 192, 256]
    if family == "gemm":
        for m in sizes:
            for n in sizes[::3]:
                yield "aten::mm", [[m, 2 * n], [2 * n, m]], f
    elif family in ("elementwise", "reduction", "copy"):
        op = {"elementwise": "aten::add", "reduction": "aten::sum", "copy": "aten::clone"}[family]
        for rows in sizes:
            for cols in (64, 256, 1024):
                dims = [[rows, cols], [rows, cols]] if family == "elementwise" else [[rows, cols]]
                yield op, dims, f[: len(dims)]


FAMILIES = ("gemm", "elementwise", "reduction", "copy")


def _runner(op: str, dims: list[list[int]]) -> Callable[[], object]:
    import torch

    gen = torch.Generator().manual_seed(0)
    tensors = [torch.rand(*d, generator=gen) for d in dims]
    ops: dict[str, Callable[..., object]] = {
        "aten::mm": torch.mm, "aten::add": torch.add, "aten::sum": torch.sum,
        "aten::clone": torch.clone}
    fn = ops[op]
    return lambda: fn(*tensors)


def time_op(run: Callable[[], object], min_s: float = 2e-3) -> float:
    """Fastest of five timings, each of enough repetitions to last ``min_s`` (the minimum: load
    from other processes only ever adds time)."""
    run()
    reps, start = 1, time.perf_counter()
    run()
    once = max(time.perf_counter() - start, 1e-7)
    reps = max(1, math.ceil(min_s / once))
    samples = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(reps):
            run()
        samples.append((time.perf_counter() - start) / reps)
    return min(samples)


@dataclass(frozen=True)
class Point:
    cost: OpCost
    seconds: float


@dataclass(frozen=True)
class FamilyModel:
    """log t = c . (1, b, b^2, f - b) with b = log bytes and f = log FLOPs: a roofline whose
    efficiency curve rises and saturates with size (the quadratic) and with arithmetic intensity."""

    coef: tuple[float, ...]

    def predict(self, cost: OpCost) -> float:
        return math.exp(float(np.dot(self.coef, _features(cost))))


def _features(cost: OpCost) -> list[float]:
    b = math.log(cost.bytes)
    return [1.0, b, b * b, math.log(max(cost.flops, 1.0)) - b]


def fit(points: list[Point]) -> FamilyModel:
    """Least squares in log space (minimum-norm where a family's intensity is constant)."""
    coef, *_ = np.linalg.lstsq(np.array([_features(p.cost) for p in points]),
                               np.log([p.seconds for p in points]), rcond=None)
    return FamilyModel(tuple(float(c) for c in coef))


def gmae(model: FamilyModel, points: list[Point]) -> float:
    """Geometric-mean absolute error: exp(mean |log(predicted / measured)|) - 1."""
    logs = [abs(math.log(model.predict(p.cost) / p.seconds)) for p in points]
    return math.expm1(sum(logs) / len(logs))


def measure(family: str, budget_s: float) -> list[Point]:
    """Time the family's sweep until the budget runs out (at least eight points)."""
    points: list[Point] = []
    deadline = time.perf_counter() + budget_s
    for op, dims, types in _sweep(family):
        if len(points) >= 8 and time.perf_counter() > deadline:
            break
        cost = op_cost(op, dims, types)
        assert cost is not None  # the sweep only holds modelled ops
        points.append(Point(cost, time_op(_runner(op, dims))))
    return points


def calibrate(budget_s: float, threads: int = 1) -> dict[str, object]:
    """The device profile: per family, the fitted model and its GMAE on every fourth (held-out)
    point, fitted on the rest. Timed with ``threads`` intra-op threads: on a shared machine torch's
    parallel-for above its grain size waits on busy cores (a fixed ~8 ms step), not on the op."""
    import torch

    families: dict[str, object] = {}
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        measured = {family: measure(family, budget_s / len(FAMILIES)) for family in FAMILIES}
    finally:
        torch.set_num_threads(saved)
    for family, points in measured.items():
        held = points[3::4]
        train = [p for i, p in enumerate(points) if i % 4 != 3]
        model = fit(train)
        families[family] = {"coef": list(model.coef), "points": len(points),
                            "gmae_held_out": gmae(model, held)}
    return {"device": "cpu", "threads": threads, "families": families}
