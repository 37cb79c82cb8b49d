"""`perfswarm demo`: record the bundled CNN trainer, analyze it, advise, write the report."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from perfswarm.cli.app import app

WORKLOAD = "perfswarm.workloads.trainer"


def _check_out(out: Path, force: bool) -> None:
    """Before recording: a Run at `out` is replaced where a demo recorded it (running the demo
    again), or with --force; anything else there is refused, as `record` refuses it."""
    from perfswarm.errors import ParameterError, RunError
    from perfswarm.trace.store import Run

    if not os.path.lexists(out):
        return
    try:
        command = Run.open(out).manifest()["command"]
    except RunError:
        raise ParameterError(None, "exists and is not a perfswarm Run ({force} replaces only "
                             "a Run)", subject=out) from None
    if not force and WORKLOAD not in command:
        raise ParameterError(None, "holds a Run the demo did not record (use {force} to "
                             "replace it)", subject=out)


@app.command("demo")
def demo_command(
    out: Annotated[Path, typer.Option("--out", "-o", help="Run directory (a demo's Run there is replaced; any other Run needs --force).")] = Path("demo.run"),
    report: Annotated[Path, typer.Option("--report", help="HTML report to write.")] = Path("demo-report.html"),
    steps: Annotated[int, typer.Option("--steps", min=4, help="Training steps of the workload (at least 4).")] = 24,
    loader_delay_ms: Annotated[float, typer.Option("--loader-delay-ms", help="Per-batch DataLoader delay: makes the run input-bound.")] = 20.0,
    force: Annotated[bool, typer.Option("--force", help="Replace a Run at --out that another command recorded.")] = False,
) -> int:
    """Record the bundled CNN trainer (slow DataLoader), analyze it, advise, and write the report."""
    from perfswarm.analyze.summary import analyze
    from perfswarm.api import report_data
    from perfswarm.cli.output import console, spinner
    from perfswarm.errors import PerfswarmError
    from perfswarm.recorder.session import RecordOptions, record
    from perfswarm.report import html
    from perfswarm.report.text import ms
    from perfswarm.trace.store import check_output

    if not 0 <= loader_delay_ms < math.inf:  # the trainer would refuse it after the recording began
        raise PerfswarmError(f"--loader-delay-ms {loader_delay_ms}: must be a finite number >= 0")
    _check_out(out, force)
    check_output(report)  # before the recording, not after it replaced --out
    command = [sys.executable, "-m", WORKLOAD, "--steps", str(steps),
               "--batch-size", "32", "--loader-delay-ms", str(loader_delay_ms),
               "--num-workers", "0"]
    options = RecordOptions(skip=min(5, steps // 3), steps=min(10, steps // 2), force=True)
    with spinner() as bar:
        task = bar.add_task("recording " + " ".join(command[1:4]))
        result = record(command, out, options)
        bar.update(task, description="analyzing")
        analysis = analyze(result.run)
        data = report_data(result.run)  # its advice is what the terminal shows too
        bar.update(task, description="writing the report")
        html.write(data, report)
    manifest = result.run.manifest()
    states = ", ".join(f"{k}: {v['status']}" for k, v in sorted(manifest["collectors"].items()))
    console.print(f"recorded {result.run.path} (exit {result.exit_code}); {states}",
                  soft_wrap=True)
    steps_found = {r: len(s) for r, s in analysis.iterations.steps.items()}
    console.print(f"iterations: {steps_found} ({analysis.iterations.used or 'none found'})")
    for item in data["advice"][:5]:
        gain = ("" if item["gain_ns"] is None else f": gain {ms(item['gain_ns'])}" + (
            "" if item["gain_pct"] is None else f" ({item['gain_pct']:.1f}% of {item['gain_of']})"))
        console.print(f"  advice [{item['severity']}] {item['title']}{gain}")
    console.print(f"report: {report}")
    return result.exit_code
