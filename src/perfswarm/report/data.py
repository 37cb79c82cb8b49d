"""Report data: everything a report shows, as one plain JSON-ready dict built from a Run.

Renderers (report/html.py) only lay this out; tests assert on the dict. Times are ns
(ints) except the timeline, which is in ms from the run's first event, ready to plot; its
spans' columns are int64 arrays (orjson writes them as lists, OPT_SERIALIZE_NUMPY).
"""

from __future__ import annotations

import shlex
import statistics
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, TypedDict

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from perfswarm.analyze.annotations import Scopes, host_calls
from perfswarm.analyze.concurrency import OnCpu, on_cpu
from perfswarm.analyze.diff import diff_runs
from perfswarm.analyze.frame import Events
from perfswarm.analyze.iterations import (
    StepFaults,
    StepTime,
    batch_sizes,
    step_counters,
    step_faults,
    step_time,
)
from perfswarm.analyze.summary import analyze
from perfswarm.analyze.swarm_diff import periods
from perfswarm.analyze.system import host_cores, recorder_steps
from perfswarm.errors import NotApplicable
from perfswarm.model.opstats import op_costs
from perfswarm.model.predict import predict
from perfswarm.model.specs import spec_of_devices
from perfswarm.model.topology import with_copy_peaks
from perfswarm.report.overview import model_flops, run_throughput, step_breakdown
from perfswarm.report.text import UNSAMPLED, WAITED_FOR_OTHERS, ms, pct, step_time_change
from perfswarm.report.timeline import (
    MAX_COUNTER_POINTS,
    MAX_SPANS,
    run_origin,
    spans,
    timeline,
)
from perfswarm.report.views import (
    critical_step_rows,
    kernel_streams,
    memory_category_rows,
    memory_view,
    module_tree,
    op_stacks,
    ops_by_shape,
    queue_rows,
    ranks_view,
)
from perfswarm.trace.schema import STEP_FORWARD
from perfswarm.trace.store import Run

TOP_OPS: Final = 25
TOP_SEQUENCES: Final = 10
MAX_MODULES: Final = 200  # rows of the module tree


class Card(TypedDict):
    label: str
    value: str
    detail: str


def _rate(flops_per_s: float) -> str:
    for unit, scale in (("TFLOP/s", 1e12), ("GFLOP/s", 1e9), ("MFLOP/s", 1e6)):
        if flops_per_s >= scale:
            return f"{flops_per_s / scale:,.1f} {unit}"
    return f"{flops_per_s:,.0f} FLOP/s"


def _unprofiled(rates: dict[str, Any] | None, timing: StepTime | None
                ) -> dict[str, Any] | None:
    """Samples and tokens per second at the program's own step time, where the recorder
    timed steps after its window: a profiled step runs slower. Not where the profiled steps'
    batches differ: the steps after the window are of batches no trace shows."""
    if rates is None or timing is None or not timing.outside or not rates["same_batch"]:
        return rates
    per_s = 1e9 / timing.rate_ns
    samples = rates["samples_per_step"]
    over = "the median" if timing.mean_ns is None else "the whole time, waits included,"
    return {**rates, "samples_per_s": samples * per_s if samples is not None else None,
            "tokens_per_s": (rates["tokens_per_step"] * per_s
                             if rates["tokens_per_step"] is not None else None),
            "source": rates["source"] + f"; per {over} of the {timing.steps} steps after "
                                        "the profiler's window"}


def _on_cpu(run: Run, ev: Events, analysis: dict[str, Any]) -> dict[int, OnCpu | None]:
    """Each rank's loop thread on the CPU (concurrency.on_cpu) over the span of its
    concurrency breakdown, from the Run's perf samples; without them (perf missing, or an
    imported trace) its ops' time alone (period 0)."""
    period = periods(run)["perf"]
    samples = run.table("samples", ["ts", "source", "pid", "tid"])
    perf = samples.filter(pc.equal(samples.column("source").cast(pa.string()), "perf"))
    if period is None or perf.num_rows == 0:
        period, perf = 0, perf.slice(0, 0)
    columns = tuple(np.asarray(perf.column(c).to_numpy(), np.int64) for c in ("ts", "pid", "tid"))
    return {r["rank"]: on_cpu(ev, r["rank"], (r["total"]["start"], r["total"]["end"]),
                              (columns[0], columns[1], columns[2]), period)
            for r in analysis["concurrency"]["ranks"]}


_PERIODS = 10  # perf's sampling periods a span holds at least for its CPU share to be read


def _cpu_busy(rank: dict[str, Any], found: OnCpu | None, comm: str) -> Card:
    """A CPU rank's loop thread on the CPU over the span (concurrency.OnCpu), beside the time
    its ops spanned; without perf's samples, the range from its ops' share to all of it."""
    label = f"CPU busy (rank {rank['rank']})"
    total = rank["total"]
    if found is None or found.span_ns < _PERIODS * found.period_ns or not found.period_ns:
        # the loop's thread's ops (another thread's, a background one's, had hidden its waits:
        # 97.9% for the loop thread's 76.0%, beside a 20% DataLoader wait)
        span = total["span_ns"]
        ops = found.ops_ns if found is not None else total["host_ops_ns"]
        why = ("none in this Run" if found is None or not found.period_ns else
               f"one each {found.period_ns / 1e6:.1f} ms of CPU time, too few in a span of "
               f"{span / 1e6:.1f} ms")
        whose = _loop(found) if found is not None else "a thread"
        return Card(label=label, value=f"{pct(min(1.0, ops / span) if span else 0.0)}-100.0%",
                    detail=f"share of the span {whose} ran ops or runtime calls, then all of "
                           "it: between and around them it may run Python or wait (a "
                           "DataLoader's next batch, a core another process holds); perf's "
                           f"samples ({why}) would tell which{comm}")
    span = found.span_ns
    others = (f"; its process's other threads {found.others_ns / span:.2f} cores"
              if found.others_ns else "")
    verb = "was" if found.threads == 1 else "were"
    return Card(label=label, value=pct(min(1.0, found.loop_ns / span)),
                detail=f"share of the span {_loop(found)} {verb} on the CPU, from perf's "
                       f"samples (one each {found.period_ns / 1e6:.1f} ms of its CPU time: "
                       f"within {pct(found.period_ns / span)}); its ops and runtime calls "
                       f"spanned {pct(found.ops_ns / span)} (wall time, waits for a core "
                       f"included; the rest Python or waits: a DataLoader's next batch, a "
                       f"sleep){others}{comm}")


def _loop(found: OnCpu) -> str:
    """Whose time a CPU busy card reads: the loop's thread, or the threads that took its steps
    in turn (a server's pool), together."""
    return ("the loop's thread" if found.threads == 1 else
            f"the loop's {found.threads} threads (each took steps), together,")


def _cards(analysis: dict[str, Any], has_device: bool, flops: dict[str, Any] | None,
           rates: dict[str, Any] | None, timing: StepTime | None,
           on_cpu: Mapping[int, OnCpu | None], faults: StepFaults | None) -> list[Card]:
    cards: list[Card] = []
    steps = [s["dur_ns"] for windows in analysis["iterations"]["steps"].values() for s in windows]
    if timing is not None and timing.outside:
        median = timing.median_ns
        profiled = (f"; the profiled ones: {ms(timing.profiled_ns)}, x"
                    f"{timing.profiler_slowdown:.2f} under the profiler"
                    if timing.profiled_ns else "")
        shift = timing.heap_shift
        before = ("" if shift is None or timing.before_ns is None else
                  f"; the steps before the window: {ms(timing.before_ns)} (after it x{shift:.2f}: "
                  "freeing the profiler's buffers can leave the program's heap otherwise, "
                  "glibc's dynamic mmap threshold raised, so its large tensors stop or start "
                  "page-faulting, or the machine's load changed; the program alone may run at "
                  "either, or between)")
        paged = ("" if faults is None or faults.outside is None else
                 f"; page faults a step: {faults.profiled:,.0f} in the window, "
                 f"{faults.outside:,.0f} after it (a fault is a page written afresh: the "
                 "profiler's allocations share glibc's heap with the program's)")
        cards.append(Card(label="step time", value=ms(median),
                          detail=f"median of {timing.steps} steps {timing.which}"
                                 f"{profiled}{paged}{before}"))
        if timing.busy_ns is not None:
            # a forward-driven loop's: the model's work, the rest of a step the loop's own
            # (an input's loading, or a server's wait for requests: no sample tells which here)
            cards.append(Card(label="forward time", value=ms(timing.busy_ns),
                              detail="median of the same steps' forwards, each from its start "
                                     "to its return; the rest of a step, up to the next "
                                     "forward, is the loop's own: loading its input, or "
                                     "waiting for it"))
        cards.append(Card(label="throughput", value=f"{1e9 / timing.rate_ns:,.2f} steps/s",
                          detail="from that median step" if timing.mean_ns is None else
                          "over those steps' whole time, their waits for input included"))
    elif steps:
        median = statistics.median(steps)
        used = analysis["iterations"]["used"]
        cards.append(Card(label="step time", value=ms(median),
                          detail=f"median of {len(steps)} steps ({used})"))
        cards.append(Card(label="throughput", value=f"{1e9 / median:,.2f} steps/s",
                          detail="from the median step"))
    if rates is not None:
        rank = rates["rank"]
        if rates["samples_per_s"] is not None:
            cards.append(Card(label=f"samples/s (rank {rank})",
                              value=f"{rates['samples_per_s']:,.1f}",
                              detail=f"{rates['samples_per_step']:,.4g} a step, from "
                                     f"{rates['source']}"))
        if rates["tokens_per_s"] is not None:
            cards.append(Card(label=f"tokens/s (rank {rank})",
                              value=f"{rates['tokens_per_s']:,.0f}",
                              detail=f"{rates['tokens_per_step']:,.6g} a step" + (
                                  f", from {rates['source']}"
                                  if rates["samples_per_s"] is None else "")))
    for rank in analysis["concurrency"]["ranks"]:
        share = rank["total"]["share"]
        if has_device:
            busy = 1.0 - share["host_busy_device_idle"] - share["idle"]
            cards.append(Card(
                label=f"device utilization (rank {rank['rank']})", value=f"{100 * busy:.1f}%",
                detail=f"of the rank's span, {ms(rank['total']['span_ns'])} from its first "
                       "work to its last (advise's busy_pct: of the profiled steps' time); "
                       f"communication hidden {rank['total']['comm_overlap_pct']:.1f}%"))
        else:  # a CPU run: the host is the device
            host = rank.get("host_comm")
            comm = ("" if not host else f"; in collectives {ms(host['comm_ns'])}, "
                    f"{host['comm_overlap_pct']:.1f}% of it hidden under ops")
            cards.append(_cpu_busy(rank, on_cpu.get(rank["rank"]), comm))
    if flops is not None:
        model = ("3x the forward's FLOPs (a backward ran)" if flops["phase_flops"]["backward"]
                 else "the forward's FLOPs (no backward ran)")
        if flops["phase_flops"]["backward"] and flops["no_grad_flops"]:
            share = pct(flops["no_grad_flops"] / flops["phase_flops"]["forward"])
            model += (", once those of the forward ops autograd made no node for (an "
                      f"evaluation's: {share} of the forward's)")
        # FLOPs are those of the ops with a cost model (not an int8 quantized linear's)
        model += f"; of the ops with a cost model, {pct(flops['coverage'])} of op time"
        if flops["profiler_slowdown"] > 1.0:
            model += (f"; at the step time after the profiler's window (the profiled steps "
                      f"ran x{flops['profiler_slowdown']:.2f} slower)")
        if flops["mfu"] is not None:
            peak = f"{flops['device']}'s {flops['dtype']} peak"
            cards.append(Card(label="MFU (per rank)", value=pct(flops["mfu"]),
                              detail=f"{_rate(flops['model_flops_per_s'])} of {peak}: {model}"))
            cards.append(Card(label="HFU (per rank)", value=pct(flops["hfu"]),
                              detail=f"{_rate(flops['flops_per_s'])} of {peak}: every costed op "
                                     "that ran"))
        else:
            cards.append(Card(label="model FLOP/s (per rank)",
                              value=_rate(flops["model_flops_per_s"]),
                              detail=f"{model}; hardware (every costed op that ran) "
                                     f"{_rate(flops['flops_per_s'])}; no device peak known, "
                                     "so no MFU or HFU"))
    cards.append(Card(label="events", value=f"{analysis['events']:,}",
                      detail=f"ranks {analysis['ranks']}"))
    return cards


def _iteration_rows(analysis: dict[str, Any], steps: list[dict[str, Any]],
                    ) -> list[dict[str, Any]]:
    """Steps with their states. `source` is where the window came from: `marker` (a
    ProfilerStep span), `detected` (the optimizer's step hooks, or found by repetition)."""
    recorded = {(s["rank"], s["step"]): s["source"] for s in steps}
    repeated = analysis["iterations"]["used"] == "detected"
    per_iteration = analysis["ops"]["per_iteration"]
    shares = {(r["rank"], i["step"]): i["share"] for r in analysis["concurrency"]["ranks"]
              for i in r["iterations"]}
    rows = []
    for rank, windows in sorted(analysis["iterations"]["steps"].items(), key=lambda kv: int(kv[0])):
        for s in windows:
            rows.append({"rank": int(rank), "step": s["step"], "dur_ns": s["dur_ns"],
                         "source": "detected" if repeated else
                         recorded.get((int(rank), s["step"]), s["source"]),
                         "device_ns": per_iteration.get(rank, {}).get(str(s["step"]), {}),
                         "share": shares.get((int(rank), s["step"]), {})})
    return rows


def _roof(costs: Mapping[str, Any], devices: Sequence[Mapping[str, Any]],
          flops: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The roofline the kernels are drawn against: the GPU spec's peak for the ops' dtype and
    its memory bandwidth; None without a spec."""
    spec = spec_of_devices(devices) if costs["device"] else None
    if spec is None:
        return None
    dtype = flops["dtype"] if flops is not None else "fp32"
    return {"device": spec.name, "dtype": dtype, "peak_flops_per_s": spec.peak_for(dtype),
            "bandwidth": spec.memory_bandwidth}


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
            "unit": summary.get("unit", "steps/s"),
            "measure": summary["measure"], "baseline": summary["baseline"],
            "best": summary["best"], "speedup": summary["speedup"],
            "pruned": summary["pruned"], "failed": summary["failed"], "trials": trials,
            "importance": [{"param": k, "importance": v} for k, v in importance],
            "this_run": this}


def report_data(run: Run, *, max_spans: int = MAX_SPANS,
                advice: Callable[[Run], Sequence[Mapping[str, Any]]] | None = None,
                tune: Mapping[str, Any] | None = None,
                projection: Callable[[Run], Mapping[str, Any]] | None = None,
                on_stage: Callable[[str], None] = lambda stage: None,
                ) -> dict[str, Any]:
    """The report of one Run as a plain dict (stable keys; see docs/cli.md).

    `advice` makes optimize.advise's list, `tune` is a tune output directory as
    optimize.tune.load_results reads it, and `projection` makes the scaling projection's
    dict (optimize.project.report_projection), all passed in by the caller: report sits
    beside optimize in the import order, not above it. A projection or prediction the Run
    cannot have (NotApplicable) is left out, the projection's reason said in the words of
    the command line the reader would run; any other error is raised. `on_stage` is told
    each stage as it starts (the board's progress).
    """
    # the prediction first: its graph and schedule (36 MB at 200k events, freed when it
    # returns) are the report's largest transient, then not held on top of the analysis and
    # the advice (29 and 11 MB), nor of what the later stages keep to the end (the drawn
    # timeline, the views' rows); what it frees, the advice's and analysis's tables reuse
    on_stage("prediction")
    prediction = _prediction(run)
    shown_advice: list[dict[str, Any]] = []
    if advice is not None:
        on_stage("advice")
        shown_advice = [dict(a) for a in advice(run)]
    shown, note = None, "not computed"
    if projection is not None:
        on_stage("projection")
        try:
            shown, note = dict(projection(run)), ""
        except NotApplicable as exc:
            note = exc.as_flags()
    manifest = run.manifest()
    on_stage("analysis")
    result = analyze(run)
    analysis = result.to_dict()
    on_stage("timeline")
    origin = run_origin(run)
    drawn = spans(run)
    line = timeline(run, drawn, origin, max_spans)
    streams = kernel_streams(run, drawn, TOP_OPS)
    del drawn  # its table and nesting (10 MB at 200k events) are not held through the rest
    has_device = any(lane["device"] for lane in line["lanes"])
    on_stage("op costs")
    costs = op_costs(run, analysis["ranks"], top=TOP_OPS).to_dict()
    steps = analysis["iterations"]["steps"]
    first = [w["dur_ns"] for w in next(iter(steps.values()), [])]
    timing = step_time(run.table("steps"), batch_sizes(run), step_counters(run, STEP_FORWARD),
                       recorder_steps(run.table("steps"), run.table("counters"),
                                      host_cores(manifest) or 1))
    # at the program's own speed where the recorder timed steps after the window, as the
    # throughput and samples/s cards (the profiler slows a CPU step 1.05-1.5x)
    outside = timing is not None and timing.outside
    slowdown = timing.profiler_slowdown if timing is not None and outside else 1.0
    step_ns = (timing.rate_ns if timing is not None and outside
               else statistics.median(first) if first else 0)
    flops = model_flops(costs, manifest["devices"], step_ns, len(first), max(1, len(steps)))
    if flops is not None:
        flops["profiler_slowdown"] = slowdown
    events = Events.load(run)
    calls = host_calls(events)
    rates = _unprofiled(run_throughput(run), timing)
    on_stage("views")
    views = {"cpu_ops": op_rows(result.scopes, op_stacks(events, calls), TOP_OPS),
             "ops_by_shape": ops_by_shape(run, events, calls, TOP_OPS),
             "modules": module_tree(events, calls, MAX_MODULES),
             "memory": memory_view(run, origin, MAX_COUNTER_POINTS)}
    return {
        "title": f"perfswarm report: {run.path.name}",
        "run": {"path": str(run.path), "shell_path": shlex.quote(str(run.path.resolve())),
                "command": manifest["command"],
                "complete": manifest["complete"], "ranks": manifest["ranks"],
                "devices": manifest["devices"], "warnings": manifest["warnings"],
                "origin_ns": origin},
        "has_device": has_device,
        "cards": _cards(analysis, has_device, flops, rates, timing,
                        {} if has_device else _on_cpu(run, events, analysis),
                        step_faults(run)),
        "step_time": None if timing is None else {
            "median_ns": timing.median_ns, "steps": timing.steps, "outside": timing.outside,
            "profiled_ns": timing.profiled_ns, "before_ns": timing.before_ns,
            "heap_shift": timing.heap_shift, "busy_ns": timing.busy_ns,
            "mean_ns": timing.mean_ns},
        "breakdown": step_breakdown(events, steps),
        "flops": flops,
        "throughput": rates,
        "roof": _roof(costs, manifest["devices"], flops),
        "timeline": line,
        "concurrency": analysis["concurrency"],
        "iterations": _iteration_rows(analysis, line["steps"]),
        "kernels": analysis["ops"]["kernels"][:TOP_OPS],
        "cpu_ops": views["cpu_ops"],
        "ops_by_shape": views["ops_by_shape"],
        "streams": streams,
        "modules": views["modules"],
        "memory": views["memory"],
        "ranks": ranks_view(analysis),
        "categories": analysis["ops"]["categories"],
        "critical_path": analysis["critical_path"],
        "critical_steps": critical_step_rows(analysis["critical_path"]),
        "stream_idle": [{"rank": r["rank"], **s} for r in analysis["launch"]
                        for s in r["streams"]],
        "kernel_overlap": [k for k in analysis["kernels"] if k["busy_ns"]],
        "sequences": analysis["sequences"][:TOP_SEQUENCES],
        "queues": queue_rows(analysis["launch"]),
        "bandwidth": with_copy_peaks(analysis["bandwidth"], manifest["devices"]),
        "scopes": analysis["scopes"],
        "cupti": analysis["cupti"],
        "memory_timeline": memory_category_rows(analysis["memory"]),
        "swarms": swarm_rows(analysis["swarms"]),
        "op_cost": costs,
        "prediction": prediction,
        "advice": shown_advice,
        "tune": tune_section(tune, run) if tune is not None else None,
        "projection": shown,
        "projection_note": note,
    }


def op_rows(found: Scopes, stacks: Mapping[str, list[str]], limit: int) -> list[dict[str, Any]]:
    """CPU ops by name from analyze's scopes (all of them, zero-length calls counted): calls,
    CPU total and self, device total and self, mean, and the heaviest call stack; the
    `limit` largest by CPU self time."""
    ops = sorted(found.ops, key=lambda o: (-o.cpu_self_ns, o.name))[:limit]
    return [{"name": o.name, "count": o.count, "total_ns": o.cpu_total_ns,
             "self_ns": o.cpu_self_ns, "device_ns": o.device_total_ns,
             "device_self_ns": o.device_self_ns, "mean_ns": o.cpu_total_ns / o.count,
             "stack": stacks.get(o.name, [])} for o in ops]


def swarm_rows(swarms: dict[str, Any]) -> dict[str, Any]:
    """Swarms as table rows: what runs (the heaviest functions, the module), how often it
    was sampled, its share of the samples, and that share of the sampled wall time."""
    sampled_ns = swarms["sampled_ns"]
    rows = [{"functions": [f for f in s["functions"] if f and f != "[unknown]"][:3]
             or ["[unknown]"],
             "module": next((m for m in s["modules"] if m), "[unknown]"),
             "samples": s["samples"], "share": s["share"],
             "time_ns": round(s["share"] * sampled_ns)}
            for s in swarms["swarms"]]
    return {"k": swarms["k"], "silhouette": swarms["silhouette"], "sampled_ns": sampled_ns,
            "scope": swarms["scope"], "unprofiled": swarms["unprofiled"],
            "left_out": swarms["left_out"], "swarms": rows}


def _prediction(run: Run) -> dict[str, Any] | None:
    """Replay and model prediction at the recorded configuration; None when the Run has
    nothing to simulate."""
    try:
        result = predict(run).to_dict()
    except NotApplicable:
        return None
    del result["overheads"]  # per op type: for `perfswarm predict --json`, not a page
    return result


def compare_data(a: Run, b: Run, a_label: str, b_label: str) -> dict[str, Any]:
    """Two Runs side by side: span, per-step times, and the ops that got slower and those that
    got faster (as `diff`: largest first, beyond their noise band, the rest counted)."""
    found = diff_runs(a, b)
    result = found.to_dict()
    timed = []
    if found.step_time is not None:
        values, change = step_time_change(found.step_time)
        timed.append(Card(label="step time", value=values, detail=change))
    for side, held in found.waited_for_others:
        timed.append(Card(label=f"{(a_label, b_label)[side]} waited for other processes",
                          value=f"{held:.2f} cores", detail=WAITED_FOR_OTHERS))
    for side in found.unsampled_beside_waits:
        timed.append(Card(label=f"{(a_label, b_label)[side]} waited for other processes",
                          value="unknown", detail=UNSAMPLED))
    changes = []
    for title, rows in ((f"slower in {b_label}", found.regressions),
                        (f"faster in {b_label}", found.improvements)):
        shown = [o.to_dict() for o in rows if o.beyond_noise]
        changes.append({"title": title, "ops": shown[:TOP_OPS],
                        "within_noise": len(rows) - len(shown)})
    return {
        "title": f"perfswarm compare: {a_label} vs {b_label}",
        "a": a_label, "b": b_label,
        "cards": [
            *timed,
            Card(label=f"span {a_label}", value=ms(result["a_span_ns"]), detail="first rank"),
            Card(label=f"span {b_label}", value=ms(result["b_span_ns"]), detail="first rank"),
            Card(label="change", value=ms(result["span_delta_ns"]),
                 detail=f"{len(result['only_a'])} ops only in {a_label}, "
                        f"{len(result['only_b'])} only in {b_label}"),
        ],
        "steps": result["steps"],
        "changes": changes,
    }
