"""Collective alpha-beta models, interconnect table, and the real torch.distributed sweep."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from perfswarm.errors import PerfswarmError
from perfswarm.model.collective_bench import (
    Measurement,
    Sweep,
    calibration,
    default_sizes,
    evaluate,
    fit,
    fit_link,
    fit_op,
    gmae,
    predict,
    sweep,
)
from perfswarm.model.collectives import (
    OPS,
    CollectiveConfig,
    Op,
    Scheme,
    all_to_allv_time,
    bus_factor,
    coefficients,
    collective_time,
    link_time,
)
from perfswarm.model.topology import Link, Topology, interconnect, interconnects

NVS = interconnect("nvswitch-h100")
IB = interconnect("ib-ndr")
SIZES = st.floats(min_value=1.0, max_value=1e10)
DEVICES = st.integers(min_value=1, max_value=512)
BANDWIDTH_OPS: tuple[Op, ...] = ("all_reduce", "all_gather", "reduce_scatter")
TREE_AND_RING: tuple[Scheme, ...] = ("ring", "tree")


def test_interconnect_table_is_complete_and_cited() -> None:
    links = interconnects()
    assert list(links) == ["nvlink3", "nvlink4", "nvswitch-a100", "nvswitch-h100", "pcie3",
                           "pcie4", "pcie5", "ib-hdr", "ib-ndr", "eth-100g", "eth-400g"]
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
    ms = tuple(Measurement("all_reduce", n, predict(true, "all_reduce", n, 4))
               for n in default_sizes(1 << 10, 1 << 24))
    got = fit_link(ms, 4)
    assert got.alpha_s == pytest.approx(20e-6, rel=1e-6)
    assert got.bandwidth_gbps == pytest.approx(2.0, rel=1e-6)
    model = fit_op(ms, 4)
    assert len(model.regimes) == 1   # no knee in a straight line
    assert evaluate({"all_reduce": model}, Sweep("gloo", 4, 1, ms))["all_reduce"] == \
        pytest.approx(0.0, abs=1e-9)


def test_fit_finds_the_knee() -> None:
    # in cache up to 1 MB at 10 GB/s, then 2 GB/s: two regimes, split at 1 MB
    fast, slow = Link("f", 5e-6, 1 / 10e9), Link("s", 5e-6, 1 / 2e9)
    ms = tuple(Measurement("all_gather", n, predict(fast if n <= 1 << 20 else slow,
                                                    "all_gather", n, 2))
               for n in default_sizes(1 << 10, 64 << 20))
    model = fit_op(ms, 2)
    assert [bound for bound, _ in model.regimes] == [1 << 20, math.inf]
    assert model.regimes[1][1].bandwidth_gbps == pytest.approx(2.0, rel=1e-6)
    assert model.time(4 << 20) == pytest.approx(predict(slow, "all_gather", 4 << 20, 2))
    assert model.to_dict()["regimes"][0]["up_to_bytes"] == 1 << 20


def test_gmae() -> None:
    assert gmae([2.0, 1.0], [1.0, 2.0]) == pytest.approx(1.0)
    assert gmae([1.1], [1.0]) == pytest.approx(0.1)
    assert math.isclose(gmae([3.0], [3.0]), 0.0)


def test_default_sizes_cover_1k_to_64m() -> None:
    sizes = default_sizes()
    assert (sizes[0], sizes[-1], len(sizes)) == (1024, 64 << 20, 17)


def test_real_gloo_sweep_world_2() -> None:
    result = sweep(ops=("all_reduce", "broadcast"), sizes=(1024, 65536), world_size=2,
                   backend="gloo", iters=2, warmup=1)
    assert (result.backend, result.world_size) == ("gloo", 2)
    assert [(m.op, m.nbytes) for m in result.measurements] == [
        ("all_reduce", 1024), ("all_reduce", 65536), ("broadcast", 1024), ("broadcast", 65536)]
    assert all(m.seconds > 0 for m in result.measurements)
    models = fit(result)
    assert set(models) == {"all_reduce", "broadcast"}
    assert all(model.time(1024) > 0 for model in models.values())
    assert result.to_dict()["measurements"][0]["busbw_gbps"] > 0
    assert set(OPS) >= set(models)
    report = calibration(result)
    assert set(report) == {"sweep", "models", "gmae_in_sample"}
    assert set(report["models"]) == {"all_reduce", "broadcast"}


def test_sweep_rejects_bad_arguments() -> None:
    with pytest.raises(PerfswarmError, match="world_size"):
        sweep(world_size=1)
    with pytest.raises(PerfswarmError, match="cannot measure"):
        sweep(ops=("push_pull",))
