"""Rules about several ranks: exposed communication, stragglers, ring order over NVLink."""

from __future__ import annotations

import itertools
import re
import statistics

import pyarrow as pa

from perfswarm.analyze.frame import HOST_COLLECTIVE
from perfswarm.optimize.rules.base import Advice, advice, pct
from perfswarm.optimize.rules.facts import Facts, col, where

_EXPOSED_SHARE = 20.0  # % of device busy time spent in communication that no compute overlaps
_STRAGGLER_RATIO = 1.1
# a Run that trains with DistributedDataParallel: its ranges or its reducer's ops
_DDP = r"DistributedDataParallel|torch\.distributed\.ddp\."
# a collective's op in its name, else "other"
_OP = re.compile(r"(AllReduce|AllGather|ReduceScatter|Broadcast|Reduce|SendRecv|AllToAll|Send|"
                 r"Recv|all_reduce|all_gather|reduce_scatter|broadcast|reduce|alltoall|"
                 r"all_to_all|barrier|gather|scatter|send|recv)")
# a pipeline's point-to-point calls (dist.send and recv, isend and irecv) and their NCCL
# annotations; NCCL runs an all-to-all as grouped sends and receives, its kernels SendRecv as
# a pipeline's are: its calls tell it apart
_P2P_CALL = r"^c10d::(send|recv_|isend|irecv)$|^nccl:(send|recv)$"
_ALL_TO_ALL = r"alltoall|all_to_all"
_P2P_OPS = frozenset({"send", "recv", "Send", "Recv", "SendRecv"})
_STRAGGLER_MIN_PCT = 5.0  # % of the measured time the others spent waiting for the straggler
# Relative bandwidth of one hop, by `nvidia-smi topo -m` link type (NV<k>: k NVLinks).
_LINK_GBPS = {"PIX": 16.0, "PXB": 12.0, "PHB": 10.0, "NODE": 8.0, "SYS": 5.0}
_NVLINK_GBPS = 25.0  # per link
_MAX_RING_SEARCH = 8  # GPUs; beyond this the permutations are too many to try


def _collectives(facts: Facts) -> pa.Table:
    """The device's collectives in the window."""
    return where(facts.device_events, facts.of_kind(facts.device_events, "collective"))


def _compute(facts: Facts) -> pa.Table:
    return where(facts.device_events, ~facts.of_kind(facts.device_events, "collective"))


def _exposed(facts: Facts) -> tuple[pa.Table, dict[int, tuple[int, int, int, int]]] | None:
    """The collectives in the window, and per rank (communication, exposed, compute beside no
    collective, busy) ns: analyze's concurrency over the device's collectives (hidden only
    under compute kernels: beside a copy alone one is exposed, the copy engine doing none of
    the step's compute), else over a CPU process group's on host threads (HostComm: hidden
    under the rank's ops)."""
    comm = _collectives(facts)
    if comm.num_rows:
        parts = {r: [b.ns for b in bs] for r, bs in facts.breakdowns.items()}
        return comm, {r: (sum(n["overlapped"] + n["comm_only"] for n in ns),
                          sum(n["comm_only"] for n in ns), sum(n["compute_only"] for n in ns),
                          span - idle)
                      for r, ns in parts.items() for idle, span in [facts.device_idle[r]]}
    # over the rank's iterations (or its span without any), as the breakdowns are
    hosts = {rc.rank: [h for h in ([i.host_comm for i in rc.iterations] or [rc.host_comm])
                       if h is not None] for rc in facts.concurrency}
    if not any(hosts.values()):
        return None
    comm = facts.in_window(facts.named(HOST_COLLECTIVE.pattern, "user_annotation"))
    return comm, {r: (sum(h.comm_ns for h in hs), sum(h.ns["comm_only"] for h in hs),
                      sum(h.ns["compute_only"] for h in hs),
                      sum(h.compute_ns + h.ns["comm_only"] for h in hs))
                  for r, hs in hosts.items() if hs}


def _pipeline(facts: Facts, ops: set[str]) -> bool:
    """Whether the communication (`ops`: its collectives' ops) is a pipeline's sends and
    receives: point-to-point ops alone, the program's point-to-point calls, or kernels named
    for one direction (Send, Recv), in the trace, and no all-to-all call (whose NCCL kernels
    are SendRecv too)."""
    events = facts.events
    return (ops <= _P2P_OPS and not facts.named_like(events, _ALL_TO_ALL).any()
            and (bool(ops & {"Send", "Recv"}) or bool(facts.named_like(events, _P2P_CALL).any())))


def communication_bound(facts: Facts) -> Advice | None:
    """Collectives take a large share of the step and compute does not hide them. A rank's
    wait at a collective for the last rank to enter it (analyze's stragglers) is no
    communication: the straggler's, which overlap cannot hide."""
    found = _exposed(facts)
    if found is None or found[0].num_rows == 0:
        return None
    comm, per_rank = found
    waited = {r.rank: r.waited_ns for r in facts.stragglers.ranks} if facts.stragglers else {}
    comm_ns = sum(c for c, _, _, _ in per_rank.values())
    exposed = sum(max(0, e - waited.get(r, 0)) for r, (_, e, _, _) in per_rank.items())
    busy = sum(b for _, _, _, b in per_rank.values())
    share = pct(exposed, busy)
    if share < _EXPOSED_SHARE:
        return None
    by_op: dict[str, int] = {}
    for name, ns in facts.by_name(comm, col(comm, "dur")):
        op = m.group(1) if (m := _OP.search(name)) else "other"
        by_op[op] = by_op.get(op, 0) + ns
    by_op = dict(sorted(by_op.items()))
    evidence = {"collectives": comm.num_rows, "comm_ns": comm_ns, "by_op_ns": by_op,
                "overlapped_pct": pct(comm_ns - sum(e for _, e, _, _ in per_rank.values()),
                                      comm_ns),
                "waited_for_last_rank_ns": sum(waited.get(r, 0) for r in per_rank),
                "exposed_ns": exposed,
                # a CPU process group's: the rank's ops and its collectives on host threads
                "device_busy_ns" if facts.device_events.num_rows else "host_busy_ns": busy,
                "comm_share_of_busy_pct": pct(comm_ns, busy), "exposed_share_of_busy_pct": share}
    # DDP's buckets all-reduce while backward computes the next ones: collective time can
    # hide only under compute that no collective overlaps yet, and the last bucket of each
    # step (about one collective) waits for backward to end whatever the bucket size.
    compute_only = sum(c for _, _, c, _ in per_rank.values())
    last = comm_ns / comm.num_rows * facts.step_count()
    evidence["compute_only_ns"] = compute_only
    hidden = min(max(0.0, exposed - last), compute_only)
    # hiding a collective shortens a step only where the step's critical path runs through it
    path = facts.critical_path
    # the steps' paths where the run has steps (the run's own spans more than they do)
    on_path = (None if path is None or (facts.steps.num_rows and not path.steps) else
               sum(s.ns["collective"] for s in path.steps) if path.steps else path.ns["collective"])
    if on_path is not None:
        evidence["overlap_model_ns"] = round(hidden)
        evidence["collective_on_critical_path_ns"] = on_path
        hidden = min(hidden, on_path)
    ddp = facts.named_like(facts.events, _DDP).any()
    shorter = "fewer bytes or fewer all-reduces"
    if ddp:
        overlap = ("let DDP's all-reduce overlap the backward: measure bucket_cap_mb both ways "
                   "(smaller buckets start all-reducing earlier in the backward, larger ones "
                   "pay the per-call latency less often), gradient_as_bucket_view=True, "
                   "static_graph=True, no find_unused_parameters=True")
        fewer = ("register_comm_hook(None, default_hooks.bf16_compress_hook) to halve the "
                 "bytes; no_sync() over k micro-batches to all-reduce once every k")
    elif _pipeline(facts, set(by_op)):  # a pipeline's stages
        overlap = ("a pipeline's stages wait for each other's sends: more micro-batches a step "
                   "(GPipe leaves each stage idle (stages - 1) / (micro-batches + stages - 1) "
                   "of it), or an interleaved schedule (torch.distributed.pipelining's "
                   "ScheduleInterleaved1F1B)")
        fewer = "stages of equal time (the slowest sets the pace), bf16 activations"
        shorter = "stages of equal time or fewer bytes (bf16 activations)"
    else:  # collectives the program calls itself
        overlap = ("issue the collectives with async_op=True and wait for each only where its "
                   "result is needed, so that compute runs meanwhile")
        fewer = ("fewer, larger collectives (flatten small tensors into one), bf16 or fp16 "
                 "data, or communicate every k steps")
    if on_path == 0:  # the steps wait on other work: shorter collectives change nothing
        return advice(facts, "communication_bound",
                      "collectives run beside no compute, but off the critical path", evidence,
                      0, "no time saved: no collective is on the steps' critical path "
                      "(analyze's), which other work decides; hiding or shortening the "
                      "collectives leaves the steps as long",
                      f"{overlap}; {fewer}: only once the critical path runs through the "
                      "collectives")
    if not hidden:  # nothing runs beside the collectives to hide them under
        return advice(facts, "communication_bound",
                      "communication is exposed on the critical path", evidence, None,
                      "no time saved: by the overlap model, no compute runs beside the exposed "
                      "collectives (beyond the last one a step) to hide them under; "
                      f"{shorter} shorten them (not modelled)", fewer)
    return advice(facts, "communication_bound", "communication is exposed on the critical path",
                  evidence, hidden,
                  "overlap model from this run's times: the exposed collective time hides under "
                  "the compute that runs beside no collective, but one collective a step (the "
                  "last bucket, after backward) stays exposed; at most that",
                  f"{overlap}; {fewer}")


def stragglers(facts: Facts) -> Advice | None:
    """One rank arrives late at the collectives and every other rank waits for it: analyze's
    stragglers where the ranks' collectives pair (its straggler, the others' wait for it as
    the gain), else, without collectives to read, the rank that computes longest, where the
    traces say the ranks joined a process group (their distributedInfo)."""
    if len(facts.ranks) < 2:
        return None
    found = facts.stragglers
    device = _compute(facts)
    if _exposed(facts) is not None and (found is None or not found.instances):
        return None  # collectives that do not pair across the ranks (process subgroups)
    if found is not None and found.instances:
        slow = found.straggler
        lateness = {r.rank: r for r in found.ranks}
        evidence: dict[str, object] = {
            "collectives": found.instances, "max_skew_ns": found.max_skew_ns,
            "last_count_by_rank": {str(r): v.last_count for r, v in lateness.items()},
            "held_back_ns_by_rank": {str(r): v.held_back_ns for r, v in lateness.items()},
            "waited_ns_by_rank": {str(r): v.waited_ns for r, v in lateness.items()}}
        if slow is None:
            return _taking_turns(facts, evidence, sum(r.held_back_ns for r in found.ranks))
        evidence["slowest_rank"] = slow
        gain: float = lateness[slow].held_back_ns
        if pct(gain, facts.wall_ns) < _STRAGGLER_MIN_PCT:
            return None
        basis = ("measured, no model: the time the other ranks waited at the collectives for "
                 "this one to enter them (each rank's waits counted once)")
    else:
        if not any(source.get("distributed") for source in facts.manifest["sources"]):
            return None  # no process group: the ranks (Hogwild's processes, an RPC trainer and
            # its server) wait for each other at no collective, traced or not
        frame = device if device.num_rows else facts.in_window(facts.kind("cpu_op"))
        busy = {int(k[0]): v for k, v in facts.busy_ns(frame).items()}
        if len(busy) < 2:
            return None
        median = statistics.median(busy.values())
        slow = max(busy, key=lambda r: (busy[r], -r))
        if median <= 0 or busy[slow] < _STRAGGLER_RATIO * median:
            return None
        evidence = {"busy_ns_by_rank": {str(r): v for r, v in busy.items()},
                    "slowest_rank": slow, "ratio_to_median": round(busy[slow] / median, 3)}
        gain = (busy[slow] - median) * len(busy)
        basis = "measured, no model: every rank stops waiting for the slowest one at the " \
                "collectives"
    return advice(facts, "stragglers", f"rank {slow} is a straggler", evidence, gain, basis,
                  f"check rank {slow}'s host (thermal throttling, other jobs, "
                  + ("a slower GPU or link" if device.num_rows else "fewer or shared cores")
                  + "), its data (a slower input pipeline, uneven sequence lengths: bucket or "
                  "pad to balance) and its own work (logging, checkpointing or evaluation on "
                  "one rank only)")


def _taking_turns(facts: Facts, evidence: dict[str, object], held_ns: int) -> Advice | None:
    """No rank holds the others back most, yet they waited for each other: the ranks take
    turns being last at the collectives (one slow for a while, then another: uneven batches,
    a host shared at times), an imbalance no single rank's fix removes."""
    if pct(held_ns, facts.wall_ns) < _STRAGGLER_MIN_PCT:
        return None
    return advice(facts, "stragglers", "the ranks take turns holding the others back",
                  evidence, held_ns,
                  "measured, no model: the time each rank waited at the collectives for the "
                  "rank that entered them last (each rank's waits counted once)",
                  "balance each step's work across the ranks (uneven batches or sequence "
                  "lengths: bucket or pad; per-rank work such as logging or evaluation), and "
                  "look for load on the ranks' hosts that comes and goes")


def parse_topology(text: str) -> dict[tuple[int, int], float]:
    """`nvidia-smi topo -m` → relative bandwidth of each GPU pair."""
    rows = [line.split() for line in text.splitlines() if re.match(r"^\s*GPU\d+\s", line)]
    header = next((line.split() for line in text.splitlines()
                   if re.match(r"^\s*GPU0\s+GPU1", line)), None)
    if not rows or header is None:
        return {}
    gpus = [int(h[3:]) for h in header if re.fullmatch(r"GPU\d+", h)]
    links: dict[tuple[int, int], float] = {}
    for row in rows:
        src = int(row[0][3:])
        for dst, cell in zip(gpus, row[1:1 + len(gpus)], strict=False):
            nv = re.fullmatch(r"NV(\d+)", cell)
            if dst != src:
                links[src, dst] = int(nv[1]) * _NVLINK_GBPS if nv else _LINK_GBPS.get(cell, 1.0)
    return links


def _bottleneck(order: tuple[int, ...], links: dict[tuple[int, int], float]) -> float:
    return min(links.get((a, b), 0.0) for a, b in zip(order, order[1:] + order[:1], strict=True))


def _topology(facts: Facts) -> str:
    extra = facts.manifest.get("extra", {}).get("nvidia_smi_topo")
    return str(extra) if extra else next(iter(facts.raw_files.values()), "")


def ring_order(facts: Facts) -> Advice | None:
    """Ranks in device order form a ring through a slow link; another order stays on NVLink."""
    links = parse_topology(_topology(facts))
    gpus = sorted({a for a, _ in links})
    if len(gpus) < 3 or len(gpus) > _MAX_RING_SEARCH:
        return None
    current = tuple(gpus)
    # Rings are cyclic and undirected: fixing the first GPU loses no candidates.
    best = max((current[:1] + p for p in itertools.permutations(current[1:])),
               key=lambda o: (_bottleneck(o, links), tuple(-g for g in o)))
    cur_bw, best_bw = _bottleneck(current, links), _bottleneck(best, links)
    if best_bw <= cur_bw * 1.2:
        return None
    comm_ns = sum(facts.busy_ns(_collectives(facts)).values())
    evidence = {"gpus": len(gpus), "current_order": list(current),
                "current_bottleneck_gbps": cur_bw,
                "best_order": list(best), "best_bottleneck_gbps": best_bw, "comm_ns": comm_ns}
    visible = ",".join(map(str, best))
    return advice(facts, "ring_order", "the rank ring crosses a slow link", evidence,
                  comm_ns * (1 - cur_bw / best_bw) if comm_ns else None,
                  "link model (nvidia-smi topo link classes): ring collectives run at the "
                  "bottleneck link's bandwidth",
                  f"CUDA_VISIBLE_DEVICES={visible} so that consecutive ranks sit on NVLink "
                  "neighbours (NCCL_ALGO=Ring keeps the order)")

