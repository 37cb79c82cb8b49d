"""Time by aten op and by user annotation (nn.Module / record_function ranges), self and total,
on the CPU and on the device.

On each host thread the events nest: an op's parent is the innermost event around it
(ties in start: the longer one encloses). CPU total is an op's duration; CPU self is
what its children leave of it. A device op belongs to the runtime call that launched
it (joined by correlation): its time is the device self time of the innermost op
around that call and the device total time of every op and annotation around it.
Names are summed over ranks; step markers are left out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from perfswarm.analyze.frame import I64, KIND, Events, lane_key
from perfswarm.analyze.launch import launch_pairs
from perfswarm.analyze.nesting import open_before

TOP: Final = 20


@dataclass(frozen=True)
class Scope:
    name: str
    count: int
    cpu_total_ns: int
    cpu_self_ns: int
    device_total_ns: int
    device_self_ns: int

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "count": self.count, "cpu_total_ns": self.cpu_total_ns,
                "cpu_self_ns": self.cpu_self_ns, "device_total_ns": self.device_total_ns,
                "device_self_ns": self.device_self_ns}


@dataclass(frozen=True)
class Scopes:
    """Every op and annotation name, most CPU time first; `to_dict` keeps the TOP of each
    (the report's CPU-op table ranks all of them by self time)."""

    ops: tuple[Scope, ...]  # aten and other CPU ops
    annotations: tuple[Scope, ...]  # user annotations

    def to_dict(self) -> dict[str, Any]:
        return {"ops": [s.to_dict() for s in self.ops[:TOP]],
                "annotations": [s.to_dict() for s in self.annotations[:TOP]]}

    @classmethod
    def merge(cls, parts: Sequence[Scopes]) -> Scopes:
        """Ranks' scopes summed by name."""
        return cls(_ranked([s for p in parts for s in p.ops]),
                   _ranked([s for p in parts for s in p.annotations]))


def _ranked(scopes: Sequence[Scope]) -> tuple[Scope, ...]:
    by_name: dict[str, Scope] = {}
    for s in scopes:
        o = by_name.get(s.name)
        by_name[s.name] = s if o is None else Scope(
            s.name, o.count + s.count, o.cpu_total_ns + s.cpu_total_ns,
            o.cpu_self_ns + s.cpu_self_ns, o.device_total_ns + s.device_total_ns,
            o.device_self_ns + s.device_self_ns)
    return tuple(sorted(by_name.values(), key=lambda s: (-s.cpu_total_ns, s.name)))


def parents(ev: Events, rows: I64) -> I64:
    """For each event row, the row of the innermost event of `rows` on its thread around it
    (-1: none); rows outside `rows` get -1."""
    parent = np.full(len(ev), -1, np.int64)
    order = rows[np.lexsort((-ev.dur[rows], ev.ts[rows], ev.tid[rows], ev.rank[rows]))]
    found = open_before(lane_key(ev.rank[order], ev.tid[order]), ev.ts[order], ev.end[order])
    parent[order] = np.where(found >= 0, order[found], -1)
    return parent


def _scopes(ev: Events, rows: I64, cpu_self: I64, dev_self: I64, dev_total: I64
            ) -> tuple[Scope, ...]:
    if len(rows) == 0:
        return ()
    uniq, inverse = np.unique(ev.name[rows], return_inverse=True)

    def by_name(values: I64) -> list[int]:
        return [int(x) for x in np.bincount(inverse, weights=values, minlength=len(uniq))]

    count = np.bincount(inverse, minlength=len(uniq)).tolist()
    cpu, own, dev, dev_own = (by_name(v[rows]) for v in (ev.dur, cpu_self, dev_total,
                                                         dev_self))
    return _ranked([Scope(ev.names[int(n)], count[i], cpu[i], own[i], dev[i], dev_own[i])
                    for i, n in enumerate(uniq.tolist())])


@dataclass(frozen=True, eq=False)
class HostCalls:
    """The one definition of a call on a host thread, shared by every table of time by op,
    shape, module or annotation: each cpu_op, user_annotation, python_function, runtime and
    driver event, step markers left out and zero-length ones kept (Kineto writes a call
    under its time unit as dur 0: it is still a call)."""

    rows: I64  # the calls' event rows
    parent: I64  # per event row: the innermost call around it on its thread, -1 none
    cpu_self: I64  # per event row: its duration less its direct children's, at least 0

    def of_kind(self, ev: Events, kind: str) -> I64:
        """The calls of one kind (`cpu_op`: the op calls)."""
        rows: I64 = self.rows[ev.kind[self.rows] == KIND[kind]]
        return rows

    def around(self, row: int) -> list[int]:
        """The calls around `row`, innermost first."""
        out, p = [], int(self.parent[row])
        while p >= 0:
            out.append(p)
            p = int(self.parent[p])
        return out


def host_calls(ev: Events) -> HostCalls:
    """The host calls of `ev` with their nesting and CPU self time, derived once per Events
    (analyze's scopes and the report's views by op, shape and module read the same)."""
    return ev.derived("host calls", lambda: _host_calls(ev))


def _host_calls(ev: Events) -> HostCalls:
    rows = np.flatnonzero(ev.of_kind("cpu_op", "user_annotation", "python_function", "runtime",
                                     "driver") & ~ev.is_step_marker)
    parent = parents(ev, rows)
    children = np.zeros(len(ev), np.int64)
    has = rows[parent[rows] >= 0]
    np.add.at(children, parent[has], ev.dur[has])
    return HostCalls(rows, parent, np.maximum(ev.dur - children, 0))


def scopes(ev: Events) -> Scopes:
    """The ops and annotations of `ev`, most CPU time first."""
    calls = host_calls(ev)
    parent = calls.parent
    dev, launches = launch_pairs(ev)
    dev_self = np.zeros(len(ev), np.int64)
    dev_total = np.zeros(len(ev), np.int64)
    innermost = parent[launches]
    known = innermost >= 0
    np.add.at(dev_self, innermost[known], ev.dur[dev][known])
    at, dur = innermost[known], ev.dur[dev][known]
    while len(at):  # up the chain of enclosing events, all at once per level
        np.add.at(dev_total, at, dur)
        up = parent[at]
        at, dur = up[up >= 0], dur[up >= 0]
    return Scopes(_scopes(ev, calls.of_kind(ev, "cpu_op"), calls.cpu_self, dev_self, dev_total),
                  _scopes(ev, calls.of_kind(ev, "user_annotation"), calls.cpu_self, dev_self,
                          dev_total))
