"""Entry point: `main(argv) -> int`, turning PerfswarmError into one line and an exit code."""

from __future__ import annotations

import gc
import sys

import typer
import typer.main

from perfswarm.cli.app import app
from perfswarm.errors import ParameterError, PerfswarmError


def error_text(exc: PerfswarmError) -> str:
    """The error as the CLI says it: a library parameter named by its flag."""
    return exc.as_flags() if isinstance(exc, ParameterError) else str(exc)


# A command is one short process that builds a trace's worth of containers (lists and tuples
# of its rows) and drops them together: with Python's default (a young collection every 700
# new containers, each full one walking them all) the collector took 0.18-0.25 of the 3 CPU s
# of a 200k-event report; every 50,000, 0.04-0.05 s (docs/benchmarks.md).
GC_THRESHOLD = (50_000, 20, 20)


def _error(line: str) -> None:
    """One line on stderr by the error console (rich is imported by a command that prints to
    the terminal, or here: `analyze --json` loads none of it)."""
    from perfswarm.cli.output import err_console

    err_console.print(line, soft_wrap=True)


def main(argv: list[str] | None = None) -> int:
    gc.set_threshold(*GC_THRESHOLD)
    command = typer.main.get_group(app)
    try:
        result = command.main(args=argv, prog_name="perfswarm", standalone_mode=False)
    except PerfswarmError as exc:
        _error(f"perfswarm: error: {error_text(exc)}")
        return exc.exit_code
    except typer.Abort:
        _error("perfswarm: aborted")
        return 130
    except typer.Exit as exc:
        return int(exc.exit_code)
    except typer.TyperException as exc:  # typer's click: usage errors, bad parameters
        # One line like every other error, naming where to read the usage.
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        ctx = getattr(exc, "ctx", None)
        where = f" (see {ctx.command_path} -h)" if ctx is not None else ""
        if message.strip():  # empty when the help was shown instead (no arguments)
            _error(f"perfswarm: error: {' '.join(message.split())}{where}")
        return int(getattr(exc, "exit_code", 2))
    return result if isinstance(result, int) else 0


def run() -> None:
    sys.exit(main())


if __name__ == "__main__":
    run()
