"""Nesting of the events of a thread: each event's innermost enclosing event, for every thread
at once, without a per-event Python loop.

The one definition, as a sweep would make it: events of a lane (a thread, a stream) taken by
start, a stack of the open ones, popped while the top one ended by the next start; what is left
on top encloses the next event. `open_before` gives the same answer directly: the nearest
earlier event of the lane whose end is past the start. An earlier event j with end_j > start_i
is never popped before i (every start before i's is at most start_i), and each event pushed
after the nearest such j ended by start_i, so the sweep pops exactly down to that j.
"""

from __future__ import annotations

import numpy as np

from perfswarm.analyze.frame import I64

LOWEST = np.iinfo(np.int64).min  # an end no start is ever past


def open_before(lane: I64, start: I64, end: I64) -> I64:
    """For events ordered by lane, then start (ties as the caller wants them), the index of
    each one's innermost enclosing event: the nearest earlier event of its lane with an end
    past its start; -1 for none.

    A max tree over the ends: each event climbs from its predecessor's leaf to the first
    left sibling holding an end past its start, then descends to that sibling's last such
    leaf (all events at once, one tree level per step)."""
    n = len(start)
    if n < 2:
        return np.full(n, -1, np.int64)
    size = 1 << (n - 1).bit_length()
    tree = np.full(2 * size, LOWEST, np.int64)
    tree[size:size + n] = end
    level = size // 2
    while level:
        tree[level:2 * level] = np.maximum(tree[2 * level:4 * level:2],
                                           tree[2 * level + 1:4 * level:2])
        level //= 2
    # events 1..n-1 (event 0 has none before it); views and one array of tree nodes, no
    # more: this runs under a command's largest arrays (the prediction's graph)
    at = np.arange(size, size + n - 1, dtype=np.int64)  # each event's predecessor's leaf
    bar = start[1:]
    done = tree[at] > bar
    climbing = np.flatnonzero(~done)
    while len(climbing):
        node = at[climbing]
        sibling = ((node & 1) == 1) & (tree[node - 1] > bar[climbing])
        at[climbing] = np.where(sibling, node - 1, node >> 1)
        done[climbing[sibling]] = True
        climbing = climbing[~sibling & ((node >> 1) > 1)]  # the root has no left sibling
    descending = np.flatnonzero(done & (at < size))
    while len(descending):
        node = at[descending] * 2
        right = tree[node + 1] > bar[descending]
        at[descending] = node + right
        descending = descending[at[descending] < size]
    del tree
    at -= size  # a found event's leaf is its index
    at[~done] = 0
    done &= lane[at] == lane[1:]
    found = np.full(n, -1, np.int64)
    found[1:][done] = at[done]
    return found


def bounded_open_before(lane: I64, start: I64, end: I64) -> tuple[I64, I64]:
    """`open_before` for a sweep that cuts an event sticking out of its parent at the parent's
    end (the stack's bounds then never grow towards its top): (parent, bound) per event, the
    bound the least end along its chain of parents.

    Where no event on an event's chain of (uncut) parents sticks out of its parent, the cut
    changes nothing for it: its parent is still open at its start, and every event between
    them ended by then. Only events under one that sticks out (none in the torch profiler's
    traces; a synthetic trace's jittered launch calls) are swept again, from the stack the
    event before them leaves."""
    parent = open_before(lane, start, end)
    has = np.flatnonzero(parent >= 0)
    tainted = np.zeros(len(end), bool)
    tainted[has] = end[has] > end[parent[has]]
    if not tainted.any():
        return parent, end.copy()
    up, live = parent.copy(), has
    while len(live):  # tainted: something on its chain sticks out
        tainted[live] |= tainted[up[live]]
        up[live] = parent[up[live]]
        live = live[up[live] >= 0]
    new_lane = np.ones(len(lane), bool)
    new_lane[1:] = lane[1:] != lane[:-1]
    swept = np.flatnonzero(tainted)
    opens = (new_lane | ~np.concatenate([[False], tainted[:-1]]))[swept].tolist()
    bound = end.copy()
    stack: list[tuple[int, int]] = []  # (event, bound)
    for i, s, e, fresh in zip(swept.tolist(), start[swept].tolist(), end[swept].tolist(),
                              opens, strict=True):
        if fresh:  # the chain the clean event before leaves open (its bounds its ends)
            stack = []
            above = -1 if new_lane[i] else i - 1
            while above >= 0:
                stack.append((above, int(end[above])))
                above = int(parent[above])
            stack.reverse()
        while stack and stack[-1][1] <= s:
            stack.pop()
        parent[i], bound[i] = (stack[-1][0], min(e, stack[-1][1])) if stack else (-1, e)
        stack.append((i, int(bound[i])))
    return parent, bound


def depth(parent: I64) -> I64:
    """How many events enclose each one (its chain of parents' length)."""
    out = np.zeros(len(parent), np.int64)
    live, up = np.flatnonzero(parent >= 0), parent.copy()
    while len(live):
        out[live] += 1
        up[live] = parent[up[live]]
        live = live[up[live] >= 0]
    return out


def subtree_ends(parent: I64) -> I64:
    """For events in nesting order, where each one's subtree ends: the first later event
    not inside it (the length for none). A subtree is the events after it that are deeper."""
    deep = depth(parent)
    n = len(parent)
    # the nearest later event no deeper: by open_before on the reversed order (-depth > -d - 1)
    back = open_before(np.zeros(n, np.int64), -deep[::-1] - 1, -deep[::-1])
    return np.where(back >= 0, n - 1 - back, n)[::-1].copy()


def roots(parent: I64) -> I64:
    """Each event's outermost enclosing event (itself when none encloses it)."""
    out = np.arange(len(parent), dtype=np.int64)
    live = np.flatnonzero(parent >= 0)
    while len(live):
        out[live] = parent[out[live]]
        live = live[parent[out[live]] >= 0]
    return out
