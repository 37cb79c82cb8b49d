"""analyze.nesting: the innermost enclosing event, vectorized, against the sweep it stands for."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

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
