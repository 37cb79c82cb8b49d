"""Collective alpha-beta models, interconnect table, and the real torch.distributed sweep."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfswarm.defaults import Scheme
from perfswarm.errors import PerfswarmError
from perfswarm.model.accuracy import gmae
from perfswarm.model.collective_fit import (
    FittedOp,
    Measurement,
    Sweep,
    calibration,
    evaluate,
    fit,
    fit_link,
    fit_op,
    split_sizes,
)
from perfswarm.model.collectives import (
    OPS,
    CollectiveConfig,
    Op,
    all_to_allv_time,
    bus_factor,
    coefficients,
    collective_time,
    link_time,
)
from perfswarm.model.topology import Link, Topology, interconnect, interconnects
from perfswarm.recorder.bench.collectives import default_sizes, sweep

NVS = interconnect("nvswitch-h100")
IB = interconnect("ib-ndr")
SIZES = st.floats(min_value=1.0, max_value=1e10)
DEVICES = st.integers(min_value=1, max_value=512)
BANDWIDTH_OPS: tuple[Op, ...] = ("all_reduce", "all_gather", "reduce_scatter")
TREE_AND_RING: tuple[Scheme, ...] = ("ring", "tree")


def test_interconnect_table_is_complete_and_cited() -> None:
    links = interconnects()
    assert list(links) == ["nvlink2-dgx1", "nvswitch-hgx2", "nvlink3", "nvlink4", "nvswitch-a100",
                           "nvswitch-h100", "pcie3", "pcie4", "pcie5", "ib-hdr", "ib-ndr",
                           "eth-100g", "eth-400g", "host-loopback"]
    assert all(link.source and link.alpha_s > 0 for link in links.values())
    assert links["nvlink4"].bandwidth_gbps == pytest.approx(360.0)   # 450 GB/s x 0.80
    assert links["ib-hdr"].bandwidth_gbps == pytest.approx(22.5)     # 25 GB/s x 0.90
    assert links["pcie4"].fabric == "bus"
    with pytest.raises(PerfswarmError, match="unknown"):
        interconnect("carrier-pigeon")


def test_ring_and_tree_coefficients() -> None:
    assert coefficients("all_reduce", 4) == (6.0, 1.5)
    assert coefficients("all_gather", 4) == (3.0, 0.75)
    assert coefficients("all_reduce", 8, CollectiveConfig("tree")) == (6.0, 2.0)
    assert coefficients("all_to_all", 8, CollectiveConfig("tree")) == (3.0, 1.5)
    assert coefficients("all_reduce", 8, CollectiveConfig("ps", servers=2)) == (2.0, 8.0)
    assert coefficients("broadcast", 1) == (0.0, 0.0)
    with pytest.raises(PerfswarmError, match="scheme ps"):
        coefficients("all_gather", 4, CollectiveConfig("ps"))


def test_ring_all_reduce_exact_time() -> None:
    # 8 GPUs, 1 GB: 14 steps of 0.4 us + 1.75 GB at 360 GB/s
    t = collective_time("all_reduce", 1e9, Topology(8, 8, NVS, IB))
    assert t == pytest.approx(14 * 0.4e-6 + 1.75e9 / 360e9)


def test_hierarchical_all_reduce_decomposes() -> None:
    top = Topology(16, 8, NVS, IB)
    assert top.nodes == 2
    expected = (link_time("reduce_scatter", 1e8, 8, NVS) + link_time("all_reduce", 1e8 / 8, 2, IB)
                + link_time("all_gather", 1e8, 8, NVS))
    assert collective_time("all_reduce", 1e8, top) == pytest.approx(expected)


def test_all_to_all_without_switch_is_bisection_bound() -> None:
    pcie = interconnect("pcie4")
    switched = Link("x", pcie.alpha_s, pcie.beta_s_per_byte, "switch")
    assert link_time("all_to_all", 1e8, 8, pcie) > 3.9 * link_time("all_to_all", 1e8, 8, switched)


@given(SIZES, DEVICES, st.sampled_from(TREE_AND_RING))
def test_time_grows_with_size_and_vanishes_alone(n: float, p: int, scheme: Scheme) -> None:
    config = CollectiveConfig(scheme)
    top = Topology(p, 8, NVS, IB)
    for op in (*BANDWIDTH_OPS, "broadcast", "all_to_all"):
        t = collective_time(op, n, top, config)
        assert 0 <= t <= collective_time(op, 2 * n, top, config)
        if p == 1:
            assert t == 0


@given(st.integers(min_value=2, max_value=64))
def test_ring_bus_bandwidth_approaches_link_bandwidth(p: int) -> None:
    n = 1e12
    for op in BANDWIDTH_OPS:
        t = link_time(op, n, p, NVS)
        assert n / t * bus_factor(op, p) / 1e9 == pytest.approx(NVS.bandwidth_gbps, rel=1e-5)


@given(st.integers(min_value=2, max_value=32), SIZES)
def test_uniform_all_to_allv_equals_all_to_all(p: int, n: float) -> None:
    matrix = [[n / p] * p for _ in range(p)]
    assert all_to_allv_time(matrix, IB) == pytest.approx(link_time("all_to_all", n, p, IB))


def test_all_to_allv_takes_the_busiest_rank() -> None:
    matrix = [[0.0, 10.0, 0.0], [0.0, 0.0, 0.0], [0.0, 30.0, 0.0]]   # rank 1 receives 40
    assert all_to_allv_time(matrix, IB) == pytest.approx(2 * IB.alpha_s + 40 * IB.beta_s_per_byte)


def test_fit_recovers_alpha_and_beta() -> None:
    true = Link("t", 20e-6, 1 / 2e9)
    ms = tuple(Measurement("all_reduce", n, link_time("all_reduce", n, 4, true))
               for n in default_sizes(1 << 10, 1 << 24))
    got = fit_link(ms, 4)
    assert got.alpha_s == pytest.approx(20e-6, rel=1e-6)
    assert got.bandwidth_gbps == pytest.approx(2.0, rel=1e-6)
    model = fit_op(ms, 4)
    assert model.knees == ()   # no knee in a straight line
    assert model.alpha_s == pytest.approx(20e-6, rel=1e-6)
    assert model.betas == pytest.approx((1 / 2e9,), rel=1e-6)
    assert evaluate({"all_reduce": model}, Sweep("gloo", 4, 1, ms))["all_reduce"] == \
        pytest.approx(0.0, abs=1e-9)


def _truth(op: Op, knees: tuple[float, ...], gbps: tuple[float, ...],
           p: int = 2) -> FittedOp:
    return FittedOp(op, p, 50e-6, knees, tuple(1e-9 / g for g in gbps))


def test_fit_finds_the_knees() -> None:
    # in cache at 3 GB/s up to 2 MB, then 1.5 GB/s, then page-faulting at 0.4 GB/s above 16 MB
    truth = _truth("all_gather", (2 << 20, 16 << 20), (3.0, 1.5, 0.4))
    ms = [Measurement("all_gather", n, truth.time(n)) for n in default_sizes()]
    model = fit_op(ms, 2)
    assert model.knees == (2 << 20, 16 << 20)
    assert model.alpha_s == pytest.approx(50e-6, rel=1e-6)
    assert [1e-9 / b for b in model.betas] == pytest.approx([3.0, 1.5, 0.4], rel=1e-6)
    assert model.to_dict()["regimes"] == [
        {"up_to_bytes": 2 << 20, "bandwidth_gbps": pytest.approx(3.0)},
        {"up_to_bytes": 16 << 20, "bandwidth_gbps": pytest.approx(1.5)},
        {"up_to_bytes": None, "bandwidth_gbps": pytest.approx(0.4)}]
    # a protocol switch that raises the bandwidth (NCCL's LL to Simple) bends the other way
    faster = _truth("all_reduce", (256 << 10,), (0.5, 20.0), p=8)
    model = fit_op([Measurement("all_reduce", n, faster.time(n)) for n in default_sizes()], 8)
    assert model.knees == (256 << 10,)
    assert model.time(1 << 26) == pytest.approx(faster.time(1 << 26), rel=1e-6)


def test_a_flat_regime_has_no_bandwidth() -> None:
    flat = FittedOp("broadcast", 2, 50e-6, (1 << 16,), (0.0, 1e-9))
    assert flat.time(1 << 10) == flat.time(1 << 16) == pytest.approx(50e-6)
    assert [r["bandwidth_gbps"] for r in flat.to_dict()["regimes"]] == [None, 1.0]


def test_knees_must_cut_the_error() -> None:
    truth = _truth("broadcast", (), (4.0,))
    noisy = [Measurement("broadcast", n, truth.time(n) * (1.03 if i % 2 else 0.97))
             for i, n in enumerate(default_sizes())]
    assert fit_op(noisy, 2).knees == ()   # +-3% noise is no knee
    with pytest.raises(PerfswarmError, match="two sizes"):
        fit_op(noisy[:1], 2)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0.5, 2.0), min_size=17, max_size=17))
def test_fitted_time_is_continuous_and_never_falls(noise: list[float]) -> None:
    truth = _truth("all_to_all", (1 << 20,), (2.0, 1.0))
    sizes = default_sizes()
    model = fit_op([Measurement("all_to_all", n, truth.time(n) * f)
                    for n, f in zip(sizes, noise, strict=True)], 2)
    grid = np.geomspace(1, 1 << 27, 400)
    times = [model.time(n) for n in grid]
    assert all(b >= a for a, b in itertools.pairwise(times))
    for knee in model.knees:   # no jump at a knee
        assert model.time(knee * (1 + 1e-9)) == pytest.approx(model.time(knee), rel=1e-6)


def test_split_sizes_holds_out_every_other_size() -> None:
    sizes = default_sizes()
    result = Sweep("gloo", 2, 1, tuple(Measurement(op, n, 1e-4) for op in ("all_reduce",
                                                                             "broadcast")
                                       for n in sizes))
    train, test = split_sizes(result)
    assert sorted({m.nbytes for m in train.measurements}) == list(sizes[::2])
    assert sorted({m.nbytes for m in test.measurements}) == list(sizes[1::2])
    assert len(train.measurements) + len(test.measurements) == len(result.measurements)


def test_gmae() -> None:
    assert gmae([2.0, 1.0], [1.0, 2.0]) == pytest.approx(1.0)
    assert gmae([1.1], [1.0]) == pytest.approx(0.1)
    assert math.isclose(gmae([3.0], [3.0]), 0.0)


def test_default_sizes_cover_1k_to_64m() -> None:
    sizes = default_sizes()
    assert (sizes[0], sizes[-1], len(sizes)) == (1024, 64 << 20, 17)


def test_real_gloo_sweep_world_2() -> None:
    result = sweep(ops=("all_reduce", "broadcast"), sizes=(1024, 4096, 16384, 65536),
                   world_size=2, backend="gloo", iters=2, warmup=1, passes=2)
    assert (result.backend, result.world_size) == ("gloo", 2)
    assert [(m.op, m.nbytes) for m in result.measurements] == [
        (op, n) for op in ("all_reduce", "broadcast") for n in (1024, 4096, 16384, 65536)]
    assert all(m.seconds > 0 for m in result.measurements)
    models = fit(result)
    assert set(models) == {"all_reduce", "broadcast"}
    assert all(model.time(1024) > 0 for model in models.values())
    assert result.to_dict()["measurements"][0]["busbw_gbps"] > 0
    assert set(OPS) >= set(models)
    report = calibration(result)
    assert set(report) == {"sweep", "models", "gmae_in_sample", "gmae_held_out"}
    assert set(report["models"]) == {"all_reduce", "broadcast"}


def test_sweep_rejects_bad_arguments() -> None:
    with pytest.raises(PerfswarmError, match="world_size"):
        sweep(world_size=1)
    with pytest.raises(PerfswarmError, match="cannot measure"):
        sweep(ops=("push_pull",))
    with pytest.raises(PerfswarmError, match="passes"):
        sweep(passes=0)
