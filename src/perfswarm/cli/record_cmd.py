"""`perfswarm record [--out RUN] [--collectors LIST] [--hz N] [--steps SKIP:COUNT] -- CMD...`,
or `perfswarm record --pid PID [--duration S]` to attach to a running process."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from perfswarm.cli.app import app
from perfswarm.defaults import (
    DEFAULT_COLLECTORS,
    PERF_HZ,
    PYSTACKS_HZ,
    RESERVE_PER_STEP_MIB,
    SAMPLER_HZ,
)

if TYPE_CHECKING:
    from rich.text import Text

    from perfswarm.recorder.session import Status


def status_line(s: Status) -> Text:
    from rich.text import Text

    from perfswarm.report.text import size

    steps = ((("steps", len(s.step_ns)),) if s.step_ns else ())  # only once a loop steps
    counts = "".join(f" | {n:,} {unit}" for unit, n in (*steps, *s.counts))
    return Text(f"recording {s.elapsed_s:6.1f}s | {', '.join(s.active) or 'no collectors'}"
                f"{counts} | {size(s.raw_bytes)} raw", style="dim")


def _seconds(value: float | None) -> float | None:
    """--duration's range, checked while the flags are read (before --pid is paired with it)."""
    if value is not None and not 0 < value <= 1e7:
        raise typer.BadParameter(f"--duration {value}: must be a positive number of seconds "
                                 "(at most 1e7)")
    return value


@app.command("record", context_settings={"allow_interspersed_args": False})
def record_command(
    command: Annotated[list[str] | None, typer.Argument(help="The command to run, after --.")] = None,
    pid: Annotated[int | None, typer.Option("--pid", min=1, help="Attach to this running process (and its descendants) instead of running a command.")] = None,
    duration: Annotated[float | None, typer.Option("--duration", callback=_seconds, metavar="S", help="With --pid: stop after S seconds (default: when the process exits, or Ctrl-C).")] = None,
    perf_events: Annotated[str, typer.Option("--perf-events", metavar="LIST", help="perf events to count beside the cpu-clock stacks, EVENT[@PERIOD],... (e.g. context-switches,page-faults,cycles); one perf refuses here is left out, the reason in the manifest.")] = "",
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Run directory to create (default: <program>.run).")] = None,
    collectors: Annotated[str, typer.Option("--collectors", "-c", help="Comma-separated: torch, system, gpu, perf, pystacks; strace and net (tcpdump) are opt-in.")] = ",".join(DEFAULT_COLLECTORS),
    hz: Annotated[float, typer.Option("--hz", min=0.1, max=1000, help="System and GPU sampling rate.")] = SAMPLER_HZ,
    steps: Annotated[str, typer.Option("--steps", help="Profiling window SKIP:COUNT in optimizer steps (SKIP 0: it opens when the first optimizer is built).")] = "5:10",
    perf_hz: Annotated[int, typer.Option("--perf-hz", min=1, max=100_000, help="perf sampling frequency.")] = PERF_HZ,
    pystacks_hz: Annotated[int, typer.Option("--pystacks-hz", min=1, max=1000, help="py-spy sampling rate.")] = PYSTACKS_HZ,
    no_et: Annotated[bool, typer.Option("--no-et", help="Skip the execution trace of the first profiled step.")] = False,
    heap_reserve: Annotated[int, typer.Option("--heap-reserve", min=0, metavar="MIB", help=f"Opt-in: heap the profiled process writes and frees before the window opens, so the tensors the profiler's allocations displace do not page-fault new memory every step ({RESERVE_PER_STEP_MIB} MiB per profiled step took all of a CPU transformer's). It changes the program measured: it stays in the process's heap, as free memory, until it exits.")] = 0,
    force: Annotated[bool, typer.Option("--force", help="Replace RUN if it exists.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No status line or summary.")] = False,
) -> int:
    """Run an unmodified command under every collector and leave an ingested Run."""
    from rich.live import Live
    from rich.text import Text

    from perfswarm.cli.output import err_console
    from perfswarm.errors import PerfswarmError
    from perfswarm.recorder.attach import attach
    from perfswarm.recorder.perf import parse_events
    from perfswarm.recorder.session import RecordOptions, parse_steps, record

    if hz <= 0 or perf_hz < 1 or pystacks_hz < 1:
        raise typer.BadParameter("sampling rates must be positive")
    if pid is not None and command:
        raise PerfswarmError("record: give either a command after -- or --pid PID, not both")
    if pid is None and not command:
        raise PerfswarmError("record: no command to record: give it after -- (perfswarm record "
                             "-o RUN -- python train.py), or --pid PID to attach")
    if duration is not None and pid is None:
        raise PerfswarmError("--duration goes with --pid (a command runs until it exits)")
    skip, count = parse_steps(steps)
    options = RecordOptions(
        collectors=tuple(c.strip() for c in collectors.split(",") if c.strip()), hz=hz,
        perf_hz=perf_hz, pystacks_hz=pystacks_hz, skip=skip, steps=count,
        execution_trace=not no_et, force=force, heap_reserve_mib=heap_reserve,
        perf_events=parse_events(perf_events))
    target = out or Path(f"pid{pid}.run" if command is None else Path(command[0]).name + ".run")
    live = not quiet and sys.stderr.isatty()
    with Live(Text(""), console=err_console, transient=True, auto_refresh=False,
              redirect_stdout=False, redirect_stderr=False) if live else _Null() as status:
        show = (lambda s: status.update(status_line(s), refresh=True)) if live else None
        result = (attach(pid, target, options, duration, show) if pid is not None
                  else record(command or [], target, options, show))
    if not quiet:
        m = result.run.manifest()
        states = ", ".join(f"{k}: {v['status']}" for k, v in sorted(m["collectors"].items()))
        how = "complete" if m["complete"] else "incomplete"
        on = _STEPS_AT.get(str(m.get("extra", {}).get("record", {}).get("window_on")))
        # on stderr: the program's stdout is its own (a CSV it prints, redirected to a file)
        err_console.print(f"recorded {result.run.path} ({how}, exit {result.exit_code}); "
                          f"{states}" + (f"; a step at each {on}" if on else ""), soft_wrap=True)
    return result.exit_code


# what counted the steps (manifest extra.record.window_on), in the summary line's words
_STEPS_AT = {"optimizer": "optimizer step", "backward": "backward() (no optimizer stepped)",
             "forward": "top-level forward() (no optimizer stepped, no backward)"}


class _Null:
    def __enter__(self) -> _Null:
        return self

    def __exit__(self, *_: object) -> None:
        return None

    def update(self, *_: object, **__: object) -> None:
        return None
