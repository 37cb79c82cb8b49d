"""Users' files in and out, one-line errors (YAML spaces and tables, JSON profiles, overhead
models, tune outputs), and the package's own YAML data (device specs, interconnects)."""

from __future__ import annotations

from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import orjson
import yaml

from perfswarm.errors import PerfswarmError
from perfswarm.trace.store import write_output


def _parsed(path: Path, parse: Callable[[bytes], Any], errors: type[Exception] | tuple[
        type[Exception], ...], what: str) -> Any:
    try:
        return parse(path.read_bytes())
    except OSError as exc:
        raise PerfswarmError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except errors as exc:
        raise PerfswarmError(f"{path}: invalid {what} ({str(exc).splitlines()[0]})") from None


def read_yaml(path: Path) -> Any:
    """A user's YAML file; unreadable or malformed files raise PerfswarmError naming the file."""
    return _parsed(path, yaml.safe_load, yaml.YAMLError, "YAML")


def read_json(path: Path) -> Any:
    """A user's JSON file; unreadable or malformed files raise PerfswarmError naming the file."""
    return _parsed(path, orjson.loads, orjson.JSONDecodeError, "JSON")


def write_json(path: Path, data: Any) -> None:
    """`data` as stable JSON (sorted keys, indented) at `path`, atomically; errors in one line."""
    write_output(path, orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)
                 + b"\n")


def bundled_mapping(package: str, name: str) -> dict[Any, Any]:
    """A YAML mapping shipped inside `package` (e.g. the device specs)."""
    data = yaml.safe_load(resources.files(package).joinpath(name).read_text())
    if not isinstance(data, dict):
        raise PerfswarmError(f"{name}: expected a mapping of names")
    return data
