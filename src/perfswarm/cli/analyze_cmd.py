"""`perfswarm analyze RUN [--json] [--ignore-markers] [--workers N] [--scheduler ADDRESS]`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from perfswarm.cli.app import app
from perfswarm.cli.cluster_options import Scheduler, WorkerMemory, Workers, cluster_options


@app.command("analyze")
def analyze_command(
    run_dir: Annotated[Path, typer.Argument(metavar="RUN", help="Run directory.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON (keys in docs/cli.md).")] = False,
    ignore_markers: Annotated[bool, typer.Option(
        "--ignore-markers", help="Detect iterations from the op sequence, ignoring ProfilerStep "
                                 "markers.")] = False,
    window: Annotated[str | None, typer.Option(
        "--window", metavar="START:END", help="Analyze only this time of interest: seconds "
        "from the Run's start (events clipped to it; '2:' to the end).")] = None,
    workers: Workers = None,
    scheduler: Scheduler = None,
    worker_memory: WorkerMemory = "auto",
) -> None:
    """Concurrency, iterations, op/kernel and launch statistics, op cost, stragglers of a Run.

    From 8 ranks up on 4 cores or more (or with --workers/--scheduler) each rank is analyzed
    on a Dask worker that reads only its rows; the result is the same. The op-cost table reads one rank at a
    time."""
    from perfswarm.analyze.summary import analyze
    from perfswarm.analyze.window import run_start, windowed
    from perfswarm.cli.json_output import print_json
    from perfswarm.model.opstats import op_costs
    from perfswarm.model.topology import with_copy_peaks
    from perfswarm.trace.store import Run

    run = windowed(Run.open(run_dir), window)
    result = analyze(run, ignore_markers=ignore_markers,  # a window reads in this process
                     cluster=None if window else cluster_options(workers, scheduler,
                                                                 worker_memory))
    costs = op_costs(run, result.ranks)
    if as_json:
        out = {**result.to_dict(), "op_cost": costs.to_dict()}
        with_copy_peaks(out["bandwidth"], run.manifest()["devices"])
        print_json(out)
    else:
        from perfswarm.cli.analyze_text import print_analysis

        print_analysis(result, costs, run_start(run), window is not None)
