"""Covered and WindowSums answer each window as the per-window reference computes it."""

from __future__ import annotations

import numpy as np
import pytest

from perfswarm.analyze.intervals import Covered, WindowSums, total


@pytest.mark.parametrize("seed", range(20))
def test_window_queries_match_the_clipped_reference(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 40))
    starts = rng.integers(0, 1000, n).astype(np.int64)
    ends = starts + rng.integers(-5, 200, n).astype(np.int64)  # some empty or reversed
    values = rng.integers(0, 50, n).astype(np.int64)
    covered, sums = Covered(starts, ends), WindowSums(starts, values)
    for lo, hi in [*rng.integers(-50, 1300, (30, 2)).tolist(), [0, 0], [500, 400]]:
        clipped = total(np.clip(starts, lo, hi), np.clip(ends, lo, hi))
        assert covered.within(lo, hi) == clipped
        assert sums.within(lo, hi) == int(values[(starts >= lo) & (starts < hi)].sum())
