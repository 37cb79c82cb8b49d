"""Shared fixtures: the corpus of real traces, and Runs imported from it once per session."""

from __future__ import annotations

import gzip
import os
import sys
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pytest

from perfswarm.analyze.frame import Events
from perfswarm.recorder.clock import monotonic_offset_ns
from perfswarm.recorder.session import RecordOptions, record
from perfswarm.trace.detail import with_detail
from perfswarm.trace.ingest import ImportOptions, import_traces
from perfswarm.trace.schema import EVENTS
from perfswarm.trace.store import Run
from tune_cases import printed_search

# pytest-xdist's workers inherit COLUMNS (the controller's terminal width, 80 under CI), which
# the CLI honours; its output is tested as written to a pipe (cli/output.py: PIPED_WIDTH), in
# this process and in the commands it runs. The console is made when perfswarm.cli.output is
# first imported, after this.
os.environ.pop("COLUMNS", None)

REPO = Path(__file__).resolve().parents[1]
CORPUS = (REPO.parent / "shared" / "corpus" / "hta").resolve()

# name -> corpus file, for the traces tests refer to by short name
TRACES = {
    "nccl": "nccl_parser_config/nccl_data.json.gz",
    "simple_add": "critical_path/simple_add/benchmark_result_493459_1694039959_trace.json.gz",
    "event_sync": "critical_path/cuda_event_sync/event_sync_trace.json.gz",
    "event_sync_multi": "critical_path/cuda_event_sync_multi_stream/event_sync_trace.json.gz",
    "et_trace": "execution_trace/benchmark_simple_add_trace.json.gz",
    "amd": "amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    "cpu_only": "cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
    "compare_base": "trace_compare/base/base.json.gz",
    "compare_test": "trace_compare/test/test.json.gz",
    "triton": "triton_example/triton_example.json.gz",
    "cupti": "cupti_profiler/benchmark_result_924719_1679055439_trace.json.gz",
    "non_gpu": "mixed_files/rank_non_gpu.json.gz",
    "old_format": "trace_file_list/inference_rank_1.json.gz",
}
ET = "execution_trace/benchmark_simple_add_et.json.gz"


def corpus(name: str) -> Path:
    return CORPUS / TRACES.get(name, name)


@pytest.fixture(scope="session")
def corpus_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    """Every corpus trace imported once (ET joined for et_trace); read-only for tests."""
    root = tmp_path_factory.mktemp("corpus-runs")
    runs: dict[str, Run] = {}
    for name in TRACES:
        ets = (CORPUS / ET,) if name == "et_trace" else ()
        runs[name] = import_traces([corpus(name)], root / f"{name}.run",
                                   ImportOptions(execution_traces=ets), ["test"])
    return runs


TRAINER_STEPS = 8
# the monotonic -> epoch offset as the session began: a later one that differs says the
# machine's wall clock stepped meanwhile (a VM's clock sync: 15 s once in this project's CI)
SESSION_OFFSET_NS = monotonic_offset_ns()


@pytest.fixture(scope="session")
def trainer_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """The bundled CNN trainer recorded once (as `perfswarm demo` records it, shorter): shared
    by the recorder's tests and the report's in the browser."""
    out = tmp_path_factory.mktemp("rec") / "trainer.run"
    result = record([sys.executable, "-m", "perfswarm.workloads.trainer", "--steps",
                     str(TRAINER_STEPS), "--batch-size", "8", "--num-workers", "2",
                     "--loader-delay-ms", "5"], out, RecordOptions(skip=2, steps=3))
    assert result.exit_code == 0
    return result.run


@pytest.fixture(scope="session")
def tune_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tune output directory (tune_cases.printed_search); read-only for tests."""
    out = tmp_path_factory.mktemp("tune") / "out"
    printed_search(out)
    return out


COLUMNS = ("rank", "ts", "dur", "kind", "name", "tid", "device", "stream", "correlation")


def events(rows: list[tuple[int, int, int, str, str, int, int, int, int]]) -> Events:
    """An events table from (rank, ts, dur, kind, name, tid, device, stream, correlation)."""
    cols = {c: [r[i] for r in rows] for i, c in enumerate(COLUMNS)}
    n = len(rows)
    table = pa.table({**cols, "pid": [1] * n, "external_id": [-1] * n, "rf_id": [-1] * n,
                      "step": [-1] * n, "args": ["{}"] * n})
    table = with_detail(table).select(EVENTS.names).cast(EVENTS)
    return Events.from_table(table.sort_by([("rank", "ascending"), ("ts", "ascending")]))


def gloo_wait_ns(path: Path) -> tuple[tuple[int, int], int]:
    """Of a one-rank CPU trace with gloo (the corpus's cpu_only, rank 34 of 300) whose loop
    thread runs no op in its first step: that step's marker (start, end), and how much of it
    gloo's threads were all-reducing (the union of their ranges in it), from the raw JSON."""
    raw = orjson.loads(gzip.decompress(path.read_bytes()))["traceEvents"]

    def ns(us: Any) -> int:
        return int(Decimal(str(us)) * 1000)

    (mark,) = [e for e in raw if e.get("ph") == "X" and e["name"].startswith("ProfilerStep#")]
    lo, hi = ns(mark["ts"]), ns(mark["ts"]) + ns(mark["dur"])
    assert not any(e.get("cat") == "cpu_op" and lo <= ns(e["ts"]) < hi for e in raw)
    covered: list[list[int]] = []
    for start, end in sorted((ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])) for e in raw
                             if e.get("name") == "gloo:all_reduce"):
        s, e = max(start, lo), min(end, hi)
        if e <= s:
            continue
        if covered and s <= covered[-1][1]:
            covered[-1][1] = max(covered[-1][1], e)
        else:
            covered.append([s, e])
    return (lo, hi), sum(e - s for s, e in covered)


GLOO_DDP = [REPO / "tests" / "data" / f"ddp_gloo_rank{r}.pt.trace.json.gz" for r in (0, 1)]
# DTensor's Colwise/Rowwise MLP on two gloo ranks, two profiled steps (the twenty-second pass)
TP_GLOO = [REPO / "tests" / "data" / f"tp_gloo_rank{r}.pt.trace.json.gz" for r in (0, 1)]


@dataclass
class GlooRank:
    """One rank of tests/data/ddp_gloo.py's trace, read from the raw JSON (ns on the trace's
    own clock, as import keeps it): its gloo all-reduces (start, end, tid), each cut at the end
    of the profiler's window as import cuts a range; its loop thread, that thread's host
    spans (not the step markers) and its step markers (start, end)."""

    gloo: list[tuple[int, int, int]]
    loop_tid: int
    loop: list[tuple[int, int]]
    markers: list[tuple[int, int]]
    work: list[tuple[int, int]]  # its ops on every thread but the calls issuing collectives
    calls: list[tuple[int, int]]  # those calls

    def merged_work(self) -> list[tuple[int, int]]:
        return _merged(self.work)

    def work_in(self, lo: int, hi: int) -> int:
        """Its work's time in [lo, hi) less the time its thread sat in a call issuing a
        collective (an op around the call is no work while the call runs)."""
        calls = _merged(self.calls)
        return sum(max(0, min(e, hi) - max(s, lo)) - sum(max(0, min(e, ce, hi) - max(s, cs, lo))
                                                         for cs, ce in calls)
                   for s, e in self.merged_work())


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted spans as disjoint ones covering the same time."""
    out: list[list[int]] = []
    for s, e in spans:
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def gloo_ddp_raw() -> list[GlooRank]:
    out = []
    for path in GLOO_DDP:
        raw = orjson.loads(gzip.decompress(path.read_bytes()))
        base = raw.get("baseTimeNanoseconds", 0)
        x = [e for e in raw["traceEvents"] if e.get("ph") == "X"]

        def span(e: dict[str, Any], base: int = base) -> tuple[int, int]:
            start = base + int(Decimal(str(e["ts"])) * 1000)
            return start, start + int(Decimal(str(e["dur"])) * 1000)

        (window,) = [span(e)[1] for e in x if e.get("cat") == "Trace"]
        marks = [e for e in x if e["name"].startswith("ProfilerStep#")]
        tid = marks[0]["tid"]
        out.append(GlooRank(
            sorted((span(e)[0], min(window, span(e)[1]), e["tid"]) for e in x
                   if e["name"] == "gloo:all_reduce"),
            tid,
            sorted(span(e) for e in x if e["tid"] == tid and e["dur"] > 0
                   and not e["name"].startswith("ProfilerStep#")),
            sorted(span(e) for e in marks),
            sorted(span(e) for e in x if e.get("cat") == "cpu_op" and e["dur"] > 0
                   and not e["name"].startswith("c10d::")),
            sorted(span(e) for e in x if e["name"].startswith("c10d::"))))
    return out
