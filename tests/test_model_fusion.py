"""Fusion candidates over op costs."""

from __future__ import annotations

import pytest

from perfswarm.model.fusion import fusion_candidates
from perfswarm.model.opcost import OpCost, op_cost
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
