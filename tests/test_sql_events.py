"""`perfswarm sql`'s events view: `dur` as the analyses read it (a user annotation ends with the
profiler trace window it began in), `dur_recorded` as the trace has it; checked against the raw
JSON of a real trace and, on random events, against the event frame's own clipping."""

from __future__ import annotations

import gzip
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfswarm.analyze.frame import KIND, Events, _within_trace
from perfswarm.cli.main import main
from perfswarm.trace.ingest import ImportOptions, import_traces
from perfswarm.trace.sql import events_view, trace_windows
from perfswarm.trace.store import Run

TRACE = Path(__file__).parent / "data" / "nanogpt_h200.pt.trace.json.gz"


def us(value: Any) -> Decimal:
    return Decimal(str(value))


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return import_traces([TRACE], tmp_path_factory.mktemp("h200") / "h200.run",
                         ImportOptions(), ["test"])


def sql(run: Run, query: str, capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    assert main(["sql", str(run.path), query, "--json"]) == 0
    rows: list[dict[str, Any]] = json.loads(capsys.readouterr().out)
    return rows


def test_a_late_annotation_ends_with_the_trace(run: Run, capsys: pytest.CaptureFixture[str]
                                               ) -> None:
    """nanoGPT on an H200: Kineto closed the last Optimizer.step range, which the profiler
    stopped inside, 31.6 ms after its trace window ended. sql's `dur` ends it with the window,
    as the analyses do (it had shown the trace's 31.6 ms more than every analysis); the trace's
    own is `dur_recorded`. Every other row's two durations are one."""
    raw = [e for e in orjson.loads(gzip.decompress(TRACE.read_bytes()))["traceEvents"]
           if e.get("ph") == "X"]
    (window,) = [e for e in raw if e["cat"] == "Trace"]
    last = max((e for e in raw if e["name"].startswith("Optimizer.step#")
                and e["cat"] == "user_annotation"), key=lambda e: us(e["ts"]))
    (late,) = sql(run, "SELECT name, kind, ts, dur, dur_recorded FROM events "
                       "WHERE dur <> dur_recorded", capsys)
    (span,) = sql(run, "SELECT ts, dur FROM events WHERE kind = 'trace_span'", capsys)
    assert (late["name"], late["kind"]) == (last["name"], "user_annotation")
    assert late["dur_recorded"] == int(us(last["dur"]) * 1000)
    assert late["ts"] + late["dur"] == span["ts"] + span["dur"]
    late_ns = (us(last["ts"]) + us(last["dur"]) - us(window["ts"]) - us(window["dur"])) * 1000
    assert late["dur_recorded"] - late["dur"] == int(late_ns) == 31_557_764


def test_the_view_is_the_event_frame(run: Run, capsys: pytest.CaptureFixture[str]) -> None:
    """Row for row, in the table's order: `dur` is the analyses' frame's, `dur_recorded` the
    stored table's."""
    rows = sql(run, "SELECT rank, ts, dur, dur_recorded FROM events", capsys)
    stored = run.table("events", ["rank", "ts", "dur"]).to_pydict()
    assert [r["ts"] for r in rows] == stored["ts"] and [r["rank"] for r in rows] == stored["rank"]
    assert [r["dur_recorded"] for r in rows] == stored["dur"]
    assert [r["dur"] for r in rows] == Events.load(run).dur.tolist()


KINDS = ["trace_span", "user_annotation", "cpu_op", "kernel"]
EVENT = st.tuples(st.integers(0, 2), st.integers(0, 1000), st.integers(0, 400),
                  st.sampled_from(KINDS))


@settings(max_examples=60, deadline=None)
@given(st.lists(EVENT, max_size=40))
def test_the_view_clips_as_the_frame_does(tmp_path_factory: pytest.TempPathFactory,
                                          rows: list[tuple[int, int, int, str]]) -> None:
    """Random events of three ranks, any number of trace windows each (ties, nesting, none):
    the view's `dur` is the frame's (`_within_trace`), row for row."""
    rows.sort(key=lambda r: (r[0], r[1]))  # as the store keeps them
    rank, ts, dur, kind = (list(c) for c in zip(*rows, strict=True)) if rows else ([],) * 4
    path = tmp_path_factory.mktemp("view") / "events.parquet"
    pq.write_table(pa.table({"rank": pa.array(rank, pa.int32()), "ts": pa.array(ts, pa.int64()),
                             "dur": pa.array(dur, pa.int64()),
                             "kind": pa.array(kind, pa.string()).dictionary_encode()}), path)
    con = duckdb.connect(":memory:")
    source = f"'{path}'"
    con.execute(events_view(source, trace_windows(con, source)))
    got = [d for (d,) in con.sql("SELECT dur FROM events").fetchall()]
    want = _within_trace(*(np.array(c, np.int64) for c in (rank, ts, dur,
                                                           [KIND[k] for k in kind])))
    assert got == want.tolist()
