"""analyze.nesting: the innermost enclosing event, vectorized, against the sweep it stands for."""

from __future__ import annotations

import tracemalloc

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import events
from perfswarm.analyze.dependencies import enclosing_ops, enclosing_rows
from perfswarm.analyze.frame import Events
from perfswarm.analyze.nesting import bounded_open_before, open_before

# (lane, start, duration): small ranges, so ties, zero-length events, events ending where the
# next starts and children sticking out of their parents are all frequent
EVENTS = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 40), st.integers(0, 15)),
                  max_size=120)


def sweep(lane: list[int], start: list[int], end: list[int]) -> list[int]:
    """The definition: a stack of the open events of a lane, popped while the top one ended
    by the next start; what is left on top encloses the next event."""
    out: list[int] = []
    stack: list[int] = []
    current = None
    for i, (ln, s) in enumerate(zip(lane, start, strict=True)):
        if ln != current:
            current, stack = ln, []
        while stack and end[stack[-1]] <= s:
            stack.pop()
        out.append(stack[-1] if stack else -1)
        stack.append(i)
    return out


@settings(max_examples=400, deadline=None)
@given(EVENTS)
def test_open_before_is_the_sweep(events: list[tuple[int, int, int]]) -> None:
    arr = np.array(events, np.int64).reshape(-1, 3)
    lane, start, dur = arr[:, 0], arr[:, 1], arr[:, 2]
    order = np.lexsort((-dur, start, lane))  # by lane, then start, longer first
    lane, start, end = lane[order], start[order], (start + dur)[order]
    assert open_before(lane, start, end).tolist() == sweep(lane.tolist(), start.tolist(),
                                                           end.tolist())


def test_open_before_by_hand() -> None:
    # lane 0: A [0, 10) holds B [2, 5) and C [5, 12) (C sticks out); D [11, 13) is inside C
    # only; lane 1 starts afresh though its event lies inside A's time
    lane = np.array([0, 0, 0, 0, 1], np.int64)
    start = np.array([0, 2, 5, 11, 3], np.int64)
    end = np.array([10, 5, 12, 13, 4], np.int64)
    assert open_before(lane, start, end).tolist() == [-1, 0, 0, 2, -1]


def bounded_sweep(lane: list[int], start: list[int], end: list[int]
                  ) -> tuple[list[int], list[int]]:
    """The definition with cuts: an event is pushed with the least of its end and its
    parent's bound."""
    parent: list[int] = []
    bound: list[int] = []
    stack: list[int] = []
    current = None
    for i, (ln, s, e) in enumerate(zip(lane, start, end, strict=True)):
        if ln != current:
            current, stack = ln, []
        while stack and bound[stack[-1]] <= s:
            stack.pop()
        parent.append(stack[-1] if stack else -1)
        bound.append(min(e, bound[stack[-1]]) if stack else e)
        stack.append(i)
    return parent, bound


@settings(max_examples=400, deadline=None)
@given(EVENTS)
def test_bounded_open_before_is_the_sweep(events: list[tuple[int, int, int]]) -> None:
    arr = np.array(events, np.int64).reshape(-1, 3)
    lane, start, dur = arr[:, 0], arr[:, 1], arr[:, 2]
    order = np.lexsort((-dur, start, lane))
    lane, start, end = lane[order], start[order], (start + dur)[order]
    parent, bound = bounded_open_before(lane, start, end)
    want = bounded_sweep(lane.tolist(), start.tolist(), end.tolist())
    assert (parent.tolist(), bound.tolist()) == want


def enclosing_sweep(ev: Events, calls: np.ndarray, ops: np.ndarray) -> dict[int, int]:
    """enclosing_ops' definition: a sweep per thread with a stack of open ops."""
    rows = np.concatenate([ops, np.unique(calls)])
    is_call = np.zeros(len(rows), bool)
    is_call[len(ops):] = True
    order = np.lexsort((~is_call, -ev.end[rows], ev.ts[rows], ev.tid[rows], ev.rank[rows]))
    out: dict[int, int] = {}
    stack: list[tuple[int, int]] = []
    current = None
    for i in order.tolist():
        row, start, end = int(rows[i]), int(ev.ts[rows[i]]), int(ev.end[rows[i]])
        lane = (int(ev.rank[row]), int(ev.tid[row]))
        if lane != current:
            current, stack = lane, []
        while stack and stack[-1][1] <= start and stack[-1][1] < end:
            stack.pop()
        if not is_call[i]:
            stack.append((row, end))
        elif stack and stack[-1][1] >= end:
            out[row] = stack[-1][0]
    return out


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 2), st.integers(0, 30), st.integers(0, 10),
                          st.booleans()), max_size=80))
def test_enclosing_ops_is_the_sweep(spans: list[tuple[int, int, int, bool]]) -> None:
    # ops and calls on two threads: zero-length calls at an op's end, equal spans, ops
    # sticking out of the op under them
    ev = events([(0, ts, dur, "runtime" if call else "cpu_op", f"e{i}", tid, -1, -1, -1)
                 for i, (tid, ts, dur, call) in enumerate(spans)])
    calls = np.flatnonzero(ev.of_kind("runtime"))
    ops = np.flatnonzero(ev.of_kind("cpu_op"))
    assert enclosing_ops(ev, calls, ops) == enclosing_sweep(ev, calls, ops)
    # the arrays: the calls that lie in an op, ascending, each beside its op
    inner, outer = enclosing_rows(ev, calls, ops)
    assert inner.tolist() == sorted(enclosing_sweep(ev, calls, ops))
    assert dict(zip(inner.tolist(), outer.tolist(), strict=True)) == enclosing_sweep(ev, calls,
                                                                                     ops)


def test_enclosing_rows_sweeps_in_few_bytes_a_row() -> None:
    # 20k ops on one thread, a call inside each: every call's op is found, and the sweep's
    # arrays are freed as it goes (the prediction's launching ops sweep beside its graph):
    # 97 bytes a swept row at its peak, where holding them all to the end took 173
    n = 20_000
    ev = events([row for i in range(n) for row in (
        (0, 10 * i, 8, "cpu_op", "op", 1, -1, -1, -1),
        (0, 10 * i + 2, 2, "runtime", "call", 1, -1, -1, -1))])
    calls, ops = np.flatnonzero(ev.of_kind("runtime")), np.flatnonzero(ev.of_kind("cpu_op"))
    assert len(ev.end) == 2 * n  # (cached before the count)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        inner, outer = enclosing_rows(ev, calls, ops)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert inner.tolist() == calls.tolist() and outer.tolist() == ops.tolist()
    assert peak < 120 * 2 * n
