"""Entry point: `main(argv) -> int`, turning PerfswarmError into one line and an exit code."""

from __future__ import annotations

import gc
import sys

import typer
import typer.main

from perfswarm.cli.app import app
from perfswarm.cli.output import err_console
from perfswarm.errors import ParameterError, PerfswarmError


def error_text(exc: PerfswarmError) -> str:
    """The error as the CLI says it: a library parameter named by its flag."""
    return exc.as_flags() if isinstance(exc, ParameterError) else str(exc)


# A command is one short process that builds a trace's worth of containers (lists and tuples
# of its rows) and drops them together: with Python's default (a young collection every 700
# new containers, each full one walking them all) the collector took 0.18-0.25 of the 3 CPU s
# of a 200k-event report; every 50,000, 0.04-0.05 s (docs/benchmarks.md).
GC_THRESHOLD = (50_000, 20, 20)


def main(argv: list[str] | None = None) -> int:
    gc.set_threshold(*GC_THRESHOLD)
    command = typer.main.get_group(app)
    try:
        result = command.main(args=argv, prog_name="perfswarm", standalone_mode=False)
    except PerfswarmError as exc:
        err_console.print(f"perfswarm: error: {error_text(exc)}", soft_wrap=True)
        return exc.exit_code
    except typer.Abort:
        err_console.print("perfswarm: aborted")
        return 130
    except typer.Exit as exc:
        return int(exc.exit_code)
    except typer.TyperException as exc:  # typer's click: usage errors, bad parameters
        # One line like every other error, naming where to read the usage.
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        ctx = getattr(exc, "ctx", None)
        where = f" (see {ctx.command_path} -h)" if ctx is not None else ""
        if message.strip():  # empty when the help was shown instead (no arguments)
            err_console.print(f"perfswarm: error: {' '.join(message.split())}{where}",
                              soft_wrap=True)
        return int(getattr(exc, "exit_code", 2))
    return result if isinstance(result, int) else 0


def run() -> None:
    sys.exit(main())


if __name__ == "__main__":
    run()
