"""Diff of two runs (or two ranks): ops and kernels aligned by name, steps by position.

Each side's time per (kind, name) is compared in total and, when both sides have
iterations, per iteration (total over the iterations / their count), so a run
with more steps does not look slower just for being longer. Largest regression first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from perfswarm.analyze.frame import Events
from perfswarm.analyze.iterations import StepWindow
from perfswarm.trace.schema import KINDS

COMPARED_KINDS = ("cpu_op", "user_annotation", "runtime", "driver", "kernel", "collective",
                  "memcpy", "memset")
TOP = 30


@dataclass(frozen=True)
class OpDelta:
    kind: str
    name: str
    a_count: int
    b_count: int
    a_ns: int
    b_ns: int
    per_iteration_delta_ns: float | None

    @property
    def delta_ns(self) -> int:
        return self.b_ns - self.a_ns

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "a_count": self.a_count,
                "b_count": self.b_count, "a_ns": self.a_ns, "b_ns": self.b_ns,
                "delta_ns": self.delta_ns,
                "per_iteration_delta_ns": self.per_iteration_delta_ns}


@dataclass(frozen=True)
class StepDelta:
    index: int
    a_step: int
    b_step: int
    a_ns: int
    b_ns: int

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "a_step": self.a_step, "b_step": self.b_step,
                "a_ns": self.a_ns, "b_ns": self.b_ns, "delta_ns": self.b_ns - self.a_ns}


@dataclass(frozen=True)
class RunDiff:
    a_span_ns: int
    b_span_ns: int
    steps: tuple[StepDelta, ...]
    ops: tuple[OpDelta, ...]  # largest regression (b slower) first
    only_a: tuple[tuple[str, str], ...]  # (kind, name) pairs present on one side only, sorted
    only_b: tuple[tuple[str, str], ...]

    def to_dict(self) -> dict[str, Any]:
        return {"a_span_ns": self.a_span_ns, "b_span_ns": self.b_span_ns,
                "span_delta_ns": self.b_span_ns - self.a_span_ns,
                "steps": [s.to_dict() for s in self.steps], "ops": [o.to_dict() for o in self.ops],
                "only_a": [{"kind": k, "name": n} for k, n in self.only_a],
                "only_b": [{"kind": k, "name": n} for k, n in self.only_b]}


def totals(ev: Events) -> dict[tuple[str, str], tuple[int, int, int]]:
    """(kind, name) -> (count, total ns, ns inside steps) over the compared kinds."""
    rows = np.flatnonzero(ev.of_kind(*COMPARED_KINDS) & ~ev.is_step_marker)
    key = ev.kind[rows] * (len(ev.names) + 1) + ev.name[rows]
    uniq, inv = np.unique(key, return_inverse=True)
    count = np.bincount(inv, minlength=len(uniq))
    total = np.bincount(inv, weights=ev.dur[rows], minlength=len(uniq))
    stepped = np.bincount(inv, weights=np.where(ev.step[rows] >= 0, ev.dur[rows], 0),
                          minlength=len(uniq))
    out = {}
    for k, c, t, s in zip(uniq.tolist(), count.tolist(), total.tolist(), stepped.tolist(),
                          strict=True):
        kind, name = divmod(k, len(ev.names) + 1)
        out[(KINDS[kind], ev.names[name])] = (c, int(t), int(s))
    return out


def span(ev: Events) -> int:
    busy = ev.of_kind(*COMPARED_KINDS)
    return int(ev.end[busy].max() - ev.ts[busy].min()) if busy.any() else 0


def diff(a: Events, a_steps: Sequence[StepWindow], b: Events, b_steps: Sequence[StepWindow],
         top: int | None = TOP) -> RunDiff:
    """Compare b against a; steps are each side's iterations (one rank's), in time order."""
    ta, tb = totals(a), totals(b)
    both_steps = bool(a_steps) and bool(b_steps)
    deltas = []
    for key in sorted(set(ta) | set(tb)):
        ca, na, sa = ta.get(key, (0, 0, 0))
        cb, nb, sb = tb.get(key, (0, 0, 0))
        per_it = sb / len(b_steps) - sa / len(a_steps) if both_steps else None
        deltas.append(OpDelta(key[0], key[1], ca, cb, na, nb, per_it))

    def regression(d: OpDelta) -> tuple[float, int, str, str]:
        primary = d.per_iteration_delta_ns if d.per_iteration_delta_ns is not None else 0.0
        return (-primary, -d.delta_ns, d.kind, d.name)

    deltas.sort(key=regression)
    steps = tuple(StepDelta(i, x.step, y.step, x.dur, y.dur)
                  for i, (x, y) in enumerate(zip(a_steps, b_steps, strict=False)))
    return RunDiff(span(a), span(b), steps, tuple(deltas[:top]), tuple(sorted(set(ta) - set(tb))),
                   tuple(sorted(set(tb) - set(ta))))

