"""`analyze`: every analysis of a Run, from one load of its events."""

from __future__ import annotations

from perfswarm.analyze.aisi import time_windows, without_iterations
from perfswarm.analyze.analysis import Analysis
from perfswarm.analyze.annotations import scopes
from perfswarm.analyze.bandwidth import bandwidth
from perfswarm.analyze.concurrency import concurrency
from perfswarm.analyze.critical_path import critical_path
from perfswarm.analyze.cupti import cupti_counters
from perfswarm.analyze.dependencies import sync_events
from perfswarm.analyze.frame import Events
from perfswarm.analyze.groups import process_groups
from perfswarm.analyze.iterations import combine, iterations, unprofiled_gaps, unprofiled_steps
from perfswarm.analyze.kernels import kernel_breakdown
from perfswarm.analyze.launch import launch_stats
from perfswarm.analyze.memory import memory_timeline
from perfswarm.analyze.ops import op_breakdown
from perfswarm.analyze.sequences import kernel_sequences
from perfswarm.analyze.stragglers import stragglers
from perfswarm.analyze.swarms import run_samples, swarms
from perfswarm.analyze.system import system_load
from perfswarm.analyze.transfers import hand_overs, rank_transfers
from perfswarm.analyze.window import WindowedRun
from perfswarm.errors import PerfswarmError
from perfswarm.trace.cluster import ClusterOptions, connect
from perfswarm.trace.store import Run


def load(run: Run, *, or_samples: bool = False) -> Events:
    """The Run's events; with `or_samples`, a Run of sampled stacks or counters alone (a loop
    the torch profiler never opened on) is analyzed for what it holds."""
    ev = Events.load(run)
    if len(ev) == 0 and not (or_samples and any(run.table(t).num_rows
                                                for t in ("samples", "counters"))):
        what = "events, samples or counters" if or_samples else "events"
        where = (f"the window {run.text} (s from its start) holds"
                 if isinstance(run, WindowedRun) else "the Run has")
        raise PerfswarmError(f"{run.path}: {where} no {what} to analyze")
    return ev


def analyze(run: Run, *, ignore_markers: bool = False,
            cluster: ClusterOptions | None = None) -> Analysis:
    """Every analysis of `run`; with `cluster`, per rank on Dask when it says to go parallel
    (analyze.parallel: the same result). Computed once per Run object: the report, the
    advice and the demo share it."""
    if cluster is not None:
        from perfswarm.analyze.parallel import analyze_parallel, event_ranks

        ranks = event_ranks(run)
        if ranks and cluster.parallel(len(ranks)):
            with connect(cluster, len(ranks)) as client:
                return analyze_parallel(run, client, ranks, ignore_markers=ignore_markers)
    return run.memo(("analysis", ignore_markers), lambda: _analyze(run, ignore_markers))


def analysis_made(run: Run) -> Analysis | None:
    """The analysis `analyze` already made of this Run object, if any: a later step (the
    report's projection) reuses its parts instead of computing them again."""
    return analyze(run) if run.holds(("analysis", False)) else None


def _analyze(run: Run, ignore_markers: bool) -> Analysis:
    ev = load(run, or_samples=True)
    its = iterations(run, ev, ignore_markers=ignore_markers)
    if not its.steps and (found := without_iterations(ev, run_samples(run),
                                                      run.table("stacks"))):
        its = combine({}, found)
    windows = {} if its.steps else time_windows(ev, run.table("counters"))
    program = unprofiled_steps(run.table("steps"), its.steps)
    per = its.steps or windows
    gaps = unprofiled_gaps(run)
    groups = process_groups(run, ev, ev.ranks)
    return Analysis(
        path=str(run.path), events=len(ev), ranks=tuple(ev.ranks), iterations=its,
        concurrency=concurrency(ev, per, gaps), ops=op_breakdown(ev, its.steps),
        launch=launch_stats(ev), stragglers=stragglers(ev, groups=groups),
        critical_path=critical_path(ev, sync_events(run, ev), its.steps, gaps, groups,
                                    hand_overs({r: rank_transfers(run, ev, r) for r in ev.ranks})),
        swarms=swarms(run_samples(run), run.table("stacks"), program,
                      unprofiled=program is not its.steps),
        system=system_load(run.table("counters"), per), kernels=kernel_breakdown(ev),
        bandwidth=bandwidth(run, ev), sequences=kernel_sequences(ev), scopes=scopes(ev),
        cupti=cupti_counters(run, ev), memory=memory_timeline(run.table("counters"), its.steps),
        windows=windows)
