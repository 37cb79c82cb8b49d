"""`perfswarm fuse [RUN] [--layer SPEC]... [--pairs I,J] [--trials N] [--budget MIN] [--json]`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer

from perfswarm.cli.app import app


@app.command("fuse")
def fuse_command(
    run_dir: Annotated[Path | None, typer.Argument(metavar="[RUN]", help="Run directory whose conv pairs to fuse (or give --layer).")] = None,
    layer: Annotated[list[str] | None, typer.Option("--layer", help="A pair's shapes, e.g. 'dw3x3:C=128,H=56,W=56 -> pw:K=128' (layers pw, dwKxK, convKxK, '/s2' for stride 2; the first takes N, C, H, W, the second K). Repeatable.")] = None,
    pairs: Annotated[str | None, typer.Option("--pairs", help="Only these candidates, by index (e.g. 0,2).")] = None,
    batch: Annotated[int | None, typer.Option("--batch", min=1, help="Batch size N of every --layer pair.")] = None,
    trials: Annotated[int, typer.Option("--trials", help="Schedules tried per kernel.")] = 24,
    budget: Annotated[float, typer.Option("--budget", help="Tuning time for all pairs, minutes.")] = 2.0,
    rounds: Annotated[int, typer.Option("--rounds", help="Side-by-side timing rounds per pair (as many again for a borderline pair, and for a gaining pair's confirmation after the others).")] = 15,
    threads: Annotated[int | None, typer.Option("--threads", min=1, help="Threads for PyTorch and the kernels (default: all cores).")] = None,
    profile: Annotated[Path | None, typer.Option("--profile", help="calibrate profile with this CPU's peaks (default: cpu-profile.json when present, else measured).")] = None,
    cache: Annotated[Path | None, typer.Option("--cache", help="Tuned-schedule cache (default: ~/.cache/perfswarm/fuse-schedules.json).")] = None,
    predict_only: Annotated[bool, typer.Option("--predict-only", help="List the candidates and the roofline's prediction; generate nothing.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON (keys in docs/cli.md).")] = False,
) -> None:
    """Fuse conv pairs (dw->pw, pw->dw, conv->dw, conv->conv) into one kernel tuned on this CPU, checked against PyTorch's separate ops and timed side by side with them."""
    from perfswarm.cli.json_output import print_json
    from perfswarm.cli.output import console, progress_bar
    from perfswarm.errors import PerfswarmError
    from perfswarm.model.profile import read_profile
    from perfswarm.optimize.fuse.host import cpu_device_spec
    from perfswarm.optimize.fuse.plan import (
        Options,
        candidates,
        default_cache,
        find_pairs,
        fuse_all,
        pick,
    )
    from perfswarm.trace.store import Run, host_info

    options = Options(trials, budget * 60.0, rounds, threads or os.cpu_count() or 1)
    if profile is None and Path("cpu-profile.json").is_file():
        profile = Path("cpu-profile.json")
    if run_dir is not None and layer:
        raise PerfswarmError("fuse: give a RUN or --layer specs, not both")
    run = Run.open(run_dir) if run_dir is not None else None
    found_pairs = find_pairs(layer or (), run, batch)
    spec = cpu_device_spec(read_profile(profile) if profile else None, str(profile),
                           options.threads)
    found = pick(candidates(found_pairs, spec), pairs)
    data: dict[str, Any] = {"device": spec.to_dict(), "candidates": [c.to_dict() for c in found]}
    if not predict_only and found:

        from perfswarm.optimize.fuse.tune import ScheduleCache

        store = ScheduleCache(cache or default_cache(), str(host_info()["cpu_model"]))
        steps = len(found) * (2 * options.trials + options.rounds)
        with progress_bar() as bar:
            task = bar.add_task("fuse", total=steps)
            results = fuse_all(found, options, store,
                               lambda what: bar.update(task, advance=1, description=what))
        data["results"] = [r.to_dict() for r in results]
    if as_json:
        print_json(data)
        return
    _print(console, data)


def _print(console: Any, data: dict[str, Any]) -> None:
    from rich.table import Table
    from rich.text import Text

    from perfswarm.report.text import size

    device = data["device"]
    console.print(f"device: {device['name']}: {device['peak_tflops']['fp32'] * 1e3:.0f} GFLOP/s, "
                  f"{device['memory_bandwidth_gbps']:.1f} GB/s memory, "
                  f"cache {device['l2_mb']:.1f} MB ({device['source']})", markup=False)
    if not data["candidates"]:
        console.print("no fusible conv pairs (dw->pw, pw->dw, conv->dw, conv->conv)")
        return
    table = Table("#", "pair", "intermediate", "round-trips", "fused FLOP/B",
                  "predicted", "gains", title="candidates (roofline)", title_justify="left")
    for c in data["candidates"]:
        p = c["prediction"]
        table.add_row(str(c["index"]), Text(c["pair"]), size(p["intermediate_bytes"]),
                      "memory" if p["round_trips_memory"] else "cache",
                      f"{p['fused_intensity']:.1f}",
                      f"{p['separate_s'] * 1e3:.3f} -> {p['fused_s'] * 1e3:.3f} ms "
                      f"(x{p['speedup']:.2f})", "yes" if p["gains"] else "no")
    console.print(table)
    if "results" not in data:
        return
    table = Table("pair", "torch separate ms", "fused ms", "own separate ms", "speedup",
                  "vs own", "paired [interval]", "predicted", "max rel err", "recommend",
                  title="measured (minimum of rounds, interleaved; paired: median of the "
                  "rounds' speedups, its interval's coverage in %)", title_justify="left")
    for r in data["results"]:
        low, high = r["speedup_interval"]
        table.add_row(Text(r["pair"]), f"{r['torch_separate_ms']['min_ms']:.3f}",
                      f"{r['fused_ms']['min_ms']:.3f}", f"{r['own_separate_ms']['min_ms']:.3f}",
                      f"x{r['speedup']:.2f}", f"x{r['speedup_vs_own']:.2f}",
                      f"x{r['paired_speedup']:.2f} [{low:.2f}, {high:.2f}] "
                      f"{100 * r['interval_coverage']:.0f}%"
                      + (f", {r['rounds']} rounds: measured again" if r["remeasured"] else "")
                      + _confirmation(r),
                      f"x{r['prediction']['speedup']:.2f}", f"{r['max_rel_error']:.1e}",
                      "yes" if r["recommended"] else "no")
    console.print(table)


def _confirmation(r: dict[str, Any]) -> str:
    """A gaining pair's second, separate measurement, as the paired column shows it."""
    if r["confirmation_interval"] is None:
        return ""
    low, high = r["confirmation_interval"]
    return f"; again x{r['confirmation_paired_speedup']:.2f} [{low:.2f}, {high:.2f}]"
