"""Report data (a plain dict, exact numbers from corpus traces) and its HTML rendering."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path
from typing import Any

import jinja2
import markupsafe
import numpy as np
import orjson
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import corpus
from perfswarm.analyze.annotations import host_calls, scopes
from perfswarm.analyze.frame import Events, lane_key
from perfswarm.analyze.intervals import union
from perfswarm.cli.main import main
from perfswarm.defaults import DEFAULT_DEVICES
from perfswarm.errors import NotApplicable, PerfswarmError
from perfswarm.model.specs import load_spec
from perfswarm.optimize.advise import advise
from perfswarm.optimize.project import project, report_projection
from perfswarm.optimize.tune import load_results
from perfswarm.report import html
from perfswarm.report.data import op_rows, report_data
from perfswarm.report.overview import CATEGORIES, model_flops
from perfswarm.report.timeline import counter_groups, run_origin, spans, timeline
from perfswarm.report.views import (
    kernel_streams,
    memory_view,
    module_tree,
    op_stacks,
    ops_by_shape,
)
from perfswarm.trace.ingest import ImportOptions, import_traces
from perfswarm.trace.store import Run


def test_report_data_of_nccl(corpus_runs: dict[str, Run]) -> None:
    data = report_data(corpus_runs["nccl"])
    assert set(data) == {"title", "run", "has_device", "cards", "breakdown", "flops",
                         "timeline", "concurrency", "ops_by_shape", "streams", "modules",
                         "memory", "ranks",
                         "iterations", "kernels", "cpu_ops", "categories", "critical_path",
                         "critical_steps", "memory_timeline", "stream_idle",
                         "kernel_overlap", "sequences", "queues", "bandwidth", "scopes",
                         "cupti", "swarms", "op_cost", "prediction", "advice", "tune", "projection",
                         "projection_note", "throughput", "roof", "step_time"}
    assert data["advice"] == [] and data["tune"] is None and data["has_device"]
    # an imported trace: no steps timed outside a profiler, its profiled steps' median
    assert data["step_time"]["outside"] is False and data["step_time"]["profiled_ns"] == (
        data["step_time"]["median_ns"])
    assert data["flops"] is None  # no shapes recorded: no op has a cost
    assert data["throughput"] is None  # nor a batch: no shapes, no --batch-size
    assert (data["projection"], data["projection_note"]) == (None, "not computed")
    prediction = data["prediction"]
    assert [s["step"] for s in prediction["steps"]] == [4, 5, 6]
    assert prediction["measured_ns"] == 222_442_191 and prediction["replay_error"] < 1e-4
    assert "overheads" not in prediction and data["op_cost"]["device"] == "A100-40GB"
    assert [c["label"] for c in data["cards"]] == [
        "step time", "throughput", "device utilization (rank 0)", "events"]
    assert data["cards"][0]["value"] == "222.442 ms"
    # utilization says what it is of: the span (684 ms), not the steps' 667 ms advise reads
    assert data["cards"][2]["value"] == "23.0%" and data["cards"][2]["detail"].startswith(
        "of the rank's span, 684.279 ms from its first work to its last")
    assert [(i["rank"], i["step"], i["source"]) for i in data["iterations"]] == [
        (0, 4, "marker"), (0, 5, "marker"), (0, 6, "marker")]
    assert data["iterations"][0]["dur_ns"] == 222_442_191
    tl = data["timeline"]
    drawn = drawn_rows(corpus_runs["nccl"])
    assert tl["events"] == 26_935 and tl["shown"] == tl["spans_total"] == len(drawn)
    assert not tl["downsampled"] and tl["note"] == ""
    # Threads first, then streams; no lane for the trace window (pid and tid -1).
    assert [lane["label"] for lane in tl["lanes"]] == [
        "thread -549452224", "thread 2910249 (pt_main_thread)",
        "thread 2919752 (pt_autograd_0)", "GPU 0 · stream 7", "GPU 0 · stream 40"]
    origin = data["run"]["origin_ns"]  # the run's start: here the trace window's
    assert origin == min(corpus_runs["nccl"].table("events").column("ts").to_pylist())
    assert min(tl["spans"]["start"]) == min(e["ts"] for e in drawn) - origin > 0
    assert [s["step"] for s in tl["steps"]] == [4, 5, 6]
    assert data["kernels"][0]["name"].startswith("ncclKernel_AllReduce_RING_LL_Sum_float")
    assert data["kernels"][0]["count"] == 15
    # each step's critical path: the main thread hands backward to the autograd thread and
    # takes over again (test_analyze_paths checks the times against the raw JSON)
    assert [(c["step"], [(h["from_tid"], h["to_tid"]) for h in c["handovers"]])
            for c in data["critical_steps"]] == [
        (s, [(2910249, 2919752), (2919752, 2910249)]) for s in (4, 5, 6)]
    assert [c["length_ns"] for c in data["critical_steps"]] == [
        s["length_ns"] for s in data["critical_path"]["steps"]]
    assert data["critical_steps"][0]["shares"][0][0] == "cpu"
    assert data["memory_timeline"] == []  # no memory timeline (import --memory-timeline)
    # analyze's per-stream idle split, overlap classes and kernel sequences (test_analyze
    # checks them against the raw JSON)
    assert [(s["stream"], s["host_wait_ns"], s["kernel_wait_ns"]) for s in data["stream_idle"]
            ] == [(7, 536_138_845, 6_102_815), (40, 582_261_309, 1_662_947)]
    assert data["kernel_overlap"][0]["busy_ns"] == 157_500_014
    assert data["sequences"][0]["count"] == 237 and len(data["sequences"]) == 10
    page = html.render(data)
    for table in ("critical-steps", "stream-idle", "kernel-overlap", "sequences"):
        assert f'<table id="{table}">' in page
    assert "<td>536.139 ms</td><td>6.103 ms</td>" in page


def drawn_rows(run: Run) -> list[dict[str, Any]]:
    """Events the timeline draws, straight from the table: a duration, not the trace window."""
    return [e for e in run.table("events").to_pylist()
            if e["dur"] > 0 and e["kind"] not in ("trace_span", "instant", "profiler_range")]


def test_the_prediction_runs_before_the_advice_and_the_analysis(
        corpus_runs: dict[str, Run]) -> None:
    """The report's largest transient, the prediction's graph and schedule, is made and
    freed first, not on top of the analysis and the advice; the advice is the same."""
    run = Run(corpus_runs["simple_add"].path)
    stages: list[str] = []
    data = report_data(run, advice=lambda r: advise(r).to_dict()["advice"],
                       on_stage=stages.append)
    assert stages == ["prediction", "advice", "analysis", "timeline", "op costs", "views"]
    assert data["advice"] == advise(corpus_runs["simple_add"]).to_dict()["advice"]


def test_timeline_keeps_everything_below_the_limit(corpus_runs: dict[str, Run]) -> None:
    run = corpus_runs["simple_add"]
    tl = timeline(run, spans(run), 0, max_spans=10**6)
    drawn = drawn_rows(run)
    assert tl["shown"] == tl["spans_total"] == len(drawn)
    assert not tl["downsampled"] and tl["note"] == ""
    assert sorted(tl["spans"]["dur"]) == sorted(int(e["dur"]) for e in drawn)


@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(limit=st.integers(1, 1200))
def test_downsampling_keeps_the_longest(corpus_runs: dict[str, Run], limit: int) -> None:
    run = corpus_runs["simple_add"]
    tl = timeline(run, spans(run), 0, max_spans=limit)
    durs = sorted((int(e["dur"]) for e in drawn_rows(run)),
                  reverse=True)
    assert tl["shown"] == min(limit, len(durs)) and tl["downsampled"] == (limit < len(durs))
    assert sorted(tl["spans"]["dur"], reverse=True) == durs[:limit]
    keys = list(zip(tl["spans"]["lane"], tl["spans"]["start"], strict=True))
    assert keys == sorted(keys)  # per lane, in time order
    if tl["downsampled"]:
        assert f"showing the {limit:,} longest of {len(durs):,} spans" in tl["note"]


@pytest.mark.parametrize("name", ["nccl", "simple_add", "event_sync_multi", "amd", "non_gpu"])
def test_spans_nest_and_self_times_cover_each_thread_once(corpus_runs: dict[str, Run],
                                                          name: str) -> None:
    """Every span at depth d > 0 starts inside a span of depth d - 1 on its lane, and the
    self times of a thread's host calls (zero-length ones too) add up to the union of the
    thread's calls (each ns counted once)."""
    run = corpus_runs[name]
    tl = timeline(run, spans(run), 0, max_spans=10**6)
    sp = tl["spans"]
    by_row: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for lane, depth, start, dur in zip(sp["lane"], sp["depth"], sp["start"], sp["dur"],
                                       strict=True):
        by_row.setdefault((lane, depth), []).append((start, start + dur))
    for (lane, depth), intervals in by_row.items():
        if depth:
            parents = by_row[(lane, depth - 1)]
            assert all(any(s0 <= s < e0 for s0, e0 in parents) for s, _ in intervals)
    ev = Events.load(run)
    calls = host_calls(ev)
    thread = lane_key(ev.rank[calls.rows], ev.tid[calls.rows])
    for key in set(thread.tolist()):
        mine = calls.rows[thread == key]
        s, e = union(ev.ts[mine], ev.end[mine])
        assert int(calls.cpu_self[mine].sum()) == int((e - s).sum())


def test_operators_have_self_and_device_time(corpus_runs: dict[str, Run]) -> None:
    """Device time of the top-level ops is that of every kernel a host launch (a runtime
    event with a correlation) put on the device, matched in the raw table."""
    run = corpus_runs["simple_add"]
    events = Events.load(run)
    ops = op_rows(scopes(events), op_stacks(events, host_calls(events)), 10**6)
    rows = run.table("events").to_pylist()
    host_corr = {(e["rank"], e["correlation"]) for e in rows
                 if e["kind"] == "runtime" and e["correlation"] != -1}
    launched = sum(int(e["dur"]) for e in rows
                   if e["kind"] in ("kernel", "memcpy", "memset")
                   and (e["rank"], e["correlation"]) in host_corr)
    assert launched > 0
    cpu = [e for e in rows if e["kind"] == "cpu_op"]
    assert sum(o["count"] for o in ops) == len(cpu)
    assert sum(o["total_ns"] for o in ops) == sum(int(e["dur"]) for e in cpu)
    assert all(0 <= o["self_ns"] <= o["total_ns"] for o in ops)
    assert [o["self_ns"] for o in ops] == sorted((o["self_ns"] for o in ops), reverse=True)
    assert sum(o["device_self_ns"] for o in ops) == launched  # each kernel under one op


def test_operators_count_zero_length_calls(corpus_runs: dict[str, Run]) -> None:
    """Calls under 1 us are stored with dur 0 and not drawn, but they are calls: the raw
    JSON of non_gpu has 200 aten::as_strided events (47 of them at dur 0) summing to
    160 us, and one aten::lift_fresh, at dur 0."""
    data = report_data(corpus_runs["non_gpu"])
    by_name = {o["name"]: o for o in data["cpu_ops"]}
    strided = by_name["aten::as_strided"]
    assert (strided["count"], strided["total_ns"]) == (200, 160_000)
    assert strided["mean_ns"] == 800
    full = {o["name"]: o for o in op_rows(scopes(Events.load(corpus_runs["non_gpu"])), {},
                                          10**6)}
    assert (full["aten::lift_fresh"]["count"], full["aten::lift_fresh"]["total_ns"]) == (1, 0)


def test_safe_json_escapes_markup() -> None:
    text = html.safe_json({"name": "</script><img src=x onerror=alert(1)>&"})
    assert "<" not in text and ">" not in text and "&" not in text
    assert json.loads(text) == {"name": "</script><img src=x onerror=alert(1)>&"}


def _analyze_json(run: Run, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["analyze", str(run.path), "--json"]) == 0
    data: dict[str, Any] = json.loads(capsys.readouterr().out)
    return data


def test_report_shows_scopes_bandwidth_and_queue_of_nccl(
        corpus_runs: dict[str, Run], capsys: pytest.CaptureFixture[str]) -> None:
    """The report carries analyze --json's scopes, bandwidth (with the device's peak) and
    launch queue bins as they are, and draws them; the raw JSON's numbers are on the page."""
    run = corpus_runs["nccl"]
    expected = _analyze_json(run, capsys)
    data = json.loads(html.safe_json(report_data(run)))
    for key in ("scopes", "bandwidth", "cupti"):
        assert data[key] == expected[key]
    assert data["cupti"] is None
    # from the raw JSON: the 960 device-to-device copies' `bytes` args and their spans' union;
    # A100's 1555 GB/s memory bandwidth (devices.yaml) is the peak
    d2d = data["bandwidth"][0]["flows"][0]
    assert (d2d["direction"], d2d["bytes"], d2d["busy_ns"]) == ("d2d", 307_323_096, 2_262_781)
    # the launch queue: the rank's, then each stream's, as analyze's bins
    launch = expected["launch"][0]
    assert [(q["device"], q["stream"], q["bins"], q["max"]) for q in data["queues"]] == [
        (None, None, launch["queue"]["bins"], launch["queue"]["max"]),
        *[(s["device"], s["stream"], s["queue"]["bins"], s["queue"]["max"])
          for s in launch["streams"]]]
    assert [q["stream"] for q in data["queues"]] == [None, 7, 40]
    page = html.render(report_data(run))
    for table in ("cpu-ops", "scope-annotations", "bandwidth"):
        assert f'<table id="{table}">' in page
    assert '<table id="scope-ops">' not in page  # its numbers are cpu-ops' columns
    for chart in ("chart-queue", "chart-bandwidth"):
        assert f'<div class="chart" id="{chart}">' in page
    # `## forward ##`: its three durations in the raw JSON, 103,788,081 + 103,098,615 +
    # 102,693,531 ns; the d2d row: 307,323,096 B (293.1 MiB) in 2.263 ms, 8.7% of 1,555 GB/s
    assert '<td class="name">## forward ##</td><td>3</td><td>309.580 ms</td>' in page
    assert ("<td>d2d</td><td>960</td><td>293.1 MiB</td><td>2.263 ms</td><td>135.82 GB/s</td>"
            in page and "<td>1,555.0 GB/s</td><td>8.7%</td>" in page)
    figure = html.queue_figure(data["queues"], data["run"]["origin_ns"])
    first = figure["data"][0]
    assert first["name"] == "rank 0 all streams" and first["y"] == launch["queue"]["bins"]
    assert first["x"][0] == (launch["queue"]["start"] - data["run"]["origin_ns"]) / 1e6
    assert first["x"][1] - first["x"][0] == pytest.approx(launch["queue"]["bin_ns"] / 1e6)


def test_report_shows_cupti_counters(corpus_runs: dict[str, Run],
                                     capsys: pytest.CaptureFixture[str]) -> None:
    """The cupti_profiler trace (range-profiler spans, no kernel spans): analyze's counters on
    the Kernels view; from the raw JSON, 77 ranges and the fp32 FLOPs of their SASS counts."""
    run = corpus_runs["cupti"]
    expected = _analyze_json(run, capsys)["cupti"]
    data = report_data(run)
    assert json.loads(html.safe_json(data["cupti"])) == expected
    page = html.render(data)
    assert '<table id="cupti-kernels">' in page and '<table id="cupti-totals">' in page
    assert "No device kernels" not in page
    assert ('<td class="name">ampere_sgemm_32x32_sliced1x4_tn</td><td>6</td><td>0</td>'
            "<td>30,160,191,488</td>") in page
    assert "<td>all</td><td>77</td><td>0</td><td>79,679,454,712</td><td>551,583,744</td>" in page


def test_html_is_self_contained_and_deterministic(corpus_runs: dict[str, Run]) -> None:
    data = report_data(corpus_runs["simple_add"])
    page = html.render(data)
    assert page == html.render(report_data(corpus_runs["simple_add"]))
    assert "<script src=" not in page and "<link " not in page  # nothing fetched
    assert "Plotly.newPlot" in page and len(page) > 1_000_000  # plotly.js inlined


def test_report_command(corpus_runs: dict[str, Run], tmp_path: Path,
                        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.html"
    assert main(["report", str(corpus_runs["event_sync"].path), "-o", str(out)]) == 0
    assert out.read_text().startswith("<!DOCTYPE html>")
    capsys.readouterr()
    assert main(["report", str(corpus_runs["event_sync"].path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["timeline"]["events"] == corpus_runs["event_sync"].table("events").num_rows
    assert main(["report", str(tmp_path / "missing")]) == 2


def test_report_carries_advice(corpus_runs: dict[str, Run], tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    run = corpus_runs["nccl"]
    expected = advise(run).to_dict()["advice"]
    assert expected  # the nccl trace is host-bound: there is something to say
    out = tmp_path / "r.html"
    assert main(["report", str(run.path), "-o", str(out)]) == 0
    page = out.read_text()
    for a in expected:
        assert str(markupsafe.escape(a["title"])) in page
    capsys.readouterr()
    assert main(["report", str(run.path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["advice"] == json.loads(json.dumps(expected))


def test_report_with_a_tune_output(corpus_runs: dict[str, Run], tune_out: Path, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    run = corpus_runs["simple_add"]
    tune = report_data(run, tune=load_results(tune_out))["tune"]
    assert set(tune) == {"dir", "command", "study", "unit", "measure", "baseline", "best",
                         "speedup", "pruned", "failed", "trials", "importance", "this_run"}
    assert tune["unit"] == "steps/s"
    assert tune["measure"] == "stdout" and tune["this_run"] is None  # printed: no Runs
    assert tune["baseline"]["throughput"] == 100.0 and tune["speedup"] == 8.0
    # eight configurations, eight trials: each tried once
    assert [(t["number"], t["state"], t["speedup"]) for t in tune["trials"]] == [
        (0, "COMPLETE", 4.0), (1, "PRUNED", None), (2, "PRUNED", None), (3, "PRUNED", None),
        (4, "FAIL", None), (5, "FAIL", None), (6, "COMPLETE", 8.0), (7, "PRUNED", None)]
    # fast: no completed trial varied it, no importance told
    assert [i["param"] for i in tune["importance"]] == ["workers"]
    page = html.render(report_data(run, tune=load_results(tune_out)))
    assert 'id="chart-importance"' in page and 'id="chart-trials"' in page
    assert '<table id="trials">' in page
    assert main(["report", str(run.path), "--tune", str(tune_out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tune"]["best"]["number"] == 6


def test_report_tune_dir_errors(corpus_runs: dict[str, Run], tune_out: Path, tmp_path: Path,
                                capsys: pytest.CaptureFixture[str]) -> None:
    run = str(corpus_runs["simple_add"].path)
    assert main(["report", run, "--tune", str(tmp_path / "none"), "--json"]) == 2
    assert "not a directory (give the --out of perfswarm tune)" in capsys.readouterr().err
    bad = tmp_path / "bad"
    shutil.copytree(tune_out, bad)
    (bad / "trials.json").write_text("[{}]")
    assert main(["report", run, "--tune", str(bad), "--json"]) == 2
    assert f"{bad / 'trials.json'}: not written by perfswarm tune" in capsys.readouterr().err
    shutil.copy(tune_out / "trials.json", bad)
    summary = orjson.loads((bad / "tune.json").read_bytes())
    (bad / "tune.json").write_bytes(orjson.dumps({**summary, "baseline": "fast"}))
    assert main(["report", run, "--tune", str(bad)]) == 2  # a TypeError traceback before
    assert capsys.readouterr().err == (f"perfswarm: error: {bad / 'tune.json'}: not written by "
                                       "perfswarm tune (Expected `object`, got `str` - at "
                                       "`$.baseline`)\n")
    (bad / "tune.json").write_text("{")
    with pytest.raises(PerfswarmError, match=r"tune\.json: invalid JSON"):
        load_results(bad)


def test_timeline_draws_the_largest_network_flows(corpus_runs: dict[str, Run],
                                                  tmp_path: Path) -> None:
    """A capture can hold thousands of flows: the timeline keeps the largest byte lines."""
    run = Run(shutil.copytree(corpus_runs["simple_add"].path, tmp_path / "flows.run"))
    names = [f"net.flow.tcp.10.0.0.1:{port}->10.0.0.2:80.{m}"
             for port in range(1, 12) for m in ("bytes", "packets")]
    run.write_table("counters", pa.table({
        "rank": [-1] * (len(names) + 1), "ts": [5] * (len(names) + 1),
        "name": [*names, "net.rx_bytes"], "device": [-1] * (len(names) + 1),
        "value": [float(int(n.split(":")[1].split("-")[0]) * 1000) for n in names] + [7.0]}))
    tl = timeline(run, spans(run), 0)
    assert [(g["title"], [c["name"] for c in g["series"]]) for g in tl["counters"]] == [
        ("net (bytes)", sorted([f"net.flow.tcp.10.0.0.1:{port}->10.0.0.2:80.bytes"
                                for port in range(4, 12)] + ["net.rx_bytes"]))]
    assert "showing the 8 largest of 11 network flows" in tl["note"]


def test_report_carries_the_scaling_projection(corpus_runs: dict[str, Run], tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    run = corpus_runs["nccl"]
    out = tmp_path / "r.html"
    assert main(["report", str(run.path), "-o", str(out)]) == 0
    page = out.read_text()
    assert 'id="chart-scaling"' in page and 'id="chart-options"' in page
    assert '<table id="projection">' in page and page.count("<tr><td>256</td>") == 1
    assert "<strong>choose</strong> eth-100g with tree" in page
    capsys.readouterr()
    assert main(["report", str(run.path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    expected = json.loads(json.dumps(project(run, DEFAULT_DEVICES).to_dict()))
    assert (data["projection"], data["projection_note"]) == (expected, "")
    figures = html.projection_figures(data["projection"])
    throughput, ideal, efficiency = figures["chart-scaling"]["data"]
    assert throughput["x"] == list(DEFAULT_DEVICES) and efficiency["yaxis"] == "y2"
    assert efficiency["y"] == [100 * p["efficiency"] for p in data["projection"]["points"]]
    # ideal: 256 times one device's step (its 39.4 ms of device work and its wait on the host)
    alone = data["projection"]["points"][0]["step_ms"] / 1e3
    assert alone > 0.2 and ideal["y"][-1] == pytest.approx(256 / alone)
    assert [t["name"] for t in figures["chart-options"]["data"]] == ["ring", "tree", "ps"]


def test_runs_without_collectives_say_why_there_is_no_projection(
        corpus_runs: dict[str, Run]) -> None:
    with pytest.raises(NotApplicable, match=r"give their size with grad_bytes$"):
        report_projection(corpus_runs["simple_add"])
    data = report_data(corpus_runs["simple_add"], projection=report_projection)
    projection, note = data["projection"], data["projection_note"]
    assert projection is None and "--grad-bytes" in note
    page = html.render(data)
    assert 'id="projection-note"' in page and 'id="chart-scaling"' not in page
    assert html.projection_figures(None) == {}


def _clipped_union(rows: list[dict[str, Any]], lo: int, hi: int) -> int:
    s, e = union(np.array([max(r["ts"], lo) for r in rows], np.int64),
                 np.array([min(r["ts"] + r["dur"], hi) for r in rows], np.int64))
    return int((e - s).sum())


def test_step_breakdown_partitions_each_step(corpus_runs: dict[str, Run]) -> None:
    """Categories add up to the step; device compute is the kernels' union in the step, and
    device compute + communication the union of kernels and collectives (from the raw table)."""
    run = corpus_runs["nccl"]
    data = report_data(run)
    rows = run.table("events").to_pylist()
    kernels = [r for r in rows if r["kind"] == "kernel" and r["dur"] > 0]
    comm = [r for r in rows if r["kind"] == "collective" and r["dur"] > 0]
    assert [(b["rank"], b["step"]) for b in data["breakdown"]] == [(0, 4), (0, 5), (0, 6)]
    for b in data["breakdown"]:
        assert sum(b["ns"].values()) == b["dur_ns"]
        step = next(s for s in data["timeline"]["steps"] if s["step"] == b["step"])
        lo, hi = step["start"] + data["run"]["origin_ns"], step["end"] + data["run"]["origin_ns"]
        assert b["ns"]["device compute"] == _clipped_union(kernels, lo, hi) > 0
        assert b["ns"]["device compute"] + b["ns"]["communication"] == _clipped_union(
            kernels + comm, lo, hi)
        assert b["ns"]["data loading"] == 0


def test_step_breakdown_of_gloo_and_of_untraced_ranks(tmp_path: Path) -> None:
    """A CPU DDP step (tests/data/ddp_gloo.py): its host compute is its ops' union and its
    communication gloo's all-reduce where none runs, from the raw JSON; a rank no trace covers
    (steps on rank -1, no event) is untraced, not idle."""
    from conftest import GLOO_DDP, gloo_ddp_raw
    from perfswarm.analyze.frame import Events
    from perfswarm.report.overview import step_breakdown

    run = import_traces(GLOO_DDP, tmp_path / "g.run", ImportOptions(ranks=(0, 1)), ["test"])
    ev = Events.load(run)
    raw = gloo_ddp_raw()
    windows = {str(r): [{"step": i, "start": lo, "end": hi}
                        for i, (lo, hi) in enumerate(raw[r].markers)] for r in (0, 1)}
    for b in step_breakdown(ev, windows):
        lo, hi = raw[b["rank"]].markers[b["step"]]
        mine = raw[b["rank"]]
        gloo = [{"ts": s, "dur": e - s} for s, e, _ in mine.gloo if s < hi and e > lo]
        assert sum(b["ns"].values()) == b["dur_ns"] == hi - lo
        assert b["ns"]["communication"] == _clipped_union(gloo, lo, hi) - sum(
            max(0, min(e, ge, hi) - max(s, gs, lo)) for g in gloo
            for gs, ge in [(g["ts"], g["ts"] + g["dur"])]
            for s, e in _host_spans(ev, b["rank"])) > 0
    untraced = step_breakdown(ev, {"-1": [{"step": 0, "start": 0, "end": 10}]})
    assert untraced == [{"rank": -1, "step": 0, "dur_ns": 10,
                         "ns": {c: (10 if c == "untraced" else 0) for c in CATEGORIES}}]


def test_step_time_of_a_run_that_profiled_no_step(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """A program that ran its own torch profiler: the recorder traced nothing, timed 5 steps
    (10, 12, 14, 16, 18 ms) and sampled the system; the report's step time is their median,
    said of steps timed with none profiled, and so is diff's headline (both had said "after
    the profiler's window", of a window there was not)."""
    from perfswarm.analyze.diff import diff_runs
    from perfswarm.report.text import step_time_change
    from perfswarm.trace.schema import STEPS

    trace = Path(__file__).parent / "data" / "eval_every3_cpu.pt.trace.json.gz"
    runs = []
    for name in ("a", "b"):
        run = import_traces([trace], tmp_path / f"{name}.run", ImportOptions(), ["test"])
        run.write_table("events", run.table("events").slice(0, 0))
        ends = np.cumsum([0, 10, 12, 14, 16, 18]) * 1_000_000
        run.write_table("steps", pa.table({
            "rank": [0] * 5, "step": list(range(1, 6)), "start": ends[:-1].tolist(),
            "end": ends[1:].tolist(), "source": ["detected"] * 5}).cast(STEPS))
        # the system sampler's one reading: what an untraced Run is analyzed for
        run.write_table("counters", pa.table({
            "rank": pa.array([-1], pa.int32()), "ts": pa.array([0], pa.int64()),
            "device": pa.array([-1], pa.int32()), "name": ["proc.cpu_cores"],
            "value": [1.0]}))
        runs.append(run)
    card = next(c for c in report_data(runs[0])["cards"] if c["label"] == "step time")
    assert (card["value"], card["detail"]) == ("14.000 ms",
                                               "median of 5 steps timed, none profiled")
    # diff compares their step times (it had stopped: "the Run has no events to analyze")
    found = diff_runs(runs[0], runs[1])
    assert found.step_time is not None and (found.ops, found.steps) == ((), ())
    assert found.step_time.delta_ns == 0 and found.step_time.a.median_ns == 14_000_000
    assert step_time_change(found.step_time)[1].endswith("; the steps timed, none profiled")
    assert main(["diff", str(runs[0].path), str(runs[1].path)]) == 0
    said = capsys.readouterr().out
    assert "14.000 ms -> 14.000 ms" in said and "no op traced on either side" in said


def _host_spans(ev: Any, rank: int) -> list[tuple[int, int]]:
    """The rank's host work (not gloo's ranges) as disjoint spans."""
    rows = np.flatnonzero((ev.rank == rank) & ev.host_busy & ~ev.host_collective)
    s, e = union(ev.ts[rows], ev.end[rows])
    return list(zip(s.tolist(), e.tolist(), strict=True))


def test_model_flops_against_the_gpu_peak(corpus_runs: dict[str, Run]) -> None:
    """MFU counts 3x the forward's FLOPs when a backward ran, HFU every costed op's; each per
    rank and step at the median step time, against the spec's peak for the heaviest ops'
    dtype: 2 ranks of 4 steps each at 0.5 s."""
    devices = corpus_runs["nccl"].manifest()["devices"]
    op_cost = {"device": "A100-40GB", "flops": 3.5e12,
               "phase_flops": {"forward": 1e12, "backward": 2.4e12, "optimizer": 1e11},
               "no_grad_flops": 0.0,
               "ops": [{"flops": 1e12, "count": 2, "dtype": "fp32"},
                       {"flops": 1e9, "count": 4, "dtype": "fp16"}], "coverage": 0.25}
    flops = model_flops(op_cost, devices, 500_000_000, 4, 2)
    assert flops is not None and flops["coverage"] == 0.25  # the FLOPs counted are of a part
    assert flops is not None and flops["flops_per_s"] == pytest.approx(3.5e12 / 2 / 2)
    assert flops["model_flops"] == 3e12 and flops["model_flops_per_s"] == pytest.approx(3e12 / 4)
    assert flops["dtype"] == "fp32" and flops["device"] == "A100-40GB"
    peak = load_spec("A100-40GB").peak_for("fp32")
    assert flops["hfu"] == pytest.approx(3.5e12 / 4 / peak)
    assert flops["mfu"] == pytest.approx(3e12 / 4 / peak)
    inference = {**op_cost, "flops": 1e12, "phase_flops": {"forward": 1e12, "backward": 0.0,
                                                           "optimizer": 0.0}}
    assert model_flops(inference, devices, 10**9, 1, 1)["model_flops"] == 1e12  # type: ignore[index]
    assert model_flops({**op_cost, "device": None}, devices, 10**9, 1, 1)["mfu"] is None  # type: ignore[index]
    assert model_flops({**inference, "flops": 0.0, "ops": []}, devices, 10**9, 1, 1) is None


def test_streams_and_launch_geometry_of_nccl(corpus_runs: dict[str, Run]) -> None:
    """Busy time per stream is the union of its kernels (from the raw table); a kernel's
    launch geometry is its longest call's args."""
    run = corpus_runs["nccl"]
    view = kernel_streams(run, spans(run), 5)
    rows = [r for r in run.table("events").to_pylist()
            if r["kind"] in ("kernel", "collective") and r["dur"] > 0 and r["device"] >= 0]
    assert [(s["device"], s["stream"]) for s in view["streams"]] == [(0, 7), (0, 40)]
    for s in view["streams"]:
        mine = [r for r in rows if r["stream"] == s["stream"]]
        assert s["kernels"] == len(mine) and s["total_ns"] == sum(r["dur"] for r in mine)
        assert s["busy_ns"] == _clipped_union(mine, 0, 2**62)
    top = view["kernels"][0]
    mine = [r for r in rows if r["name"] == top["name"]]
    longest = json.loads(max(mine, key=lambda r: r["dur"])["args"])
    assert top["count"] == len(mine) == 15 and top["streams"] == [40]
    assert top["launch"]["grid"] == " x ".join(map(str, longest["grid"]))
    assert top["launch"]["block"] == " x ".join(map(str, longest["block"]))
    cpu = corpus_runs["cpu_only"]
    assert kernel_streams(cpu, spans(cpu), 5) == {"streams": [], "kernels": []}


def _shape_key(name: str, dims: Any) -> tuple[str, str] | None:
    """(op, shapes) as the by-shape table writes them; None for dims that are not lists of
    ints per input (a tensor list is not one input's shape; op cost leaves them out too)."""
    if isinstance(dims, list) and all(
            isinstance(d, list) and all(isinstance(x, int) for x in d) for d in dims):
        return name, ", ".join("x".join(map(str, d)) if d else "scalar" for d in dims)
    return None


def _by_shape(run: Run) -> list[dict[str, Any]]:
    events = Events.load(run)
    return ops_by_shape(run, events, host_calls(events), 10**6)


def test_cpu_busy_of_the_recorded_trainer(trainer_run: Run) -> None:
    """The CPU busy card of a real recording, from its tables with plain Python: the loop's
    thread (its ProfilerStep markers') perf samples between the rank's first event and where
    its last one ends, times perf's period (its manifest's perf_hz); or the range without."""
    if trainer_run.manifest()["collectors"]["perf"]["status"] != "ok":
        pytest.skip("perf cannot sample here")
    events = trainer_run.table("events").to_pylist()
    rank0 = [e for e in events if e["rank"] == 0]
    loop_tid = next(e["tid"] for e in rank0 if e["name"].startswith("ProfilerStep#"))
    pid = next(e["pid"] for e in rank0 if e["tid"] == loop_tid and e["kind"] == "cpu_op")
    busy = [e for e in rank0 if e["dur"] > 0 and e["kind"] in (
        "cpu_op", "user_annotation", "python_function", "runtime", "driver", "syscall")
        and not e["name"].startswith("ProfilerStep#")]
    lo, hi = min(e["ts"] for e in busy), max(e["ts"] + e["dur"] for e in busy)
    hz = trainer_run.manifest()["extra"]["record"]["perf_hz"]
    samples = [s for s in trainer_run.table("samples").to_pylist() if s["source"] == "perf"
               and s["pid"] == pid and s["tid"] == loop_tid and lo <= s["ts"] < hi]
    (card,) = [c for c in report_data(trainer_run)["cards"] if c["label"] == "CPU busy (rank 0)"]
    period = round(1e9 / hz)
    if hi - lo >= 10 * period:
        assert card["value"] == f"{100 * min(1.0, len(samples) * period / (hi - lo)):.1f}%"
    else:
        assert card["value"].endswith("-100.0%")


def test_cpu_busy_card_from_samples() -> None:
    """600 ms of span: 450 ms of the loop thread's samples is 75.0%, within one 10 ms period
    (1.7%); a count one over the span reads 100.0%; a span under 10 periods reads the range
    from the ops' share."""
    from perfswarm.analyze.concurrency import OnCpu
    from perfswarm.report.data import _cpu_busy

    rank = {"rank": 0, "total": {"span_ns": 600 * MS, "host_ops_ns": 300 * MS}}
    card = _cpu_busy(rank, OnCpu(600 * MS, 450 * MS, 120 * MS, 300 * MS, 10 * MS), "")
    assert card["value"] == "75.0%" and "within 1.7%" in card["detail"]
    assert "other threads 0.20 cores" in card["detail"] and "spanned 50.0%" in card["detail"]
    assert _cpu_busy(rank, OnCpu(600 * MS, 610 * MS, 0, 300 * MS, 10 * MS), "")["value"] == "100.0%"
    short = {"rank": 0, "total": {"span_ns": 60 * MS, "host_ops_ns": 30 * MS}}
    assert _cpu_busy(short, OnCpu(60 * MS, 40 * MS, 0, 30 * MS, 10 * MS), "")["value"] == \
        "50.0%-100.0%"
    assert _cpu_busy(short, None, "")["value"] == "50.0%-100.0%"
    # no samples (an imported trace): the loop thread's ops, not every thread's (a background
    # thread's had hidden the loop's DataLoader wait: 97.9% where the loop's ops were 76.0%)
    busy = {"rank": 0, "total": {"span_ns": 600 * MS, "host_ops_ns": 590 * MS}}
    card = _cpu_busy(busy, OnCpu(600 * MS, 0, 0, 456 * MS, 0), "")
    assert card["value"] == "76.0%-100.0%" and "the loop's thread ran ops" in card["detail"]
    # a server's pool of 8 threads taking its steps in turn: their time together, said so
    pool = _cpu_busy(rank, OnCpu(600 * MS, 450 * MS, 0, 300 * MS, 10 * MS, threads=8), "")
    assert pool["value"] == "75.0%"
    assert "the loop's 8 threads (each took steps), together, were on the CPU" in pool["detail"]


MS = 1_000_000


def test_ops_by_input_shape(trainer_run: Run) -> None:
    """Calls per (op, shapes) counted straight from the recorded `Input Dims`."""
    groups = _by_shape(trainer_run)
    expected: dict[tuple[str, str], tuple[int, int]] = {}
    for r in trainer_run.table("events").to_pylist():
        dims = json.loads(r["args"] or "{}").get("Input Dims") if r["kind"] == "cpu_op" else None
        key = _shape_key(r["name"], dims)
        if key is not None:
            count, total = expected.get(key, (0, 0))
            expected[key] = (count + 1, total + r["dur"])
    assert {(g["name"], g["shapes"]): (g["count"], g["total_ns"]) for g in groups} == expected
    assert len(groups) > 10 and all(g["self_ns"] <= g["total_ns"] for g in groups)


def test_ops_by_input_shape_count_zero_length_calls(corpus_runs: dict[str, Run]) -> None:
    """non_gpu's raw JSON has 173 op calls with dur 0 (under Kineto's 1 us), every one with
    its `Input Dims`: each is a call of its (op, shapes) row, counted the same way as the
    operators table counts it."""
    with gzip.open(corpus("non_gpu")) as f:
        raw = [e for e in json.load(f)["traceEvents"]
               if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    assert sum(1 for e in raw if e["dur"] == 0) == 173
    expected: dict[tuple[str, str], tuple[int, int]] = {}
    for e in raw:
        key = _shape_key(e["name"], e["args"].get("Input Dims"))
        if key is not None:
            count, total = expected.get(key, (0, 0))
            expected[key] = (count + 1, total + 1000 * e["dur"])
    run = corpus_runs["non_gpu"]
    groups = _by_shape(run)
    assert {(g["name"], g["shapes"]): (g["count"], g["total_ns"]) for g in groups} == expected
    assert sum(g["count"] for g in groups) == 2410
    strided = {g["shapes"]: g["count"] for g in groups if g["name"] == "aten::as_strided"}
    assert sum(strided.values()) == 200  # the operators table's calls of it, all shapes
    zero = [g for g in groups if g["name"] == "aten::lift_fresh"]
    assert [(g["count"], g["total_ns"], g["self_ns"]) for g in zero] == [(1, 0, 0)]


def _import_events(tmp_path: Path, events: list[dict[str, Any]]) -> Run:
    src = tmp_path / "trace.json"
    src.write_text(json.dumps({"traceEvents": events, "baseTimeNanoseconds": 10**18}))
    return import_traces([src], tmp_path / "t.run", ImportOptions(), ["test"])


def test_module_tree_and_memory(tmp_path: Path) -> None:
    """nn.Module spans (with_modules) become a tree with calls and time and the ops' call
    stacks; `[memory]` instants (profile_memory) give allocated and reserved bytes and their
    peaks."""
    def span(name: str, ts: float, dur: float, cat: str = "python_function") -> dict[str, Any]:
        return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
                "args": {}}

    def mem(ts: float, nbytes: int, allocated: int, reserved: int) -> dict[str, Any]:
        return {"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1,
                "tid": 1, "ts": ts, "args": {"Device Type": 1, "Device Id": 0, "Bytes": nbytes,
                                             "Total Allocated": allocated,
                                             "Total Reserved": reserved, "Addr": 7}}

    events = [span("nn.Module: Net_0", 0, 100), span("nn.Module: Linear_0", 10, 30),
              span("aten::addmm", 12, 20, "cpu_op"), span("nn.Module: ReLU_0", 50, 10),
              span("aten::view", 55, 0, "cpu_op"),  # calls under 1 us: dur 0, still calls
              span("nn.Module: Linear_0", 70, 20), span("nn.Module: Dropout_0", 80, 0),
              span("nn.Module: Net_0", 200, 50), span("nn.Module: Linear_0", 210, 5),
              mem(11, 4096, 4096, 2 << 20), mem(60, 8192, 12288, 2 << 20),
              mem(95, -4096, 8192, 4 << 20)]
    run = _import_events(tmp_path, events)
    # its call stack: the python spans around it
    stacks = {"aten::addmm": ["nn.Module: Net_0", "nn.Module: Linear_0"],
              "aten::view": ["nn.Module: Net_0", "nn.Module: ReLU_0"]}
    events = Events.load(run)
    calls = host_calls(events)
    assert op_stacks(events, calls) == stacks
    data = report_data(run)
    assert {o["name"]: (o["count"], o["stack"]) for o in data["cpu_ops"]} == {
        name: (1, stack) for name, stack in stacks.items()}
    tree = module_tree(events, calls, 100)
    assert [(m["depth"], m["module"], m["calls"], m["total_ns"]) for m in tree] == [
        (0, "Net_0", 2, 150_000), (1, "Linear_0", 3, 55_000), (2, "Dropout_0", 1, 0),
        (1, "ReLU_0", 1, 10_000)]
    assert data["modules"] == tree
    origin = run_origin(run)
    (memory,) = memory_view(run, origin, 1000)
    assert memory["device"] == "device 0" and (memory["allocations"], memory["frees"]) == (2, 1)
    assert memory["peak_allocated"] == 12288 and memory["peak_reserved"] == 4 << 20
    assert memory["allocated"] == [4096, 12288, 8192] and memory["allocated_bytes"] == 12288
    assert memory["t_ms"] == [(10**18 + 11_000 - origin) / 1e6, (10**18 + 60_000 - origin) / 1e6,
                              (10**18 + 95_000 - origin) / 1e6]


def test_module_tree_of_a_recording(tmp_path: Path) -> None:
    """torch.profiler's with_modules spans of tests/data's MLP (3 steps): each module's calls
    and total from the raw JSON, the Linear and ReLU layers under the Sequential."""
    path = Path(__file__).parent / "data" / "mlp_adam_cpu.pt.trace.json.gz"
    with gzip.open(path) as f:
        raw = [e for e in json.load(f)["traceEvents"] if e.get("cat") == "python_function"
               and e["name"].startswith("nn.Module: ")]
    totals: dict[str, list[int]] = {}
    for e in raw:
        t = totals.setdefault(e["name"].removeprefix("nn.Module: "), [0, 0])
        t[0] += 1
        t[1] += round(1000 * e["dur"])
    run = import_traces([path], tmp_path / "mlp.run", ImportOptions(), ["t"])
    events = Events.load(run)
    tree = module_tree(events, host_calls(events), 100)
    assert [(m["path"], m["calls"], m["total_ns"]) for m in tree] == [
        ([*outer, name], *totals[name]) for outer, name in (
            ([], "Sequential_0"), (["Sequential_0"], "Linear_0"),
            (["Sequential_0"], "Linear_1"), (["Sequential_0"], "ReLU_0"))]
    assert totals["ReLU_0"][0] == 3


def test_ranks_view_of_nccl(corpus_runs: dict[str, Run]) -> None:
    data = report_data(corpus_runs["nccl"])
    (rank,) = data["ranks"]
    ns = data["concurrency"]["ranks"][0]["total"]["ns"]
    assert rank["comm_ns"] == ns["comm_only"] + ns["overlapped"] > 0
    assert rank["median_step_ns"] == 222_442_191 and rank["steps"] == 3


def test_a_run_without_iterations_is_charted_in_windows(corpus_runs: dict[str, Run]) -> None:
    """The corpus's 14-event inference trace has no iterations: its states chart shows the
    span's equal time windows as windows (they had been labelled steps under "No
    iterations"), and its prediction the whole window."""
    data = report_data(corpus_runs["old_format"])
    assert data["iterations"] == []
    parts = data["concurrency"]["ranks"][0]["iterations"]
    figure = html.concurrency_figure(data["concurrency"], data["has_device"], windows=True)
    assert figure["data"][0]["x"] == ["rank 1 all", *(f"rank 1 window {i}"
                                                      for i in range(len(parts)))]
    page = html.render(data)
    assert "rank 1 step" not in page and f"span in {len(parts)} equal time windows" in page
    assert '"x":["rank 1 whole window"]' in page


def test_ranks_view_of_a_cpu_run(tmp_path: Path) -> None:
    """A CPU run without collectives computes on the host: its ops' time in the steps (the
    union of the raw JSON's cpu_ops, every thread), no communication to hide (it had read 0 ms
    of compute and 0.0% hidden)."""
    trace = Path(__file__).parent / "data" / "mlp_adam_cpu.pt.trace.json.gz"
    run = import_traces([trace], tmp_path / "m.run", ImportOptions(), ["test"])
    data = report_data(run)
    (rank,) = data["ranks"]
    raw = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    steps = [e for e in raw if e.get("name", "").startswith("ProfilerStep#")]
    lo = min(round(e["ts"] * 1000) for e in steps)
    hi = max(round((e["ts"] + e["dur"]) * 1000) for e in steps)
    ops = [(round(e["ts"] * 1000), round((e["ts"] + e["dur"]) * 1000)) for e in raw
           if e.get("cat") == "cpu_op"]
    start, end = union(np.array([max(a, lo) for a, b in ops if b > lo and a < hi], np.int64),
                       np.array([min(b, hi) for a, b in ops if b > lo and a < hi], np.int64))
    assert abs(rank["compute_ns"] - int((end - start).sum())) <= len(start)  # us to ns rounding
    assert rank["comm_ns"] == 0 and rank["comm_hidden_pct"] is None
    page = html.render(data)
    row = page.split('<table id="ranks">', 1)[1].split("</table>", 1)[0]
    assert "<td>n/a</td>" in row and "0.000 ms</td><td>0.000 ms" not in row


def test_a_template_cache_that_cannot_be_written_is_no_cache(tmp_path: Path) -> None:
    # the cache directory is gone: writing the compiled template fails, the page is still made
    cache = html._CompiledTemplates(str(tmp_path / "gone"))
    env = jinja2.Environment(loader=jinja2.PackageLoader("perfswarm.report", "templates"),
                             bytecode_cache=cache)
    page = env.get_template("building.html.j2").render(
        title="t", what="w", stage="s", waited="1 s", ahead=0, plotly_js="", figures_json="")
    assert "w" in page
    # and a writable one holds the compiled template for the next process
    cache = html._CompiledTemplates(str(tmp_path))
    env = jinja2.Environment(loader=jinja2.PackageLoader("perfswarm.report", "templates"),
                             bytecode_cache=cache)
    env.get_template("building.html.j2")
    assert len(list(tmp_path.glob("__jinja2_*.cache"))) == 1


def test_a_cpu_runs_states_are_the_hosts(corpus_runs: dict[str, Run],
                                        trainer_run: Run) -> None:
    """Without a device the iterations table and the states chart say host busy and idle,
    not device states that are all 0 (host_busy_device_idle, compute_only, ...); the critical
    path's and the annotations' tables have no device columns (all 0 on a CPU run)."""
    cpu = html.render(report_data(corpus_runs["cpu_only"]))
    assert "<th>host busy</th><th>idle</th></tr>" in cpu and "<th>compute_only</th>" not in cpu
    recorded = html.render(report_data(trainer_run))  # a real CPU recording: it has both
    assert 'id="critical-steps"' in recorded and 'id="scope-annotations"' in recorded
    assert "<th>device ops</th>" not in recorded and "<th>device total</th>" not in recorded
    gpu = html.render(report_data(corpus_runs["nccl"]))
    assert "<th>compute_only</th>" in gpu and "<th>host_busy_device_idle</th>" in gpu
    assert "<th>device ops</th>" in gpu and "<th>device total</th>" in gpu


def test_timeline_draws_a_clock_apart_from_shares(corpus_runs: dict[str, Run],
                                                  tmp_path: Path) -> None:
    """A core's steal (a share) beside its usr; its clock (MHz) on a chart of its own (steal
    had shared the unitless chart with the clock, a fraction beside 2,600)."""
    run = Run(shutil.copytree(corpus_runs["simple_add"].path, tmp_path / "clock.run"))
    names = ["cpu.core0.usr", "cpu.core0.steal", "cpu.core0.mhz"]
    run.write_table("counters", pa.table({
        "rank": [-1] * 3, "ts": [5] * 3, "name": names, "device": [-1] * 3,
        "value": [0.5, 0.01, 2600.0]}))
    tl = timeline(run, spans(run), 0)
    assert [(g["title"], [c["name"] for c in g["series"]]) for g in tl["counters"]] == [
        ("cpu (%)", ["cpu.core0.steal", "cpu.core0.usr"]), ("cpu (MHz)", ["cpu.core0.mhz"])]


def test_a_processs_own_counters_are_not_charted(corpus_runs: dict[str, Run],
                                                 tmp_path: Path) -> None:
    """The sampler's per-process counters (proc.PID.main_run_delay_cores, one a process: a
    loop starting DataLoader workers each epoch has hundreds) are the advice's, not a chart's;
    the tree's are drawn."""
    run = Run(shutil.copytree(corpus_runs["nccl"].path, tmp_path / "r.run"))
    names = ["proc.run_delay_cores", "proc.41.main_run_delay_cores",
             "proc.42.main_run_delay_cores"]
    run.write_table("counters", pa.table({
        "rank": pa.array([-1] * 6, pa.int32()), "ts": pa.array(range(6), pa.int64()),
        "name": [n for n in names for _ in range(2)], "device": pa.array([-1] * 6, pa.int32()),
        "value": [0.5] * 6}))
    groups, _notes, shown, recorded = counter_groups(run, 0)
    assert [s["name"] for g in groups for s in g["series"]] == ["proc.run_delay_cores"]
    assert (shown, recorded) == (2, 6)
