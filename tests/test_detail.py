"""The events' `detail` column: the fields of their args that the analyses read."""

from __future__ import annotations

import shutil
import tracemalloc
from pathlib import Path

import numpy as np
import orjson
import pyarrow.parquet as pq
import pytest

from perfswarm.analyze.frame import detail_of
from perfswarm.api import import_traces
from perfswarm.trace import synthetic
from perfswarm.trace.detail import detail_column
from perfswarm.trace.store import Run

# Written out again here (not imported): the args keys the analyses read, and the event kinds
# whose args they read them from.
KEYS = {"Input Dims", "Input type", "Input Strides", "Concrete Inputs", "bytes",
        "cuda_sync_kind", "stream", "wait_on_stream", "wait_on_cuda_event_record_corr_id",
        "registers per thread", "shared memory", "blocks per SM", "warps per SM", "grid",
        "block", "est. achieved occupancy %", "Collective name", "In msg nelems",
        "Out msg nelems", "Group size", "dtype", "Process Group Name", "Process Group Ranks"}
KINDS = {"cpu_op", "kernel", "memcpy", "memset", "sync", "collective"}


def expected(kind: str, args: str | None) -> dict[str, object]:
    if kind not in KINDS:
        return {}
    return {k: v for k, v in orjson.loads(args or "{}").items() if k in KEYS}


def test_detail_is_the_read_fields_of_the_args(corpus_runs: dict[str, Run]) -> None:
    """On every corpus trace, each event's detail holds exactly the read keys of its args
    (values equal as JSON), and nothing for the kinds whose args are never read."""
    seen: dict[str, int] = {}
    for name, run in corpus_runs.items():
        table = run.table("events", ["kind", "args", "detail"]).to_pydict()
        for kind, args, detail in zip(table["kind"], table["args"], table["detail"],
                                      strict=True):
            found = orjson.loads(detail)
            assert found == expected(kind, args), (name, kind, args)
            for key in found:
                seen[key] = seen.get(key, 0) + 1
        column = run.table("events", ["detail"]).column("detail")  # read as a dictionary
        distinct = sum(len(c.dictionary) for c in column.chunks)
        if len(column) >= 1000:  # every iteration repeats the same ones
            assert distinct <= len(column) // 3, name
    # the corpus exercises the shapes, copies, syncs, launch geometry and collectives
    assert {"Input Dims", "bytes", "cuda_sync_kind", "grid", "Collective name"} <= set(seen)


def test_a_run_written_before_detail_reads_it(corpus_runs: dict[str, Run],
                                              tmp_path: Path) -> None:
    """A Run whose events table has no detail column (written by an earlier version) gets
    the same detail, derived when read, whole or by rank."""
    source = corpus_runs["nccl"]
    old = tmp_path / "old.run"
    shutil.copytree(source.path, old)
    events = old / "tables" / "events.parquet"
    table = pq.read_table(events)
    pq.write_table(table.drop_columns(["detail"]), events)
    run, new = Run(old), Run(source.path)
    assert "detail" not in pq.read_schema(events).names
    want = new.table("events", ["detail"]).column("detail").to_pylist()
    assert run.table("events", ["detail"]).column("detail").to_pylist() == want
    assert run.table("events").column_names == new.table("events").column_names
    for rank in new.table("events", ["rank"]).column("rank").unique().to_pylist():
        assert (Run(old).table("events", ["ts", "detail"], rank=rank).to_pydict()
                == Run(source.path).table("events", ["ts", "detail"], rank=rank).to_pydict())


@pytest.mark.parametrize("texts", [
    [b'{"Input Dims": [[2,\n 3]], "Ev Idx": 4}', b'{"bytes": 8}'],  # a value across lines
    [b'{"bytes": 8}', b"[1, 2]", b'"text"', b'{"grid": [1, 1, 1]}'],  # not objects
])
def test_detail_of_odd_args(texts: list[bytes]) -> None:
    """Args a value of which spans lines, and args that are not objects, get the detail
    they hold; rows outside `rows` get none."""
    rows = np.arange(1, len(texts) + 1)
    column = detail_column(texts, rows, len(texts) + 2)
    found = [orjson.loads(t) for t in column.to_pylist()]
    want = [{}]
    for text in texts:
        value = orjson.loads(text)
        want.append({k: v for k, v in value.items() if k in KEYS}
                    if isinstance(value, dict) else {})
    assert found == [*want, {}]


def test_detail_of_a_few_rows_decodes_their_texts_alone(tmp_path: Path) -> None:
    """detail_of's texts are the column's own at those rows, one string object per distinct
    text; of its dictionary only the texts those rows hold become Python strings (a
    synthetic trace draws new shapes for every op: thousands of distinct texts, each call
    for a few rows had made them all)."""
    run = Run(import_traces(synthetic.write(tmp_path / "t.json", 20_000), tmp_path / "t.run")
              .path)
    column = run.table("events", ["detail"]).column("detail")
    distinct = [t for c in column.chunks for t in c.dictionary.to_pylist()]
    assert len(distinct) > 2_000
    values = column.to_pylist()
    shared = values.index(values[-1])  # the last row's text, first held by an earlier row
    assert shared < len(values) - 1
    rows = np.array([shared, 1000, 5000, len(values) - 1])
    tracemalloc.start()
    try:
        texts = detail_of(run, rows)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert texts == column.take(rows).to_pylist()
    assert texts[0] is texts[-1]
    # what the call held at most against what its dictionary's texts take as Python strings
    assert peak < sum(map(len, distinct)) / 10
