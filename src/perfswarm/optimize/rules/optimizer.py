"""Rules about the optimizer: per-parameter kernels and gradients zeroed instead of freed."""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa

from perfswarm.analyze.frame import group_rows, lane_key
from perfswarm.analyze.iterations import top_level
from perfswarm.model.opcost import data_cost, shapes_from_args
from perfswarm.optimize.rules.base import Advice, advice
from perfswarm.optimize.rules.facts import Facts, col, groups, where

_MULTI_TENSOR = r"_foreach_|_fused_"
# Fewer ops than this per step is a handful of parameters: nothing to batch.
_MIN_OPS_PER_STEP = 20
_FUSED = ("Adam", "AdamW", "SGD")  # optimizers with fused=True
# ... but not over a tensor subclass's parameters (DTensor: FSDP2's, tensor parallelism's), whose
# ops each run under a PythonSubclass op: torch 2.13's DTensor has no sharding strategy for
# aten._fused_sgd_ (fused=True raises NotImplementedError at the first step; Adam's and
# AdamW's it has)
_SUBCLASS, _NO_SUBCLASS_FUSED = "PythonSubclass", ("SGD",)
_CLIP_NORM, _CLIP_SCALE = "aten::_foreach_norm", "aten::_foreach_mul_"  # clip_grad_norm_'s
_CPU_FUSED = (2, 4)  # the torch version whose fused Adam, AdamW and SGD run on the CPU too


def _inside(facts: Facts, outer_pattern: str,
            inner_pattern: str) -> tuple[pa.Table, pa.Table]:
    outer = facts.in_window(facts.named(outer_pattern, "cpu_op", "user_annotation"))
    inner = facts.named(inner_pattern, "cpu_op")
    return outer, facts.inside(outer, inner)


def single_tensor_optimizer(facts: Facts) -> Advice | None:
    """optimizer.step() runs one small op per parameter instead of one multi-tensor op: of the
    optimizers the run steps (a GAN's two, LBFGS beside SGD), the one it gains most on."""
    steps, ops = facts.optimizer_steps
    found = [_single_tensor(facts, mine, facts.inside(mine, ops))
             for _name, mine in groups(steps, ["name"])]
    return max((a for a in found if a is not None), key=lambda a: a.gain_ns or 0.0,
               default=None)


def _local(facts: Facts, ops: pa.Table) -> pa.Table:
    """`ops` less a tensor subclass's own (DTensor's `aten::mul_` at the global shape), each of
    which holds a PythonSubclass op that runs the op again on the local tensor (`aten::mul_`
    at the shard's shape): the local op is the one that runs and moves the bytes, once (the
    subclass's op around it is the call the fused kernel's one call replaces, its dispatch
    with it)."""
    subclass = facts.around(ops, facts.named(f"^{_SUBCLASS}$", "cpu_op"))
    return where(ops, ~np.isin(col(ops, "row"), col(subclass, "row")))


def _without_clipping(facts: Facts, ops: pa.Table) -> pa.Table:
    """The ops of a step's own work less a gradient clipping in it, from each _foreach_norm
    to the end of the first _foreach_mul_ after it (clip_grad_norm_ scaling the gradients by
    their norm): a closure passed to step() clips after its backward (Lightning's
    gradient_clip_val), and its two multi-tensor ops, with the per-tensor ops they fall back to
    on the CPU, are not the update's."""
    ops = ops.take(pa.array(np.argsort(col(ops, "ts"), kind="stable")))
    ts = col(ops, "ts")
    end = ts + col(ops, "dur")
    norms = ts[facts.named_as(ops, [_CLIP_NORM])]
    muls = np.flatnonzero(facts.named_as(ops, [_CLIP_SCALE]))
    keep = np.ones(len(ts), bool)
    for start in norms.tolist():
        after = muls[ts[muls] > start]
        if len(after):
            keep &= (ts < start) | (ts >= end[after[0]])
    return where(ops, keep)


def _single_tensor(facts: Facts, steps: pa.Table, ops: pa.Table) -> Advice | None:
    """single_tensor_optimizer of one optimizer's calls and their ops."""
    if steps.num_rows == 0 or ops.num_rows == 0:
        return None
    ops = _without_clipping(facts, ops)
    if facts.named_like(steps, "Fused").any() or facts.named_like(ops, _MULTI_TENSOR).any():
        return None
    local = _local(facts, ops)
    per_step = local.num_rows / steps.num_rows
    if per_step < _MIN_OPS_PER_STEP:
        return None
    kinds = len(np.unique(col(local, "name")))
    step_ns = sum(facts.busy_ns(steps).values())
    optimizer = facts.name_texts(steps.slice(0, 1))[0].split("#", 1)[1].split(".", 1)[0]
    evidence: dict[str, object] = {"optimizer": optimizer, "steps": steps.num_rows,
                                   "ops_per_step": round(per_step, 1), "distinct_ops": kinds,
                                   "optimizer_ns": step_ns}
    fusable = optimizer in _FUSED and not (
        optimizer in _NO_SUBCLASS_FUSED
        and facts.inside(steps, facts.named(f"^{_SUBCLASS}$", "cpu_op")).num_rows)
    if facts.device_events.num_rows:
        # A multi-tensor optimizer issues one op per distinct elementwise op, not one per
        # parameter.
        fused = ("or fused=True" if fusable else "" if optimizer in _FUSED
                 else "(fused=True: Adam, AdamW, SGD)")
        return advice(facts, "single_tensor_optimizer", "optimizer runs one op per parameter",
                      evidence, step_ns * (1 - kinds / per_step),
                      "op-count model: one multi-tensor op per distinct op replaces one op per "
                      "parameter, time scaling with the op count",
                      f"torch.optim.{optimizer}(..., foreach=True)" + (fused and f", {fused}"))
    # On the CPU foreach=True loops over the tensors as the single-tensor path does (no gain
    # measured); the fused kernel makes one pass over each tensor.
    if not fusable:
        return None
    version = facts.recorded.get("torch_version")
    known = isinstance(version, str) and bool(re.match(r"\d+\.\d+", version))
    if known and tuple(int(x) for x in re.findall(r"\d+", str(version))[:2]) < _CPU_FUSED:
        return None
    streamed = _streaming_ns(facts, facts.with_text(top_ops(local), "detail"))
    if streamed is None:
        return None
    ops_ns = _typical_calls_ns(steps, top_ops(ops))
    evidence["ops_ns"] = ops_ns
    evidence["streaming_ns"] = round(streamed)
    # the steps' slowdown, as gain_of's text reads it (at_program_speed: it had read 1.80x
    # beside a `profiler_slowdown` of 2.172, the optimizer's calls'), and the calls' own
    measured = facts.optimizer_slowdown
    slowdown = measured or facts.profiler_slowdown
    evidence["profiler_slowdown"] = round(facts.profiler_slowdown, 3)
    evidence["optimizer_slowdown"] = None if measured is None else round(measured, 3)
    if known:
        evidence["torch_version"] = version
    need = "" if known else f" (on the CPU since torch {'.'.join(map(str, _CPU_FUSED))})"
    # The fused kernel replaces the per-parameter ops, not step()'s own Python: their time
    # without the profiler (whose cost per op is most of a small op's) against the kernel's at
    # the rate one op reached (which that cost hardly changes).
    gain = ops_ns / slowdown - streamed
    if gain <= 0:
        return None
    return advice(facts, "single_tensor_optimizer", "optimizer runs one op per parameter",
                  evidence, gain,
                  "streaming model from this step: the fused kernel moves the ops' bytes in one "
                  "pass at the best rate one of them reached; it replaces the ops' time without "
                  "the profiler (the median call's, times the calls, over its slowdown of the "
                  "optimizer's calls, median in the window / median the recorder timed outside "
                  "it, else of the step); the step's own Python stays",
                  f"torch.optim.{optimizer}(..., fused=True){need}",
                  of=(facts.wall_ns / facts.profiler_slowdown, facts.at_program_speed))


def _typical_calls_ns(calls: pa.Table, top: pa.Table) -> int:
    """The ops' time (`top`: not nested in one another) of the median optimizer call, times
    the calls: a call another process held up (one of five at 48.6 ms, the others 1 ms) is
    priced as a usual one."""
    per_call = []
    for (rank,), mine in groups(calls, ["rank"]):
        starts = np.sort(col(mine, "ts"))
        ops = col(top, "rank") == rank
        at = np.searchsorted(starts, col(top, "ts")[ops], side="right") - 1
        inside = at >= 0
        per_call.append(np.bincount(at[inside], weights=col(top, "dur")[ops][inside],
                                    minlength=len(starts)))
    found = np.concatenate(per_call)
    return round(float(np.median(found)) * len(found))


def top_ops(ops: pa.Table) -> pa.Table:
    """The ops of `ops` not nested in another of them (per rank and thread), by rank, thread
    and start (the longer first)."""
    ordered = ops.take(pa.array(np.lexsort((-col(ops, "dur"), col(ops, "ts"), col(ops, "tid"),
                                            col(ops, "rank")))))
    ts, end = col(ordered, "ts"), col(ordered, "ts") + col(ordered, "dur")
    keep = np.zeros(ordered.num_rows, bool)
    for lane in group_rows(lane_key(col(ordered, "rank"), col(ordered, "tid")),
                           np.arange(ordered.num_rows)).values():
        keep[lane[top_level(ts[lane], end[lane])]] = True
    return where(ordered, keep)


def _streaming_ns(facts: Facts, ops: pa.Table) -> float | None:
    """Time to move the bytes `ops` move (model.opcost over the recorded shapes) at the best
    rate one of them reached; None without shapes."""
    moved, best = 0.0, 0.0
    for name, detail, dur in zip(facts.name_texts(ops), ops.column("detail").to_pylist(),
                                 col(ops, "dur").tolist(), strict=True):
        shapes = shapes_from_args(detail)
        cost = None if shapes is None else data_cost(name, shapes)
        if cost is None or cost.bytes <= 0 or dur <= 0:
            continue
        moved += cost.bytes
        best = max(best, cost.bytes / dur)
    return moved / best if best else None


def zero_grad_fill(facts: Facts) -> Advice | None:
    """zero_grad() fills every gradient with zeros instead of dropping it (set_to_none=False)."""
    calls, fills = _inside(facts, r"^Optimizer\.zero_grad#", r"^aten::zero_$")
    if fills.num_rows == 0:
        return None
    fill_ns = sum(facts.busy_ns(fills).values())
    evidence = {"zero_grad_calls": calls.num_rows, "zero_ops": fills.num_rows,
                "zero_ns": fill_ns}
    return advice(facts, "zero_grad_set_to_none", "zero_grad() writes zeros into every gradient",
                  evidence, fill_ns, "measured, no model: the fills' time goes; backward "
                  "writes fresh gradients",
                  "optimizer.zero_grad(set_to_none=True) (the default since torch 2.0)")
