"""`perfswarm export RUN --format perfetto -o trace.json.gz`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import typer

from perfswarm.cli.app import app


@app.command("export")
def export_command(
    run_dir: Annotated[Path, typer.Argument(metavar="RUN", help="Run directory.")],
    fmt: Annotated[Literal["perfetto"], typer.Option("--format", help="Output format: perfetto (Chrome trace JSON).")] = "perfetto",
    output: Annotated[Path, typer.Option("-o", "--output", help="Output file (.json or .json.gz).")] = Path("trace.json.gz"),
    rank: Annotated[int | None, typer.Option("--rank", help="Only this rank, as Kineto writes one trace per rank: `import` reads several such files back into one Run of their ranks (a file of every rank is for viewing).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON (keys in docs/cli.md).")] = False,
) -> None:
    """Write a Run as Chrome trace JSON that opens in Perfetto and chrome://tracing."""
    from perfswarm.cli.json_output import print_json
    from perfswarm.cli.output import console, err_console
    from perfswarm.report import perfetto
    from perfswarm.trace.store import Run

    run = Run.open(run_dir)
    with err_console.status(f"writing {output}"):
        path = perfetto.write(run, output, rank)
    result = {"format": fmt, "path": str(path), "bytes": path.stat().st_size}
    if as_json:
        print_json(result)
        return
    console.print(f"wrote {path} ({result['bytes']:,} bytes); open it in https://ui.perfetto.dev")
