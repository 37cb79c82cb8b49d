"""Bounded-memory ingest for traces too large to decode at once.

trace/eventsplit.py finds the events in the JSON text in one pass (which also reads the
metadata around them: baseTimeNanoseconds often comes *after* the events) and a second pass
hands over whole pieces of events; each piece goes through the same typed decoder and column
builder as the in-memory path and is spilled to Parquet. trace/merge.py then sorts and marks
steps out of core with DuckDB.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from perfswarm.trace import eventsplit
from perfswarm.trace.build import Extent
from perfswarm.trace.kineto import (
    ReadOptions,
    TraceMeta,
    TraceTables,
    decode_event_text,
    finish,
    no_events,
    tables_from_events,
    trace_meta,
)
from perfswarm.trace.schema import COUNTERS, EVENTS, FLOWS, STEPS
from perfswarm.trace.store import statistics_columns

SPILLED = ("events", "flows", "counters", "steps")


def _write(writers: dict[str, pq.ParquetWriter], part: TraceTables) -> None:
    for name, table in zip(SPILLED, (part.events, part.flows, part.counters, part.steps),
                           strict=True):
        if table.num_rows:
            writers[name].write_table(table.cast(_SCHEMAS[name]))
_SCHEMAS = {"events": EVENTS, "flows": FLOWS, "counters": COUNTERS, "steps": STEPS}


def spill_trace(path: Path, rank_hint: int, opts: ReadOptions, scratch: Path,
                rank_override: int | None = None
                ) -> tuple[TraceMeta, dict[str, Path], int, Extent | None]:
    """Decode `path` in batches and write its tables to Parquet files under `scratch`.

    Returns the metadata, the spilled file per table, the number of events and their extent.
    """
    layout = eventsplit.scan(path)
    meta = trace_meta(path, eventsplit.metadata(path, layout))
    rank = rank_override if rank_override is not None else (
        meta.rank if meta.rank is not None else rank_hint)
    scratch.mkdir(parents=True, exist_ok=True)
    spill = {name: scratch / f"{name}.parquet" for name in SPILLED}
    writers = {name: pq.ParquetWriter(spill[name], _SCHEMAS[name],
                                      write_statistics=statistics_columns(_SCHEMAS[name]))
               for name in SPILLED}
    rows = 0
    extent: Extent | None = None
    try:
        first = 0
        for text in eventsplit.pieces(path, layout):
            batch = decode_event_text(path, text, first)
            part = tables_from_events(path, batch, meta, rank, opts, first_index=first)
            first += len(batch)
            rows += part.events.num_rows
            found = Extent.of(part.events)
            extent = found.union(extent) if found is not None else extent
            _write(writers, part)
        if first == 0:
            raise no_events(path)
        _write(writers, finish(path, meta, rank, opts))
    finally:
        for w in writers.values():
            w.close()
    return meta, spill, rows, extent
