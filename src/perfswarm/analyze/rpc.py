"""torch.distributed.rpc: each request paired with the work it asked of another process.

Nothing in a Kineto trace pairs a request with its callee's work (torch names requests only
under its legacy profiler). The recorder (recorder/inject/sitecustomize.py) names them in every
process it profiles, as torch's profiler key does: each request sent in the window is a range
on the sending thread from the send to the reply's arrival (`rpc_sync#FUNC(CALLER -> CALLEE)`,
`rpc_async#...`; torch's own `rpc_async_jit#...` of a TorchScript request, which reached the
trace for 1 request of 10, is not read), and each Python function
run for a request a range on the pool thread that ran it (`rpc_serve#FUNC(WORKER)`, FUNC named
as the caller names it). A TorchScript function or a builtin op runs as an op of its own name at
the top of the callee's pool thread (`_script_local_optimizer_step` for
`__torch__.torch.distributed.optim.optimizer._script_local_optimizer_step`, `aten::add`).

What crosses the wire is left as it is, so a callee's work is paired by name and time: with the
request of its function from another rank whose range holds it, to its worker (its own
`rpc_serve#` ranges name it; an op on a rank with none: any), of several the one sent last
before it began, each request once. A request to its own worker runs on its own process's
pool, which the analysis leaves to the threads' hand-overs (dependencies.thread_wakes); paired
with another rank's op it had been (torch's `rpc_async_jit#...(w0 -> w0)` around a server's
`_script_local_optimizer_step`). Its start waited for
the send, unless another request's work on its thread ended after the send (it queued behind
that); the reply's arrival waited for its end, unless the sending thread was at work of its own
then (an op begun after the send and running over the arrival: an rpc_async's caller computing
meanwhile). Those are hand-overs across processes (critical_path), as a gloo receive's."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from typing import Final, NamedTuple

import numpy as np

from perfswarm.analyze.frame import RPC_REQUEST, WORK_KINDS, Events, group_rows, lane_key
from perfswarm.analyze.intervals import sorted_unique
from perfswarm.analyze.nesting import open_before
from perfswarm.analyze.stragglers import Peer

SERVE: Final = re.compile(r"^rpc_serve#(.+)\((\S*)\)$")
SCRIPTED: Final = "__torch__."  # a TorchScript function's qualified name begins so


class Request(NamedTuple):
    """A request a rank sent: its range's row, its function, the callee's worker, the op its
    callee runs it as (a TorchScript function's or a builtin's; None: a Python function's
    runs in an `rpc_serve#` range), its send, the reply's arrival, and whether the sending
    thread sat waiting for the reply then."""

    rank: int
    row: int
    function: str
    worker: str
    op: str | None
    sent: int
    arrived: int
    waited: bool


class Served(NamedTuple):
    """Work a rank ran for a request: its row, thread (lane_key), start and end, what it names
    (a function, `rpc_serve#`; or an op, `op`), and its worker (None: an op's, on a rank whose
    `rpc_serve#` ranges name none)."""

    rank: int
    row: int
    lane: int
    function: str
    op: bool
    worker: str | None
    start: int
    end: int


def op_of(function: str) -> str | None:
    """The op a request's callee runs it as: a TorchScript function's own name, a builtin's
    (`aten::add`) itself; None for a Python function."""
    if function.startswith(SCRIPTED):
        return function.rsplit(".", 1)[-1]
    return function if "::" in function else None


def requests(ev: Events, rank: int) -> list[Request]:
    """The rank's requests (frame.RPC_REQUEST ranges) to another worker, by send (a request to
    its own worker runs on a thread of its own process)."""
    rows = np.arange(len(ev))[ev.rank_slice(rank)]
    ranges = rows[ev.rpc_request[rows]]  # the mask every analysis shares: names matched once
    named = {i: m for i in sorted_unique(ev.name[ranges]).tolist()
             if (m := RPC_REQUEST.match(ev.names[i])) and m[2] != m[3]}
    found = ranges[np.isin(ev.name[ranges], list(named))]
    if not len(found):
        return []
    work = rows[ev.of_kind(*WORK_KINDS)[rows]]
    by_lane = group_rows(lane_key(ev.rank[work], ev.tid[work]), work)
    out = []
    for row in found[np.argsort(ev.ts[found], kind="stable")].tolist():
        m = named[int(ev.name[row])]
        sent, arrived = int(ev.ts[row]), int(ev.end[row])
        mine = by_lane.get(int(lane_key(rank, int(ev.tid[row]))), work[:0])
        since = mine[(ev.ts[mine] > sent) & (ev.ts[mine] < arrived)]
        out.append(Request(rank, row, m[1], m[3], op_of(m[1]), sent, arrived,
                           not bool((ev.end[since] > arrived).any())))
    return out


def served(ev: Events, rank: int, ops: Collection[str]) -> list[Served]:
    """The rank's work for requests: its `rpc_serve#` ranges, and the ops named in `ops` (what
    the requests' callees run them as) that no other op on their thread encloses, of the
    worker its ranges name (where they name one)."""
    rows = np.arange(len(ev))[ev.rank_slice(rank)]
    host = rows[ev.host_busy[rows]]
    ranges = {i: m for i, n in enumerate(ev.names) if (m := SERVE.match(n))}
    wanted = {i: n for i, n in enumerate(ev.names) if n in ops}
    out = []
    for row in host[np.isin(ev.name[host], list(ranges))].tolist():
        m = ranges[int(ev.name[row])]
        out.append(Served(rank, row, int(lane_key(rank, int(ev.tid[row]))), m[1], False, m[2],
                          int(ev.ts[row]), int(ev.end[row])))
    workers = {s.worker for s in out}
    worker = workers.pop() if len(workers) == 1 else None
    if wanted:
        lanes = lane_key(rank, ev.tid[host])
        order = np.lexsort((-ev.end[host], ev.ts[host], lanes))  # the outer first at a tie
        parent = open_before(lanes[order], ev.ts[host][order], ev.end[host][order])
        top = host[order][parent < 0]
        for row in top[np.isin(ev.name[top], list(wanted))].tolist():
            out.append(Served(rank, row, int(lane_key(rank, int(ev.tid[row]))),
                              wanted[int(ev.name[row])], True, worker, int(ev.ts[row]),
                              int(ev.end[row])))
    return sorted(out, key=lambda s: (s.start, s.rank, s.row))


class HandOvers(NamedTuple):
    """rank -> row -> the peer it waited for: each reply's arrival (its request's row) -> the
    callee's work (rank, row, end); each callee's work that waited for its request (its row,
    starting as the request arrived) -> the request (rank, row, send)."""

    replies: dict[int, dict[int, Peer]]
    requested: dict[int, dict[int, Peer]]


def hand_overs(sent: Mapping[int, Sequence[Request]],
               ran: Mapping[int, Sequence[Served]]) -> HandOvers:
    """Pair each rank's work for requests (`ran`) with the requests (`sent`, each rank's by
    send) that asked for it."""
    by_key: dict[tuple[str, bool], list[Request]] = defaultdict(list)
    for rank_requests in sent.values():
        for r in rank_requests:
            by_key[(r.function, False) if r.op is None else (r.op, True)].append(r)
    for found in by_key.values():
        found.sort(key=lambda r: (r.sent, r.rank, r.row))
    taken: set[tuple[int, int]] = set()
    out = HandOvers(defaultdict(dict), defaultdict(dict))
    for rank in sorted(ran):
        done: dict[int, list[int]] = defaultdict(list)  # per thread, its requests' work ends
        for s in ran[rank]:
            found = by_key.get((s.function, s.op), [])
            sends = [r.sent for r in found]
            i = int(np.searchsorted(sends, s.start, side="right"))
            pick = next((r for r in reversed(found[:i]) if r.rank != s.rank
                         and s.worker in (None, r.worker) and s.end <= r.arrived
                         and (r.rank, r.row) not in taken), None)
            if pick is not None:
                taken.add((pick.rank, pick.row))
                if not any(pick.sent < e <= s.start for e in done[s.lane]):
                    out.requested[rank][s.row] = (pick.rank, pick.row, pick.sent)
                if pick.waited:
                    out.replies[pick.rank][pick.row] = (rank, s.row, s.end)
            done[s.lane].append(s.end)
    return HandOvers(dict(out.replies), dict(out.requested))


def rpc_ops(sent: Mapping[int, Sequence[Request]]) -> frozenset[str]:
    """The ops the callees of `sent` (each rank's requests) run them as."""
    return frozenset(r.op for found in sent.values() for r in found if r.op is not None)


def rpc_hand_overs(ev: Events) -> HandOvers:
    """hand_overs of every rank of `ev`."""
    sent = {rank: requests(ev, rank) for rank in ev.ranks}
    if not any(sent.values()):
        return HandOvers({}, {})
    ops = rpc_ops(sent)
    return hand_overs(sent, {rank: served(ev, rank, ops) for rank in ev.ranks})
