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
    """The order to measure `configurations` in, round by round, each round once each: round
    r starts at configuration r (each first in turn: the first follows whatever ran before the
    round) and steps through them by a stride coprime with their number, 1, n - 1, 2, n - 2, ...
    in turn (round 0 in their own order, round 1 backwards), so no configuration follows the
    same one in every round of two or more, as it would in a rotation (r, r + 1, ...), where
    each follows the one before it in every round but one. A machine's state left by the one
    before (its caches, its allocator, its clock's drift over minutes) then falls on each
    configuration from several sides."""
    n = configurations
    strides = list(dict.fromkeys(s for k in range(1, n) for s in (k, n - k)
                                 if math.gcd(s, n) == 1)) or [1]
    return [tuple((r + k * strides[r % len(strides)]) % n for k in range(n))
            for r in range(rounds)]


def over_rounds(values: Iterable[float | None]) -> float | None:
    """The median over the rounds that took a figure (None where none did): a round a burst of
    other load or a cold cache moved is outvoted, where a single measurement is a draw."""
    taken = [v for v in values if v is not None]
    return statistics.median(taken) if taken else None


def round_spread(values: Sequence[float]) -> float:
    """How far a figure moved over rounds: its largest over its smallest, less 1."""
    return max(values) / min(values) - 1
