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
meanwhile). Those are hand-overs across processes (critical_path), as a gloo receive's.

The distributed backward is paired the same way, as a request for the op its callee runs
(torch's `SendRpcBackward`): nothing in the trace names the pair (the context id is known to
Python on the caller, but the callee's backward runs in C++ from the RPC agent's handler, with
no Python to name it in), so by time. The caller's `torch::distributed::autograd::backward` op
waits, as one op on its thread, for its autograd thread, where each `RecvRpcBackward` sends a
gradient to the callee that ran the forward's request; the callee's thread runs its
`SendRpcBackward` and the nodes after it through, then takes its next message up (its work up
to its next work for a request: under load the backward's nodes are 50 us and more apart,
no pause delimits it). Each callee's backward
pairs, as a request's work, with the `RecvRpcBackward` of another rank begun last before it
inside a backward op that holds it; its start waited for the gradient's send (by the
`RecvRpcBackward`'s end) and the op's end for its end, unless the autograd thread's own work
there ended later."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import Final, NamedTuple

import numpy as np
import numpy.typing as npt

from perfswarm.analyze.dependencies import DIST_BACKWARD
from perfswarm.analyze.frame import RPC_REQUEST, WORK_KINDS, Events, group_rows, lane_key
from perfswarm.analyze.intervals import sorted_unique
from perfswarm.analyze.nesting import open_before
from perfswarm.analyze.stragglers import Peer

SERVE: Final = re.compile(r"^rpc_serve#(.+)\((\S*)\)$")
SCRIPTED: Final = "__torch__."  # a TorchScript function's qualified name begins so
RECV_BACKWARD: Final = "torch::distributed::autograd::RecvRpcBackward"  # sends a gradient
SEND_BACKWARD: Final = "torch::distributed::autograd::SendRpcBackward"  # its callee's first node
NEVER: Final = np.iinfo(np.int64).max


class Request(NamedTuple):
    """A request a rank sent: its range's row, its function, the callee's worker, the op its
    callee runs it as (a TorchScript function's or a builtin's; None: a Python function's
    runs in an `rpc_serve#` range), its send, the reply's arrival, and until when the sender's
    own work ran toward it (a reply arriving before did not end its wait: past the arrival
    where the sending thread was at work then). A gradient a distributed backward sends
    (`RecvRpcBackward`'s row, function and op SEND_BACKWARD, worker "": not named) was sent
    from its start to its end (`sent_by`); the reply reaches the backward op (`reply`), which
    its autograd thread's work holds until `busy_until`. A request's range is all three."""

    rank: int
    row: int
    function: str
    worker: str
    op: str | None
    sent: int
    arrived: int
    busy_until: int
    reply: int
    sent_by: int


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
    """The rank's requests (frame.RPC_REQUEST ranges) to another worker (a request to its own
    worker runs on a thread of its own process) and the gradients its distributed backward
    sends, by send."""
    rows = np.arange(len(ev))[ev.rank_slice(rank)]
    ranges = rows[ev.rpc_request[rows]]  # the mask every analysis shares: names matched once
    named = {i: m for i in sorted_unique(ev.name[ranges]).tolist()
             if (m := RPC_REQUEST.match(ev.names[i])) and m[2] != m[3]}
    found = ranges[np.isin(ev.name[ranges], list(named))]
    backward = DIST_BACKWARD in ev.names
    if not len(found) and not backward:  # most traces: no work rows gathered for nothing
        return []
    work = rows[ev.of_kind(*WORK_KINDS)[rows]]
    out = _gradients(ev, work) if backward else []
    if not len(found):
        return out
    by_lane = group_rows(lane_key(ev.rank[work], ev.tid[work]), work)
    for row in found.tolist():
        m = named[int(ev.name[row])]
        sent, arrived = int(ev.ts[row]), int(ev.end[row])
        mine = by_lane.get(int(lane_key(rank, int(ev.tid[row]))), work[:0])
        since = mine[(ev.ts[mine] > sent) & (ev.ts[mine] < arrived)]
        over = ev.end[since][ev.end[since] > arrived]  # at work as the reply arrived
        out.append(Request(rank, row, m[1], m[3], op_of(m[1]), sent, arrived,
                           int(over.max(initial=sent)), row, sent))
    return sorted(out, key=lambda r: (r.sent, r.row))


def _gradients(ev: Events, work: npt.NDArray[np.int64]) -> list[Request]:
    """The gradients a rank's distributed backward ops send (`work`: the rank's work rows),
    by send: each `RecvRpcBackward` on another thread inside one."""
    code = {n: i for i, n in enumerate(ev.names) if n in (DIST_BACKWARD, RECV_BACKWARD)}
    ops = work[ev.name[work] == code.get(DIST_BACKWARD, -1)]
    out = []
    for send in work[ev.name[work] == code.get(RECV_BACKWARD, -1)].tolist():
        start, end, tid = int(ev.ts[send]), int(ev.end[send]), int(ev.tid[send])
        holding = ops[(ev.ts[ops] <= start) & (ev.end[ops] >= end) & (ev.tid[ops] != tid)]
        if not len(holding):
            continue
        op = int(holding[np.argmax(ev.ts[holding])])
        arrived = int(ev.end[op])
        inside = work[(ev.tid[work] == tid) & (ev.ts[work] >= ev.ts[op])
                      & (ev.ts[work] < arrived)]
        out.append(Request(int(ev.rank[send]), send, SEND_BACKWARD, "", SEND_BACKWARD, start,
                           arrived, int(np.minimum(ev.end[inside], arrived).max()), op, end))
    return sorted(out, key=lambda r: (r.sent, r.row))


def served(ev: Events, rank: int, ops: Collection[str]) -> list[Served]:
    """The rank's work for requests: its `rpc_serve#` ranges, and the ops named in `ops` (what
    the requests' callees run them as) that no other op on their thread encloses, of the
    worker its ranges name (where they name one); a `SendRpcBackward` with the backward it
    began (_backwards_whole)."""
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
    out.sort(key=lambda s: (s.start, s.rank, s.row))
    return _backwards_whole(ev, rows, out) if SEND_BACKWARD in ops else out


def _backwards_whole(ev: Events, rows: npt.NDArray[np.int64], found: list[Served]
                     ) -> list[Served]:
    """`found` (a rank's work for requests, by start; `rows` the rank's), each
    `SendRpcBackward` to the end of its thread's work before that thread's next work for a
    request (the thread runs the backward through, then takes its next message up)."""
    work = rows[ev.of_kind(*WORK_KINDS)[rows]]
    by_lane = group_rows(lane_key(ev.rank[work], ev.tid[work]), work)
    later: dict[int, int] = {}  # per thread, the start of its next work for a request
    out = []
    for s in reversed(found):
        end = s.end
        if s.function == SEND_BACKWARD:  # a cpu_op: its thread has work
            mine = by_lane[s.lane]
            end = int(ev.end[mine[(ev.ts[mine] >= s.start)
                                  & (ev.ts[mine] < later.get(s.lane, NEVER))]].max())
        later[s.lane] = s.start
        out.append(s._replace(end=end))
    return out[::-1]


class HandOvers(NamedTuple):
    """rank -> row -> the peer it waited for: each reply's arrival (its request's row) -> the
    callee's work (rank, row, end); each callee's work that waited for its request (its row,
    starting as the request arrived) -> the request (rank, row, send)."""

    replies: dict[int, dict[int, Peer]]
    requested: dict[int, dict[int, Peer]]


def paired(sent: Mapping[int, Sequence[Request]], ran: Mapping[int, Sequence[Served]]
           ) -> Iterator[tuple[Served, Request | None]]:
    """Each rank's work for requests (`ran`, rank by rank, each by start) with the request
    (`sent`, each rank's by send) that asked for it, None where none did."""
    by_key: dict[tuple[str, bool], list[Request]] = defaultdict(list)
    for rank_requests in sent.values():
        for r in rank_requests:
            by_key[(r.function, False) if r.op is None else (r.op, True)].append(r)
    for found in by_key.values():
        found.sort(key=lambda r: (r.sent, r.rank, r.row))
    taken: set[tuple[int, int]] = set()
    for rank in sorted(ran):
        for s in ran[rank]:
            found = by_key.get((s.function, s.op), [])
            sends = [r.sent for r in found]
            i = int(np.searchsorted(sends, s.start, side="right"))
            pick = next((r for r in reversed(found[:i]) if r.rank != s.rank
                         and (s.worker in (None, r.worker) or not r.worker) and s.end <= r.arrived
                         and (r.rank, r.row) not in taken), None)
            if pick is not None:
                taken.add((pick.rank, pick.row))
            yield s, pick


def hand_overs(sent: Mapping[int, Sequence[Request]],
               ran: Mapping[int, Sequence[Served]]) -> HandOvers:
    """The hand-overs of each rank's work for requests (`ran`) and the requests (`sent`, each
    rank's by send) that asked for it (paired)."""
    out = HandOvers(defaultdict(dict), defaultdict(dict))
    done: dict[int, list[int]] = defaultdict(list)  # per thread, its requests' work ends
    for s, pick in paired(sent, ran):
        if pick is not None:
            if not any(pick.sent < e <= s.start for e in done[s.lane]):
                out.requested[s.rank][s.row] = (pick.rank, pick.row, min(pick.sent_by, s.start))
            replied = out.replies[pick.rank]
            if s.end >= pick.busy_until and s.end > replied.get(pick.reply, (0, 0, -1))[2]:
                replied[pick.reply] = (s.rank, s.row, s.end)  # of a backward's, the last
        done[s.lane].append(s.end)
    return HandOvers(dict(out.replies), dict(out.requested))


def rpc_ops(sent: Mapping[int, Sequence[Request]]) -> frozenset[str]:
    """The ops the callees of `sent` (each rank's requests) run them as."""
    return frozenset(r.op for found in sent.values() for r in found if r.op is not None)


def rpc_work(ev: Events) -> tuple[dict[int, list[Request]], dict[int, list[Served]]]:
    """Every rank's requests and work for requests (none where no rank sent any), once per
    Events object (iterations and the critical path both read them)."""
    def make() -> tuple[dict[int, list[Request]], dict[int, list[Served]]]:
        sent = {rank: requests(ev, rank) for rank in ev.ranks}
        if not any(sent.values()):
            return sent, {}
        ops = rpc_ops(sent)
        return sent, {rank: served(ev, rank, ops) for rank in ev.ranks}

    return ev.derived("rpc work", make)


def rpc_hand_overs(ev: Events) -> HandOvers:
    """hand_overs of every rank of `ev`."""
    return hand_overs(*rpc_work(ev))
