"""Non-negative least squares of a few unknowns, exactly, in numpy.

The models fitted here have two to six non-negative coefficients (a latency and a bandwidth,
a roofline's constant, byte and FLOP terms, an embedding lookup's terms). scipy's `nnls` would
serve, but importing `scipy.optimize` costs 0.4 CPU s, more than a report of the corpus's
largest trace spends on anything else (docs/benchmarks.md, "Sixth pass"). With few unknowns
the exact answer is found by trying every set of free coefficients: the optimum is the
least-squares solution on its own set of non-zero coefficients, which is feasible, and every
other feasible candidate is a feasible point, so none has a smaller residual.
"""

from __future__ import annotations

import itertools
from typing import Any, Final

import numpy as np
import numpy.typing as npt

MAX_UNKNOWNS: Final = 12  # 4,095 candidate sets; the models here have at most six

Floats = npt.NDArray[np.float64]


def nnls(a: npt.ArrayLike, b: npt.ArrayLike) -> tuple[Floats, float]:
    """x >= 0 minimizing ||a x - b||, and that norm (scipy.optimize.nnls's answer). Of equally
    good answers (columns that are multiples of each other), the one with the fewest non-zero
    coefficients, then the first columns."""
    a_, b_ = np.asarray(a, np.float64), np.asarray(b, np.float64)
    n = a_.shape[1]
    if n > MAX_UNKNOWNS:
        raise ValueError(f"nnls: {n} unknowns; this exact search takes at most {MAX_UNKNOWNS}")
    best, best_norm = np.zeros(n), float(np.linalg.norm(b_))
    for size in range(1, n + 1):
        for chosen in itertools.combinations(range(n), size):
            free = list(chosen)
            solution: Any = np.linalg.lstsq(a_[:, free], b_, rcond=None)[0]
            if np.any(solution < 0):
                continue
            x = np.zeros(n)
            x[free] = solution
            norm = float(np.linalg.norm(a_ @ x - b_))
            if norm < best_norm * (1 - 1e-12):  # a larger set must do better, not as well
                best, best_norm = x, norm
    return best, best_norm
