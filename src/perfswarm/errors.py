"""The error types that reach the user: a message and an exit code.

The library speaks of its own parameters, never of command-line flags: a `ParameterError`
carries the parameter's name, its message shows Python names (`devices`), and the CLI shows
the same error with the flag that sets that parameter (`--devices`, see cli/main.py)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

# `{name}` in a ParameterError's `why`: another parameter the message points to
_PARAM = re.compile(r"\{([a-z][a-z_]*)\}")
# Library parameters whose command-line flag is not `--` + the name with dashes (see flag()).
FLAGS = {"ranks": "--rank", "execution_traces": "--et", "bandwidth_gbps": "--bandwidth",
         "layers": "--layer", "budget_s": "--budget",
         "dims": "--dim", "memory_timelines": "--memory-timeline"}


def flag(param: str) -> str:
    """The command-line flag that sets the library parameter `param`: how the CLI, and the
    report (which tells its reader what to run), name it."""
    return FLAGS.get(param, "--" + param.replace("_", "-"))


# line breaks and the blanks around them, in a message: a library's own text (pyarrow's
# "Couldn't deserialize thrift: ...\n") ends its lines where one line is promised
_BREAKS = re.compile(r"\s*[\n\r\v\f\x1c-\x1e\x85\u2028\u2029]+\s*")


class PerfswarmError(Exception):
    """An error the CLI prints as one line and turns into an exit code: its message is one
    line whatever text it quotes (line breaks become a space)."""

    exit_code: int = 2

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(_BREAKS.sub(" ", message).strip())
        self.exit_code = exit_code

    def noted(self, note: str) -> PerfswarmError:
        """The same error with `note` (text, shown as it is) added at its end."""
        return PerfswarmError(f"{self}; {note}", self.exit_code)


class ParameterError(PerfswarmError):
    """A bad argument: `param` is the parameter's Python name, `value` what it was given (shown
    after the name), `subject` what the error is about (a file, a Run), `detail` text from the
    data (shown as it is) and `why` our own words, which may point at other parameters as
    `{name}` (e.g. "use {force} to replace it").

    `message(name)` renders it with `name` turning each parameter name into how the reader
    knows it: the library's message keeps the Python names, the CLI maps them to flags."""

    def __init__(self, param: str | None, why: str, *, value: object = None,
                 subject: str | Path | None = None, detail: str = "", note: str = "",
                 exit_code: int = 2) -> None:
        self.param = param
        self.template = why  # `why`, its {name}s not yet rendered
        self.value = value
        self.subject = subject
        self.detail = detail
        self.note = note
        super().__init__(self.message(lambda name: name), exit_code)

    def noted(self, note: str) -> ParameterError:
        return ParameterError(self.param, self.template, value=self.value, subject=self.subject,
                              detail=self.detail, note="; ".join(t for t in (self.note, note) if t),
                              exit_code=self.exit_code)

    def as_flags(self) -> str:
        """The message with each parameter named by its command-line flag."""
        return self.message(flag)

    def message(self, name: Callable[[str], str]) -> str:
        head = [] if self.subject is None else [str(self.subject)]
        if self.param is not None:
            head.append(name(self.param) + ("" if self.value is None else f" {self.value}"))
        why = _PARAM.sub(lambda m: name(m.group(1)), self.template)
        return ": ".join([*head, "; ".join(t for t in (self.detail, why, self.note) if t)])


class NotApplicable(ParameterError):
    """The Run lacks what a result needs (events, device kernels, collectives): a caller that
    gathers several results (the report) leaves this one out and says why; every other error
    stays an error. It may point at the parameter that would supply what is missing."""


class TraceFormatError(ParameterError):
    """A raw input file that cannot be read: names the file, where in it, and why (`why`, the
    parser's words, as they are); `hint` (our words) may point at a parameter that helps."""

    def __init__(self, path: str | Path, where: str, why: str, hint: str = "") -> None:
        self.path = str(path)
        self.where = where
        # Parsers' messages may span lines (yajl draws a caret); the first one says it.
        reason = why.strip().splitlines()[0] if why.strip() else "unreadable"
        location = f" ({where})" if where else ""
        super().__init__(None, hint, subject=f"{self.path}{location}", detail=reason)
        self.why = reason


class RunError(PerfswarmError):
    """A Run directory that is missing, incomplete or not a Run."""
