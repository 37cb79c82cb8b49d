"""JSON in, one-line errors out: users' files (profiles, overhead models, tune outputs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from perfswarm.errors import PerfswarmError


def read_json(path: Path) -> Any:
    """A JSON file; unreadable or malformed files raise PerfswarmError naming the file."""
    try:
        return orjson.loads(path.read_bytes())
    except OSError as exc:
        raise PerfswarmError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except orjson.JSONDecodeError as exc:
        raise PerfswarmError(f"{path}: invalid JSON ({exc})") from None
