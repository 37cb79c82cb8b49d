"""Chrome trace export: Kineto's shape, exact times, every source, the export command."""

from __future__ import annotations

import gzip
import json
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from conftest import corpus
from perfswarm.cli.main import main
from perfswarm.errors import ParameterError
from perfswarm.report import perfetto
from perfswarm.trace import synthetic
from perfswarm.trace.ingest import ImportOptions, import_traces
from perfswarm.trace.store import Run
from perfswarm.trace.timebase import ns_to_us_text


def exported(run: Run) -> dict[str, Any]:
    """The Run's Chrome trace, parsed."""
    dumped: dict[str, Any] = orjson.loads(b"".join(perfetto.chrome_trace(run)))
    return dumped


def test_events_keep_kineto_categories_and_exact_times(corpus_runs: dict[str, Run]) -> None:
    run = corpus_runs["simple_add"]
    text = b"".join(perfetto.chrome_trace(run)).decode()
    trace = json.loads(text)
    base = trace["baseTimeNanoseconds"]
    spans = [e for e in trace["traceEvents"] if e["ph"] in ("X", "i")]
    rows = run.table("events").to_pylist()
    assert len(spans) == len(rows) == 840
    cats = Counter(e["cat"] for e in spans)
    kinds = Counter(r["kind"] for r in rows)
    assert cats == {perfetto.KIND_CATEGORY[k]: n for k, n in kinds.items()}
    for row in rows:  # every time written as the exact 3-decimal text of its ns
        ts = f'"ts":{ns_to_us_text(row["ts"] - base)}'
        assert ts + (f',"dur":{ns_to_us_text(row["dur"])}' if row["kind"] != "instant" else "") \
            in text


def test_written_file_has_three_decimal_times_and_every_source(
        corpus_runs: dict[str, Run], tmp_path: Path) -> None:
    run = corpus_runs["nccl"]
    out = perfetto.write(run, tmp_path / "t.json.gz")
    data = json.loads(gzip.decompress(out.read_bytes()))
    phases = Counter(e["ph"] for e in data["traceEvents"])
    assert phases["X"] + phases["i"] == run.table("events").num_rows
    derived = sum(e.get("cat") == perfetto.DERIVED_COUNTERS for e in data["traceEvents"])
    assert phases["C"] - derived == run.table("counters").num_rows
    assert phases["s"] + phases["f"] + phases["t"] == run.table("flows").num_rows
    steps = [e["name"] for e in data["traceEvents"]
             if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")]
    assert steps == ["ProfilerStep#4", "ProfilerStep#5", "ProfilerStep#6"]
    text = gzip.decompress(out.read_bytes()).decode()
    manifest = run.manifest()
    raw = json.loads(gzip.decompress(corpus("nccl").read_bytes()))["traceEvents"]
    labels = {f"0:{e['pid']}": e["args"]["labels"] for e in raw
              if e.get("ph") == "M" and e["name"] == "process_labels"}  # "CPU", "GPU 0", ...
    assert len(labels) == 9
    assert [e for e in data["traceEvents"] if e["ph"] == "M"] == [
        *({"ph": "M", "name": "process_name", "pid": int(k.split(":")[1]), "tid": 0,
           "args": {"name": v}} for k, v in sorted(manifest["processes"].items())),
        *({"ph": "M", "name": "process_labels", "pid": int(k.split(":")[1]), "tid": 0,
           "args": {"labels": v}} for k, v in sorted(labels.items())),
        *({"ph": "M", "name": "thread_name", "pid": int(k.split(":")[1]),
           "tid": int(k.split(":")[2]), "args": {"name": v}}
          for k, v in sorted(manifest["threads"].items()))]
    assert manifest["processes"]
    kernel = next(e for e in data["traceEvents"] if e.get("cat") == "kernel")
    assert {"device", "stream", "correlation", "External id"} <= set(kernel["args"])
    assert kernel["pid"] == kernel["args"]["device"] and kernel["tid"] == kernel["args"]["stream"]
    for event in data["traceEvents"][:200]:
        if "ts" in event:
            assert f'"ts":{ns_to_us_text(round(event["ts"] * 1000))}' in text


def test_deterministic_bytes(corpus_runs: dict[str, Run], tmp_path: Path) -> None:
    a = perfetto.write(corpus_runs["event_sync"], tmp_path / "a.json.gz")
    b = perfetto.write(corpus_runs["event_sync"], tmp_path / "b.json.gz")
    assert a.read_bytes() == b.read_bytes()


def test_bad_output_name(corpus_runs: dict[str, Run], tmp_path: Path) -> None:
    with pytest.raises(perfetto.PerfswarmError, match=r"\.json or \.json\.gz"):
        perfetto.write(corpus_runs["simple_add"], tmp_path / "t.txt")


def test_export_command(corpus_runs: dict[str, Run], tmp_path: Path,
                        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "trace.json"
    assert main(["export", str(corpus_runs["simple_add"].path), "--format", "perfetto",
                 "-o", str(out), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result == {"format": "perfetto", "path": str(out), "bytes": out.stat().st_size}
    assert len(json.loads(out.read_text())["traceEvents"]) > 840
    assert main(["export", str(tmp_path / "missing"), "-o", str(out)]) == 2


def test_two_ranks_get_their_own_pids(tmp_path: Path) -> None:
    run = import_traces([corpus("compare_base"), corpus("compare_test")], tmp_path / "two.run",
                        ImportOptions(ranks=(0, 1)), ["t"])
    trace = exported(run)
    assert "distributedInfo" not in trace
    spans = [e for e in trace["traceEvents"] if e["ph"] in ("X", "i")]
    events = run.table("events").to_pylist()
    assert len(spans) == len(events)
    pids_of_rank: dict[int, set[int]] = {0: set(), 1: set()}
    for span, row in zip(spans, events, strict=True):
        pids_of_rank[row["rank"]].add(span["pid"])
    assert pids_of_rank[0] and pids_of_rank[1] and not pids_of_rank[0] & pids_of_rank[1]


def test_two_ranks_flows_and_one_rank_each_round_trip(tmp_path: Path) -> None:
    """In one file of both ranks no flow id is shared between ranks (each rank's Kineto ids
    count alike: Perfetto would join their arrows); a file per rank (`rank`) imports back to
    the same events, flows and steps of both ranks."""
    run = import_traces([corpus("simple_add"), corpus("simple_add")], tmp_path / "two.run",
                        ImportOptions(ranks=(0, 1)), ["t"])
    trace = exported(run)
    flows = run.table("flows").to_pylist()
    assert {f["id"] for f in flows if f["rank"] == 0} & {f["id"] for f in flows if f["rank"] == 1}
    pids_of_id: dict[int, set[int]] = {}
    for e in trace["traceEvents"]:
        if e["ph"] in ("s", "f", "t"):
            pids_of_id.setdefault(e["id"], set()).add(e["pid"])
    assert len(pids_of_id) == len({(f["rank"], f["id"]) for f in flows})
    files = []
    for rank in (0, 1):
        files.append(perfetto.write(run, tmp_path / f"r{rank}.json", rank))
        assert json.loads(files[-1].read_text())["distributedInfo"] == {"rank": rank}
    back = import_traces(files, tmp_path / "back.run", ImportOptions(), ["t"])
    columns = ["rank", "ts", "dur", "kind", "name", "pid", "tid"]
    assert back.table("events", columns).equals(run.table("events", columns))
    assert back.table("flows").sort_by("rank").equals(run.table("flows").sort_by("rank"))
    assert back.table("steps").equals(run.table("steps"))
    with pytest.raises(ParameterError, match="no rank 2"):
        perfetto.chrome_trace(run, 2)


def test_string_process_ids_export(tmp_path: Path) -> None:
    """Traces may name a pid or tid with a string ('Spans'): the events table holds -1 for it,
    the manifest keys its names the same way, and the export places them there."""
    trace = {"traceEvents": [
        {"ph": "M", "name": "process_name", "pid": "Spans", "tid": 0, "args": {"name": "spans"}},
        {"ph": "M", "name": "thread_name", "pid": "Spans", "tid": "t1", "args": {"name": "t"}},
        {"ph": "X", "cat": "cpu_op", "name": "a", "pid": "Spans", "tid": "t1", "ts": 1.0,
         "dur": 2.0}]}
    path = tmp_path / "s.json"
    path.write_text(json.dumps(trace))
    run = import_traces([path], tmp_path / "s.run", ImportOptions(), ["test"])
    m = run.manifest()
    assert (m["processes"], m["threads"]) == ({"0:-1": "spans"}, {"0:-1:-1": "t"})
    meta = [e for e in exported(run)["traceEvents"] if e["ph"] == "M"]
    assert [(e["name"], e["pid"], e["tid"], e["args"]["name"]) for e in meta] == [
        ("process_name", -1, 0, "spans"), ("thread_name", -1, -1, "t")]


def test_stack_samples_are_exported_as_thread_instants(trainer_run: Run) -> None:
    """Every perf and py-spy sample, at its time, on its thread, named by its leaf frame."""
    trace = exported(trainer_run)
    base = trace["baseTimeNanoseconds"]
    got = sorted((e["cat"], round(float(e["ts"]) * 1000) + base, e["tid"], e["name"])
                 for e in trace["traceEvents"] if e.get("cat", "").endswith("_sample"))
    leaf = {r["stack_id"]: r["function"] or "[unknown]"
            for r in trainer_run.table("stacks").to_pylist() if r["depth"] == 0}
    samples = trainer_run.table("samples").to_pylist()
    assert {s["source"] for s in samples} == {"perf", "py-spy"}
    assert got == sorted((f"{s['source']}_sample", s["ts"], s["tid"], leaf[s["stack_id"]])
                         for s in samples)


def test_recorded_counters_are_named(trainer_run: Run) -> None:
    """Every counter row of a recording is a named counter event: `cpu.core0.usr` in series
    `cpu.core0` (key `usr`), and the recorder's `minor page faults`, a name without a dot, in
    its own series (it had been a series without a name)."""
    trace = exported(trainer_run)
    counters = [e for e in trace["traceEvents"] if e.get("ph") == "C" and "cat" not in e]
    assert len(counters) == trainer_run.table("counters").num_rows
    assert all(e["name"] for e in counters)
    faults = [e for e in counters if "minor page faults" in e["args"]]
    assert faults and {e["name"] for e in faults} == {"minor page faults"}


def test_derived_counters(corpus_runs: dict[str, Run]) -> None:
    """Queue length per stream, device utilization and memory bandwidth, derived from the
    events: they agree with analyze's numbers, and a re-import skips them (round trip)."""
    trace = exported(corpus_runs["nccl"])
    derived = [e for e in trace["traceEvents"] if e.get("cat") == perfetto.DERIVED_COUNTERS]
    queue = [e["args"] for e in derived if e["name"] == "queue length"]
    # nccl_data: at most 11 ops queued on stream 7, 1 on the NCCL stream 40
    assert max(a["stream 7"] for a in queue if "stream 7" in a) == 11
    assert max(a["stream 40"] for a in queue if "stream 40" in a) == 1
    assert queue[-1] in ({"stream 7": 0}, {"stream 40": 0})  # each stream ends empty
    busy = [e["args"]["busy"] for e in derived if e["name"] == "device utilization"]
    assert len(busy) == 100 and all(0 <= b <= 1 for b in busy)
    bandwidth = [e["args"] for e in derived if e["name"] == "memory bandwidth (GB/s)"]
    assert {k for a in bandwidth for k in a} == {"d2d", "memset"}


def test_a_manifest_without_ranks_exports(corpus_runs: dict[str, Run], tmp_path: Path) -> None:
    """A manifest whose `ranks` is empty (the fuzzer's): no distributedInfo, no IndexError."""
    import shutil

    run = Run(shutil.copytree(corpus_runs["simple_add"].path, tmp_path / "r.run"))
    m = run.manifest()
    m["ranks"] = []
    run.write_manifest(m)
    assert "distributedInfo" not in exported(run)


def _with_system_counters(run: Run, out: Path) -> Run:
    """A copy of `run` with two counters of the machine (rank -1, no device), as the system
    sampler writes them, on host `box`."""
    import shutil

    import pyarrow as pa

    from perfswarm.trace.schema import COUNTERS

    copy = Run(shutil.copytree(run.path, out))
    m = copy.manifest()
    m["host"]["hostname"] = "box"
    copy.write_manifest(m)
    start = min(copy.table("events", ["ts"]).column("ts").to_pylist())
    system = pa.table({"rank": [-1, -1], "ts": [start, start + 1000],
                       "name": ["cpu.core0.usr", "mem.used_bytes"], "device": [-1, -1],
                       "value": [1.0, 2.0]}).cast(COUNTERS)
    kept = copy.table("counters") if copy.has_table("counters") else COUNTERS.empty_table()
    copy.write_table("counters", pa.concat_tables([kept.cast(COUNTERS), system]))
    return copy


@pytest.mark.parametrize(("name", "pid"), [("cpu_only", 0), ("simple_add", None)])
def test_the_systems_counters_have_a_named_process(corpus_runs: dict[str, Run], tmp_path: Path,
                                                   name: str, pid: int | None) -> None:
    """The machine's counters (CPU, memory: rank -1) are drawn on a process named for the
    system and its host (they sat on a pid 0 without a name, a bare 'Process 0' in Perfetto):
    pid 0 where no device has it, else one past every pid the Run uses (a GPU trace's kernels
    are on pid 0, its device's own name)."""
    run = _with_system_counters(corpus_runs[name], tmp_path / "r.run")
    events = run.table("events", ["pid"]).column("pid").to_pylist()
    expected = pid if pid is not None else max(events) + 1
    assert (0 in events) == (pid is None)
    trace = exported(run)["traceEvents"]
    named = [e for e in trace if e["ph"] == "M" and e["name"] == "process_name"
             and e["pid"] == expected]
    assert named == [{"ph": "M", "name": "process_name", "pid": expected, "tid": 0,
                      "args": {"name": "system (box)"}}]
    system = [(e["pid"], e["name"], e["args"]) for e in trace
              if e["ph"] == "C" and e["name"] in ("cpu.core0", "mem")]
    assert system == [(expected, "cpu.core0", {"usr": 1.0}),
                      (expected, "mem", {"used_bytes": 2.0})]


def test_the_export_peaks_a_part_not_the_trace(tmp_path: Path) -> None:
    """The trace is serialized, gzipped and written a part (BATCH events) at a time, never
    held whole: traced at its highest (the Run's columns read already, as a first export
    leaves them) 400 bytes an event on a 20k-event synthetic trace's 11,476, where the whole
    list of events and its JSON had been 2,960 (a 200k-event Run's export peaked at 10x its
    JSON's size in RSS, 3.6x since). The parts gzipped are gzip.compress's bytes of the
    whole text."""
    path = import_traces([synthetic.write(tmp_path / "t.json", 20_000)], tmp_path / "t.run",
                         ImportOptions(), ["t"]).path
    run = Run(path)
    perfetto.write(run, tmp_path / "warm.json.gz")  # (the columns a first one reads, kept)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        out = perfetto.write(run, tmp_path / "t.json.gz")
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    n = run.table("events", ["ts"]).num_rows
    text = b"".join(perfetto.chrome_trace(run))
    assert out.read_bytes() == gzip.compress(text, compresslevel=6, mtime=0)
    assert sum(e["ph"] in ("X", "i") for e in orjson.loads(text)["traceEvents"]) == n == 11_476
    assert peak < 600 * n
