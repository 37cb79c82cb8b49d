"""Shared terminal output: one rich console for results, one for errors and progress.

Neither parses markup or emoji codes: every string printed (names from traces, paths, commands,
advice) is text, so "[param|cuda]" or "[/x]" prints as itself. Styled parts are given as
`rich.text.Text` (e.g. `Text.assemble((path, "bold"), ": ...")`)."""

from __future__ import annotations

import sys
from typing import Any

import orjson
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

console = Console(highlight=False, markup=False, emoji=False)
err_console = Console(stderr=True, highlight=False, markup=False, emoji=False)


def print_json(data: Any) -> None:
    """Stable JSON (sorted keys, 2-space indent) on stdout."""
    text = orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS
                        | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)
    sys.stdout.write(text.decode() + "\n")


def description() -> TextColumn:
    """A progress column showing the task's description as text (it may name files)."""
    return TextColumn("{task.description}", markup=False)


def spinner() -> Progress:
    """A transient spinner with elapsed time on stderr, for work that shows no count."""
    return Progress(SpinnerColumn(), description(), TimeElapsedColumn(),
                    console=err_console, transient=True)


def progress_bar() -> Progress:
    """A transient bar with a count and elapsed time on stderr, for work of known size."""
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=err_console, transient=True)


def ms(ns: float) -> str:
    return f"{ns / 1e6:,.3f} ms"
