"""How far predictions are from measurements: the one error measure every model reports."""

from __future__ import annotations

import math
from collections.abc import Sequence

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

