"""`perfswarm report RUN [-o report.html] [--tune DIR] [--json]`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from perfswarm.cli.app import app
from perfswarm.cli.profile_option import Profile


@app.command("report")
def report_command(
    run_dir: Annotated[Path, typer.Argument(metavar="RUN", help="Run directory.")],
    output: Annotated[Path | None, typer.Option("-o", "--output", help="HTML file (default RUN/report.html).")] = None,
    tune_dir: Annotated[Path | None, typer.Option("--tune", help="A perfswarm tune --out directory: adds its trials table, throughput per trial and parameter importance.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report data as JSON instead of writing HTML (keys in docs/cli.md).")] = False,
    window: Annotated[str | None, typer.Option("--window", metavar="START:END", help="Report only this time of interest: seconds from the Run's start (events clipped to it; '2:' to the end).")] = None,
    profile: Profile = None,
) -> None:
    """A self-contained HTML report (works offline): cards, timeline, concurrency, iterations, ops."""
    from perfswarm.analyze.window import windowed
    from perfswarm.api import report_data
    from perfswarm.cli.json_output import print_json
    from perfswarm.cli.output import console, spinner
    from perfswarm.model.hostcosts import host_costs
    from perfswarm.trace.store import Run, check_output

    run = windowed(Run.open(run_dir), window)
    costs = host_costs(profile)
    tune = None
    if tune_dir is not None:
        from perfswarm.optimize.tune import load_results  # optuna: only with --tune

        tune = load_results(tune_dir)
    target = output or run.path / "report.html"
    if not as_json:
        check_output(target)  # said before the analysis, not after
    with spinner() as progress:
        task = progress.add_task("analyzing", total=2)
        data = report_data(run, tune=tune, costs=costs)
        progress.update(task, advance=1, description="rendering")
        if as_json:
            progress.update(task, advance=1)
        else:
            from perfswarm.report import html  # jinja2 and plotly: not for --json

            path = html.write(data, target)
            progress.update(task, advance=1)
    if as_json:
        print_json(data)
        return
    console.print(f"wrote {path} ({path.stat().st_size:,} bytes)")
