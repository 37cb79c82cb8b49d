"""`perfswarm shard --tables TABLES.yaml --devices N [--json]`."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer

from perfswarm.cli.app import app


@app.command("shard")
def shard_command(
    tables: Annotated[Path, typer.Option("--tables", help="TABLES.yaml: batch_size and tables (name, rows, dim, pooling, distribution).")],
    devices: Annotated[int, typer.Option("--devices", min=1, max=65536, help="Number of devices to shard over.")],
    batch: Annotated[int | None, typer.Option("--batch", min=1, max=2**31 - 1, help="Override the file's batch_size.")] = None,
    memory_gb: Annotated[float | None, typer.Option("--memory-gb", help="Embedding memory per device, GB.")] = None,
    measure_cost: Annotated[bool, typer.Option("--calibrate", help="Fit the cost model to EmbeddingBag timings of probe tables on this machine first (torch, about a minute).")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON (keys in docs/cli.md).")] = False,
) -> None:
    """Size-greedy, lookup-greedy and predicted-time-balanced embedding placements."""
    from rich.table import Table
    from rich.text import Text

    from perfswarm.cli.json_output import print_json
    from perfswarm.cli.output import console, spinner
    from perfswarm.model.embedding import EmbeddingCost
    from perfswarm.optimize.shard import load_workload, shard
    from perfswarm.recorder.bench.embedding import calibrate
    from perfswarm.report.text import size

    work = load_workload(tables, batch)
    if measure_cost:
        with spinner() as bar:
            bar.add_task("timing EmbeddingBag probe tables")
            cost = calibrate()
    else:
        cost = EmbeddingCost()
    result = shard(work, devices, cost, memory_gb * 1e9 if memory_gb else math.inf)
    data = result.to_dict()
    if as_json:
        print_json(data)
        return
    console.print(Text.assemble((str(tables), "bold"), f": {len(work.tables)} tables, batch "
                                f"{work.batch}, {devices} devices"))
    for p in data["plans"]:
        t = Table("device", "tables", "size", "lookups", "predicted ms", title_justify="left",
                  title=f"{p['strategy']}: max {p['max_ms']:.3f} ms, imbalance {p['imbalance']:.3f}")
        for d in p["devices"]:
            t.add_row(str(d["device"]), ", ".join(d["tables"]), size(d["bytes"]),
                      f"{d['lookups']:,.0f}", f"{d['predicted_ms']:.3f}")
        console.print(t)
    console.print(Text.assemble(("choose", "bold"), f" {data['best']}"))
