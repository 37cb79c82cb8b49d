"""Point-to-point transfers: a CPU process group's sends paired with the receives they fed.

gloo records a send or a receive (dist.send and dist.recv, isend and irecv: a pipeline's
activations and gradients between its stages) as the call that queues it, `c10d::send` or
`c10d::recv_`, whose scalar arguments (`Concrete Inputs`, recorded with the shapes) are the
peer's rank and the tag, and a range frame.HOST_P2P (`gloo:recv`) on the same thread from when
that call queued it until it completed (a blocking recv: the call returns at once and the range
is its wait, the thread doing nothing else; an irecv: the range runs on over the thread's own
work until wait() returns). Between two ranks, a tag's sends are its receives in order (gloo
delivers one pair's messages of a tag in order), each receive the next send that started before
it completed: a send that started later is a later receive's (the ranks' traces may begin at
different messages), and a receive it leaves unpaired fed by a send outside the trace. A receive
whose thread had blocked, no work of its own left until the completion, before its send was
issued waited for the sender: its completion is a hand-over from the sending rank
(critical_path), as a collective's end is from the rank that entered it last. A thread still at
its own work when the send was issued (an irecv, then compute, then wait) decided the time
itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import msgspec
import numpy as np

from perfswarm.analyze.frame import Events, detail_of, group_rows
from perfswarm.analyze.stragglers import Peer, occurrences
from perfswarm.trace.store import Run

SEND: Final = "c10d::send"
RECV: Final = "c10d::recv_"
RECEIVED: Final = "gloo:recv"

# (sending rank, receiving rank, tag, n-th of them)
Transfer = tuple[int, int, int, int]
# a rank's transfers: each send's (its call's row, start), each receive's (the row of its
# completion, gloo's range; when its thread blocked: the end of its last own work before the
# completion, its call's start where none; the completion)
RankTransfers = tuple[dict[Transfer, tuple[int, int]], dict[Transfer, tuple[int, int, int]]]


class _Fields(msgspec.Struct):
    concrete: Any = msgspec.field(default=None, name="Concrete Inputs")


_FIELDS: Final = msgspec.json.Decoder(_Fields)


def rank_transfers(run: Run, ev: Events, rank: int) -> RankTransfers:
    """`rank`'s sends and receives whose call names its peer (a trace recorded with shapes),
    a receive where gloo's range says when it completed (the first `gloo:recv` on its thread
    that starts after its call does); its thread's own work: its ops that started after the
    call, not gloo's ranges nor the calls."""
    rows = np.arange(len(ev))[ev.rank_slice(rank)]
    codes = {n: i for i, n in enumerate(ev.names) if n in (SEND, RECV, RECEIVED)}
    if SEND not in codes and RECV not in codes:
        return {}, {}
    calls = rows[np.isin(ev.name[rows], [codes.get(SEND, -1), codes.get(RECV, -1)])
                 & ev.of_kind("cpu_op")[rows]]
    calls = calls[np.argsort(ev.ts[calls], kind="stable")]
    peer, tag = [], []
    for text in detail_of(run, calls, rank if len(ev.ranks) == 1 else None):
        concrete = _FIELDS.decode(text).concrete
        try:
            peer.append(int(concrete[2]))
            tag.append(int(concrete[3]))
        except (TypeError, IndexError, ValueError):
            peer.append(-1)
            tag.append(-1)
    sending = ev.name[calls] == codes.get(SEND, -1)
    src = np.where(sending, rank, peer)
    dst = np.where(sending, peer, rank)
    named = np.asarray(peer) >= 0
    # the n-th of each (direction, peer, tag)
    keys = (np.asarray(peer) * 2 + sending) * (1 << 31) + np.asarray(tag)
    nth = occurrences(keys)
    done = rows[(ev.name[rows] == codes.get(RECEIVED, -1)) & ev.host_collective[rows]]
    done = done[np.argsort(ev.ts[done], kind="stable")]
    own = rows[ev.host_busy[rows] & ~ev.host_collective[rows]
               & ~np.isin(ev.name[rows], [codes.get(SEND, -1), codes.get(RECV, -1)])]
    # each thread's own work in start order: (starts, ends)
    own = own[np.argsort(ev.ts[own], kind="stable")]
    work = {tid: (ev.ts[r], ev.end[r]) for tid, r in group_rows(ev.tid[own], own).items()}
    sent: dict[Transfer, tuple[int, int]] = {}
    received: dict[Transfer, tuple[int, int, int]] = {}
    for i, row in enumerate(calls.tolist()):
        if not named[i]:
            continue
        key = (int(src[i]), int(dst[i]), tag[i], int(nth[i]))
        if sending[i]:
            sent[key] = (row, int(ev.ts[row]))
            continue
        mine = done[ev.tid[done] == ev.tid[row]]
        at = int(np.searchsorted(ev.ts[mine], ev.ts[row]))
        if at < len(mine):
            completion, posted = int(mine[at]), int(ev.ts[row])
            end = int(ev.end[completion])
            starts, ends = work.get(int(ev.tid[row]), (ev.ts[:0], ev.end[:0]))
            inside = ends[np.searchsorted(starts, posted, side="right"):
                          np.searchsorted(starts, end, side="left")]
            received[key] = (completion, max(posted, int(inside.max(initial=posted))), end)
    return sent, received


def hand_overs(per_rank: Mapping[int, RankTransfers]) -> dict[int, dict[int, Peer]]:
    """rank -> the completion row of each of its receives that waited for its send (its thread
    blocked before the send was issued) -> that send: (its rank, its call's row, its start)."""
    sends: dict[tuple[int, int, int], list[tuple[int, int, int]]] = {}
    for sent, _ in per_rank.values():
        for (src, dst, tag, nth), (row, start) in sent.items():
            sends.setdefault((src, dst, tag), []).append((nth, row, start))
    out: dict[int, dict[int, Peer]] = {rank: {} for rank in per_rank}
    for rank, (_, received) in per_rank.items():
        pending: dict[tuple[int, int, int], list[tuple[int, int, int]]] = {}
        for key in sorted(received):
            pending.setdefault(key[:3], []).append(received[key])
        for pair, receives in pending.items():
            queue = sorted(sends.get(pair, []))
            at = 0
            for row, blocked, completed in receives:
                if at < len(queue) and queue[at][2] < completed:
                    _, call, start = queue[at]
                    at += 1
                    if start > blocked:
                        out[rank][row] = (pair[0], call, start)
    return out
