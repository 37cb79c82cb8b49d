"""A loop over the batch's samples on the training thread: the same op once per sample."""

from __future__ import annotations

from collections import Counter
from typing import Final

import numpy as np
import numpy.typing as npt

from perfswarm.analyze.frame import Events
from perfswarm.analyze.intervals import I64
from perfswarm.analyze.phases import parameter_rows
from perfswarm.analyze.summary import analyze
from perfswarm.model.opcost import OpCost, Shapes, data_cost, shapes_from_args
from perfswarm.optimize.rules.base import Advice, advice
from perfswarm.optimize.rules.facts import Facts, col, where
from perfswarm.optimize.rules.optimizer import top_ops
from perfswarm.report.overview import run_throughput

# Fewer samples a step than this: a per-sample loop costs little against batching them.
_MIN_SAMPLES: Final = 8
# Per-sample ops and the Python between them taking less of the median step: no finding.
_MIN_SHARE: Final = 0.05
# An op moving this much streams at the machine's rate, its call's own cost aside.
_LARGE_BYTES: Final = 1 << 20
_SHOWN: Final = 3  # op groups named in the evidence


def per_sample_ops(facts: Facts) -> Advice | None:
    """The loop thread runs the same op once for each sample of its batch (augmentation on
    the main thread, one observation at a time through a policy): ops at the top of the
    thread (not inside another op) whose calls per profiled step are the same whole multiple
    of the batch in every step, on one sample: an input with a leading 1 ([1, 4]) or the
    shape of a batched tensor's rows ([3, 32, 32] of an input [64, 3, 32, 32] in the steps),
    not the batch's own. Each such call pays the op's whole fixed cost (dispatch, allocation,
    the profiler's record) for a sample's bytes; batched, one call per multiple moves them
    all at the median rate of the step's large streaming ops."""
    ev = Events.load(facts.run)
    windows = analyze(facts.run).iterations.steps
    rates = run_throughput(facts.run)
    if rates is None or not rates["same_batch"] or rates["samples_per_step"] is None:
        return None
    batch, rank = rates["samples_per_step"], int(rates["rank"])
    # the steps advice measures: a first one that times the profiler's start aside
    usual = [w for w in windows.get(rank, ()) if (rank, w.step) not in facts.set_aside]
    loop, steps = facts.loop_threads.get(rank), len(usual)
    if batch < _MIN_SAMPLES or batch != int(batch) or loop is None or steps == 0:
        return None
    ops = facts.in_window(facts.kind("cpu_op"))
    ops = where(ops, (col(ops, "rank") == rank) & (col(ops, "tid") == loop[1]))
    top = facts.with_text(top_ops(ops), "detail")
    shapes = [shapes_from_args(d) for d in top.column("detail").to_pylist()]
    # the ops that take the parameters (a single-tensor optimizer's per-parameter updates,
    # one a layer: 16 layers at batch 8 or 16 had read as once per sample)
    ran = col(top, "row")
    updates = np.isin(ran, parameter_rows(ev, ran))
    names = facts.name_texts(top)
    groups = _groups(names, np.asarray(col(top, "step"), np.int64), shapes, int(batch), steps,
                     updates)
    if not groups:
        return None
    ns = np.asarray(col(top, "dur"), np.int64)
    rate = _streaming_rate(names, shapes, ns)
    batched = 0.0
    found = []
    for (name, dims), rows in groups.items():
        calls = len(rows) // (int(batch) * steps)  # a batched call for each multiple, a step
        cost = _cost(name, shapes[rows[0]])
        batched += steps * calls * int(ns[rows].min()) + (
            len(rows) * cost.bytes / rate if rate and cost is not None else 0.0)
        found.append((int(ns[rows].sum()), name, dims, len(rows) / steps))
    mine = np.zeros(top.num_rows, bool)
    mine[np.concatenate(list(groups.values()))] = True
    step_of = np.asarray(col(top, "step"), np.int64)
    ts = np.asarray(col(top, "ts"), np.int64)
    # the Python between two per-sample calls in a row: the loop's own body, each gap at
    # most the median one (a longer one does other work: an environment's step)
    between = np.flatnonzero(mine[:-1] & mine[1:] & (step_of[:-1] == step_of[1:]))
    gaps = ts[between + 1] - ts[between] - ns[between]
    gaps = np.minimum(gaps, np.median(gaps)) if len(gaps) else gaps
    # the median step's, times the steps: a step other processes held up is priced as a
    # usual one
    typical = _median_step(step_of[mine], ns[mine])
    python = _median_step(step_of[between], gaps)
    median = float(np.median([w.end - w.start for w in usual]))
    if typical + python < _MIN_SHARE * median:
        return None
    found.sort(reverse=True)
    slowdown = facts.profiler_slowdown
    evidence = {"samples_per_step": int(batch), "samples_from": rates["source"],
                "steps": steps, "op_groups": len(found),
                "calls_per_step": round(sum(f[3] for f in found)),
                "per_sample_ns": int(ns[mine].sum()),
                "median_step_ns": round(median),
                "per_sample_step_ns": round(typical),
                "python_between_step_ns": round(python),
                "batched_ns": round(batched),
                "streaming_gbps": round(rate, 2) if rate else None,
                "profiler_slowdown": round(slowdown, 3),
                **{f"top_{i + 1}": f"{name} {'x'.join(map(str, dims))}: {per:,.0f} a step, "
                                   f"{ops_ns / 1e6:,.3f} ms"
                   for i, (ops_ns, name, dims, per) in enumerate(found[:_SHOWN])}}
    return advice(facts, "per_sample_ops", "the loop runs ops once per sample of its batch",
                  evidence, (typical + python) * steps / slowdown - batched,
                  "measured, and a streaming model: the per-sample calls' time and the Python "
                  "between two in a row (the loop's body, each gap at most the median one) in "
                  "the median step, times the steps, without the profiler (over its slowdown "
                  "of the steps), less one call for each multiple of the batch (the group's "
                  "fastest) moving all their bytes at the rate the step's large streaming ops "
                  "reached (their median); their backward is not counted",
                  "run it once on the whole batch (tensor ops over [batch, ...], "
                  "torchvision.transforms.v2 on a batch, torch.vmap, vectorized environments), "
                  "or move the per-sample work into the Dataset's __getitem__ with "
                  "DataLoader(num_workers>0) so that it overlaps the step",
                  of=(facts.wall_ns / slowdown, facts.at_program_speed))


def _median_step(step: I64, ns: I64) -> float:
    """The median over the steps in `step` of the ns each holds (0: none)."""
    if len(step) == 0:
        return 0.0
    return float(np.median(np.bincount(np.unique(step, return_inverse=True)[1], weights=ns)))


def _groups(names: list[str], step_of: I64, shapes: list[Shapes | None], batch: int, steps: int,
            updates: npt.NDArray[np.bool_]) -> dict[tuple[str, tuple[int, ...]], list[int]]:
    """Rows of the ops (`names`, in profiled steps `step_of`) by (name, first input's dims) for
    the groups that run once per sample:
    a whole multiple of `batch` calls a step, on a sample's shape (see per_sample_ops); not
    the `updates` (ops that take the parameters), whose shapes are no sample's either."""
    parameters = {d for found, update in zip(shapes, updates.tolist(), strict=True)
                  if update and found is not None for d in found.dims}
    rows_of: dict[tuple[str, tuple[int, ...]], list[int]] = {}
    for i, (name, found) in enumerate(zip(names, shapes, strict=True)):
        if found is not None and found.dims and found.dims[0] and not updates[i]:
            rows_of.setdefault((name, found.dims[0]), []).append(i)
    # the rows of a batched tensor (of two or more, no parameter): a sample's shape
    rows_of_sample = {d[1:] for s in shapes if s is not None for d in s.dims
                      if len(d) >= 2 and d[0] >= 2 and d not in parameters}
    out = {}
    for key, rows in rows_of.items():
        dims = key[1]
        counts = Counter(step_of[rows].tolist())
        per_step = set(counts.values())
        if len(counts) != steps or len(per_step) != 1:
            continue
        calls = per_step.pop()
        if calls % batch or batch in dims[:1]:
            continue
        if dims[0] == 1 or dims in rows_of_sample:
            out[key] = rows
    return out


def _cost(name: str, shapes: Shapes | None) -> OpCost | None:
    return None if shapes is None else data_cost(name, shapes)


def _streaming_rate(names: list[str], shapes: list[Shapes | None], ns: I64) -> float:
    """Bytes per ns of the median op that streams (at most a FLOP a byte) at least
    _LARGE_BYTES (0: none): what a batched elementwise op reaches here, where the best is a fill
    in the cache and a convolution's rate is its FLOPs'."""
    rates = [cost.bytes / dur for name, found, dur in zip(names, shapes, ns.tolist(), strict=True)
             if (cost := _cost(name, found)) is not None and cost.bytes >= _LARGE_BYTES
             and cost.flops <= cost.bytes and dur > 0]
    return float(np.median(rates)) if rates else 0.0
