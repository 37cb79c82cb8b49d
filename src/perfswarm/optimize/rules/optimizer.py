"""Rules about the optimizer: per-parameter kernels and gradients zeroed instead of freed."""

from __future__ import annotations

import math
import re

import numpy as np
import pyarrow as pa

from perfswarm.analyze.frame import group_rows, lane_key
from perfswarm.analyze.iterations import top_level
from perfswarm.model.fusedstep import CPU_SINCE, on_cpu
from perfswarm.model.fusedstep import OPTIMIZERS as _FUSED
from perfswarm.model.opcost import Shapes, element_bytes, shapes_from_args
from perfswarm.optimize.rules.base import Advice, advice
from perfswarm.optimize.rules.facts import Facts, col, groups, where

_MULTI_TENSOR = r"_foreach_|_fused_"
# Fewer ops than this per step is a handful of parameters: nothing to batch.
_MIN_OPS_PER_STEP = 20
# optimizers with fused=True (_FUSED), but not over a tensor subclass's parameters (DTensor:
# FSDP2's, tensor parallelism's), whose ops each run under a PythonSubclass op: torch 2.13's
# DTensor has no sharding strategy for aten._fused_sgd_ (fused=True raises
# NotImplementedError at the first step; Adam's and AdamW's it has)
_SUBCLASS, _NO_SUBCLASS_FUSED = "PythonSubclass", ("SGD",)
_CLIP_NORM, _CLIP_SCALE = "aten::_foreach_norm", "aten::_foreach_mul_"  # clip_grad_norm_'s


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
    if known and not on_cpu(str(version)):
        return None
    updated = _updated(facts, steps, facts.with_text(top_ops(local), "detail"))
    if updated is None:
        return None
    tensors, parameter_bytes = updated
    calls_ns = round(float(np.median(col(steps, "dur"))) * steps.num_rows)
    # The fused step at calibrate's CPU time, its fastest: where the recorded calls waited for
    # a core the fused one would too, and the claim is over by the fused step's share of that
    # wait. Stretching it by the loop thread's run delay at the step hooks had been worse: a
    # short call escapes the waits its step has (realworld_loop.py's AdamW call of 1.4-2.0 ms
    # at load 5 had claimed 0.23 of the call where fused=True saves 0.66).
    cost = facts.costs.fused
    fused_ns = cost.steps[optimizer].of(tensors, parameter_bytes) * steps.num_rows
    evidence.update({"calls_ns": calls_ns, "tensors": tensors,
                     "parameter_bytes": parameter_bytes, "fused_ns": round(fused_ns)})
    # the steps' slowdown, as gain_of's text reads it (at_program_speed: it had read 1.80x
    # beside a `profiler_slowdown` of 2.172, the optimizer's calls'), and the calls' own
    measured = facts.optimizer_slowdown
    slowdown = measured or facts.profiler_slowdown
    evidence["profiler_slowdown"] = round(facts.profiler_slowdown, 3)
    evidence["optimizer_slowdown"] = None if measured is None else round(measured, 3)
    if known:
        evidence["torch_version"] = version
    need = "" if known else f" (on the CPU since torch {'.'.join(map(str, CPU_SINCE))})"
    # The fused step replaces the whole single-tensor call: its loop over the parameters, the
    # ops and the Python between them (which had been kept: GIN's claim 23% under its
    # measured saving, a U-Net's 8%), by one kernel; what it costs is measured, not read
    # off the ops (their bytes at the best rate one op reached had been 1.5-2x under the
    # fused kernel's time, and its fixed cost a call and a tensor left out).
    gain = calls_ns / slowdown - fused_ns
    if gain <= 0:
        return None
    return advice(facts, "single_tensor_optimizer", "optimizer runs one op per parameter",
                  evidence, gain,
                  "fused-step model: the calls' time without the profiler (the median call's, "
                  "times the calls, over the profiler's slowdown of the optimizer's calls, "
                  "median in the window / median the recorder timed outside it, else of the "
                  "step) less a fused step's at each call over the parameters the call updates "
                  "(the ops like its loop's first, their largest tensors' bytes), "
                  f"{cost.steps[optimizer].call_ns / 1e3:,.1f} µs a call + "
                  f"{cost.steps[optimizer].tensor_ns / 1e3:,.2f} µs a tensor + "
                  f"{cost.steps[optimizer].byte_ns * 1e6 / 1e3:,.2f} µs a MB of CPU time, "
                  f"{cost.source}",
                  f"torch.optim.{optimizer}(..., fused=True){need}",
                  of=(facts.wall_ns / facts.profiler_slowdown, facts.at_program_speed))


def _largest_bytes(shapes: Shapes | None) -> int:
    """The bytes of an op's largest input tensor (0 without shapes)."""
    if shapes is None or not any(shapes.dims):
        return 0
    return max(math.prod(d) for d in shapes.dims if d) * element_bytes(shapes)


def _updated(facts: Facts, calls: pa.Table, top: pa.Table) -> tuple[int, int] | None:
    """The parameters the median call updates and their bytes, from its single-tensor loop
    (`top`: its ops not nested in one another, with `detail`): the loop runs the same ops for
    each parameter, so they are as many as the ops like the loop's first (the same op, on a
    0-d tensor or not: Adam's first increments the parameter's step count, a 0-d tensor, with
    the `add_` its denominator later takes eps with), and each one's bytes are those of the
    largest tensor an op reads from its first to the next like it. None without shapes."""
    shapes = [shapes_from_args(d) for d in top.column("detail").to_pylist()]
    if not any(shapes):
        return None
    names = facts.name_texts(top)
    kinds = [(n, s is not None and s.dims[:1] == ((),)) for n, s in zip(names, shapes,
                                                                        strict=True)]
    sizes = np.array([_largest_bytes(s) for s in shapes], np.int64)
    ts, rank = col(top, "ts"), col(top, "rank")
    found = []
    for call_rank, start, dur in zip(col(calls, "rank").tolist(), col(calls, "ts").tolist(),
                                     col(calls, "dur").tolist(), strict=True):
        mine = np.flatnonzero((rank == call_rank) & (ts >= start) & (ts < start + dur))
        if len(mine):
            firsts = np.flatnonzero([kinds[i] == kinds[mine[0]] for i in mine.tolist()])
            found.append((len(firsts), int(np.maximum.reduceat(sizes[mine], firsts).sum())))
    if not found:
        return None
    tensors, parameter_bytes = np.median(np.array(found, np.float64), axis=0)
    return round(float(tensors)), round(float(parameter_bytes))


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
