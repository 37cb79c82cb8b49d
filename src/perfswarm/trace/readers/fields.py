"""What the readers of tools' text and sampler files share: the bound on a clock reading, a
checked integer field, and a counter row."""

from __future__ import annotations

from pathlib import Path

from perfswarm.errors import TraceFormatError

# Tools' clock readings and durations beyond this (146 years of ns) are not a clock; the bound
# leaves room to add an epoch offset, or a duration to a time, within int64.
MAX_CLOCK_NS = 1 << 62
Row = tuple[int, str, int, float]  # ts, name, device, value


def int64_field(text: str, path: Path, line: int, what: str, limit: int = 1 << 63) -> int:
    """A decimal (or 0x-hex) integer field of a tool's text output, checked to fit `limit`
    (an int64 column by default): anything larger means the file is not what the tool writes."""
    if len(text) <= 20:  # longer cannot fit, and int() of thousands of digits is refused
        value = int(text, 16) if text[:2] in ("0x", "0X") else int(text)
        if -limit <= value < limit:
            return value
    raise TraceFormatError(path, f"line {line}", f"{what} out of range: {text[:24]}")
