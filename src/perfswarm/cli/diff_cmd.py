"""`perfswarm diff A B [--json]`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from perfswarm.cli.app import app

if TYPE_CHECKING:
    from rich.table import Table

    from perfswarm.analyze.diff import OpDelta, RunDiff
    from perfswarm.analyze.swarm_diff import SwarmDiff


@app.command("diff")
def diff_command(
    a: Annotated[Path, typer.Argument(metavar="A", help="Baseline Run.")],
    b: Annotated[Path, typer.Argument(metavar="B", help="Run compared against A.")],
    rank_a: Annotated[int | None, typer.Option("--rank-a", help="Rank of A (default lowest).")]
    = None,
    rank_b: Annotated[int | None, typer.Option("--rank-b", help="Rank of B (default lowest).")]
    = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON (keys in docs/cli.md).")] = False,
    swarms_only: Annotated[bool, typer.Option("--swarms", help="Only the swarm diff (sampled stacks), for Runs without events (perf or py-spy alone).")] = False,
) -> None:
    """B against A: each one's step time and the change, then the loop process's ops and
    kernels aligned by name and iteration, with each step's time no op covers: regressions
    and improvements beyond their noise band (twice the standard error from the step-to-step
    variation)."""
    from perfswarm.analyze.diff import diff_runs
    from perfswarm.analyze.swarm_diff import swarm_diff
    from perfswarm.cli.json_output import print_json
    from perfswarm.cli.output import console
    from perfswarm.report.text import UNSAMPLED, WAITED_FOR_OTHERS, step_time_change
    from perfswarm.trace.store import Run

    run_a, run_b = Run.open(a), Run.open(b)
    swarms = swarm_diff(run_a, run_b)
    if swarms_only:
        if as_json:
            print_json({"swarms": swarms.to_dict()})
        else:
            _print_swarms(swarms)
        return
    result = diff_runs(run_a, run_b, rank_a=rank_a, rank_b=rank_b)
    if as_json:
        print_json({**result.to_dict(), "swarms": swarms.to_dict()})
        return
    if result.step_time is not None:
        values, change = step_time_change(result.step_time)
        console.print(f"step time: {values} ({change}; two recordings of one program differ "
                      "by more on a busy machine)")
    for side, held in result.waited_for_others:
        console.print(f"note: {'AB'[side]} waited for other processes, {held:.2f} cores' worth: "
                      f"{WAITED_FOR_OTHERS}")
    for side in result.unsampled_beside_waits:
        console.print(f"note: {'AB'[side]} was {UNSAMPLED}")
    if not (result.a_span_ns or result.b_span_ns):
        console.print("no op traced on either side (a program that ran its own torch "
                      "profiler, or a recording without torch): the step time alone")
    else:
        _print_ops(result)
    if swarms.swarms or len(swarms.unsampled) == 1:  # one side sampled: say the other is not
        _print_swarms(swarms)


def _print_ops(result: RunDiff) -> None:
    from rich.table import Table

    from perfswarm.cli.output import console
    from perfswarm.report.text import ms

    console.print(f"span {ms(result.a_span_ns)} -> {ms(result.b_span_ns)} "
                  f"({ms(result.b_span_ns - result.a_span_ns)}); "
                  f"{len(result.only_a)} names only in A, {len(result.only_b)} only in B")
    if result.steps:
        steps = Table("#", "A step", "B step", "A", "B", "delta", title="steps",
                      title_justify="left")
        for s in result.steps:
            steps.add_row(str(s.index), str(s.a_step), str(s.b_step), ms(s.a_ns), ms(s.b_ns),
                          ms(s.b_ns - s.a_ns))
        console.print(steps)
    for title, rows in (("largest regressions first", list(result.regressions)),
                        ("largest improvements first", list(result.improvements))):
        shown = [o for o in rows if o.beyond_noise]
        if shown:
            console.print(_ops_table(title, shown))
        if len(shown) < len(rows):
            kind = title.split()[1]  # regressions / improvements
            console.print(f"  {len(rows) - len(shown)} {'more ' if shown else ''}{kind} within "
                          "their noise band (step-to-step variation)")
    console.print("the ops are the loop process's (a DataLoader worker's run beside its "
                  "steps), compared over the profiled steps; `no op` is a step's time no op "
                  "covers (Python, or waiting); the bands are of step-to-step variation, and "
                  "of some 60 ops a few cross theirs by chance (an op nested in another moves "
                  "with it): two recordings on a busy machine also differ run to run (diff A "
                  "against a second recording of A to see how much)")


def _ops_table(title: str, rows: list[OpDelta]) -> Table:
    from rich.table import Table

    ops = Table(title=title, title_justify="left")
    ops.add_column("kind")
    ops.add_column("name", min_width=10, overflow="fold")
    for header in ("count A→B", "ms A→B", "delta ms", "per iter", "± noise"):
        ops.add_column(header, justify="right")
    for o in rows:
        per_it = "" if o.per_iteration_delta_ns is None else f"{o.per_iteration_delta_ns / 1e6:.3f}"
        band = "" if o.noise_ns is None else f"{o.noise_ns / 1e6:.3f}"
        ops.add_row(o.kind, o.name, f"{o.a_count}→{o.b_count}",
                    f"{o.a_ns / 1e6:.3f}→{o.b_ns / 1e6:.3f}", f"{o.delta_ns / 1e6:+.3f}", per_it,
                    band)
    return ops


def _print_swarms(diff: SwarmDiff) -> None:
    from rich.table import Table

    from perfswarm.cli.output import console
    from perfswarm.report.text import short_caption

    if diff.unsampled:
        sides = " and ".join(diff.unsampled)
        console.print(f"{sides} {'have' if len(diff.unsampled) > 1 else 'has'} no sampled stacks "
                      "(recorded without perf and py-spy): no swarm diff")
        return
    table = Table("swarm (its heaviest leaf)", "samples A→B", "ms A→B", "delta ms", "± noise",
                  title=f"function swarms (A and B clustered together, {diff.source or 'all'} "
                  "samples), largest change first", title_justify="left")
    for d in diff.swarms[:15]:
        times = ("-", "-", "-") if d.ns is None else (
            f"{d.ns[0] / 1e6:.1f}→{d.ns[1] / 1e6:.1f}", f"{(d.delta_ns or 0) / 1e6:+.1f}",
            f"{(d.noise_ns or 0) / 1e6:.1f}" + ("" if d.beyond_noise else " (within)"))
        table.add_row(short_caption(d.caption), f"{d.samples[0]}→{d.samples[1]}", *times)
    console.print(table)
