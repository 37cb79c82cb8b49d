"""Report data: everything a report shows, as one plain JSON-ready dict built from a Run.

Renderers (report/html.py) only lay this out; tests assert on the dict. Times are ns
(ints) except the timeline, which is in ms from the run's first event, ready to plot.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final, TypedDict

import pyarrow as pa
import pyarrow.compute as pc

from perfswarm.analyze.summary import analyze, diff_runs
from perfswarm.errors import PerfswarmError
from perfswarm.model.opstats import op_costs
from perfswarm.model.predict import predict
from perfswarm.trace.schema import DEVICE_KINDS, NONE
from perfswarm.trace.store import Run

# Above these sizes the timeline keeps the longest spans / every n-th counter sample: a
# browser draws a few thousand SVG bars smoothly, not a million.
MAX_SPANS: Final = 4000
MAX_COUNTER_POINTS: Final = 1000
MAX_FLOWS: Final = 8  # network flows drawn (the largest by bytes): a capture can hold thousands
TOP_OPS: Final = 25


class Card(TypedDict):
    label: str
    value: str
    detail: str


def _ms(ns: float) -> str:
    return f"{ns / 1e6:,.3f} ms"


def _track(rank: int, device: int, pid: int, tid: int, several: bool) -> str:
    where = f"device {device} stream {tid}" if device != NONE else f"cpu {pid}:{tid}"
    return f"rank {rank} {where}" if several else where


def _drawn_counters(table: pa.Table) -> tuple[list[str], int]:
    """Counter names to draw, and how many network flows there were: of the flows only the
    largest (by final bytes) are kept, as their byte lines."""
    names = sorted(set(table.column("name").to_pylist()))
    flow_bytes = table.filter(pc.and_(
        pc.starts_with(table.column("name").cast(pa.string()), "net.flow."),
        pc.ends_with(table.column("name").cast(pa.string()), ".bytes")))
    totals = flow_bytes.group_by("name").aggregate([("value", "max")]).to_pylist()
    top = {t["name"] for t in sorted(totals, key=lambda t: (-t["value_max"], t["name"]))
           [:MAX_FLOWS]}
    return [n for n in names if not n.startswith("net.flow.") or n in top], len(totals)


def timeline(run: Run, origin: int, max_spans: int = MAX_SPANS,
             max_points: int = MAX_COUNTER_POINTS) -> dict[str, Any]:
    """CPU threads and device streams as bars, counters as lines, steps as bands."""
    ranks = run.manifest()["ranks"]
    several = len(ranks) > 1
    events = run.table("events", ["rank", "ts", "dur", "kind", "name", "pid", "tid", "device",
                                  "stream"])
    total = events.num_rows
    spans = events.filter(pc.greater(events.column("dur"), 0))
    drawable = spans.num_rows
    if drawable > max_spans:
        # Keep the longest spans; ties by time so the choice is deterministic.
        order = pc.sort_indices(spans, [("dur", "descending"), ("ts", "ascending")])
        spans = spans.take(order[:max_spans])
        spans = spans.take(pc.sort_indices(spans, [("rank", "ascending"), ("ts", "ascending")]))
    rows = spans.to_pylist()
    device_rows = [r["kind"] in DEVICE_KINDS for r in rows]
    tracks = [_track(r["rank"], r["device"] if dev else NONE, r["pid"],
                     r["stream"] if dev else r["tid"], several)
              for r, dev in zip(rows, device_rows, strict=True)]
    track_order = sorted(set(tracks), key=lambda t: ("device " in t, t))  # cpu threads first
    counters: list[dict[str, Any]] = []
    counter_rows = 0
    notes = []
    if run.has_table("counters"):
        table = run.table("counters")
        counter_rows = table.num_rows
        names, flows = _drawn_counters(table)
        if flows > MAX_FLOWS:
            notes.append(f"showing the {MAX_FLOWS} largest of {flows:,} network flows")
        for name in names:
            series = table.filter(pc.equal(table.column("name").cast(pa.string()), name))
            series = series.take(pc.sort_indices(series, [("rank", "ascending"),
                                                          ("ts", "ascending")]))
            step = max(1, -(-series.num_rows // max_points))
            ts = series.column("ts").to_pylist()[::step]
            counters.append({"name": name, "t_ms": [(t - origin) / 1e6 for t in ts],
                             "value": series.column("value").to_pylist()[::step],
                             "points": series.num_rows})
    steps = [{"rank": s["rank"], "step": s["step"], "start_ms": (s["start"] - origin) / 1e6,
              "end_ms": (s["end"] - origin) / 1e6}
             for s in run.table("steps").to_pylist()] if run.has_table("steps") else []
    shown_points = sum(len(c["t_ms"]) for c in counters)
    if len(rows) < drawable:
        notes.append(f"showing the {len(rows):,} longest of {drawable:,} spans "
                     f"(the limit is {max_spans:,})")
    if shown_points < counter_rows:
        notes.append(f"counters downsampled to {shown_points:,} of {counter_rows:,} samples")
    return {
        "tracks": track_order,
        "spans": {
            "track": tracks,
            "start_ms": [(r["ts"] - origin) / 1e6 for r in rows],
            "dur_ms": [r["dur"] / 1e6 for r in rows],
            "name": [r["name"] or "" for r in rows],
            "kind": [r["kind"] for r in rows],
        },
        "counters": counters,
        "steps": steps,
        "events": total,
        "spans_total": drawable,  # events with a duration; instants are not drawn
        "shown": len(rows),
        "downsampled": bool(notes),
        "note": "; ".join(notes),
    }


def _cards(analysis: dict[str, Any]) -> list[Card]:
    cards: list[Card] = []
    steps = [s["dur_ns"] for windows in analysis["iterations"]["steps"].values() for s in windows]
    if steps:
        median = statistics.median(steps)
        used = analysis["iterations"]["used"]
        cards.append(Card(label="step time", value=_ms(median),
                          detail=f"median of {len(steps)} steps ({used})"))
        cards.append(Card(label="throughput", value=f"{1e9 / median:,.2f} steps/s",
                          detail="from the median step"))
    for rank in analysis["concurrency"]["ranks"]:
        share = rank["total"]["share"]
        busy = 1.0 - share["host_busy_device_idle"] - share["idle"]
        cards.append(Card(label=f"device utilization (rank {rank['rank']})",
                          value=f"{100 * busy:.1f}%",
                          detail=f"communication hidden {rank['total']['comm_overlap_pct']:.1f}%"))
    cards.append(Card(label="events", value=f"{analysis['events']:,}",
                      detail=f"ranks {analysis['ranks']}"))
    return cards


def _iteration_rows(analysis: dict[str, Any]) -> list[dict[str, Any]]:
    per_iteration = analysis["ops"]["per_iteration"]
    shares = {(r["rank"], i["step"]): i["share"] for r in analysis["concurrency"]["ranks"]
              for i in r["iterations"]}
    rows = []
    for rank, windows in sorted(analysis["iterations"]["steps"].items(), key=lambda kv: int(kv[0])):
        for s in windows:
            rows.append({"rank": int(rank), "step": s["step"], "dur_ns": s["dur_ns"],
                         "source": s["source"],
                         "device_ns": per_iteration.get(rank, {}).get(str(s["step"]), {}),
                         "share": shares.get((int(rank), s["step"]), {})})
    return rows


def tune_section(files: Mapping[str, Any], run: Run) -> dict[str, Any]:
    """A tune output (optimize.tune.load_results) as the report shows it: each trial's speedup
    over the baseline, importances largest first, and which run this report is of."""
    summary = files["summary"]
    base = summary["baseline"]["throughput"] or 0.0
    here = run.path.resolve()

    def is_here(path: str | None) -> bool:
        return path is not None and Path(path).resolve() == here

    trials = [{**t, "speedup": round(t["throughput"] / base, 4) if t["throughput"] and base
               else None, "this_run": is_here(t["run"])} for t in files["trials"]]
    this = next((t["number"] for t in trials if t["this_run"]),
                "baseline" if is_here(summary["baseline"]["run"]) else None)
    importance = sorted(summary["importance"].items(), key=lambda kv: (-kv[1], kv[0]))
    return {"dir": files["dir"], "command": summary["command"], "study": summary["study"],
            "measure": summary["measure"], "baseline": summary["baseline"],
            "best": summary["best"], "speedup": summary["speedup"],
            "pruned": summary["pruned"], "failed": summary["failed"], "trials": trials,
            "importance": [{"param": k, "importance": v} for k, v in importance],
            "this_run": this}


def report_data(run: Run, *, max_spans: int = MAX_SPANS,
                advice: Sequence[Mapping[str, Any]] = (),
                tune: Mapping[str, Any] | None = None,
                projection: tuple[Mapping[str, Any] | None, str] = (None, "not computed"),
                ) -> dict[str, Any]:
    """The report of one Run as a plain dict (stable keys; see docs/cli.md).

    `advice` is optimize.advise's list, `tune` a tune output directory as
    optimize.tune.load_results reads it, and `projection` optimize.project's
    report_projection (the projection's dict, or None and why not), all passed in by the
    caller: report sits beside optimize in the import order, not above it.
    """
    manifest = run.manifest()
    analysis = analyze(run).to_dict()
    ts = run.table("events", ["ts"]).column("ts")
    origin = pc.min(ts).as_py() if len(ts) else 0
    return {
        "title": f"perfswarm report: {run.path.name}",
        "run": {"path": str(run.path), "command": manifest["command"],
                "complete": manifest["complete"], "ranks": manifest["ranks"],
                "devices": manifest["devices"], "warnings": manifest["warnings"],
                "origin_ns": origin},
        "cards": _cards(analysis),
        "timeline": timeline(run, origin, max_spans),
        "concurrency": analysis["concurrency"],
        "iterations": _iteration_rows(analysis),
        "kernels": analysis["ops"]["kernels"][:TOP_OPS],
        "cpu_ops": analysis["ops"]["cpu_ops"][:TOP_OPS],
        "categories": analysis["ops"]["categories"],
        "critical_path": analysis["critical_path"],
        "swarms": analysis["swarms"],
        "op_cost": op_costs(run, analysis["ranks"]).to_dict(),
        "prediction": _prediction(run),
        "advice": [dict(a) for a in advice],
        "tune": tune_section(tune, run) if tune is not None else None,
        "projection": dict(projection[0]) if projection[0] is not None else None,
        "projection_note": projection[1],
    }


def _prediction(run: Run) -> dict[str, Any] | None:
    """Replay and model prediction at the recorded configuration; None without iterations."""
    try:
        result = predict(run).to_dict()
    except PerfswarmError:
        return None
    del result["overheads"]  # per op type: for `perfswarm predict --json`, not a page
    return result


def compare_data(a: Run, b: Run, a_label: str, b_label: str) -> dict[str, Any]:
    """Two Runs side by side: span, per-step times and the ops that changed most."""
    result = diff_runs(a, b).to_dict()
    ops = sorted(result["ops"], key=lambda o: (-abs(o["delta_ns"]), o["kind"], o["name"]))
    return {
        "title": f"perfswarm compare: {a_label} vs {b_label}",
        "a": a_label, "b": b_label,
        "cards": [
            Card(label=f"span {a_label}", value=_ms(result["a_span_ns"]), detail="first rank"),
            Card(label=f"span {b_label}", value=_ms(result["b_span_ns"]), detail="first rank"),
            Card(label="change", value=_ms(result["span_delta_ns"]),
                 detail=f"{result['only_a']} ops only in {a_label}, "
                        f"{result['only_b']} only in {b_label}"),
        ],
        "steps": result["steps"],
        "ops": ops[:TOP_OPS],
    }
