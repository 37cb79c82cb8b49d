"""Which pass of a training step each event ran in: forward, backward or optimizer.

PyTorch's profiler brackets each autograd node it runs (`autograd::engine::evaluate_function:
MmBackward0`, and the node `MmBackward0` inside it) and each optimizer call
(`Optimizer.step#AdamW.step`, `Optimizer.zero_grad#...`); an event inside one of those spans
on its thread ran in that pass. Everything else in a step (data loading, the forward and the
loss) is `forward`: the work a model FLOPs count is made of. Activation recomputation runs
forward ops inside backward nodes, so it is counted as backward work, as it should be for
hardware FLOPs and not for model FLOPs.
"""

from __future__ import annotations

import re
from typing import Final

import numpy as np

from perfswarm.analyze.dependencies import enclosing_rows
from perfswarm.analyze.frame import Events, Mask, lane_key
from perfswarm.analyze.intervals import I64

PHASES: Final = ("forward", "backward", "optimizer")
FORWARD, BACKWARD, OPTIMIZER = range(3)
SCOPES: Final = {BACKWARD: re.compile(r"^autograd::engine::evaluate_function: |Backward\d*$"),
                 OPTIMIZER: re.compile(r"^Optimizer\.")}


def scopes(ev: Events, phase: int) -> I64:
    """Rows of the spans that bracket `phase` (autograd nodes, optimizer calls), ascending."""
    def make() -> I64:
        codes = [i for i, n in enumerate(ev.names) if SCOPES[phase].search(n)]
        return np.flatnonzero(np.isin(ev.name, codes) & (ev.dur > 0))
    return ev.derived(("phase scopes", phase), make)


STEP_CALL: Final = re.compile(r"^Optimizer\.step#")  # an optimizer's step(), not zero_grad()


def step_calls(ev: Events) -> I64:
    """Rows of the optimizers' step() calls, ascending."""
    calls = scopes(ev, OPTIMIZER)
    return calls[np.isin(ev.name[calls],
                         [i for i, n in enumerate(ev.names) if STEP_CALL.match(n)])]


def nested(ev: Events, calls: I64, inner: bool) -> Mask:
    """Which of `calls` (rows) lie in an earlier one of them on their thread (`inner` False:
    the rest are the outermost, what the recorder times), or hold a later one (`inner` True:
    the rest are the innermost, the optimizers that update: a wrapper's step() holds its inner
    optimizer's)."""
    if not len(calls):
        return np.zeros(0, bool)
    key = lane_key(ev.rank[calls], ev.tid[calls])
    order = np.lexsort((ev.ts[calls], key))
    key, ts, end = key[order], ev.ts[calls][order], ev.end[calls][order]
    same = np.concatenate(([False], key[1:] == key[:-1]))  # the call before is its thread's
    if inner:
        hit = np.append(same[1:] & (ts[1:] < end[:-1]), False)
    else:
        hit = np.zeros(len(calls), bool)
        for lane in np.split(np.arange(len(calls)), np.flatnonzero(~same)[1:]):
            before = np.maximum.accumulate(end[lane])
            hit[lane[1:]] = end[lane[1:]] <= before[:-1]
    out = np.empty(len(calls), bool)
    out[order] = hit
    return out


def optimizer_calls(ev: Events) -> tuple[I64, I64]:
    """The optimizer calls' rows (ascending) and where each one's own work starts."""
    return ev.derived(("optimizer calls",), lambda: (
        scopes(ev, OPTIMIZER), own_starts(ev, scopes(ev, OPTIMIZER))))


def own_starts(ev: Events, calls: I64) -> I64:
    """Where each optimizer call at `calls` (rows) starts its own work: after the last
    autograd node that ran within it on its rank, else at its start. A closure passed to
    step() (LBFGS, Lightning's training loop, `optimizer.step(closure)`) runs the forward and
    the backward inside the call; the update follows it."""
    out = ev.ts[calls].copy()
    nodes = scopes(ev, BACKWARD)
    for rank in np.unique(ev.rank[calls]).tolist() if len(nodes) else ():
        mine = nodes[ev.rank[nodes] == rank]
        mine = mine[np.argsort(ev.ts[mine], kind="stable")]
        for i in np.flatnonzero(ev.rank[calls] == rank).tolist():
            lo, hi = int(ev.ts[calls[i]]), int(ev.end[calls[i]])
            within = mine[int(np.searchsorted(ev.ts[mine], lo)):
                          int(np.searchsorted(ev.ts[mine], hi))]
            ends = ev.end[within][ev.end[within] <= hi]
            if len(ends):
                out[i] = ends.max()
    return out


def phases(ev: Events, rows: I64) -> I64:
    """The phase (an index into PHASES) of each event at `rows`: backward where it is an
    autograd node's span or lies in one on its thread (dependencies.enclosing_rows: the one
    nesting sweep), else optimizer where it is or lies in an optimizer call's own work (after
    the closure passed to it, which is forward and backward: own_starts), else forward."""
    out = np.full(len(rows), FORWARD, np.int64)
    if not len(rows):
        return out
    for phase in (OPTIMIZER, BACKWARD):  # backward last: an autograd node wins
        spans = scopes(ev, phase)
        if not len(spans):
            continue
        found, call = enclosing_rows(ev, rows, spans)
        if phase == OPTIMIZER:  # not the closure's: before its call's own work
            found = found[ev.ts[found] >= optimizer_calls(ev)[1][np.searchsorted(spans, call)]]
        out[np.isin(rows, found) | np.isin(rows, spans)] = phase
    return out


# the spans whose ops take the tensors the optimizer updates and gradients accumulate into
PARAMETER_SCOPES: Final = ("Optimizer.", "torch::autograd::AccumulateGrad",
                           "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad")


def parameter_rows(ev: Events, rows: I64) -> I64:
    """Of `rows`, the ops that take the parameters (the tensors the optimizer updates and
    gradients accumulate into), ascending: those in an optimizer call's own work and in a
    gradient's accumulation, not a closure's (a closure passed to step() runs the forward and
    the backward there, on activations), and the spans themselves."""
    spans = np.flatnonzero(np.isin(ev.name, [i for i, n in enumerate(ev.names)
                                             if n.startswith(PARAMETER_SCOPES)]))
    inner, outer = enclosing_rows(ev, rows, spans)
    by_optimizer = np.isin(outer, optimizer_calls(ev)[0])
    inner = inner[~by_optimizer | (phases(ev, inner) == OPTIMIZER)]
    return np.union1d(inner, rows[np.isin(rows, spans)])
