"""`analyze`: every analysis of a Run, from one load of its events."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from perfswarm.analyze.aisi import time_windows, without_iterations
from perfswarm.analyze.annotations import Scopes, scopes
from perfswarm.analyze.bandwidth import RankBandwidth, bandwidth
from perfswarm.analyze.concurrency import Concurrency, concurrency
from perfswarm.analyze.critical_path import CriticalPath, critical_path
from perfswarm.analyze.cupti import CuptiCounters, cupti_counters
from perfswarm.analyze.dependencies import sync_events
from perfswarm.analyze.diff import RunDiff, diff
from perfswarm.analyze.frame import Events
from perfswarm.analyze.iterations import Iterations, StepWindow, combine, iterations
from perfswarm.analyze.kernels import RankKernels, kernel_breakdown
from perfswarm.analyze.launch import LaunchStats, launch_stats
from perfswarm.analyze.ops import OpBreakdown, op_breakdown
from perfswarm.analyze.sequences import Sequence_, kernel_sequences
from perfswarm.analyze.stragglers import Stragglers, stragglers
from perfswarm.analyze.swarms import Swarms, swarms
from perfswarm.analyze.system import SystemLoad, system_load
from perfswarm.errors import PerfswarmError
from perfswarm.trace.cluster import ClusterOptions, connect
from perfswarm.trace.store import Run


@dataclass(frozen=True)
class Analysis:
    path: str
    events: int
    ranks: tuple[int, ...]
    iterations: Iterations
    concurrency: Concurrency
    ops: OpBreakdown
    launch: tuple[LaunchStats, ...]
    stragglers: Stragglers
    critical_path: CriticalPath | None
    swarms: Swarms
    system: tuple[SystemLoad, ...]
    kernels: tuple[RankKernels, ...]
    bandwidth: tuple[RankBandwidth, ...]
    sequences: tuple[Sequence_, ...]
    scopes: Scopes
    cupti: CuptiCounters | None
    # time windows the concurrency and system load are given per when no iterations are found
    windows: Mapping[int, Sequence[StepWindow]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "events": self.events, "ranks": list(self.ranks),
                "iterations": self.iterations.to_dict(),
                "concurrency": self.concurrency.to_dict(), "ops": self.ops.to_dict(),
                "launch": [s.to_dict() for s in self.launch],
                "stragglers": self.stragglers.to_dict(),
                "critical_path": self.critical_path.to_dict() if self.critical_path else None,
                "swarms": self.swarms.to_dict(),
                "system": [s.to_dict() for s in self.system],
                "kernels": [k.to_dict() for k in self.kernels],
                "bandwidth": [b.to_dict() for b in self.bandwidth],
                "sequences": [s.to_dict() for s in self.sequences],
                "scopes": self.scopes.to_dict(),
                "cupti": self.cupti.to_dict() if self.cupti else None,
                "windows": {str(r): [w.to_dict() for w in ws] for r, ws in self.windows.items()}}


def load(run: Run, *, or_samples: bool = False) -> Events:
    """The Run's events; with `or_samples`, a Run of sampled stacks or counters alone (a loop
    the torch profiler never opened on) is analyzed for what it holds."""
    ev = Events.load(run)
    if len(ev) == 0 and not (or_samples and any(run.table(t).num_rows
                                                for t in ("samples", "counters"))):
        what = "events, samples or counters" if or_samples else "events"
        raise PerfswarmError(f"{run.path}: the Run has no {what} to analyze")
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


def _analyze(run: Run, ignore_markers: bool) -> Analysis:
    ev = load(run, or_samples=True)
    its = iterations(run, ev, ignore_markers=ignore_markers)
    if not its.steps and (found := without_iterations(ev, run.table("samples"),
                                                      run.table("stacks"))):
        its = combine({}, found)
    windows = {} if its.steps else time_windows(ev, run.table("counters"))
    per = its.steps or windows
    return Analysis(
        path=str(run.path), events=len(ev), ranks=tuple(ev.ranks), iterations=its,
        concurrency=concurrency(ev, per), ops=op_breakdown(ev, its.steps),
        launch=launch_stats(ev), stragglers=stragglers(ev),
        critical_path=critical_path(ev, sync_events(run, ev), its.steps),
        swarms=swarms(run.table("samples"), run.table("stacks"), its.steps),
        system=system_load(run.table("counters"), per), kernels=kernel_breakdown(ev),
        bandwidth=bandwidth(run, ev), sequences=kernel_sequences(ev), scopes=scopes(ev),
        cupti=cupti_counters(run, ev), windows=windows)


def diff_runs(a: Run, b: Run, *, rank_a: int | None = None, rank_b: int | None = None,
              ignore_markers: bool = False) -> RunDiff:
    """Diff one rank of b against one rank of a (each Run's lowest rank unless given)."""
    sides = []
    for run, rank in ((a, rank_a), (b, rank_b)):
        ev = load(run)
        chosen = ev.ranks[0] if rank is None else rank
        if chosen not in ev.ranks:
            raise PerfswarmError(f"{run.path}: no rank {chosen} (ranks: {ev.ranks})")
        steps = iterations(run, ev, ignore_markers=ignore_markers).steps.get(chosen, [])
        sides.append((ev.of_rank(chosen), list(steps)))
    (ea, sa), (eb, sb) = sides
    return diff(ea, sa, eb, sb)
