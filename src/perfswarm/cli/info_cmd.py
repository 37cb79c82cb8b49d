"""`perfswarm info RUN [--json]`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from perfswarm.cli.app import app


@app.command("info")
def info_command(
    run_dir: Annotated[Path, typer.Argument(metavar="RUN", help="Run directory.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON (keys in docs/cli.md).")] = False,
) -> None:
    """Ranks, devices, time span, event counts per kind and steps of a Run."""
    from rich.table import Table
    from rich.text import Text

    from perfswarm.cli.json_output import print_json
    from perfswarm.cli.output import console
    from perfswarm.report.text import ms
    from perfswarm.trace.info import run_info
    from perfswarm.trace.store import Run

    info = run_info(Run.open(run_dir))
    if as_json:
        print_json(info)
        return
    state = "complete" if info["complete"] else "INCOMPLETE"
    console.print(Text.assemble((str(info["path"]), "bold"), f" ({state}): ranks {info['ranks']}, "
                                f"span {ms(info['span_ns'])}, {info['events']:,} events"))
    for d in info["devices"]:
        console.print(f"  device rank {d.get('rank')} id {d.get('id')}: {d.get('name')}")
    kinds = Table("kind", "events", title="events per kind", title_justify="left")
    for kind, n in info["events_per_kind"].items():
        kinds.add_row(kind, f"{n:,}")
    console.print(kinds)
    if info["steps"]:
        steps = Table("rank", "step", "duration", "source", title="steps", title_justify="left")
        for s in info["steps"]:
            steps.add_row(str(s["rank"]), str(s["step"]), ms(s["duration_ns"]), s["source"])
        console.print(steps)
    for name, status in info["collectors"].items():
        console.print(f"  collector {name}: {status}")
    for w in info["warnings"]:
        console.print(Text.assemble("  ", ("warning", "yellow"),
                                    f" {w['source']}: {w['what']} (x{w['count']})"))
