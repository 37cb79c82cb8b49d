"""A command's --json output, with nothing of rich imported: a command that prints JSON alone
needs none of the terminal's consoles (cli/output.py); `analyze --json` loads no rich."""

from __future__ import annotations

import sys
from typing import Any

import orjson

from perfswarm.shown import json_escaped


def print_json(data: Any) -> None:
    """Stable JSON (sorted keys, 2-space indent) on stdout, every character that would act on
    a terminal escaped (shown.json_escaped). orjson's UTF-8 bytes are written as they are:
    decoded, joined to the newline and encoded again by the text stream, a 200k-event
    report's 5 MB of JSON had been held four times over, at the command's peak."""
    text = json_escaped(orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS
                                     | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS))
    stdout = sys.stdout
    binary = getattr(stdout, "buffer", None)
    if binary is None:  # a text stream with no bytes beneath (io.StringIO)
        stdout.write(text.decode() + "\n")
        return
    stdout.flush()  # what was printed before comes first
    for part in (text, b"\n"):
        # a raw stream (python -u, PYTHONUNBUFFERED) writes what one system call takes
        view = memoryview(part)
        while view:
            view = view[binary.write(view):]
