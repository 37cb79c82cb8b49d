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

_LOWEST = np.iinfo(np.int64).min


def open_before(lane: I64, start: I64, end: I64) -> I64:
    """For events ordered by lane, then start (ties as the caller wants them), the index of
    each one's innermost enclosing event: the nearest earlier event of its lane with an end
    past its start; -1 for none.

    A max tree over the ends: each event climbs from its predecessor's leaf to the first
    left sibling holding an end past its start, then descends to that sibling's last such
    leaf (all events at once, one tree level per step)."""
    n = len(start)
    found = np.full(n, -1, np.int64)
    if n < 2:
        return found
    size = 1 << (n - 1).bit_length()
    tree = np.full(2 * size, _LOWEST, np.int64)
    tree[size:size + n] = end
    level = size // 2
    while level:
        tree[level:2 * level] = np.maximum(tree[2 * level:4 * level:2],
                                           tree[2 * level + 1:4 * level:2])
        level //= 2
    query = np.arange(1, n, dtype=np.int64)
    at = size + query - 1  # each event's predecessor's leaf
    bar = start[query]
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
    leaf = np.where(done, at - size, -1)
    same_lane = (leaf >= 0) & (lane[np.maximum(leaf, 0)] == lane[query])
    found[query] = np.where(same_lane, leaf, -1)
    return found
