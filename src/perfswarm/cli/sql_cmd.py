"""`perfswarm sql RUN "SELECT ..."`."""

from __future__ import annotations

import csv
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from perfswarm.cli.app import app
from perfswarm.defaults import MEMORY_MB, TIMEOUT_S
from perfswarm.shown import json_escaped, visible

if TYPE_CHECKING:
    import pyarrow as pa

# A terminal table shows this many rows and this many characters of a cell; --json/--csv give all.
TABLE_ROWS = 1000
CELL_CHARS = 200


def _cell(value: Any) -> str:
    text = "" if value is None else str(value)
    return text if len(text) <= CELL_CHARS else text[:CELL_CHARS - 1] + "…"


def _json_row(row: dict[str, Any]) -> bytes:
    import orjson

    return orjson.dumps(row, default=str, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS
                        | orjson.OPT_SERIALIZE_NUMPY)


@app.command("sql")
def sql_command(
    run_dir: Annotated[Path, typer.Argument(metavar="RUN", help="Run directory.")],
    sql: Annotated[str, typer.Argument(help="A read-only query over the views events, counters, "
                                            "flows, steps, samples, stacks, graph_nodes, graph_edges. "
                                            "events.dur is the analyses' (a user annotation the "
                                            "profiler stopped inside ends with its trace window), "
                                            "events.dur_recorded the trace's own.")],
    as_json: Annotated[bool, typer.Option("--json", help="All rows as a JSON list of objects.")] = False,
    as_csv: Annotated[bool, typer.Option("--csv", help="All rows as CSV with a header line.")] = False,
    timeout: Annotated[float, typer.Option("--timeout", min=TIMEOUT_S[0], max=TIMEOUT_S[1], metavar="SECONDS",
                                           help="Stop the query after this long.")] = 60.0,
    memory: Annotated[int, typer.Option("--memory", min=MEMORY_MB[0], max=MEMORY_MB[1], metavar="MIB",
                                        help="Memory the query may use.")] = 2048,
) -> None:
    """Run a read-only DuckDB query over a Run's tables.

    The table shows the first 1,000 rows (cells cut at 200 characters); --json and --csv give all."""
    from rich.table import Table

    from perfswarm.cli.output import console, err_console
    from perfswarm.trace.sql import Limits, query
    from perfswarm.trace.store import Run

    if as_json and as_csv:
        raise typer.BadParameter("choose one of --json and --csv", param_hint="--csv")
    schema, batches = query(Run.open(run_dir), sql, Limits(timeout, memory << 20))
    columns = list(schema.names)
    if as_json or as_csv:
        _stream(columns, batches, as_json)
        return
    table = Table(*columns)
    shown = 0
    for batch in batches:
        for row in zip(*(c.to_pylist() for c in batch.columns), strict=True):
            if shown == TABLE_ROWS:
                batches.close()
                console.print(table)
                err_console.print(f"(first {TABLE_ROWS:,} rows shown; --json or --csv for all)")
                return
            table.add_row(*map(_cell, row))
            shown += 1
    console.print(table)


def _stream(columns: list[str], batches: Iterable[pa.RecordBatch], as_json: bool) -> None:
    """Rows to stdout batch by batch, so memory holds one batch. JSON escapes what would act
    on a terminal; CSV shows it as escapes on a terminal and writes the data as it is to a
    file or a pipe."""
    out = sys.stdout
    writer = None if as_json else csv.writer(out, lineterminator="\n")
    shown = out.isatty()
    if writer is not None:
        writer.writerow(map(visible, columns) if shown else columns)
    first = True
    for batch in batches:
        for row in zip(*(c.to_pylist() for c in batch.columns), strict=True):
            if writer is not None:
                writer.writerow([visible(v) if isinstance(v, str) else v for v in row]
                                if shown else row)
                continue
            out.write(("[\n  " if first else ",\n  ")
                      + json_escaped(_json_row(dict(zip(columns, row, strict=True)))).decode())
            first = False
    if writer is None:
        out.write("[]\n" if first else "\n]\n")
