"""Parallel analyze: each rank's analyses on a Dask worker, combined as analyze() combines them.

Most analyses are per rank already (iterations, concurrency, launches) or sums over ranks
(op and kernel totals). Stragglers need each rank's collective start times: a few numbers
per step. The critical path crosses ranks only at collectives, at receives that waited for
their sends (each worker reads its rank's sends and receives) and at RPC requests and their
replies (each worker reads its rank's requests, then its work for the ops they name), so each
worker keeps its
rank's events and dependency graph, and the walk goes from worker to worker, one segment per
stretch on a rank (critical_path.path_of). Samples and counters are small and stay here.
A worker reads only its rank's rows. The result equals analyze()'s, key for key (tested).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from perfswarm.analyze.analysis import Analysis
from perfswarm.analyze.annotations import Scopes, scopes
from perfswarm.analyze.bandwidth import RankBandwidth, bandwidth
from perfswarm.analyze.concurrency import Concurrency, RankConcurrency, rank_concurrency
from perfswarm.analyze.critical_path import (
    Graph,
    Segment,
    State,
    build,
    collective_peers,
    counted,
    ends,
    linked_ranks,
    merged,
    paths,
    step_windows,
    walk,
    without_gaps,
)
from perfswarm.analyze.cupti import CuptiCounters, cupti_counters
from perfswarm.analyze.dependencies import sync_events, thread_wakes
from perfswarm.analyze.frame import EVENT_COLUMNS, I64, Events
from perfswarm.analyze.groups import NO_GROUPS, process_groups
from perfswarm.analyze.intervals import sorted_unique
from perfswarm.analyze.iterations import (
    StepWindow,
    after_gaps,
    combine,
    detected_windows,
    first_op_ns,
    gaps_between,
    profiled_windows,
    run_markers,
    served_steps,
)
from perfswarm.analyze.kernels import RankKernels, rank_kernels
from perfswarm.analyze.launch import LaunchStats, rank_launch_stats
from perfswarm.analyze.memory import memory_timeline
from perfswarm.analyze.ops import OpTotals
from perfswarm.analyze.rpc import Request, Served, rpc_ops
from perfswarm.analyze.rpc import hand_overs as rpc_hand_overs
from perfswarm.analyze.rpc import requests as rpc_requests
from perfswarm.analyze.rpc import served as rpc_served
from perfswarm.analyze.sequences import Counts, merge, sequence_counts, top_sequences
from perfswarm.analyze.stragglers import Instance, Peer, collective_starts, instances, skews
from perfswarm.analyze.swarms import run_samples, swarms
from perfswarm.analyze.system import system_load
from perfswarm.analyze.transfers import RankTransfers, hand_overs, rank_transfers
from perfswarm.trace.cluster import results
from perfswarm.trace.schema import empty
from perfswarm.trace.store import Run


def event_ranks(run: Run) -> list[int]:
    ranks = run.table("events", ["rank"]).column("rank").to_numpy()
    return [int(r) for r in sorted_unique(np.asarray(ranks, np.int64))]


@dataclass(frozen=True)
class RankPart:
    """One rank's share of the analysis."""

    rank: int
    events: int
    detected: list[StepWindow]
    first_op: int | None  # iterations.first_op_ns
    concurrency: RankConcurrency
    launch: LaunchStats
    ops: OpTotals
    collectives: dict[Instance, tuple[int, int]]  # (row, start ns)
    transfers: RankTransfers  # its sends and receives (transfers.rank_transfers)
    requests: list[Request]  # its RPC requests (rpc.requests)
    working: tuple[I64, I64]  # frame.Events.working
    kernels: RankKernels
    sequences: Counts
    scopes: Scopes


def load_rank(path: str, rank: int) -> Events:
    return Events.load(Run(path), rank)


def rank_part(ev: Events, rank: int, use_markers: bool,
              markers: Sequence[StepWindow] | None,
              profiled: Sequence[tuple[int, int]] = (), run_path: str | None = None,
              ranks: Sequence[int] = ()) -> RankPart:
    """The per-rank analyses of one rank. Its iterations are its markers when the Run has
    markers (none if it has none of its own), else the ones detected on it; `profiled`: its
    profiling windows (iterations.profiled_windows); with `run_path`, its collectives' process
    groups and its optimizer calls' shapes are read from the Run (`ranks`: all of the
    Run's)."""
    run = Run(run_path) if run_path is not None else None
    groups = process_groups(run, ev, ranks) if run is not None else NO_GROUPS
    detected = after_gaps(detected_windows(ev, rank, thread_wakes(ev), run, groups),
                          profiled)
    windows = markers if use_markers else (detected or None)
    steps = {rank: list(windows)} if windows else {}
    return RankPart(rank, len(ev), detected, first_op_ns(ev, rank),
                    rank_concurrency(ev, rank, steps.get(rank, []), gaps_between(profiled)),
                    rank_launch_stats(ev, rank), OpTotals.of(ev, steps),
                    collective_starts(ev, rank, groups),
                    rank_transfers(run, ev, rank) if run is not None else ({}, {}),
                    rpc_requests(ev, rank),
                    ev.working(rank), rank_kernels(ev, rank),
                    sequence_counts(ev),
                    scopes(ev))


def rank_graph(ev: Events, run_path: str, rank: int, peers: dict[int, list[Peer]],
               received: dict[int, Peer], requested: dict[int, Peer]) -> Graph:
    return build(ev, sync_events(Run(run_path), ev, rank), peers, received, requested)


def rank_bandwidth(ev: Events, run_path: str,
                   rank: int) -> tuple[tuple[RankBandwidth, ...], CuptiCounters | None]:
    """The rank's analyses that read args: bandwidth, and its CUPTI counters (untruncated)."""
    run = Run(run_path)
    return bandwidth(run, ev, rank), cupti_counters(run, ev, rank, None)


def walk_segment(g: Graph, state: State, stop: int | None, floor: int) -> Segment:
    """One walk on the worker holding its graph, its host time counted there."""
    return counted(g, [walk(g, state, frozenset(g.ev.ranks), stop, floor)])[0]


def analyze_parallel(run: Run, client: Any, ranks: Sequence[int], *,
                     ignore_markers: bool = False) -> Analysis:
    """analyze() with the per-rank work on `client`'s workers (`ranks`: the events' ranks)."""
    markers = run_markers(run, ignore_markers=ignore_markers)
    where = str(run.path)
    loaded = {r: client.submit(load_rank, where, r, pure=False) for r in ranks}
    profiled = profiled_windows(run)
    parts: list[RankPart] = results([client.submit(rank_part, loaded[r], r, bool(markers),
                                                   markers.get(r), profiled.get(r, ()),
                                                   where, list(ranks), pure=False)
                                     for r in ranks])
    flows = results([client.submit(rank_bandwidth, loaded[r], where, r, pure=False)
                     for r in ranks])
    sent = {p.rank: p.requests for p in parts}
    ran: dict[int, list[Served]] = dict(zip(ranks, results([
        client.submit(rpc_served, loaded[r], r, rpc_ops(sent), pure=False) for r in ranks
    ]), strict=True)) if any(sent.values()) else {}
    its = combine(markers, served_steps({p.rank: p.detected for p in parts if p.detected},
                                        sent, ran), {p.rank: p.first_op for p in parts})
    peers = collective_peers(instances({p.rank: p.collectives for p in parts}).values())
    rpc = rpc_hand_overs(sent, ran)
    received = merged(hand_overs({p.rank: p.transfers for p in parts}), rpc.replies)
    graphs = {r: client.submit(rank_graph, loaded[r], where, r, peers.get(r, {}),
                               received.get(r, {}), rpc.requested.get(r, {}), pure=False)
              for r in ranks}
    del loaded  # the graphs hold the events now
    windows = step_windows(its.steps, linked_ranks([*ranks, *its.steps], peers,
                                                   merged(received, rpc.requested)))
    within = [None, *(w for _, w in windows)]
    try:
        critical = without_gaps(paths(
            results([client.submit(ends, graphs[r], within, pure=False) for r in ranks]),
            windows, lambda s, stop, floor: results([client.submit(
                walk_segment, graphs[s[0]], s, stop, floor, pure=False)])[0], list),
            {r: gaps_between(w) for r, w in profiled.items() if len(w) > 1})
    finally:
        for f in graphs.values():
            f.release()
    # ranks with markers but no events still get their (empty) iterations in the op breakdown
    missing = {r: w for r, w in its.steps.items() if r not in ranks}
    ops = [p.ops for p in parts] + (
        [OpTotals.of(Events.from_table(empty("events").select(EVENT_COLUMNS)), missing)]
        if missing else [])
    return Analysis(
        path=where, events=sum(p.events for p in parts), ranks=tuple(ranks), iterations=its,
        concurrency=Concurrency(tuple(p.concurrency for p in parts)),
        ops=OpTotals.merge(ops).breakdown(), launch=tuple(p.launch for p in parts),
        stragglers=skews({p.rank: {k: ts for k, (_, ts) in p.collectives.items()}
                          for p in parts}, working={p.rank: p.working for p in parts}),
        critical_path=critical,
        swarms=swarms(run_samples(run), run.table("stacks"), its.steps),
        system=system_load(run.table("counters"), its.steps),
        kernels=tuple(p.kernels for p in parts),
        bandwidth=tuple(b for rank_flows, _ in flows for b in rank_flows),
        sequences=top_sequences(merge([p.sequences for p in parts])),
        scopes=Scopes.merge([p.scopes for p in parts]),
        cupti=CuptiCounters.merge([c for _, c in flows]),
        memory=memory_timeline(run.table("counters"), its.steps))

