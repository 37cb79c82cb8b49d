"""The report's timeline: spans nested per thread and stream.

Every span gets a lane (a rank's CPU thread, or a device stream) and a depth (how many
spans of its lane enclose it), found with one stack walk per lane. Only spans with a
duration are drawn; the tables of time by op, shape and module count calls as analyze's
`host_calls` defines them (zero-length ones too), not these spans.

Times are integer ns from the run's start (the earliest event, counter sample or step),
so the axis starts at 0 and nothing is lost to floats. Above `max_spans` the longest
spans are kept: a parent is never shorter than its child, so the kept spans still nest.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from perfswarm.analyze.frame import I64, Events, codes, unique_rows
from perfswarm.analyze.nesting import bounded_open_before
from perfswarm.analyze.nesting import depth as nesting_depth
from perfswarm.trace.schema import DEVICE_KINDS
from perfswarm.trace.store import Run

# A canvas draws tens of thousands of spans per frame; the page stays a few MB.
MAX_SPANS: Final = 50_000
MAX_COUNTER_POINTS: Final = 1000  # per series
MAX_FLOWS: Final = 8  # network flows drawn (the largest by bytes): a capture can hold thousands
# The trace window itself (Kineto's "Trace" span) and instants are not work on a lane.
NOT_DRAWN: Final = frozenset({"trace_span", "instant", "profiler_range"})
# what the timeline and the views read of each span, and what places it on a lane
_DRAWN: Final = ["ts", "dur", "kind", "name"]
_LANE: Final = ["rank", "pid", "tid", "device", "stream"]


def run_origin(run: Run) -> int:
    """The run's start in ns: its earliest event, counter sample or step."""
    starts = [pc.min(run.table(name, [column]).column(column)).as_py()
              for name, column in (("events", "ts"), ("counters", "ts"), ("steps", "start"))
              if run.has_table(name)]
    known = [s for s in starts if s is not None]
    return min(known) if known else 0


@dataclass(frozen=True)
class Nesting:
    """Per span (rows of the events table as loaded): lane and depth."""

    lane: I64  # index into `lanes`
    depth: I64
    lanes: tuple[tuple[int, bool, int, int], ...]  # (rank, device?, pid or device, tid or stream)


def _lanes(keys: I64) -> tuple[I64, tuple[tuple[int, bool, int, int], ...]]:
    """Each span's lane, of its key rows (rank, device?, pid or device, tid or stream)."""
    head, inverse = unique_rows(keys)
    lanes = tuple((int(r), bool(d), int(x), int(y)) for r, d, x, y in keys[head].tolist())
    return inverse, lanes


def nest(table: pa.Table, rows: I64) -> Nesting:
    """Lanes and depths of the spans at `rows` (sorted) of an events table."""

    def col(name: str) -> I64:
        return np.asarray(table.column(name).to_numpy(), np.int64)[rows]

    ts, dur = col("ts"), col("dur")
    is_device = np.asarray(pc.is_in(table.column("kind").cast(pa.string()),
                                    pa.array(sorted(DEVICE_KINDS))).to_numpy(
                                        zero_copy_only=False), bool)[rows]
    # each column read as it is used, not all five held beside the keys (1 MB each at 120k)
    lane, lanes = _lanes(np.stack([col("rank"), is_device.astype(np.int64),
                                   np.where(is_device, col("device"), col("pid")),
                                   np.where(is_device, col("stream"), col("tid"))], axis=1))
    # a span that outlives its parent is cut at the parent's end
    order = np.lexsort((-dur, ts, lane))
    start, end = ts[order], (ts + dur)[order]
    del ts, dur  # not held under the sweep's own arrays
    parent, _bound = bounded_open_before(lane[order], start, end)
    depth = np.zeros(len(order), np.int64)
    depth[order] = nesting_depth(parent)
    return Nesting(lane, depth, lanes)


def _lane_label(lane: tuple[int, bool, int, int], threads: Mapping[str, str],
                several_ranks: bool, pids_of_rank: Mapping[int, int]) -> str:
    rank, device, a, b = lane
    if device:
        where = f"GPU {a} · stream {b}"
    else:
        where = threads.get(f"{rank}:{a}:{b}") or f"thread {b}"
        if pids_of_rank.get(rank, 1) > 1:
            where = f"pid {a} · {where}"
    return f"rank {rank} · {where}" if several_ranks else where


def _unit(name: str) -> str:
    last = name.rsplit(".", 1)[-1].lower()
    if "bytes" in last:
        return "bytes"
    if last in {"usr", "sys", "iowait", "steal", "idle"} or "util" in last or last.endswith("pct"):
        return "%"
    if last == "mhz" or last.endswith("_mhz"):  # a clock is no share: its own chart
        return "MHz"
    return ""


# a process's own counters (proc.PID.main_run_delay_cores): one a process, so a loop whose
# DataLoader workers start each epoch has hundreds; the advice reads them, the charts draw the
# tree's (proc.run_delay_cores)
_PER_PROCESS: Final = re.compile(r"^proc\.\d+\.")


def _drawn_counters(table: pa.Table) -> tuple[list[str], int]:
    """Counter names to draw, and how many network flows there were: of the flows only the
    largest (by final bytes) are kept, as their byte lines; no process's own (_PER_PROCESS)."""
    names = sorted(n for n in set(table.column("name").cast(pa.string()).to_pylist())
                   if not _PER_PROCESS.match(n))
    flow_bytes = table.filter(pc.and_(
        pc.starts_with(table.column("name").cast(pa.string()), "net.flow."),
        pc.ends_with(table.column("name").cast(pa.string()), ".bytes")))
    totals = flow_bytes.group_by("name").aggregate([("value", "max")]).to_pylist()
    top = {t["name"] for t in sorted(totals, key=lambda t: (-t["value_max"], t["name"]))
           [:MAX_FLOWS]}
    return [n for n in names if not n.startswith("net.flow.") or n in top], len(totals)


def counter_groups(run: Run, origin: int, max_points: int = MAX_COUNTER_POINTS,
                   ) -> tuple[list[dict[str, Any]], list[str], int, int]:
    """Counters as small charts, one per source and unit (`cpu` %, `mem` bytes, ...), so
    gigabytes of memory do not flatten CPU shares. Returns the groups, notes, and samples
    shown and recorded."""
    if not run.has_table("counters"):
        return [], [], 0, 0
    table = run.table("counters")
    several = len(run.manifest()["ranks"]) > 1
    names, flows = _drawn_counters(table)
    notes = [f"showing the {MAX_FLOWS} largest of {flows:,} network flows"] \
        if flows > MAX_FLOWS else []
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    shown = 0
    column = table.column("name").cast(pa.string())
    for name in names:
        series = table.filter(pc.equal(column, name))
        for rank in sorted(set(series.column("rank").to_pylist())):
            mine = series.filter(pc.equal(series.column("rank"), rank))
            mine = mine.take(pc.sort_indices(mine, [("ts", "ascending")]))
            step = max(1, -(-mine.num_rows // max_points))
            ts = mine.column("ts").to_pylist()[::step]
            shown += len(ts)
            unit = _unit(name)
            source = name.split(".", 1)[0] if "." in name else name
            groups.setdefault((source, unit), []).append({
                "name": f"rank {rank} · {name}" if several and rank >= 0 else name,
                "t_ms": [(t - origin) / 1e6 for t in ts],
                "value": mine.column("value").to_pylist()[::step]})
    # Shares recorded as fractions (psutil's) are drawn as percentages all the same.
    out = [{"title": f"{source} ({unit})" if unit else source, "unit": unit, "series": s,
            "fraction": unit == "%" and max((max(c["value"], default=0) for c in s),
                                            default=0) <= 1}
           for (source, unit), s in sorted(groups.items())]
    return out, notes, shown, table.num_rows


@dataclass(frozen=True)
class Spans:
    """The events drawn on lanes (a duration, not the trace window) and their nesting."""

    table: pa.Table  # their _DRAWN columns
    nesting: Nesting
    events: int  # rows of the events table, drawn or not
    rows: I64  # each span's row in the events table (its args are read from there)


def spans(run: Run) -> Spans:
    events = run.table("events", [*_DRAWN, *_LANE])
    # the durations the analyses read (frame.Events: a range the profiler stopped inside ends
    # with its trace window), row for row the table's
    events = events.set_column(events.schema.get_field_index("dur"), "dur",
                               pa.array(Events.load(run).dur))
    kinds = events.column("kind").cast(pa.string())
    mask = pc.and_(pc.greater(events.column("dur"), 0),
                   pc.invert(pc.is_in(kinds, pa.array(sorted(NOT_DRAWN)))))
    rows = np.flatnonzero(np.asarray(mask.to_numpy(), bool))
    # of the drawn rows only what is read of them is copied (their lanes' columns are not)
    return Spans(events.select(_DRAWN).filter(mask), nest(events, rows), events.num_rows, rows)


def _interned(column: pa.ChunkedArray, rows: I64) -> tuple[I64, list[str]]:
    """The text of a dictionary column at `rows` as ids into a list of its distinct values, in
    the order they first occur (no string per row)."""
    idx, values = codes(column)
    taken = idx[rows]
    found, first, inverse = np.unique(taken, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    renumber = np.empty(len(found), np.int64)
    renumber[order] = np.arange(len(found))
    return renumber[inverse.reshape(-1)], [values[found[j]] for j in order.tolist()]


def timeline(run: Run, spans: Spans, origin: int, max_spans: int = MAX_SPANS,
             max_points: int = MAX_COUNTER_POINTS) -> dict[str, Any]:
    """Spans nested per lane (CPU threads first, then device streams), counters grouped per
    unit, steps as bands. Span times are ns from `origin`; names and kinds are interned; the
    spans' columns are int64 arrays."""
    manifest = run.manifest()
    drawn, nesting, total = spans.table, spans.nesting, spans.events
    dur = np.asarray(drawn.column("dur").to_numpy(), np.int64)
    ts = np.asarray(drawn.column("ts").to_numpy(), np.int64)
    keep = np.arange(len(dur))
    if len(keep) > max_spans:  # the longest spans; ties by time, so the choice is stable
        keep = np.lexsort((ts, -dur))[:max_spans]
    keep = keep[np.lexsort((ts[keep], nesting.lane[keep]))]
    lanes_used = sorted(set(nesting.lane[keep].tolist()),
                        key=lambda i: (nesting.lanes[i][0], nesting.lanes[i][1],
                                       nesting.lanes[i][2], nesting.lanes[i][3]))
    lane_index = {old: new for new, old in enumerate(lanes_used)}
    several = len(manifest["ranks"]) > 1
    pids: dict[int, set[int]] = {}
    for r, dev, a, _ in nesting.lanes:
        if not dev:
            pids.setdefault(r, set()).add(a)
    pids_of_rank = {r: len(p) for r, p in pids.items()}
    depth = nesting.depth[keep]
    lane = np.array([lane_index[i] for i in nesting.lane[keep].tolist()], np.int64)
    span_name, names = _interned(drawn.column("name"), keep)
    span_kind, kinds = _interned(drawn.column("kind"), keep)
    lanes = [{"label": _lane_label(nesting.lanes[i], manifest["threads"], several, pids_of_rank),
              "device": nesting.lanes[i][1],
              "rows": int(depth[lane == j].max()) + 1}
             for j, i in enumerate(lanes_used)]
    counters, notes, shown_points, counter_rows = counter_groups(run, origin, max_points)
    if len(keep) < len(dur):
        notes.append(f"showing the {len(keep):,} longest of {len(dur):,} spans "
                     f"(the limit is {max_spans:,})")
    if shown_points < counter_rows:
        notes.append(f"counters downsampled to {shown_points:,} of {counter_rows:,} samples")
    steps = run.table("steps").to_pylist() if run.has_table("steps") else []
    end = max([int((ts + dur).max()) if len(dur) else origin]
              + [int(s["end"]) for s in steps]) - origin
    return {
        "end_ns": end,
        "lanes": lanes,
        "names": names,
        "kinds": kinds,
        # int64 arrays, not lists: JSON writes them alike (orjson's OPT_SERIALIZE_NUMPY),
        # and 50k spans' Python ints were 6.3 MB held to the end of a report
        "spans": {"lane": lane, "depth": depth, "start": ts[keep] - origin, "dur": dur[keep],
                  "name": span_name, "kind": span_kind},
        "counters": counters,
        "steps": [{"rank": s["rank"], "step": s["step"], "source": s["source"],
                   "start": s["start"] - origin, "end": s["end"] - origin} for s in steps],
        "events": total,
        "spans_total": len(dur),  # events with a duration on a lane; instants are not drawn
        "shown": len(keep),
        "downsampled": bool(notes),
        "note": "; ".join(notes),
    }
