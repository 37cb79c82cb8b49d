"""Kernel-model calibration on this CPU with a tiny budget."""

from __future__ import annotations

import math

import pytest

from perfswarm.model.calibrate import FAMILIES, FamilyModel, Point, calibrate, fit, gmae
from perfswarm.model.opcost import op_cost


def _add(n: int) -> Point:
    cost = op_cost("aten::add", [[n], [n]], ["float", "float"])
    assert cost is not None
    b = math.log(cost.bytes)
    return Point(cost, math.exp(-2.0 - 1.1 * b + 0.06 * b * b))


def test_fit_recovers_a_curve_of_its_own_form() -> None:
    points = [_add(1 << k) for k in range(8, 20)]
    assert gmae(fit(points), points) == pytest.approx(0.0, abs=1e-9)
    exact = FamilyModel((math.log(2e-6), 0.0, 0.0, 0.0))
    assert gmae(exact, [Point(p.cost, 2e-6) for p in points]) == pytest.approx(0.0, abs=1e-12)


def test_calibrate_tiny_budget_profile_shape() -> None:
    profile = calibrate(0.5)
    families = profile["families"]
    assert isinstance(families, dict) and list(families) == list(FAMILIES)
    for entry in families.values():
        assert entry["points"] >= 8 and len(entry["coef"]) == 4
        assert math.isfinite(entry["gmae_held_out"]) and entry["gmae_held_out"] >= 0
