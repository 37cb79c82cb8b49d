"""`perfswarm sql RUN "SELECT ..."`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from perfswarm.cli.app import app
from perfswarm.cli.output import console, print_json
from perfswarm.trace.sql import query
from perfswarm.trace.store import Run


@app.command("sql")
def sql_command(
    run_dir: Annotated[Path, typer.Argument(metavar="RUN", help="Run directory.")],
    sql: Annotated[str, typer.Argument(help="A read-only query over the views events, counters, "
                                            "flows, steps, samples, stacks, graph_nodes, graph_edges.")],
    as_json: Annotated[bool, typer.Option("--json", help="Rows as a JSON list of objects.")] = False,
) -> None:
    """Run a read-only DuckDB query over a Run's tables."""
    columns, rows = query(Run.open(run_dir), sql)
    if as_json:
        print_json([dict(zip(columns, r, strict=True)) for r in rows])
        return
    table = Table(*columns)
    for r in rows:
        table.add_row(*("" if v is None else str(v) for v in r))
    console.print(table)
