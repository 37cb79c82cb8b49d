"""Users' files in and out, one-line errors (YAML spaces and tables, JSON profiles, overhead
models, tune outputs), and the package's own YAML data (device specs, interconnects)."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import orjson
import yaml

from perfswarm.errors import PerfswarmError
from perfswarm.trace.store import write_output

# Users' files are small (a space, a table list, a profile): past this, something is wrong.
MAX_USER_FILE = 64 << 20


def _parsed(path: Path, parse: Callable[[bytes], Any], errors: type[Exception] | tuple[
        type[Exception], ...], what: str) -> Any:
    """`parse` of a regular file's bytes: a FIFO, a device (/dev/zero) or an oversized file is
    refused before it is read, a parser's recursion limit is one line like any syntax error."""
    try:
        # O_NONBLOCK: opening a FIFO nobody writes to would wait for ever
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise PerfswarmError(f"{path}: not a regular file")
            if info.st_size > MAX_USER_FILE:
                raise PerfswarmError(f"{path}: {info.st_size:,} bytes, over the "
                                     f"{MAX_USER_FILE >> 20} MiB a {what} input may have")
            data = f.read()
        return parse(data)
    except OSError as exc:
        raise PerfswarmError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except RecursionError:
        raise PerfswarmError(f"{path}: invalid {what} (nested too deep)") from None
    except errors as exc:
        raise PerfswarmError(f"{path}: invalid {what} ({str(exc).splitlines()[0]})") from None


class _NoAliasLoader(yaml.SafeLoader):
    """safe_load without anchors/aliases: a few lines of aliases can stand for billions of
    nodes ("billion laughs"), and no perfswarm YAML needs them."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise yaml.composer.ComposerError(None, None, "aliases (*name) are not accepted",
                                              event.start_mark)
        return super().compose_node(parent, index)


def _load_yaml(data: bytes) -> Any:
    return yaml.load(data, Loader=_NoAliasLoader)


def read_yaml(path: Path) -> Any:
    """A user's YAML file; unreadable or malformed files raise PerfswarmError naming the file."""
    return _parsed(path, _load_yaml, yaml.YAMLError, "YAML")


def read_json(path: Path) -> Any:
    """A user's JSON file; unreadable or malformed files raise PerfswarmError naming the file."""
    return _parsed(path, orjson.loads, orjson.JSONDecodeError, "JSON")


def write_json(path: Path, data: Any) -> None:
    """`data` as stable JSON (sorted keys, indented) at `path`, atomically; errors in one line."""
    write_output(path, orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)
                 + b"\n")


def bundled_mapping(package: str, name: str) -> dict[Any, Any]:
    """A YAML mapping shipped inside `package` (e.g. the device specs), read by libyaml where
    PyYAML has it (6x faster than its Python loader on the device specs: 0.03 s of a command)."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    data = yaml.load(resources.files(package).joinpath(name).read_text(), Loader=loader)
    if not isinstance(data, dict):
        raise PerfswarmError(f"{name}: expected a mapping of names")
    return data
