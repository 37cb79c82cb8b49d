"""Covered, WindowSums and StateSums answer each window as the per-window reference computes
it."""

from __future__ import annotations

import numpy as np
import pytest

from perfswarm.analyze.intervals import Covered, StateSums, WindowSums, total


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


@pytest.mark.parametrize("seed", range(20))
def test_state_sums_match_the_per_segment_reference(seed: int) -> None:
    """ns per state up to any instant, segments summed one by one in Python ints: before,
    on and between the points, across many of StateSums' checkpoints, at epoch-ns times,
    every instant asked at once (a row each) and in any order."""
    rng = np.random.default_rng(seed)
    n, states = int(rng.integers(1, 300)), int(rng.integers(1, 6))
    points = np.cumsum(rng.integers(1, 10**9, n)).astype(np.int64) + 1_700_000_000 * 10**9
    codes = rng.integers(0, states, n - 1).astype(np.int64)
    outside = int(rng.integers(0, states))
    sums = StateSums(points, codes, states, outside)
    first, last = int(points[0]), int(points[-1])
    asked = rng.permutation([*points.tolist(),
                             *rng.integers(first - 10**9, last + 10**9, 60).tolist()])
    wants = []
    for x in asked.tolist():
        want = [0] * states
        for j, code in enumerate(codes.tolist()):
            want[code] += max(0, min(int(points[j + 1]), x) - int(points[j]))
        want[outside] += x - last if x > last else min(0, x - first)
        wants.append(want)
    assert sums.upto(asked.astype(np.int64)).tolist() == wants
    lo, hi = np.sort(rng.integers(first, last + 1, (2, 9)), axis=0)
    assert sums.between(lo, hi).tolist() == (sums.upto(hi) - sums.upto(lo)).tolist()


def test_state_sums_keep_less_than_their_points() -> None:
    """The running sums a StateSums keeps take less memory than its points, whatever the
    number of states (one per state at every point had taken states x 8 bytes a point)."""
    points = np.arange(0, 100_000, dtype=np.int64)
    sums = StateSums(points, np.arange(len(points) - 1, dtype=np.int64) % 6, 6, 0)
    assert sums.cum.nbytes < points.nbytes / 4
    assert sums.upto(np.array([99_999])).tolist() == [[16_667, 16_667, 16_667, 16_666, 16_666,
                                                        16_666]]
