"""Report data -> one self-contained HTML file (plotly.js inlined: it works offline).

The plotly.js inlined is its basic bundle (scatter, bar and pie: every chart here), vendored
from plotly.js's own release (vendor/, MIT): 1.2 MB against the full bundle's 4.8 MB, which
chromium took ~4x as long to compile, the wait before a page's first chart.

Every string from a trace reaches the page either through Jinja's autoescaping (tables,
cards) or inside a JSON block whose `<`, `>` and `&` are `\\u` escapes, read with
JSON.parse; chart labels are HTML-escaped as well, because plotly reads a few tags in
hover text. So a kernel named `</script><img src=x onerror=...>` is shown, never run.
"""

from __future__ import annotations

import contextlib
import hashlib
import html
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any, Final

import jinja2
import orjson
from markupsafe import Markup

from perfswarm.analyze.phases import PHASES
from perfswarm.report.overview import CATEGORIES
from perfswarm.report.text import evidence_text, ms, pct, size
from perfswarm.report.views import BEFORE_TRACE
from perfswarm.shown import json_visible, visible
from perfswarm.trace.store import write_output

STATES: Final = ("overlapped", "compute_only", "comm_only", "memory", "host_busy_device_idle",
                 "idle")
# A run without a device: its host is all there is, busy or idle (the other states are 0)
HOST_STATES: Final = {"host_busy_device_idle": "host busy", "idle": "idle"}


def states_shown(has_device: bool) -> dict[str, str]:
    """The concurrency states a report shows, each with its column's title."""
    return {s: s for s in STATES} if has_device else HOST_STATES
VIEWS: Final = (("overview", "Overview"), ("trace", "Trace"), ("operators", "Operators"),
                ("kernels", "Kernels"), ("memory", "Memory"), ("modules", "Modules"),
                ("distributed", "Distributed"), ("swarms", "Swarms"), ("model", "Prediction"))
MEMORY_CATEGORIES: Final = (BEFORE_TRACE, *PHASES)
_JSON_ESCAPES: Final = (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                        ("\u2028", "\\u2028"), ("\u2029", "\\u2029"))


def safe_json(value: Any) -> str:
    """JSON text that can sit inside a <script> element: no `</script>`, no `<!--`; and
    whose strings show each control character and bidirectional mark as its escape (the
    text `\u202e`, as the terminal does: shown.visible), not the character."""
    text = orjson.dumps(value, option=orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY).decode()
    for char, escaped in _JSON_ESCAPES:  # str.replace: 7x faster than str.translate here
        text = text.replace(char, escaped)
    return json_visible(text)


def plot_text(text: str) -> str:
    """Text for a plotly label, legend or hover: plotly draws a subset of HTML there, so `<`,
    `>` and `&` are escaped; not quotes, which plotly shows as typed (`&quot;`)."""
    return html.escape(text, quote=False)


class _CompiledTemplates(jinja2.FileSystemBytecodeCache):
    """Jinja's cache of compiled templates, in its private per-user directory under the
    temporary directory (made 0700 and checked to be the user's; an entry is keyed by the
    template's source, Python's version and this module's source, which sets the environment
    the code is compiled for: its finalize is compiled in): compiling report.html.j2 took
    0.12 of a report's CPU seconds. A cache that cannot be written is no cache."""

    def get_cache_key(self, name: str, filename: str | None = None) -> str:
        return super().get_cache_key(name, filename) + _module_digest()

    def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        with contextlib.suppress(OSError):
            super().dump_bytecode(bucket)


@cache
def _module_digest() -> str:
    return hashlib.sha1(Path(__file__).read_bytes(), usedforsecurity=False).hexdigest()


def _compiled_templates() -> jinja2.BytecodeCache | None:
    try:
        return _CompiledTemplates()
    except (OSError, RuntimeError):  # no private temporary directory to be had
        return None


@cache
def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("perfswarm.report", "templates"),
        autoescape=True, undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
        bytecode_cache=_compiled_templates(),
        # data's text as text: control characters and bidirectional marks as their escapes
        # (Markup is the page's own: HTML and JSON made safe already)
        finalize=lambda value: visible(value)
        if isinstance(value, str) and not isinstance(value, Markup) else value,
    )


def counter_figures(timeline: dict[str, Any]) -> dict[str, Any]:
    """One small chart per counter group (a source and unit), on the run's time axis."""
    end_ms = timeline["end_ns"] / 1e6
    return {f"chart-counter-{i}": {
        "data": [{"type": "scatter", "mode": "lines", "name": plot_text(c["name"]),
                  "x": c["t_ms"], "y": c["value"]} for c in group["series"]],
        "layout": {"height": 220, "margin": {"t": 28, "b": 30, "l": 60, "r": 10},
                   "title": {"text": plot_text(group["title"]), "font": {"size": 12}},
                   "showlegend": len(group["series"]) > 1,
                   "legend": {"font": {"size": 9}},
                   "xaxis": {"range": [0, end_ms], "title": {"text": "ms from the run's start"}},
                   "yaxis": {"tickformat": ".0%"} if group["fraction"] else
                   {"ticksuffix": "%" if group["unit"] == "%" else "", "exponentformat": "SI"}}}
        for i, group in enumerate(timeline["counters"])}


MAX_BARS: Final = 60  # x positions of a stacked chart drawn as bars; past it, stacked areas


def stacked(x: list[str], series: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Traces stacking `series` (each a plotly trace's name, y and style) over x: bars for
    a few steps, stacked areas past MAX_BARS (one path a series, not one a bar: plotly took
    0.7 s to draw 1,000 bars of a 200-step run in chromium, the wait before the overview is
    interactive)."""
    if len(x) <= MAX_BARS:
        return [{"type": "bar", "x": x, **s} for s in series]
    return [{"type": "scatter", "mode": "lines", "stackgroup": "one", "x": x,
             **{k: v for k, v in s.items() if k != "marker"},
             "line": {"shape": "hv", "width": 0.5, **({"color": s["marker"]["color"]}
                                                       if "marker" in s else {})}}
            for s in series]


def concurrency_figure(concurrency: dict[str, Any], has_device: bool,
                       windows: bool = False) -> dict[str, Any]:
    """The states' shares of each rank's span and of each of its steps, or of its time
    windows where it has no iterations (`windows`: analyze's equal parts of the span)."""
    labels: list[str] = []
    shares: list[dict[str, float]] = []
    part = "window" if windows else "step"
    for rank in concurrency["ranks"]:
        labels.append(f"rank {rank['rank']} all")
        shares.append(rank["total"]["share"])
        for it in rank["iterations"]:
            labels.append(f"rank {rank['rank']} {part} {it['step']}")
            shares.append(it["share"])
    data = stacked(labels, [{"name": title, "y": [100 * s.get(state, 0.0) for s in shares]}
                            for state, title in states_shown(has_device).items()])
    return {"data": data, "layout": {"barmode": "stack", "height": 360, "margin": {"t": 30},
                                     "yaxis": {"title": {"text": "% of span"}}}}


BREAKDOWN_COLORS: Final = ("#2ca02c", "#9467bd", "#8c564b", "#ff7f0e", "#1f77b4", "#7f7f7f",
                            "#d9d9d9", "#f2e6c9")


def breakdown_categories(breakdown: list[dict[str, Any]]) -> list[str]:
    """The categories some step spent time in (a CPU run has no device compute)."""
    return [c for c in CATEGORIES if any(b["ns"][c] for b in breakdown)]


def breakdown_figure(breakdown: list[dict[str, Any]]) -> dict[str, Any]:
    """Each step's time stacked by category (overview.CATEGORIES), in ms."""
    shown = breakdown_categories(breakdown)
    several = len({b["rank"] for b in breakdown}) > 1
    x = [f"rank {b['rank']} step {b['step']}" if several else f"step {b['step']}"
         for b in breakdown]
    data = stacked(x, [{"name": category, "marker": {"color": color},
                        "y": [b["ns"][category] / 1e6 for b in breakdown],
                        "hovertemplate": "%{y:.3f} ms"}
                       for category, color in zip(CATEGORIES, BREAKDOWN_COLORS, strict=True)
                       if category in shown])
    return {"data": data, "layout": {"barmode": "stack", "height": 340, "margin": {"t": 20},
                                     "yaxis": {"title": {"text": "step time (ms)"}},
                                     "legend": {"traceorder": "normal"}}}


def memory_figure(memory: list[dict[str, Any]]) -> dict[str, Any]:
    data = [{"type": "scatter", "mode": "lines", "line": {"shape": "hv"}, "x": m["t_ms"],
             "y": m[what], "name": f"rank {m['rank']} {plot_text(m['device'])} {what}"}
            for m in memory for what in ("allocated", "reserved")]
    return {"data": data, "layout": {"height": 320, "margin": {"t": 20},
                                     "xaxis": {"title": {"text": "ms from the run's start"}},
                                     "yaxis": {"title": {"text": "bytes"},
                                               "exponentformat": "SI"}}}


def roofline_figure(kernels: list[dict[str, Any]], roof: dict[str, Any]) -> dict[str, Any]:
    """Each kernel at its FLOP/byte and achieved FLOP/s under the device's roof (log-log);
    kernels without FLOPs (copies) have no place on it and stay in the table."""
    shown = [k for k in kernels if k["flops"] > 0 and k["bytes"] > 0 and k["time_ns"] > 0]
    ridge = roof["peak_flops_per_s"] / roof["bandwidth"]
    xs = [k["intensity"] for k in shown] or [ridge]
    lo, hi = min(*xs, ridge) / 4, max(*xs, ridge) * 4
    data = [{"type": "scatter", "mode": "lines", "name": plot_text(
                f"{roof['device']} roof ({roof['dtype']})"),
             "x": [lo, ridge, hi],
             "y": [roof["bandwidth"] * lo, roof["peak_flops_per_s"], roof["peak_flops_per_s"]],
             "line": {"color": "#888"}, "hoverinfo": "skip"},
            {"type": "scatter", "mode": "markers", "name": "kernels",
             "x": [k["intensity"] for k in shown],
             "y": [k["achieved_gflops"] * 1e9 for k in shown],
             "text": [plot_text(k["name"][:120]) for k in shown],
             "hovertemplate": "%{text}<br>%{x:.3g} FLOP/byte, %{y:.3s}FLOP/s<extra></extra>",
             "marker": {"size": 9}}]
    return {"data": data, "layout": {
        "height": 380, "margin": {"t": 20}, "showlegend": True,
        "xaxis": {"type": "log", "title": {"text": "arithmetic intensity (FLOP/byte)"}},
        "yaxis": {"type": "log", "title": {"text": "achieved FLOP/s"},
                  "exponentformat": "SI"}}}


def memory_peak_figure(memory: list[dict[str, Any]]) -> dict[str, Any]:
    """Each device's peak stacked by category (views.memory_view), in bytes."""
    y = [f"rank {m['rank']} {plot_text(m['device'])}" for m in memory]
    data = [{"type": "bar", "orientation": "h", "name": category, "y": y,
             "x": [m["peak_by_category"][category] for m in memory]}
            for category in MEMORY_CATEGORIES]
    return {"data": data, "layout": {"barmode": "stack", "height": 140 + 40 * len(memory),
                                     "margin": {"t": 20}, "yaxis": {"automargin": True},
                                     "xaxis": {"title": {"text": "bytes at the peak"},
                                               "exponentformat": "SI"}}}


def binned_figure(rows: list[dict[str, Any]], values: str, names: list[str], origin_ns: int,
                  y_title: str) -> dict[str, Any]:
    """Series of equal time bins (each row's `start`, `bin_ns` and `values` list) as step lines
    on the run's time axis: ms from `origin_ns`, each value at its bin's start."""
    data = [{"type": "scatter", "mode": "lines", "line": {"shape": "hv"}, "name": name,
             "x": [(r["start"] + i * r["bin_ns"] - origin_ns) / 1e6
                   for i in range(len(r[values]))], "y": r[values]}
            for r, name in zip(rows, names, strict=True)]
    return {"data": data, "layout": {"height": 300, "margin": {"t": 20},
                                     "xaxis": {"title": {"text": "ms from the run's start"}},
                                     "yaxis": {"title": {"text": y_title}}}}


def queue_figure(queues: list[dict[str, Any]], origin_ns: int) -> dict[str, Any]:
    """The launch queue's mean length in each bin, per rank and per stream."""
    names = [f"rank {q['rank']} " + ("all streams" if q["stream"] is None else
                                     f"device {q['device']} stream {q['stream']}")
             for q in queues]
    return binned_figure(queues, "bins", [plot_text(n) for n in names], origin_ns,
                         "launched, unfinished ops")


def bandwidth_figure(bandwidth: list[dict[str, Any]], origin_ns: int) -> dict[str, Any]:
    """Each rank's copy and set traffic in GB/s over time, one line a direction."""
    rows = [{"start": b["start"], "bin_ns": b["bin_ns"], "bins_gbps": f["bins_gbps"]}
            for b in bandwidth for f in b["flows"]]
    names = [plot_text(f"rank {b['rank']} {f['direction']}")
             for b in bandwidth for f in b["flows"]]
    return binned_figure(rows, "bins_gbps", names, origin_ns, "GB/s")


def prediction_figure(prediction: dict[str, Any]) -> dict[str, Any]:
    steps = prediction["steps"]
    # step -1: a Run without iterations is simulated over each rank's whole window
    x = [f"rank {s['rank']} " + (f"step {s['step']}" if s["step"] >= 0 else "whole window")
         for s in steps]
    data = [{"type": "bar", "name": what, "x": x, "y": [s[f"{what}_ns"] / 1e6 for s in steps]}
            for what in ("measured", "replayed", "predicted")]
    return {"data": data, "layout": {"barmode": "group", "height": 320, "margin": {"t": 30},
                                     "yaxis": {"title": {"text": "iteration ms"}}}}


def importance_figure(tune: dict[str, Any]) -> dict[str, Any]:
    rows = tune["importance"][::-1]  # plotly draws the first bar at the bottom
    data = [{"type": "bar", "orientation": "h", "name": "importance",
             "y": [plot_text(r["param"]) for r in rows], "x": [r["importance"] for r in rows]}]
    return {"data": data, "layout": {"height": 120 + 30 * len(rows), "margin": {"t": 30},
                                     "xaxis": {"title": {"text": "fANOVA importance"}},
                                     "yaxis": {"automargin": True}}}


def trials_figure(tune: dict[str, Any]) -> dict[str, Any]:
    """Throughput of each trial (pruned ones at their estimate so far), the baseline as a line."""
    data = []
    for state in ("COMPLETE", "PRUNED"):
        rows = [t for t in tune["trials"] if t["state"] == state and t["median_step_s"]]
        data.append({"type": "scatter", "mode": "markers", "name": state.lower(),
                     "x": [t["number"] for t in rows],
                     "y": [t["throughput"] or t.get("per_step", 1.0) / t["median_step_s"]
                           for t in rows],
                     "hovertext": [plot_text(str(t["params"])) for t in rows]})
    base = tune["baseline"]["throughput"]
    return {"data": data, "layout": {
        "height": 320, "margin": {"t": 30},
        "xaxis": {"title": {"text": "trial"}, "zeroline": False},
        "yaxis": {"title": {"text": tune.get("unit", "steps/s")}, "rangemode": "tozero"},
        "shapes": [{"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": base, "y1": base,
                    "line": {"dash": "dash", "width": 1}}],
        "annotations": [{"xref": "paper", "x": 1, "y": base, "text": "baseline",
                         "showarrow": False, "xanchor": "right", "yanchor": "bottom"}]}}


def scaling_figure(projection: dict[str, Any]) -> dict[str, Any]:
    """Projected throughput (with the ideal line) and scaling efficiency per device count."""
    points = projection["points"]
    x = [p["devices"] for p in points]
    line = {"type": "scatter", "mode": "lines+markers", "x": x}
    data = [{**line, "name": "throughput", "y": [p["throughput_per_s"] for p in points]},
            {**line, "mode": "lines", "name": "ideal (no communication)",
             "y": [p["devices"] * 1e3 / p["compute_ms"] for p in points],
             "line": {"dash": "dot"}},
            {**line, "name": "scaling efficiency", "yaxis": "y2",
             "y": [100 * p["efficiency"] for p in points]}]
    return {"data": data, "layout": {
        "height": 380, "margin": {"t": 40}, "legend": {"orientation": "h", "y": 1.12},
        "xaxis": {"type": "log", "tickvals": x, "title": {"text": projection["rank_units"]}},
        "yaxis": {"type": "log", "title": {"text": f"batches/s, all {projection['rank_units']}"}},
        "yaxis2": {"overlaying": "y", "side": "right", "range": [0, 105],
                   "tickvals": [0, 20, 40, 60, 80, 100], "showgrid": False,
                   "title": {"text": "efficiency %"}}}}


def options_figure(projection: dict[str, Any]) -> dict[str, Any]:
    """Scaling efficiency at the largest device count, per network and scheme."""
    options = projection["options"]
    networks = list(dict.fromkeys(plot_text(o["interconnect"]) for o in options))
    data = [{"type": "bar", "name": scheme, "x": networks,
             "y": [100 * o["efficiency"] for o in options if o["scheme"] == scheme]}
            for scheme in dict.fromkeys(o["scheme"] for o in options)]
    largest = projection["points"][-1]["devices"]
    return {"data": data, "layout": {
        "barmode": "group", "height": 320, "margin": {"t": 30},
        "yaxis": {"title": {"text": f"efficiency % at {largest} {projection['rank_units']}"},
                  "range": [0, 105]}}}


def projection_figures(projection: dict[str, Any] | None) -> dict[str, Any]:
    if projection is None:
        return {}
    return {"chart-scaling": scaling_figure(projection),
            "chart-options": options_figure(projection)}


def render(report: dict[str, Any]) -> str:
    """The report as one HTML page."""
    return "".join(_report_page(report))


def _report_page(report: dict[str, Any]) -> Iterator[str]:
    """The report's page in parts, as the template makes them."""
    timeline = report["timeline"]
    figures = {"chart-concurrency": concurrency_figure(report["concurrency"],
                                                       report["has_device"],
                                                       windows=not report["iterations"]),
               "chart-breakdown": breakdown_figure(report["breakdown"]),
               **counter_figures(timeline),
               **projection_figures(report["projection"])}
    if report["memory"]:
        figures["chart-memory"] = memory_figure(report["memory"])
        figures["chart-memory-peak"] = memory_peak_figure(report["memory"])
    if report["roof"] is not None and report["op_cost"]["kernels"]:
        figures["chart-roofline"] = roofline_figure(report["op_cost"]["kernels"], report["roof"])
    origin = report["run"]["origin_ns"]
    if report["queues"]:
        figures["chart-queue"] = queue_figure(report["queues"], origin)
    if report["bandwidth"]:
        figures["chart-bandwidth"] = bandwidth_figure(report["bandwidth"], origin)
    if report["prediction"]:
        figures["chart-prediction"] = prediction_figure(report["prediction"])
    tune = report["tune"]
    if tune is not None:
        figures["chart-trials"] = trials_figure(tune)
        if tune["importance"]:
            figures["chart-importance"] = importance_figure(tune)
    return _page_parts("report.html.j2", report, figures,
                       states=states_shown(report["has_device"]), pct=pct, views=VIEWS,
                       categories_=breakdown_categories(report["breakdown"]),
                       evidence=evidence_text, memory_categories=MEMORY_CATEGORIES,
                       launch={k["name"]: k for k in report["streams"]["kernels"]},
                       timeline_json=Markup(safe_json(timeline)),
                       timeline_js=Markup(_timeline_js()))


@cache
def _timeline_js() -> str:
    return (Path(__file__).parent / "templates" / "timeline.js").read_text()


@cache
def plotly_js() -> str:
    """plotly.js's basic bundle, the script every page with charts inlines."""
    return (Path(__file__).parent / "vendor" / "plotly-basic.min.js").read_text("utf-8")


def steps_figure(compare: dict[str, Any]) -> dict[str, Any]:
    steps = compare["steps"]
    x = [f"#{s['index']}" for s in steps]
    data = [{"type": "bar", "name": plot_text(compare[side]), "x": x,
             "y": [s[f"{side}_ns"] / 1e6 for s in steps]} for side in ("a", "b")]
    return {"data": data, "layout": {"barmode": "group", "height": 320, "margin": {"t": 30},
                                     "yaxis": {"title": {"text": "ms"}}}}


def render_compare(compare: dict[str, Any]) -> str:
    """Two runs compared (data.compare_data) as one HTML page."""
    return _page("compare.html.j2", compare, {"chart-steps": steps_figure(compare)})


def render_projection(title: str, projection: dict[str, Any]) -> str:
    """`project --html`: the projection alone as one HTML page."""
    return _page("projection.html.j2", {"title": title, "projection": projection,
                                        "projection_note": ""},
                 projection_figures(projection))


def render_board(root: str, runs: list[dict[str, Any]]) -> str:
    """The board's run list, with links to reports and a compare form."""
    return _environment().get_template("board.html.j2").render(
        title=f"perfswarm board: {root}", root=root, runs=runs, plotly_js="", figures_json="")


def render_building(what: str, stage: str, waited_s: float, ahead: int) -> str:
    """The board's page while a report is built: what it is doing, for how long, and how
    many builds are ahead of it; it reloads itself every second (no script needed)."""
    return _environment().get_template("building.html.j2").render(
        title=f"perfswarm: building {what}", what=what, stage=stage,
        waited=f"{waited_s:.0f} s", ahead=ahead, plotly_js="", figures_json="")


def _page(template: str, data: dict[str, Any], figures: dict[str, Any], **extra: Any) -> str:
    return "".join(_page_parts(template, data, figures, **extra))


def _page_parts(template: str, data: dict[str, Any], figures: dict[str, Any], **extra: Any
                ) -> Iterator[str]:
    """The page in the pieces its template makes, not joined: a join of a few would copy the
    largest (plotly.js, the timeline's data) into one more string."""
    # Both are script text, already safe there: HTML-escaping would break them.
    return _environment().get_template(template).generate(
        **data, plotly_js=Markup(plotly_js()), figures_json=Markup(safe_json(figures)),
        ms=ms, size=size, **extra)


def write(report: dict[str, Any], path: str | Path) -> Path:
    """The report's page written to `path` part by part, as they are made: the whole page
    is never held as text, nor as bytes (at 200k events a 2.7 MB page, 5.4 MB as text of
    two bytes a character, 13 MB with its join's pieces and its encoding)."""
    out = Path(path)
    write_output(out, (part.encode() for part in _report_page(report)))
    return out
