"""The exact small non-negative least squares against scipy's (the reference it replaces)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import nnls as scipy_nnls

from perfswarm.model.nnls import MAX_UNKNOWNS, nnls


@settings(max_examples=400, deadline=None)
@given(rows=st.integers(1, 12), cols=st.integers(1, 6), seed=st.integers(0, 2**32 - 1),
       scale=st.sampled_from([1e-9, 1.0, 1e6]))
def test_same_answer_as_scipy(rows: int, cols: int, seed: int, scale: float) -> None:
    """The same residual always; the same coefficients where the answer is unique (columns
    independent), as the fits here have: relative error rows of measured sizes."""
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(rows, cols)) * scale
    b = rng.normal(size=rows) + (a @ np.abs(rng.normal(size=cols)) if seed % 2 else 0.0)
    x, norm = nnls(a, b)
    want, want_norm = scipy_nnls(a, b)
    assert np.all(x >= 0)
    assert norm == pytest.approx(want_norm, rel=1e-7, abs=1e-9 * max(1.0, float(np.abs(b).max())))
    if rows >= cols and np.linalg.matrix_rank(a) == cols and np.linalg.cond(a) < 1e6:
        assert x == pytest.approx(want, rel=1e-6, abs=1e-8 * max(1.0, float(np.abs(want).max())))


def test_a_fit_of_collective_times() -> None:
    """t = alpha + n * beta from exact times: alpha and beta back (the collective fit's form,
    rows divided by their time)."""
    n = np.array([1e3, 1e4, 1e5, 1e6, 1e7])
    t = 20e-6 + n * 1e-10
    design = np.column_stack([np.ones_like(t), n]) / t[:, None]
    (alpha, beta), norm = nnls(design, np.ones_like(t))
    assert alpha == pytest.approx(20e-6) and beta == pytest.approx(1e-10) and norm < 1e-9


def test_too_many_unknowns_is_refused() -> None:
    with pytest.raises(ValueError, match="unknowns"):
        nnls(np.ones((2, MAX_UNKNOWNS + 1)), np.ones(2))
