"""Shared terminal output: one rich console for results, one for errors and progress.

Neither parses markup or emoji codes: every string printed (names from traces, paths, commands,
advice) is text, so "[param|cuda]" or "[/x]" prints as itself. Styled parts are given as
`rich.text.Text` (e.g. `Text.assemble((path, "bold"), ": ...")`).

Control characters and bidirectional overrides in that text would drive the terminal, so both
consoles show them as escapes (perfswarm.shown.visible: `\x1b`, `\u202e`; rich itself drops
BEL, BS, VT, FF and CR from Text), a newline in a string too (`\n`: a name's newline had split
a table's row), and JSON escapes them (cli/json_output.py, which imports no rich: a command
printing JSON alone loads none of it)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from typing import Any, Final, TextIO

from rich.console import Console, ConsoleOptions, RenderableType
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    Task,
    TimeElapsedColumn,
)
from rich.segment import Segment
from rich.text import Text

from perfswarm.shown import visible


class _TextConsole(Console):
    """A console that prints data as text: no markup, no emoji codes, no control characters."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(highlight=False, markup=False, emoji=False, **kwargs)

    def render_str(self, text: str, **kwargs: Any) -> Text:
        # before rich drops BEL, CR, ...; a newline in a string (a name in a table's cell) is
        # shown as an escape too: it had split the row into rows of empty cells (lines of
        # output are printed apart, or as Text, which keeps its own)
        return super().render_str(visible(text).replace("\n", "\\n"), **kwargs)

    def render(self, renderable: RenderableType, options: ConsoleOptions | None = None
               ) -> Iterable[Segment]:
        for segment in super().render(renderable, options):  # Text built by callers
            yield segment if segment.control else Segment(visible(segment.text), segment.style)


def _width(stream: TextIO) -> int | None:
    """Rich's width (None: the terminal's, or $COLUMNS); written to a file or a pipe, where
    rich takes 80 columns and cuts a table's numbers ("1,30... ms"), 160."""
    return None if "COLUMNS" in os.environ or stream.isatty() else PIPED_WIDTH


PIPED_WIDTH: Final = 160
console = _TextConsole(width=_width(sys.stdout))
err_console = _TextConsole(stderr=True, width=_width(sys.stderr))


class _Description(ProgressColumn):
    """The task's description as text (it may name files), escaped before it is measured."""

    def render(self, task: Task) -> Text:
        return Text(visible(task.description))


def description() -> ProgressColumn:
    """A progress column showing the task's description as text (it may name files)."""
    return _Description()


def spinner() -> Progress:
    """A transient spinner with elapsed time on stderr, for work that shows no count; none
    where stderr is no terminal (rich then leaves an empty line, before an error too)."""
    return Progress(SpinnerColumn(), description(), TimeElapsedColumn(),
                    console=err_console, transient=True, disable=not err_console.is_terminal)


def progress_bar(quiet: bool = False) -> Progress:
    """A transient bar with a count and elapsed time on stderr, for work of known size (none
    when `quiet`, or where stderr is no terminal, as spinner)."""
    return Progress(description(), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=err_console, transient=True,
                    disable=quiet or not err_console.is_terminal)

