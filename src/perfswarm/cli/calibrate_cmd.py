"""`perfswarm calibrate --collectives`: sweep collectives across local processes, fit models."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import orjson
import typer
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from perfswarm.cli.app import app
from perfswarm.cli.output import console, err_console, print_json
from perfswarm.errors import PerfswarmError
from perfswarm.model.collective_bench import calibration, sweep
from perfswarm.trace.store import atomic_write_bytes


@app.command("calibrate")
def calibrate_command(
    collectives: Annotated[bool, typer.Option("--collectives", help="Sweep all-reduce, all-gather, reduce-scatter, all-to-all and broadcast over 1 KB-64 MB with real torch.distributed (gloo on CPU, NCCL on GPUs) and fit latency-bandwidth models.")] = False,
    world_size: Annotated[int, typer.Option("--world-size", help="Local processes in the sweep.")] = 2,
    backend: Annotated[str, typer.Option("--backend", help="auto | gloo | nccl")] = "auto",
    out: Annotated[Path, typer.Option("--out", "-o", help="Profile JSON to write.")] = Path("collectives-profile.json"),
    as_json: Annotated[bool, typer.Option("--json", help="Print the profile as JSON.")] = False,
) -> None:
    """Calibrate models on this machine (today: the collective models, with --collectives)."""
    if not collectives:
        raise PerfswarmError("calibrate: only --collectives is available so far "
                             "(kernel-model calibration is not built yet)")
    if backend not in ("auto", "gloo", "nccl"):
        raise typer.BadParameter("must be auto, gloo or nccl", param_hint="--backend")
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                  console=err_console, transient=True) as bar:
        bar.add_task(f"sweeping collectives across {world_size} processes")
        result = sweep(world_size=world_size, backend=backend)  # type: ignore[arg-type]
    profile = calibration(result)
    atomic_write_bytes(out, orjson.dumps(profile, option=orjson.OPT_INDENT_2
                                         | orjson.OPT_SORT_KEYS) + b"\n")
    if as_json:
        print_json(profile)
        return
    table = Table("op", "regimes (latency us, bandwidth GB/s)", "GMAE (in sample)",
                  title=f"collective models, world size {world_size}", title_justify="left")
    for op, model in sorted(profile["models"].items()):
        regimes = "; ".join(f"{r['latency_us']:.1f} us, {r['bandwidth_gbps']:.2f} GB/s"
                            for r in model["regimes"])
        table.add_row(op, regimes, f"{100 * profile['gmae_in_sample'][op]:.1f}%")
    console.print(table)
    console.print(f"profile: {out}")
