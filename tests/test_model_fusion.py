"""Fusion candidates over op costs."""

from __future__ import annotations

import pytest

from perfswarm.model.fusion import fusion_candidates
from perfswarm.model.opcost import OpCost, op_cost, roofline
from perfswarm.model.specs import load_spec

N = 1 << 20


def _cost(name: str, dims: list[list[int]]) -> OpCost:
    cost = op_cost(name, dims, ["float"] * len(dims))
    assert cost is not None
    return cost


def test_memory_bound_chain_between_gemms() -> None:
    spec = load_spec("A100-80GB")
    mm = _cost("aten::mm", [[4096, 4096], [4096, 4096]])
    add = _cost("aten::add", [[N], [N]])
    relu = _cost("aten::relu", [[N]])
    mul = _cost("aten::mul", [[N], [N]])
    found = fusion_candidates([mm, add, relu, mul, mm, relu, None, relu], spec)
    assert len(found) == 1
    chain = found[0]
    assert (chain.start, chain.end, chain.ops) == (1, 4, ("add", "relu", "mul"))
    # 3N + 2N + 3N floats unfused, the largest op's 3N once fused.
    assert chain.unfused_s == pytest.approx(8 * 4 * N / spec.memory_bandwidth)
    assert chain.fused_s == pytest.approx(3 * 4 * N / spec.memory_bandwidth)
    assert chain.saving_s == pytest.approx(5 * 4 * N / spec.memory_bandwidth)
    assert fusion_candidates([add, relu], spec, min_length=3) == []


def test_conv_then_depthwise_conv() -> None:
    spec = load_spec("A100-80GB")
    pointwise = _cost("aten::conv2d", [[8, 64, 56, 56], [128, 64, 1, 1]])
    depthwise = _cost("aten::conv2d", [[8, 128, 56, 56], [128, 1, 3, 3]])
    assert (pointwise.family, depthwise.family) == ("conv", "depthwise_conv")
    ((pair,),) = [fusion_candidates([pointwise, depthwise, None], spec)]
    assert (pair.start, pair.end, pair.ops) == (0, 2, ("conv2d", "conv2d"))
    # fused, the 8x128x56x56 map is neither written by the first nor read by the second: the
    # pair moves only the outer tensors, against the FLOPs of both
    mid = 4 * 8 * 128 * 56 * 56
    assert pair.unfused_s == pytest.approx(roofline(pointwise, spec).time_s
                                           + roofline(depthwise, spec).time_s)
    assert pair.fused_s == pytest.approx(max(
        (pointwise.flops + depthwise.flops) / spec.peak_for("fp32"),
        (pointwise.bytes + depthwise.bytes - 2 * mid) / spec.memory_bandwidth))
    # depthwise -> pointwise (MobileNet's pair) is one too, depthwise -> depthwise is not
    assert [c.ops for c in fusion_candidates([depthwise, pointwise], spec)] == [
        ("conv2d", "conv2d")]
    assert fusion_candidates([depthwise, depthwise], spec) == []
