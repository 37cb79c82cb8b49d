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

from perfswarm.analyze.dependencies import enclosing_ops
from perfswarm.analyze.frame import Events
from perfswarm.analyze.intervals import I64

PHASES: Final = ("forward", "backward", "optimizer")
FORWARD, BACKWARD, OPTIMIZER = range(3)
SCOPES: Final = {BACKWARD: re.compile(r"^autograd::engine::evaluate_function: |Backward\d*$"),
                 OPTIMIZER: re.compile(r"^Optimizer\.")}


def phases(ev: Events, rows: I64) -> I64:
    """The phase (an index into PHASES) of each event at `rows`: backward where it is an
    autograd node's span or lies in one on its thread (dependencies.enclosing_ops: the one
    nesting sweep), else optimizer where it is or lies in an optimizer call's, else forward."""
    out = np.full(len(rows), FORWARD, np.int64)
    if not len(rows):
        return out
    for phase in (OPTIMIZER, BACKWARD):  # backward last: an autograd node wins
        codes = [i for i, n in enumerate(ev.names) if SCOPES[phase].search(n)]
        scopes = np.flatnonzero(np.isin(ev.name, codes) & (ev.dur > 0))
        if not len(scopes):
            continue
        inside = enclosing_ops(ev, rows, scopes)
        out[np.isin(rows, np.fromiter(inside, np.int64, len(inside))) | np.isin(rows, scopes)] = (
            phase)
    return out
