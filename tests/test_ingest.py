"""Import of the real corpus traces: exact counts, clocks, steps, flows and the ET join."""

from __future__ import annotations

import gzip
import importlib.abc
import json
import shutil
import statistics
import subprocess
import sys
import tracemalloc
from collections.abc import Iterator, Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from conftest import CORPUS, ET, corpus
from perfswarm.errors import PerfswarmError
from perfswarm.trace import build, kineto
from perfswarm.trace.info import run_info
from perfswarm.trace.ingest import ImportOptions, import_traces
from perfswarm.trace.kineto import ReadOptions, rank_in_name, read_bytes, read_trace
from perfswarm.trace.schema import STEPS
from perfswarm.trace.store import ROW_GROUP, Run, row_groups
from perfswarm.trace.stream import spill_trace

DATA = Path(__file__).parent / "data"

# Counted independently from the raw JSON (ph X/i events by category; _raw_counts checks totals).
EXPECTED_KINDS = {
    "nccl": {"collective": 21, "cpu_op": 14346, "gpu_annotation": 30, "instant": 2,
             "kernel": 2679, "memcpy": 960, "memset": 114, "runtime": 8740, "trace_span": 1,
             "user_annotation": 42},
    "simple_add": {"cpu_op": 359, "instant": 2, "kernel": 79, "memcpy": 16, "memset": 3,
                   "runtime": 331, "sync": 41, "trace_span": 1, "user_annotation": 8},
    "event_sync": {"cpu_op": 10, "instant": 2, "kernel": 4, "memcpy": 1, "runtime": 12,
                   "sync": 4, "trace_span": 1, "user_annotation": 1},
    "event_sync_multi": {"cpu_op": 6, "instant": 2, "kernel": 3, "memset": 3, "runtime": 39,
                         "sync": 5, "trace_span": 1},
    "amd": {"cpu_op": 70, "gpu_annotation": 2, "instant": 2, "kernel": 14, "memcpy": 2,
            "runtime": 21, "trace_span": 1, "user_annotation": 3},
    "cupti": {"cpu_op": 375, "instant": 3, "profiler_range": 77, "runtime": 1862,
              "trace_span": 2, "user_annotation": 8},
    "cpu_only": {"cpu_op": 4, "instant": 2, "trace_span": 1, "user_annotation": 11},
    "triton": {"cpu_op": 3, "driver": 1, "instant": 2, "kernel": 1, "runtime": 1,
               "trace_span": 1, "user_annotation": 1},
    "non_gpu": {"cpu_op": 2424, "user_annotation": 43},
    "old_format": {"instant": 1, "kernel": 4, "runtime": 8, "trace_span": 1},
    "compare_base": {"cpu_op": 6, "kernel": 6, "memcpy": 6, "memset": 6, "runtime": 5,
                     "user_annotation": 4},
    "compare_test": {"cpu_op": 9, "kernel": 5, "memcpy": 6, "memset": 6, "runtime": 5,
                     "user_annotation": 3},
    "et_trace": {"cpu_op": 28, "instant": 2, "kernel": 4, "runtime": 15, "trace_span": 1,
                 "user_annotation": 8},
}
EXPECTED_FLOWS = {"nccl": 13600, "simple_add": 470, "event_sync": 21, "old_format": 8,
                  "amd": 45, "cupti": 1862, "compare_base": 0}


def _raw_counts(path: Path) -> dict[str, int]:
    """Independent count with the stdlib json module: X/i events per category."""
    import gzip

    data = json.loads(gzip.decompress(path.read_bytes()))
    counts: dict[str, int] = {}
    for e in data["traceEvents"]:
        if e.get("ph") in ("X", "i"):
            counts[e.get("cat", "")] = counts.get(e.get("cat", ""), 0) + 1
    return counts


@pytest.mark.parametrize("name", sorted(EXPECTED_KINDS))
def test_event_counts_per_kind(corpus_runs: dict[str, Run], name: str) -> None:
    info = run_info(corpus_runs[name])
    assert info["events_per_kind"] == EXPECTED_KINDS[name]
    assert info["events"] == sum(_raw_counts(corpus(name)).values())


@pytest.mark.parametrize("name", sorted(EXPECTED_FLOWS))
def test_flow_counts(corpus_runs: dict[str, Run], name: str) -> None:
    assert corpus_runs[name].table("flows").num_rows == EXPECTED_FLOWS[name]


def test_nccl_steps_and_step_assignment(corpus_runs: dict[str, Run]) -> None:
    run = corpus_runs["nccl"]
    steps = run.table("steps").to_pylist()
    assert [s["step"] for s in steps] == [4, 5, 6]
    events = run.table("events")
    per_step = {}
    for kind in ("cpu_op", "kernel", "collective", "memcpy"):
        rows = events.filter(pc.equal(events.column("kind").cast("string"), kind))
        per_step[kind] = sorted(pc.value_counts(rows.column("step")).to_pylist(),
                                key=lambda r: r["values"])
    assert per_step["cpu_op"] == [{"values": s, "counts": 4782} for s in (4, 5, 6)]
    assert per_step["kernel"] == [{"values": s, "counts": 893} for s in (4, 5, 6)]
    assert per_step["collective"] == [{"values": s, "counts": 7} for s in (4, 5, 6)]
    assert per_step["memcpy"] == [{"values": s, "counts": 320} for s in (4, 5, 6)]


def test_step_durations_are_the_markers(corpus_runs: dict[str, Run]) -> None:
    steps = corpus_runs["nccl"].table("steps").to_pylist()
    raw = json.loads(__import__("gzip").decompress(corpus("nccl").read_bytes()))
    marks = sorted((e for e in raw["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")),
                   key=lambda e: e["ts"])
    assert [s["end"] - s["start"] for s in steps] == [round(e["dur"] * 1000) for e in marks]


def test_steps_are_the_host_markers_only(corpus_runs: dict[str, Run]) -> None:
    """The MI250 trace marks step 1 on the host and again on the GPU's timeline (Kineto's
    `gpu_user_annotation` copy, from the step's first kernel to its last): only the host's
    spans are steps."""
    raw = json.loads(__import__("gzip").decompress(corpus("amd").read_bytes()))
    marks = sorted((e for e in raw["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")),
                   key=lambda e: e["ts"])
    assert sorted(e["cat"] for e in marks) == ["gpu_user_annotation", *["user_annotation"] * 2]
    host = [e for e in marks if e["cat"] == "user_annotation"]
    steps = corpus_runs["amd"].table("steps").to_pylist()
    assert [(s["step"], s["end"] - s["start"]) for s in steps] == [
        (int(e["name"].split("#")[1]), round(e["dur"] * 1000)) for e in host]


def test_a_step_ends_with_the_profilers_window(corpus_runs: dict[str, Run]) -> None:
    """HTA's triton example stops its profiler inside its only ProfilerStep, whose marker Kineto
    closes 13.3 s later: the step ends where the trace window (`PyTorch Profiler`) does, as
    the analyses clip the events (1.67 ms), and the events table keeps the recorded span."""
    raw = json.loads(gzip.decompress(corpus("triton").read_bytes()))["traceEvents"]
    (mark,) = (e for e in raw if e.get("name", "").startswith("ProfilerStep#"))
    (window,) = (e for e in raw if e.get("cat") == "Trace")
    assert mark["ts"] + mark["dur"] > window["ts"] + window["dur"]
    run = corpus_runs["triton"]
    (step,) = run.table("steps").to_pylist()
    assert step["end"] - step["start"] == round((window["ts"] + window["dur"] - mark["ts"]) * 1000)
    assert step["end"] - step["start"] == 1_673_183
    events = run.table("events").to_pylist()
    assert max(e["dur"] for e in events) == round(mark["dur"] * 1000)


def test_clock_uses_base_time_exactly(corpus_runs: dict[str, Run]) -> None:
    # First event in the file: ts 4458676522690.655 us after base 1711964646000000000 ns.
    events = corpus_runs["nccl"].table("events")
    row = events.filter(pc.equal(events.column("name").cast("string"),
                                 "autograd::engine::evaluate_function: DivBackward1"))
    assert 1_711_964_646_000_000_000 + 4_458_676_522_690_655 in row.column("ts").to_pylist()
    assert corpus_runs["nccl"].manifest()["clock_offsets"] == {
        "kineto:nccl_data.json.gz": 1_711_964_646_000_000_000}


def test_old_format_keeps_epoch_microseconds(corpus_runs: dict[str, Run]) -> None:
    events = corpus_runs["old_format"].table("events")
    launches = events.filter(pc.equal(events.column("kind").cast("string"), "runtime"))
    assert 1_665_536_373_729_065_000 in launches.column("ts").to_pylist()
    assert corpus_runs["old_format"].manifest()["ranks"] == [1]


def test_device_columns(corpus_runs: dict[str, Run]) -> None:
    events = corpus_runs["nccl"].table("events")
    kernels = events.filter(pc.equal(events.column("kind").cast("string"), "kernel"))
    assert set(kernels.column("stream").to_pylist()) == {7}
    comms = events.filter(pc.equal(events.column("kind").cast("string"), "collective"))
    assert set(comms.column("stream").to_pylist()) == {40}
    assert set(kernels.column("device").to_pylist()) == {0}
    host = events.filter(pc.equal(events.column("kind").cast("string"), "cpu_op"))
    assert set(host.column("device").to_pylist()) == {-1}
    # AMD: device events carry pid 2 and args.device 2
    amd = corpus_runs["amd"].table("events")
    amd_k = amd.filter(pc.equal(amd.column("kind").cast("string"), "kernel"))
    assert set(amd_k.column("device").to_pylist()) == {2}


def test_every_kernel_finds_its_launch(corpus_runs: dict[str, Run]) -> None:
    events = corpus_runs["simple_add"].table("events").to_pylist()
    launches = {e["correlation"] for e in events if e["kind"] in ("runtime", "driver")}
    kernels = [e for e in events if e["kind"] in ("kernel", "memcpy", "memset")]
    assert len(kernels) == 98
    assert all(k["correlation"] in launches for k in kernels)


def test_execution_trace_joins_by_rf_id(corpus_runs: dict[str, Run]) -> None:
    run = corpus_runs["et_trace"]
    nodes = run.table("graph_nodes")
    assert nodes.num_rows == 38
    edges = run.table("graph_edges").to_pylist()
    assert sum(e["kind"] == "parent" for e in edges) == 37
    data = [e for e in edges if e["kind"] == "data"]
    assert data and all(e["tensor"] for e in data)
    events = run.table("events").to_pylist()
    by_ext = {(e["external_id"], e["name"]) for e in events if e["kind"] == "cpu_op"}
    matched = [n for n in nodes.to_pylist() if (n["rf_id"], n["name"]) in by_ext]
    assert len(matched) == 28  # every cpu_op of the trace
    warnings = {w["what"] for w in run.manifest()["warnings"]}
    assert "no Record function id in the trace: ET joined by External id" in warnings


def test_every_ranks_execution_trace_is_kept(tmp_path: Path) -> None:
    """Two ranks, an execution trace each: both graphs are in the Run (each was written over
    the one before), 38 nodes a rank, each rank's source in the manifest."""
    ranks = [tmp_path / f"rank{r}.json.gz" for r in (0, 1)]
    for path in ranks:
        path.write_bytes(corpus("et_trace").read_bytes())
    run = import_traces(ranks, tmp_path / "two.run",
                        ImportOptions(ranks=(0, 1), execution_traces=(CORPUS / ET,) * 2), ["t"])
    nodes = run.table("graph_nodes").to_pydict()
    assert [nodes["rank"].count(r) for r in (0, 1)] == [38, 38]
    assert [(s["rank"], s["nodes"]) for s in run.manifest()["sources"]
            if s["format"] == "execution_trace"] == [(0, 38), (1, 38)]


def test_ranks_from_distributed_info_and_flag(tmp_path: Path) -> None:
    files = [corpus("compare_base"), corpus("compare_test")]
    run = import_traces(files, tmp_path / "two.run", ImportOptions(ranks=(3, 5)), ["t"])
    assert run.manifest()["ranks"] == [3, 5]
    assert set(run.table("events").column("rank").to_pylist()) == {3, 5}
    ranks = run.table("events").column("rank").to_pylist()
    assert ranks == sorted(ranks)


@pytest.mark.parametrize("streaming", ["never", "always"])
def test_rank_from_the_file_name(tmp_path: Path, streaming: str) -> None:
    """A trace without distributedInfo takes the rank its file name says (the recorder's
    torch-rank{R}-pid{P}: a DataLoader worker's trace beside its rank's; it had taken its
    place in the list, a rank of its own); without one either, the lowest rank no file names
    (its place, 3 here, could be a named one's)."""
    event = {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 1.0,
             "dur": 2.0, "args": {}}
    names = ["torch-rank1-pid10.pt.trace.json", "torch-rank1-pid11.pt.trace.json",
             "rank-7.host.pt.trace.json", "plain.json"]
    for pid, name in enumerate(names, 10):  # each its own process, as the names say
        (tmp_path / name).write_text(json.dumps({"traceEvents": [{**event, "pid": pid}]}))
    run = import_traces([tmp_path / n for n in names], tmp_path / "r.run",
                        ImportOptions(streaming=streaming), ["t"])
    assert [s["rank"] for s in run.manifest()["sources"]] == [1, 1, 7, 0]


@pytest.mark.parametrize(("name", "rank"), [
    ("torch-rank1-pid42.pt.trace.json", 1),  # the recorder's
    ("trace_rank2.json", 2), ("rank_5.json", 5), ("rank-7.host.pt.trace.json", 7),
    ("inference_rank_1.json.gz", 1), ("rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz", 34),
    ("rank_non_gpu.json.gz", None),  # HTA's corpus names
    # tensorboard_trace_handler's {worker_name}.{time}.pt.trace.json: a worker named for its
    # rank is that rank; the default worker, {hostname}_{pid}, names none, whatever its host
    ("rank3.1733400000000.pt.trace.json", 3), ("rank_3.1733400000000.pt.trace.json.gz", 3),
    ("trace_rank_3.1790857026000000000.pt.trace.json", 3),
    ("myhost-rank3_12345.1733400000000.pt.trace.json", None),
    ("gpu-rank3-node_4242.1733400000.pt.trace.json", None),
    ("gpu-rank3.cluster.local_4242.1790857026000000000.pt.trace.json.gz", None),
    ("rank3_4242.1733400000000.pt.trace.json", None),
    # the host is everything before the last _{pid}, '_' in it too (it had escaped the rule:
    # my_host-rank2 read rank 2)
    ("my_host-rank2_1234.1700000000000000000.pt.trace.json", None),
    ("gpu_node-rank_3-a_77.1733400000000.pt.trace.json.gz", None),
    ("my_host_1234.1700000000000000000.pt.trace.json", None),
])
def test_rank_in_a_file_name(name: str, rank: int | None) -> None:
    assert rank_in_name(name) == rank


@pytest.mark.parametrize("streaming", ["never", "always"])
def test_no_rank_from_a_host_name(tmp_path: Path, streaming: str) -> None:
    """tensorboard_trace_handler's default names, {hostname}_{pid}.{time_ns}.pt.trace.json, of
    a host named gpu-rank3-node: two processes of one real run (tests/data/loader_workers.py's
    main process and DataLoader worker, pids 3550 and 3617) are rank 0, the worker its
    process's (both had been rank 3, the host's "rank3" read as theirs)."""
    for src, pid in (("main", 3550), ("worker", 3617)):
        shutil.copy(DATA / f"loader_workers_{src}.pt.trace.json.gz",
                    tmp_path / f"gpu-rank3-node_{pid}.1790857026{pid}00000.pt.trace.json.gz")
    run = import_traces([tmp_path], tmp_path / "r.run", ImportOptions(streaming=streaming), ["t"])
    assert [(s["file"][:19], s["rank"]) for s in run.manifest()["sources"]] == [
        ("gpu-rank3-node_3550", 0), ("gpu-rank3-node_3617", 0)]
    assert run.manifest()["ranks"] == [0]


@pytest.mark.parametrize("streaming", ["never", "always"])
def test_a_process_naming_no_rank_beside_one_that_does(tmp_path: Path, streaming: str) -> None:
    """tests/data/loader_workers.py's main process in a file named rank-1, another program's
    process (loader_cpu.py's, no worker) in one naming none, given second: that process is
    rank 0, the lowest no file names (by its position it had been rank 1 too, two processes
    merged into one rank)."""
    files = [tmp_path / "rank-1.pt.trace.json.gz", tmp_path / "other.pt.trace.json.gz"]
    shutil.copy(DATA / "loader_workers_main.pt.trace.json.gz", files[0])
    shutil.copy(DATA / "loader_cpu_w0_main.pt.trace.json.gz", files[1])
    run = import_traces(files, tmp_path / "r.run", ImportOptions(streaming=streaming), ["t"])
    assert [(s["file"], s["rank"]) for s in run.manifest()["sources"]] == [
        ("rank-1.pt.trace.json.gz", 1), ("other.pt.trace.json.gz", 0)]
    assert run.manifest()["ranks"] == [0, 1]


@pytest.mark.parametrize("main", ["rank-1.pt.trace.json.gz", "main.pt.trace.json.gz"])
def test_a_dataloader_workers_file_is_its_process_rank(tmp_path: Path, main: str) -> None:
    """The recorder's files of tests/data/loader_cpu.py with 2 DataLoader workers, renamed:
    each worker's file (every thread torch's `pt_data_worker`, no rank named) is of the one
    rank the main process's file makes, named or not (each had been a rank of its own, which
    ran no step); and a rank with its workers' files is no rank "several files claim" (given
    the rank for each, as the recorder's names give it, it had warned)."""
    files = [tmp_path / main, tmp_path / "w1.pt.trace.json.gz", tmp_path / "w2.pt.trace.json.gz"]
    for src, dst in zip(("main", "worker1", "worker2"), files, strict=True):
        shutil.copy(DATA / f"loader_cpu_w2_{src}.pt.trace.json.gz", dst)
    rank = 1 if main.startswith("rank-1") else 0
    run = import_traces(files, tmp_path / "r.run", ImportOptions(), ["t"])
    m = run.manifest()
    assert [(s["rank"], s.get("data_worker", False)) for s in m["sources"]] == [
        (rank, False), (rank, True), (rank, True)]
    assert m["ranks"] == [rank] and m["warnings"] == []
    raw = [orjson.loads(gzip.decompress(f.read_bytes()))["traceEvents"] for f in files]
    assert run.table("events").num_rows == sum(
        e.get("ph") in ("X", "i", "I") for events in raw for e in events)
    given = import_traces(files, tmp_path / "g.run", ImportOptions(ranks=(rank,) * 3), ["t"])
    assert given.manifest()["warnings"] == []


def test_distributed_info_over_the_file_name(tmp_path: Path) -> None:
    """A trace's distributedInfo.rank wins over its file name's: ddp_gloo's rank 1, named
    trace_rank5, is rank 1."""
    path = tmp_path / "trace_rank5.pt.trace.json.gz"
    shutil.copy(DATA / "ddp_gloo_rank1.pt.trace.json.gz", path)
    run = import_traces([path], tmp_path / "r.run", ImportOptions(), ["t"])
    assert run.manifest()["ranks"] == [1]


def test_streaming_path_equals_in_memory(tmp_path: Path) -> None:
    """The out-of-core path (event splitter + DuckDB) against the in-memory reference."""
    src = [corpus("nccl")]
    a = import_traces(src, tmp_path / "mem.run", ImportOptions(streaming="never"), ["t"])
    b = import_traces(src, tmp_path / "stream.run", ImportOptions(streaming="always"), ["t"])
    for name in ("steps", "flows", "counters"):
        assert a.table(name).equals(b.table(name)), name
    ea, eb = a.table("events"), b.table("events")
    for col in ea.column_names:
        if col == "args":
            assert [json.loads(x) for x in ea.column(col).to_pylist()] == [
                json.loads(x) for x in eb.column(col).to_pylist()]
        else:
            assert ea.column(col).to_pylist() == eb.column(col).to_pylist(), col


def test_import_is_deterministic(tmp_path: Path) -> None:
    src = [corpus("simple_add")]
    a = import_traces(src, tmp_path / "a.run", ImportOptions(), ["t"])
    b = import_traces(src, tmp_path / "b.run", ImportOptions(), ["t"])
    for name in a.table_names():
        assert a.table_path(name).read_bytes() == b.table_path(name).read_bytes(), name


def test_raw_files_are_kept(corpus_runs: dict[str, Run]) -> None:
    run = corpus_runs["et_trace"]
    raw = sorted(p.name for p in run.raw_dir.iterdir())
    assert raw == sorted([corpus("et_trace").name, (CORPUS / ET).name])
    assert (run.raw_dir / corpus("et_trace").name).read_bytes() == corpus("et_trace").read_bytes()


def test_import_a_directory_of_traces(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A TensorBoard log dir: each rank's *.pt.trace.json (ranks from distributedInfo, not the
    name order) is imported; other files beside them are not; a dir without any is refused."""
    from perfswarm.cli.main import main

    log = tmp_path / "log" / "mlp"
    log.mkdir(parents=True)
    for rank, name in ((1, "a_host_1.1.pt.trace.json"), (0, "b_host_2.2.pt.trace.json")):
        event = {"ph": "X", "cat": "cpu_op", "name": f"aten::mm{rank}", "pid": 1, "tid": 1,
                 "ts": 10 + rank, "dur": 5, "args": {}}
        (log / name).write_text(json.dumps({"traceEvents": [event],
                                            "distributedInfo": {"rank": rank}}))
    (log / "events.out.tfevents.1").write_text("not a trace")
    (log / "meta.json").write_text("{}")  # a trace file name wins over any other .json
    assert main(["import", str(log), "-o", str(tmp_path / "mlp.run"), "-q"]) == 0
    run = Run(tmp_path / "mlp.run")
    assert run.manifest()["ranks"] == [0, 1]
    ev = run.table("events").to_pydict()
    assert sorted(zip(ev["rank"], ev["name"], strict=True)) == [(0, "aten::mm0"),
                                                                 (1, "aten::mm1")]
    (tmp_path / "empty").mkdir()
    assert main(["import", str(tmp_path / "empty"), "-o", str(tmp_path / "e.run")]) == 2
    assert "a directory with no trace files" in capsys.readouterr().err
    assert not (tmp_path / "e.run").exists()


def test_info_spans_what_a_run_without_events_saw(tmp_path: Path) -> None:
    """A program without torch has no events: its span is that of its counters and steps (and
    samples), from the tables themselves (it had been 0 ms)."""
    import shutil

    from perfswarm.trace.schema import empty

    run = import_traces([corpus("nccl")], tmp_path / "n.run", ImportOptions(), ["t"])
    bare = Run(shutil.copytree(run.path, tmp_path / "bare.run"))
    bare.write_table("events", empty("events"))
    times = [t for name, c in (("counters", "ts"), ("steps", "start"), ("steps", "end"))
             for t in run.table(name, [c]).column(c).to_pylist()]
    info = run_info(bare)
    assert (info["events"], info["start_ns"], info["end_ns"]) == (0, min(times), max(times))
    assert info["span_ns"] == max(times) - min(times) > 0


@pytest.mark.parametrize("streaming", ["never", "always"])
def test_two_recordings_of_a_rank_are_refused(tmp_path: Path, streaming: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """HTA's trace_compare holds two recordings of rank 1 (test.json.gz an edited copy of
    base.json.gz: process 2568503 over the same time); critical_path three of rank 0 (other
    processes, months apart). Merged, every op of the first counted twice. A rank's windows
    one after another in one process, and a worker process beside it, are one recording."""
    from perfswarm.cli.main import main

    for folder in ("trace_compare", "critical_path"):
        code = main(["import", str(CORPUS / folder), "-o", str(tmp_path / f"{folder}.run"),
                     "--streaming", streaming])
        assert code == 2 and not (tmp_path / f"{folder}.run").exists()
    err = capsys.readouterr().err.splitlines()
    assert err[0].endswith("base.json.gz and " + str(CORPUS / "trace_compare/test/test.json.gz")
                           + ": two recordings of rank 1 (process 2568503 over the same time); a"
                           " Run holds one: import each alone (`perfswarm diff A.run B.run` "
                           "compares them)")
    assert "two recordings of rank 0 (other processes, 63.1 days apart)" in err[1]

    def trace(name: str, pid: int, ts: float) -> Path:
        event = {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": pid, "tid": 1,
                 "ts": ts, "dur": 2.0, "args": {}}
        path = tmp_path / name
        path.write_text(json.dumps({"traceEvents": [event], "distributedInfo": {"rank": 0}}))
        return path

    # a profiler schedule's two cycles in process 5, its DataLoader worker 6 beside the first
    ok = [trace("a.json", 5, 1.0), trace("b.json", 5, 100.0), trace("w.json", 6, 2.0)]
    run = import_traces(ok, tmp_path / "ok.run", ImportOptions(streaming=streaming), ["t"])
    assert [s["rank"] for s in run.manifest()["sources"]] == [0, 0, 0]
    assert [s["host_pids"] for s in run.manifest()["sources"]] == [[5], [5], [6]]
    with pytest.raises(PerfswarmError, match=r"a.json and .*c.json: two recordings of rank 0 "
                                             r"\(process 5 over the same time\)"):
        import_traces([ok[0], trace("c.json", 5, 2.0)], tmp_path / "c.run",
                      ImportOptions(streaming=streaming), ["t"])
    with pytest.raises(PerfswarmError, match=r"\(other processes, 1.0 s apart\)"):
        import_traces([ok[0], trace("d.json", 7, 1_000_003.0)], tmp_path / "d.run",
                      ImportOptions(streaming=streaming), ["t"])


@pytest.mark.parametrize("streaming", ["never", "always"])
def test_two_profilers_of_a_process_keep_their_steps_apart(tmp_path: Path, streaming: str
                                                          ) -> None:
    """Each profiler counts ProfilerStep#N from 0: a training window then an evaluation one of
    one process, into one log dir, both hold steps 2-4. The later file's steps continue after
    the earlier's (each step had merged a training step and an evaluation step 30 ms on: 6
    steps read as 3, predict 75% off)."""
    train = [window(tmp_path / f"vm_7.{100 + n}.pt.trace.json", 7, 10.0 * n, n)
             for n in (2, 3, 4)]
    evaluation = [window(tmp_path / f"vm_7.{200 + n}.pt.trace.json", 7, 1000.0 + 10 * n, n)
                  for n in (2, 3, 4)]
    run = import_traces([*evaluation, *train], tmp_path / "r.run",
                        ImportOptions(streaming=streaming), ["t"])
    steps = run.table("steps", ["step", "start"]).to_pylist()
    assert sorted((s["start"], s["step"]) for s in steps) == [
        (ts * 1000 - 1000, n) for ts, n in ((20.0, 2), (30.0, 3), (40.0, 4), (1020.0, 5),
                                             (1030.0, 6), (1040.0, 7))]
    events = run.table("events", ["step", "ts"]).to_pylist()
    assert sorted((e["ts"], e["step"]) for e in events if e["ts"] % 10_000 == 0) == [
        (ts * 1000, n) for ts, n in ((20.0, 2), (30.0, 3), (40.0, 4), (1020.0, 5), (1030.0, 6),
                                     (1040.0, 7))]


@pytest.mark.parametrize("streaming", ["never", "always"])
def test_an_empty_last_marker_is_no_step(tmp_path: Path, streaming: str) -> None:
    """tests/data/short_loop.py: a loop that ends inside the profiler's active steps; its last
    `prof.step()` opens a ProfilerStep that holds no event (9 us; it had counted as a step,
    the step time 5% low). The marker steps are those holding events in the raw JSON; the
    empty one is the tail, as is one holding a tenth of a step's events or less."""
    trace = DATA / "short_loop_cpu.pt.trace.json.gz"
    raw = [e for e in json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
           if e.get("ph") == "X"]
    markers = {int(e["name"].split("#")[1]): (e["ts"], e["ts"] + e["dur"]) for e in raw
               if e["name"].startswith("ProfilerStep#")}
    held = {n for n, (lo, hi) in markers.items() for e in raw
            if not e["name"].startswith("ProfilerStep#") and lo <= e["ts"] < hi}
    assert held == set(markers) - {max(markers)}
    run = import_traces([trace], tmp_path / "r.run", ImportOptions(streaming=streaming), ["t"])
    steps = run.table("steps", ["step", "source"]).to_pylist()
    assert sorted((s["step"], s["source"]) for s in steps) == sorted(
        [(n, "marker") for n in held] + [(max(markers), "tail")])
    # what the program ran after its loop, in that marker (a loss.item(): 2 ops beside every
    # step's many), leaves it the tail; as many ops as a step's, a step
    lo, _ = markers[max(markers)]
    item = {"ph": "X", "cat": "cpu_op", "name": "aten::item", "pid": raw[0]["pid"],
            "tid": raw[0]["tid"], "ts": lo + 1, "dur": 1, "args": {}}
    full = json.loads(gzip.decompress(trace.read_bytes()))
    for name, extra in (("item.json", [item]), ("busy.json", [item] * 400)):
        (tmp_path / name).write_text(json.dumps(dict(full, traceEvents=[*full["traceEvents"],
                                                                        *extra])))
        found = import_traces([tmp_path / name], tmp_path / f"{name}.run",
                              ImportOptions(streaming=streaming), ["t"])
        last = max(found.table("steps", ["step", "source"]).to_pylist(), key=lambda s: s["step"])
        assert last["source"] == ("tail" if name == "item.json" else "marker")


def test_a_directory_with_an_execution_trace(tmp_path: Path) -> None:
    """The corpus's execution_trace folder holds a Kineto trace and the ExecutionTraceObserver
    file beside it, as torch's docs lay them out: the directory imports, its execution trace
    read as --et would (it had been read as a Kineto trace and refused); the same graph as
    --et gives."""
    folder = CORPUS / "execution_trace"
    run = import_traces([folder], tmp_path / "d.run", ImportOptions(), ["t"])
    given = import_traces([corpus("et_trace")], tmp_path / "e.run",
                          ImportOptions(execution_traces=(CORPUS / ET,)), ["t"])
    assert [s["file"] for s in run.manifest()["sources"]] == [
        s["file"] for s in given.manifest()["sources"]]
    assert run.table("graph_nodes").num_rows == given.table("graph_nodes").num_rows > 0
    # a directory holding only an execution trace: one line naming it, nothing written
    alone = tmp_path / "et_only"
    alone.mkdir()
    (alone / ET.split("/")[-1]).write_bytes((CORPUS / ET).read_bytes())
    with pytest.raises(PerfswarmError, match=r"et_only: a directory of execution traces only"):
        import_traces([alone], tmp_path / "x.run", ImportOptions(), ["t"])
    assert not (tmp_path / "x.run").exists()


def test_an_execution_trace_joins_the_rank_of_its_process(tmp_path: Path) -> None:
    """An execution trace's header names its process (`pid`): it joins the rank whose trace
    files hold that process, not the first rank (a directory's ETs in name order had landed on
    each other's ranks). The corpus's ET is process 563677's, its Kineto trace here rank 1."""
    head = gzip.decompress((CORPUS / ET).read_bytes())[:200].decode()
    pid = int(head.split('"pid":')[1].split(",")[0])
    other = window(tmp_path / "other.json", 7, 1.0, 1)
    run = import_traces([other, corpus("et_trace")], tmp_path / "r.run",
                        ImportOptions(ranks=(0, 1), execution_traces=(CORPUS / ET,)), ["t"])
    (source,) = [s for s in run.manifest()["sources"] if s["file"] == (CORPUS / ET).name]
    assert pid in next(s["host_pids"] for s in run.manifest()["sources"] if s["rank"] == 1)
    assert source["rank"] == 1
    assert set(run.table("graph_nodes", ["rank"]).column("rank").to_pylist()) == {1}


def test_a_directory_says_which_trace_files_it_left_out(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """HTA's corpus holds one *.pt.trace.json.gz among 14 *.json[.gz]: the log-dir rule takes
    that one; the 13 others (counted here from the folder) are named as left out."""
    from perfswarm.cli.main import main

    others = sorted(f for f in CORPUS.rglob("*") if f.is_file() and f.name.endswith(
        (".json", ".json.gz", ".sqlite")) and ".pt.trace.json" not in f.name)
    assert main(["import", str(CORPUS), "-o", str(tmp_path / "r.run")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "from 1 file(s)" in out
    assert (f"left out {len(others)} other trace file(s) under the directories given, "
            f"{others[0]} the first") in out


def window(path: Path, pid: int, ts: float, step: int | None = None) -> Path:
    """A one-op trace of process `pid` at `ts` us, with no distributedInfo, under a
    ProfilerStep marker `step` if given."""
    op = {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": pid, "tid": 1, "ts": ts,
          "dur": 2.0, "args": {}}
    marker = {**op, "cat": "user_annotation", "name": f"ProfilerStep#{step}", "ts": ts - 1,
              "dur": 4.0}
    path.write_text(json.dumps({"traceEvents": [op] if step is None else [marker, op]}))
    return path


@pytest.mark.parametrize("streaming", ["never", "always"])
@pytest.mark.parametrize("names", [
    ("vm_42.1796000001.pt.trace.json", "vm_42.1796000002.pt.trace.json",
     "vm_43.1796000001.pt.trace.json"),
    ("trace_10.json", "trace_5.json", "other.json")])
def test_a_processs_windows_are_one_rank(tmp_path: Path, streaming: str,
                                         names: tuple[str, str, str]) -> None:
    """Files with no distributedInfo whose host process is one are one rank: the cycles of a
    profiler schedule with `repeat` (tensorboard_trace_handler's {worker}.{time} files), or a
    process exporting each window itself, as torch's docs show in `on_trace_ready`
    (`trace_" + str(p.step_num) + ".json"`: its two windows had been two ranks, the later
    one rank 0, and advise called the one holding the warm-up step a straggler). Another
    process's file keeps a rank of its own; ranks are numbered 0, 1, ... and every table's
    rows carry the manifest's (streaming had kept each file's position)."""
    paths = [window(tmp_path / names[0], 42, 100.0, 10), window(tmp_path / names[1], 42, 1.0, 5),
             window(tmp_path / names[2], 43, 5.0, 1)]
    run = import_traces(paths, tmp_path / "s.run", ImportOptions(streaming=streaming), ["t"])
    assert [s["rank"] for s in run.manifest()["sources"]] == [0, 0, 1]
    assert run.manifest()["ranks"] == [0, 1]
    steps = run.table("steps", ["rank", "step"]).to_pylist()
    assert sorted((s["rank"], s["step"]) for s in steps) == [(0, 5), (0, 10), (1, 1)]
    events = run.table("events", ["rank", "pid"]).to_pylist()
    assert sorted((e["rank"], e["pid"]) for e in events) == [(0, 42)] * 4 + [(1, 43)] * 2
    assert run.manifest()["warnings"] == []  # one process's windows claim nothing
    # info lists them in time order, whatever the files' names
    assert [(s["rank"], s["step"]) for s in run_info(run)["steps"]] == [(0, 5), (0, 10), (1, 1)]
    # a process whose window ran 20 ms after the others': a rank of the same job (processes
    # that run together may profile windows apart)
    near = window(tmp_path / ("y" + names[0]), 45, 20_000.0, 1)
    together = import_traces([*paths, near], tmp_path / "n.run",
                             ImportOptions(streaming=streaming), ["t"])
    assert together.manifest()["ranks"] == [0, 1, 2]
    # the same program run again into the log dir, 9.5 minutes on: another run, not a rank
    again = window(tmp_path / ("z" + names[0]), 44, 570e6, 2)
    with pytest.raises(PerfswarmError, match=rf"{names[0]} and .*z{names[0]}: two recordings "
                                             r"with no rank named \(other processes, 9.5 "
                                             r"minutes apart\)"):
        import_traces([*paths, again], tmp_path / "t.run", ImportOptions(streaming=streaming),
                      ["t"])




def test_row_groups_hold_one_part_at_a_time() -> None:
    """While the next part is made, the row groups of the last one, written, hold none of its
    memory (an empty slice of it had kept its buffers: two parts in memory during an import,
    11 MB of a 200k-event import's peak); the rows come out as they went in."""
    held: list[int] = []

    def parts() -> Iterator[pa.Table]:
        for i in range(4):
            held.append(pa.total_allocated_bytes())
            # Arrow's own buffers (numpy's would be invisible to its allocation count)
            yield pa.table({"rank": pa.array([0] * ROW_GROUP, pa.int32()),
                            "step": pa.array(range(i * ROW_GROUP, (i + 1) * ROW_GROUP),
                                             pa.int32()),
                            "source": pa.array(["hook"] * ROW_GROUP).dictionary_encode(),
                            "start": pa.array(range(ROW_GROUP), pa.int64()),
                            "end": pa.array(range(1, ROW_GROUP + 1), pa.int64())})

    before = pa.total_allocated_bytes()
    steps = []
    for group in row_groups(parts(), STEPS):
        steps += group.column("step").to_pylist()
        del group  # as write_batches does, once written
    assert steps == list(range(4 * ROW_GROUP))
    part = ROW_GROUP * (4 + 4 + 8 + 8)  # a part's four number columns
    assert max(held) - before < part / 2, [h - before for h in held]


def test_gzip_text_grows_in_place() -> None:
    """A gzip trace's text is inflated into one buffer that grows a chunk at a time: the
    chunks had been listed and then joined, the text twice at once (2x the JSON: 93 MiB of a
    200k-event import's 211 MiB peak). Python's allocations (tracemalloc) while the corpus's
    NCCL trace (9.8 MB of JSON) is read peak at the text, its growth's slack (an eighth) and
    a chunk (1 MiB)."""
    path = corpus("nccl")
    with gzip.open(path, "rb") as f:
        expected = f.read()
    tracemalloc.start()
    try:
        text = read_bytes(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert text == expected
    assert len(expected) > 9_000_000
    assert peak < 1.5 * len(expected), peak / len(expected)  # 1.27x; joined, 2.00x


def _mapped_kib(name: str) -> tuple[int, int]:
    """The size of this process's mappings of files named `name` and their resident pages
    (kB, /proc/self/smaps)."""
    size = resident = 0
    mine = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if "-" in head[0] and len(head) >= 5:  # a mapping's header: addresses ... [path]
            mine = len(head) > 5 and Path(head[5]).name == name
        elif mine and head[0] in ("Size:", "Rss:"):
            size += int(head[1]) if head[0] == "Size:" else 0
            resident += int(head[1]) if head[0] == "Rss:" else 0
    return size, resident


def test_spilled_events_read_in_place_a_slice_at_a_time(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The in-memory path reads its events back from the spill file in place (mapped), and the
    pages a sorted slice read are dropped before the next is taken: the table had been read
    whole into memory and held there while it was sorted and written (46 MiB of a 200k-event
    import's 178 MiB write stage). On the corpus's NCCL trace, in slices of 1,024 rows:
    Arrow's pool grows by under a quarter of the events table as the trace is read (the whole
    table's columns, read back, had been in it), and the spill file's pages resident in this
    process stay under half the file after every slice, their median under a third (kept
    mapped, they had grown to the whole file)."""
    monkeypatch.setattr(build, "SLICE", 1_024)
    pool = pa.total_allocated_bytes()
    _, tables = read_trace(corpus("nccl"), 0, ReadOptions(), spill_dir=tmp_path)
    grown = pa.total_allocated_bytes() - pool
    spill = f".{corpus('nccl').name}.events.arrow"
    events = tables.events
    assert events.num_rows > 8 * build.SLICE
    assert grown < events.nbytes / 4, grown / events.nbytes  # 0.11 (flows: 0.08); read, 1.05
    resident = []
    slices = []
    for part in build.sorted_slices(events, tables.steps, tables.mapped):
        resident.append(_mapped_kib(spill)[1])
        slices.append(part)
    # a 1,024-row slice maps 15-41% of the 5.5 MiB file (the kernel maps 64 KiB around each
    # page read, and a slice's rows lie in every chunk); kept mapped, 52-100%, median 84%
    file_kib = _mapped_kib(spill)[0]
    assert max(resident) < file_kib / 2, (resident, file_kib)
    assert statistics.median(resident) < file_kib / 3, (resident, file_kib)
    copied = pa.Table.from_batches(events.to_batches()).combine_chunks()  # in memory
    assert pa.concat_tables(slices).equals(
        pa.concat_tables(build.sorted_slices(copied, tables.steps)))



class _NoDateutil(importlib.abc.MetaPathFinder):
    """dateutil not installed (this VM), each import of it counted."""

    def __init__(self) -> None:
        self.looked = 0

    def find_spec(self, name: str, path: Sequence[str] | None,
                  target: object = None) -> ModuleSpec | None:
        if name == "dateutil":
            self.looked += 1
            raise ModuleNotFoundError(name)
        return None


def test_a_chunk_gives_arrow_its_types(monkeypatch: pytest.MonkeyPatch) -> None:
    """Python values become Arrow arrays and scalars of the type they are given: pyarrow's
    inference of one imports dateutil each time, where it is not installed a search of
    sys.path (0.15 ms; 5 a chunk, 200 at 200k events: 33 ms of the import had gone to them).
    On the corpus's NCCL trace, read in chunks of 500 events: not one."""
    monkeypatch.setattr(kineto, "CHUNK", 500)
    for name in ("dateutil", "dateutil.relativedelta"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    spy = _NoDateutil()
    monkeypatch.setattr(sys, "meta_path", [spy, *sys.meta_path])
    _, tables = read_trace(corpus("nccl"), 0, ReadOptions())
    assert tables.events.num_rows > 10 * kineto.CHUNK
    assert tables.flows.num_rows and tables.steps.num_rows
    assert spy.looked == 0


READ_THREADS = """import os, sys
from pathlib import Path
import pyarrow as pa
from perfswarm.trace.store import Run
pa.set_io_thread_count(1)
run = Run.open(Path(sys.argv[1]))
before = len(os.listdir("/proc/self/task"))
run.table("events", ["ts", "name"], rank=0)  # (its row groups, before the Run holds any)
run.table("events")
print(len(os.listdir("/proc/self/task")) - before)
"""


def test_table_reads_decode_in_the_calling_thread(corpus_runs: dict[str, Run]) -> None:
    # Arrow's pool threads allocate from glibc arenas of their own, whose freed pages the
    # main thread's arrays do not reuse: a Run's reads start none of them (its I/O pool's
    # thread aside, one here; decoding in its CPU pool had started one or two more)
    out = subprocess.run([sys.executable, "-c", READ_THREADS, str(corpus_runs["nccl"].path)],
                         capture_output=True, text=True, check=True)
    assert int(out.stdout) <= 1


def test_no_numpy_array_of_text_per_event(monkeypatch: pytest.MonkeyPatch,
                                          tmp_path: Path) -> None:
    """A chunk's columns are built without a NumPy array of Python strings (each event's phase
    had been one, to find the instants: 31 of 200k events' 720 ms of building; a mask from a
    list of bools costs 13); an instant still takes no time, whatever `dur` it carries."""
    made: list[str] = []
    array = np.array

    def spy(*args: Any, **kwargs: Any) -> Any:
        out = array(*args, **kwargs)
        made.append(out.dtype.kind)
        return out

    monkeypatch.setattr(np, "array", spy)
    read_trace(corpus("nccl"), 0, ReadOptions())
    monkeypatch.undo()
    assert len(made) > 10 and "U" not in made

    path = tmp_path / "instants.json"
    event = {"cat": "cpu_op", "pid": 1, "tid": 1}
    path.write_text(json.dumps({"traceEvents": [
        {**event, "ph": "X", "name": "op", "ts": 10.0, "dur": 5.0},
        {**event, "ph": "i", "name": "mark", "ts": 11.0, "dur": 7.0, "s": "t"},
        {**event, "ph": "I", "name": "mark", "ts": 12.0, "dur": 3.0, "s": "t"}]}))
    _, tables = read_trace(path, 0, ReadOptions())
    assert tables.events.column("dur").to_pylist() == [5000, 0, 0]


def _statistics_set(path: Path) -> list[dict[str, bool]]:
    """Per row group of a Parquet file, whether each column has statistics."""
    meta = pq.read_metadata(path)
    names = meta.schema.to_arrow_schema().names
    return [{name: meta.row_group(g).column(i).is_stats_set for i, name in enumerate(names)}
            for g in range(meta.num_row_groups)]


def test_text_columns_carry_no_parquet_statistics(corpus_runs: dict[str, Run],
                                                  tmp_path: Path) -> None:
    """The events file keeps min/max statistics where a reader uses them (a rank's row groups
    are found by `rank`'s) and none on the text columns, whose statistics compared every long
    value (22% of the 200k-event table's write); the streaming path's spilled events alike."""
    _, spilled, _, _ = spill_trace(corpus("nccl"), 0, ReadOptions(), tmp_path)
    for path in (corpus_runs["nccl"].table_path("events"), spilled["events"]):
        groups = _statistics_set(path)
        assert groups
        for stats in groups:
            assert stats["rank"] and stats["ts"] and stats["name"]
            assert not stats["args"] and not stats["detail"]
