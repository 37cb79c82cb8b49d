"""Point-to-point transfers: a CPU process group's sends paired with the receives they fed.

gloo records a send or a receive (dist.send and dist.recv, isend and irecv: a pipeline's
activations and gradients between its stages) as the call that queues it, `c10d::send` or
`c10d::recv_`, whose scalar arguments (`Concrete Inputs`, recorded with the shapes) are the
peer's rank and the tag, and a range frame.HOST_P2P (`gloo:recv`) on the same thread from when
that call queued it until it completed. Between two ranks, the n-th send of a tag is the n-th
receive of that tag (gloo delivers one pair's messages of a tag in order). A receive posted
before its send was issued waited for the sender: its completion is a hand-over from the
sending rank (critical_path), as a collective's end is from the rank that entered it last.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import msgspec
import numpy as np

from perfswarm.analyze.frame import Events, detail_of
from perfswarm.analyze.stragglers import Peer, occurrences
from perfswarm.trace.store import Run

SEND: Final = "c10d::send"
RECV: Final = "c10d::recv_"
RECEIVED: Final = "gloo:recv"

# (sending rank, receiving rank, tag, n-th of them)
Transfer = tuple[int, int, int, int]
# a rank's transfers: each send's (its call's row, start), each receive's (the row of its
# completion, gloo's range, and its call's start)
RankTransfers = tuple[dict[Transfer, tuple[int, int]], dict[Transfer, tuple[int, int]]]


class _Fields(msgspec.Struct):
    concrete: Any = msgspec.field(default=None, name="Concrete Inputs")


_FIELDS: Final = msgspec.json.Decoder(_Fields)


def rank_transfers(run: Run, ev: Events, rank: int) -> RankTransfers:
    """`rank`'s sends and receives whose call names its peer (a trace recorded with shapes),
    a receive where gloo's range says when it completed (the first `gloo:recv` on its thread
    that starts after its call does)."""
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
    sent: dict[Transfer, tuple[int, int]] = {}
    received: dict[Transfer, tuple[int, int]] = {}
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
            received[key] = (int(mine[at]), int(ev.ts[row]))
    return sent, received


def hand_overs(per_rank: Mapping[int, RankTransfers]) -> dict[int, dict[int, Peer]]:
    """rank -> the completion row of each of its receives that waited for its send (posted
    before the send was issued) -> that send: (its rank, its call's row, its start)."""
    out: dict[int, dict[int, Peer]] = {rank: {} for rank in per_rank}
    for rank, (_, received) in per_rank.items():
        for key, (row, posted) in received.items():
            found = per_rank.get(key[0], ({}, {}))[0].get(key)
            if found is not None and found[1] > posted:
                out[rank][row] = (key[0], *found)
    return out
