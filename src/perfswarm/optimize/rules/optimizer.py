"""Rules about the optimizer: per-parameter kernels and gradients zeroed instead of freed."""

from __future__ import annotations

import polars as pl

from perfswarm.optimize.rules.base import Advice, advice
from perfswarm.optimize.rules.facts import Facts, contained

_STEP = r"^Optimizer\.step#"
_MULTI_TENSOR = r"_foreach_|_fused_"
# Fewer ops than this per step is a handful of parameters: nothing to batch.
_MIN_OPS_PER_STEP = 20


def _inside(facts: Facts, outer_pattern: str,
            inner_pattern: str) -> tuple[pl.DataFrame, pl.DataFrame]:
    outer = facts.in_window(facts.named(outer_pattern, "cpu_op", "user_annotation"))
    inner = facts.named(inner_pattern, "cpu_op")
    return outer, inner.filter(pl.Series(contained(outer, inner)))


def single_tensor_optimizer(facts: Facts) -> Advice | None:
    """optimizer.step() runs one small op per parameter instead of one multi-tensor op."""
    steps, ops = _inside(facts, _STEP, r"^aten::")
    if steps.height == 0 or ops.height == 0:
        return None
    if steps["name"].str.contains("Fused").any() or ops["name"].str.contains(_MULTI_TENSOR).any():
        return None
    per_step = ops.height / steps.height
    if per_step < _MIN_OPS_PER_STEP:
        return None
    kinds = ops["name"].n_unique()
    step_ns = sum(facts.busy_ns(steps).values())
    optimizer = str(steps["name"][0]).split("#", 1)[1].split(".", 1)[0]
    evidence = {"optimizer": optimizer, "steps": steps.height, "ops_per_step": round(per_step, 1),
                "distinct_ops": kinds, "optimizer_ns": step_ns}
    # A multi-tensor optimizer issues one op per distinct elementwise op, not one per parameter.
    return advice(facts, "single_tensor_optimizer", "optimizer runs one op per parameter",
                  evidence, step_ns * (1 - kinds / per_step),
                  "op-count model: one multi-tensor op per distinct op replaces one op per "
                  "parameter, time scaling with the op count",
                  f"torch.optim.{optimizer}(..., foreach=True), or fused=True on CUDA "
                  "(Adam, AdamW, SGD)")


def zero_grad_fill(facts: Facts) -> Advice | None:
    """zero_grad() fills every gradient with zeros instead of dropping it (set_to_none=False)."""
    calls, fills = _inside(facts, r"^Optimizer\.zero_grad#", r"^aten::zero_$")
    if fills.height == 0:
        return None
    fill_ns = sum(facts.busy_ns(fills).values())
    evidence = {"zero_grad_calls": calls.height, "zero_ops": fills.height, "zero_ns": fill_ns}
    return advice(facts, "zero_grad_set_to_none", "zero_grad() writes zeros into every gradient",
                  evidence, fill_ns, "measured, no model: the fills' time goes; backward "
                  "writes fresh gradients",
                  "optimizer.zero_grad(set_to_none=True) (the default since torch 2.0)")
