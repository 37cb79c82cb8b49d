"""A time of interest: the Run seen through a window [start, end) of its clock.

`--window START:END` (seconds from the Run's first event, sample or counter reading; either
side may be left out) hands every analysis a `WindowedRun`: its events are those that overlap
the window, clipped to it (an op running across the edge counts only its time inside), its
counter readings and stack samples those taken inside, its steps those that overlap, clipped
too. The analyses themselves do not change: they read the Run's tables as ever.
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from perfswarm.errors import ParameterError
from perfswarm.trace.store import Run

SPANS = {"events": ("ts", "dur"), "steps": ("start", "end")}
POINTS = {"counters": "ts", "samples": "ts"}


def parse_window(text: str) -> tuple[float | None, float | None]:
    """`START:END` in seconds (`2:`, `:5` leave a side open) -> (start, end)."""
    lo, sep, hi = text.partition(":")
    try:
        start = float(lo) if lo.strip() else None
        end = float(hi) if hi.strip() else None
    except ValueError:
        start = end = math.nan
    bad = (not sep or any(v is not None and not math.isfinite(v) for v in (start, end))
           or (start is not None and start < 0)
           or (start is not None and end is not None and end <= start))
    if bad:
        raise ParameterError("window", "expected START:END in seconds from the Run's "
                             "start, 0 <= START < END (e.g. 1.5:3, or 2: to the end)", value=text)
    return start, end


def run_start(run: Run) -> int | None:
    """The Run's first time (ns): its earliest event, counter reading or sample."""
    firsts = [pc.min(run.table(name, ["ts"]).column("ts")).as_py()
              for name in ("events", "counters", "samples")]
    found = [int(f) for f in firsts if f is not None]
    return min(found) if found else None


class WindowedRun(Run):
    """`run` seen through [start_ns, end_ns)."""

    def __init__(self, run: Run, start_ns: int, end_ns: int, text: str) -> None:
        super().__init__(run.path)
        self.window = (start_ns, end_ns)
        self.text = text  # as --window gave it

    def table(self, name: str, columns: list[str] | None = None, *,
              rank: int | None = None) -> pa.Table:
        keys: tuple[str, ...] = SPANS.get(name) or ((POINTS[name],) if name in POINTS else ())
        if not keys:
            return super().table(name, columns, rank=rank)
        wanted = columns or super().table(name).column_names
        table = super().table(name, list(dict.fromkeys([*wanted, *keys])), rank=rank)
        lo, hi = self.window
        if name in POINTS:
            ts = table.column(keys[0]).to_numpy()
            return table.filter(pa.array((ts >= lo) & (ts < hi))).select(wanted)
        start = np.asarray(table.column(keys[0]).to_numpy(), np.int64)
        other = np.asarray(table.column(keys[1]).to_numpy(), np.int64)
        end = start + other if name == "events" else other
        keep = ((start < hi) & (end > lo)) | ((start == end) & (start >= lo) & (start < hi))
        table = table.filter(pa.array(keep))
        s, e = np.clip(start[keep], lo, hi), np.clip(end[keep], lo, hi)
        table = table.set_column(table.schema.get_field_index(keys[0]), keys[0],
                                 pa.array(s, pa.int64()))
        table = table.set_column(table.schema.get_field_index(keys[1]), keys[1],
                                 pa.array(e - s if name == "events" else e, pa.int64()))
        return table.select(wanted)


def windowed(run: Run, text: str | None) -> Run:
    """`run`, or its WindowedRun when a `--window` is given."""
    if text is None:
        return run
    start, end = parse_window(text)
    first = run_start(run)
    if first is None:
        raise ParameterError(None, "the Run has no times to take a {window} of", subject=run.path)
    lo = first + round((start or 0.0) * 1e9)
    hi = first + round(end * 1e9) if end is not None else np.iinfo(np.int64).max
    return WindowedRun(run, lo, int(hi), text)
