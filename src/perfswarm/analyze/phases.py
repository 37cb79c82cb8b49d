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

from perfswarm.analyze.frame import Events, group_rows, lane_key
from perfswarm.analyze.intervals import I64, union

PHASES: Final = ("forward", "backward", "optimizer")
FORWARD, BACKWARD, OPTIMIZER = range(3)
SCOPES: Final = {BACKWARD: re.compile(r"^autograd::engine::evaluate_function: |Backward\d*$"),
                 OPTIMIZER: re.compile(r"^Optimizer\.")}


def phases(ev: Events, rows: I64) -> I64:
    """The phase (an index into PHASES) of each event at `rows`: backward where an autograd
    node's span is around its start on its thread, else optimizer where an optimizer call's
    is, else forward."""
    out = np.full(len(rows), FORWARD, np.int64)
    if not len(rows):
        return out
    keys = lane_key(ev.rank, ev.tid)
    for phase in (OPTIMIZER, BACKWARD):  # backward last: an autograd node wins
        codes = [i for i, n in enumerate(ev.names) if SCOPES[phase].search(n)]
        scopes = np.flatnonzero(np.isin(ev.name, codes) & (ev.dur > 0))
        if not len(scopes):
            continue
        by_thread = group_rows(keys[scopes], scopes)
        for key, mine in group_rows(keys[rows], np.arange(len(rows))).items():
            around = by_thread.get(key)
            if around is None:
                continue
            s, e = union(ev.ts[around], ev.end[around])
            t = ev.ts[rows[mine]]
            i = np.searchsorted(s, t, side="right") - 1
            inside = (i >= 0) & (t < e[np.maximum(i, 0)])
            out[mine[inside]] = phase
    return out
