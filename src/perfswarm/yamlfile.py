"""YAML in, one-line errors out: users' files (spaces, tables) and the package's own data."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from perfswarm.errors import PerfswarmError


def read_yaml(path: Path) -> Any:
    """A user's YAML file; unreadable or malformed files raise PerfswarmError naming the file."""
    try:
        return yaml.safe_load(path.read_text())
    except OSError as exc:
        raise PerfswarmError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except yaml.YAMLError as exc:
        raise PerfswarmError(f"{path}: invalid YAML ({str(exc).splitlines()[0]})") from None


def bundled_mapping(package: str, name: str) -> dict[Any, Any]:
    """A YAML mapping shipped inside `package` (e.g. the device specs)."""
    data = yaml.safe_load(resources.files(package).joinpath(name).read_text())
    if not isinstance(data, dict):
        raise PerfswarmError(f"{name}: expected a mapping of names")
    return data
