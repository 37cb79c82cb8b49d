"""The generated fused kernels against PyTorch's two separate ops, over every pair kind and
schedules that cut the maps unevenly (halo rows and columns, ragged edge tiles)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba")
pytest.importorskip("torch")

from perfswarm.optimize.fuse.layers import parse_pair
from perfswarm.optimize.fuse.tune import (
    MAX_REL_ERROR,
    PairBench,
    Schedule,
    channels_last_fits,
    schedule_space,
)

SPECS = ["dw3x3:N=2,C=16,H=13,W=11 -> pw:K=24", "dw5x5/s2:C=8,H=15 -> pw:K=12",
         "pw:C=12,H=10,K=20 -> dw3x3/s2", "conv3x3/s2:C=3,H=17,K=8 -> dw3x3",
         "conv3x3:C=6,H=9,W=12,K=8 -> conv3x3:K=5", "conv3x3:C=4,H=8,K=6 -> pw:K=7"]
SCHEDULES = [Schedule(4, 5, "blocked", "blas"), Schedule(3, 32, "interleaved", "loops"),
             Schedule(1, 8, "serial", "blas"), Schedule(64, 64, "blocked", "loops"),
             # channels-last depthwise stage (where a pair or op has none, the planar path)
             Schedule(4, 5, "blocked", "blas", True), Schedule(2, 64, "serial", "blas", True),
             Schedule(64, 64, "interleaved", "blas", True)]


@pytest.mark.parametrize("spec", SPECS)
def test_fused_matches_pytorch(spec: str) -> None:
    bench = PairBench(parse_pair(spec), threads=2)
    scale = np.abs(bench.ref).max()
    for s in SCHEDULES:
        assert np.abs(bench.fused(s) - bench.ref).max() / scale <= MAX_REL_ERROR, s
        assert np.abs(bench.own_separate(s, s) - bench.ref).max() / scale <= MAX_REL_ERROR, s
    # a stride-2 depthwise conv really skips: its map is a quarter of its input
    assert bench.ref.shape == (bench.pair.batch, bench.pair.second.out_channels,
                               *bench.pair.out_size)


def test_schedule_space() -> None:
    space = schedule_space(7, 7, threads=2)
    # tiles of 1, 2, 4 or all 7 rows; 7 columns (every column tile is capped at the width)
    assert sorted({s.tile_rows for s in space}) == [1, 2, 4, 7]
    assert {s.tile_cols for s in space} == {7}
    assert len(space) == 4 * 1 * 3 * 2 and not any(s.channels_last for s in space)
    assert {s.split for s in schedule_space(7, 7, threads=1)} == {"serial"}
    wide = schedule_space(7, 7, threads=2, channels_last=True)
    assert len(wide) == 4 * 1 * 3 * 3
    assert {s.gemm for s in wide if s.channels_last} == {"blas"}


def test_channels_last_fits() -> None:
    pairs = {spec: parse_pair(spec) for spec in SPECS}
    fits = [spec for spec, p in pairs.items() if channels_last_fits(p.first, p.second)]
    assert fits == SPECS[:4]   # dw -> pw, pw -> dw, conv -> dw; not conv -> conv or conv -> pw
    assert channels_last_fits(pairs[SPECS[0]].first)   # a depthwise op alone
    assert not channels_last_fits(pairs[SPECS[0]].second)
