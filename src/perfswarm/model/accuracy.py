"""How far predictions are from measurements: the one error measure every model reports, and
how measurements taken over interleaved rounds are ordered and reduced before it is taken."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence

import numpy as np
import numpy.typing as npt


def gmae(predicted: Sequence[float] | npt.NDArray[np.float64],
         measured: Sequence[float] | npt.NDArray[np.float64], *, empty: float = 0.0) -> float:
    """Geometric-mean absolute error: exp(mean |ln(predicted / measured)|) - 1 (0.15: typically
    15% off either way). Pairs with a side that is not positive have no ratio and are left
    out; with no pairs left, `empty` (NaN where "not measured" must not read as "exact")."""
    p = np.asarray(predicted, np.float64)
    m = np.asarray(measured, np.float64)
    if p.shape != m.shape:
        raise ValueError(f"gmae: {p.size} predictions for {m.size} measurements")
    keep = (p > 0) & (m > 0)
    return math.expm1(float(np.mean(np.abs(np.log(p[keep] / m[keep]))))) if keep.any() else empty


def round_orders(configurations: int, rounds: int) -> list[tuple[int, ...]]:
    """The order to measure `configurations` in, round by round, each once a round: the rows of
    a cyclic Latin square on Williams' sequence (0, 1, n - 1, 2, n - 2, ...; Williams 1949),
    renamed so that round 0 is 0, 1, 2, ... Each configuration takes each place once in n
    rounds, so none keeps its place from one round to the next (the first follows whatever ran
    before the round; a drift within rounds falls on every place), and none follows the same
    one in every round of two or more (but three configurations over two rounds: no order of
    them can do both), as a rotation (r, r + 1, ...) would put each after the one before it in
    every round it is not first. Of an even number, each follows each other once in n rounds.
    A machine's state left by the one before (its caches, allocator, clock speed) then falls on
    each configuration from several sides."""
    n = configurations
    sequence = [0, *((k + 1) // 2 if k % 2 else n - k // 2 for k in range(1, n))]
    renamed = {c: k for k, c in enumerate(sequence)}
    return [tuple(renamed[(c + r) % n] for c in sequence) for r in range(rounds)]


def over_rounds(values: Iterable[float | None]) -> float | None:
    """The median over the rounds that took a figure (None where none did): a round a burst of
    other load or a cold cache moved is outvoted, where a single measurement is a draw."""
    taken = [v for v in values if v is not None]
    return statistics.median(taken) if taken else None


def round_spread(values: Sequence[float]) -> float:
    """How far a figure moved over rounds: its largest over its smallest, less 1."""
    return max(values) / min(values) - 1
