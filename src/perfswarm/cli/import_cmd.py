"""`perfswarm import TRACE... [--out RUN] [--et ET.json] [--memory-timeline FILE]`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from perfswarm.cli.app import app
from perfswarm.cli.cluster_options import Scheduler, WorkerMemory, Workers, cluster_options

if TYPE_CHECKING:
    from perfswarm.trace.ingest import Streaming


@app.command("import")
def import_command(
    traces: Annotated[list[Path], typer.Argument(help="Kineto trace files (.json, .json.gz) or Nsight Systems SQLite exports (nsys export --type sqlite), one per rank or per profiling window, or a directory of them (e.g. TensorBoard's log dir: every *.pt.trace.json under it; an execution trace there is read as --et).")],
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Run directory to create.")] = None,
    et: Annotated[list[Path] | None, typer.Option("--et", help="Execution trace JSON: each joins the rank of the process its header names, else the ranks in order.")] = None,
    memory_timeline: Annotated[list[Path] | None, typer.Option("--memory-timeline", help="torch.profiler's memory timeline (export_memory_timeline: .json, .json.gz, or raw.json.gz) or a CUDA memory snapshot (torch.cuda.memory._dump_snapshot's pickle, read without running code), one per rank, in rank order: bytes alive per category over time, as counters memory.<category>.")] = None,
    rank: Annotated[list[int] | None, typer.Option("--rank", help="Rank of each file, in order (default: distributedInfo or a rank in the file name, else one rank per host process).")] = None,
    drop_bad_events: Annotated[bool, typer.Option("--drop-bad-events", help="Drop events with negative or absurd times, or args that are not UTF-8 text (counted in warnings), instead of failing.")] = False,
    streaming: Annotated[str, typer.Option("--streaming", help="auto | always | never: bounded-memory path for traces over a quarter of RAM.")] = "auto",
    force: Annotated[bool, typer.Option("--force", help="Replace RUN if it exists.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar or summary line.")] = False,
    workers: Workers = None,
    scheduler: Scheduler = None,
    worker_memory: WorkerMemory = "auto",
) -> None:
    """Import Kineto (torch.profiler) traces, Nsight Systems SQLite exports and execution traces
    into a Run.

    From 8 files up on 4 cores or more (or with --workers/--scheduler) each file is read on a
    Dask worker; files that need the streaming path are read by it instead, in this process."""
    from rich.text import Text

    from perfswarm.cli.output import console, progress_bar
    from perfswarm.trace.ingest import (
        ImportOptions,
        directory_execution_traces,
        import_traces,
        passed_over,
        trace_files,
    )

    if streaming not in ("auto", "always", "never"):
        raise typer.BadParameter("must be auto, always or never", param_hint="--streaming")
    target = out or Path(traces[0].name.split(".")[0] + ".run")
    mode: Streaming = streaming  # type: ignore[assignment]
    options = ImportOptions(ranks=tuple(rank or ()),
                            execution_traces=tuple(et or directory_execution_traces(traces)),
                            memory_timelines=tuple(memory_timeline or ()),
                            drop_bad_events=drop_bad_events, streaming=mode, force=force,
                            cluster=cluster_options(workers, scheduler, worker_memory))
    command = ["perfswarm", "import", *map(str, traces)]
    left_out = passed_over(traces)
    traces = trace_files(traces)
    with progress_bar(quiet) as bar:
        task = bar.add_task("import", total=len(traces))

        def progress(what: str, done: int, total: int) -> None:
            bar.update(task, description=what, completed=done, total=total)

        run = import_traces(traces, target, options, command, progress)
    if not quiet:
        manifest = run.manifest()
        events = sum(int(s.get("events", 0)) for s in manifest["sources"])
        console.print(f"imported {events:,} events from {len(traces)} file(s) into {run.path}"
                      f" ({len(manifest['warnings'])} warning(s))")
        if left_out:
            console.print(Text(
                f"left out {len(left_out)} other trace file(s) under the directories given, "
                f"{left_out[0]} the first: where a directory holds *.pt.trace.json[.gz] "
                "(a TensorBoard log dir), only those are taken; name the others to import them"))
