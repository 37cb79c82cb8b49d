"""The one error type that reaches the user: a message and an exit code."""

from __future__ import annotations

from pathlib import Path


class PerfswarmError(Exception):
    """An error the CLI prints as one line and turns into an exit code."""

    exit_code: int = 2

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class TraceFormatError(PerfswarmError):
    """A raw input file that cannot be read: names the file, where in it, and why."""

    def __init__(self, path: str | Path, where: str, why: str) -> None:
        self.path = str(path)
        self.where = where
        # Parsers' messages may span lines (yajl draws a caret); the first one says it.
        self.why = why.strip().splitlines()[0] if why.strip() else "unreadable"
        location = f" ({where})" if where else ""
        super().__init__(f"{self.path}{location}: {self.why}")


class RunError(PerfswarmError):
    """A Run directory that is missing, incomplete or not a Run."""
