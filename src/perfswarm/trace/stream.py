"""Bounded-memory ingest for traces too large to decode at once.

ijson (C backend) walks the file and hands over `traceEvents` items in batches;
each batch goes through the same typed decoder and column builder as the
in-memory path and is spilled to Parquet. The top-level metadata
(baseTimeNanoseconds often comes *after* the events) is read first by C-level
passes that build no events. trace/merge.py then sorts and marks steps out of
core with DuckDB.
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ijson
import msgspec
import numpy as np
import orjson
import pyarrow.parquet as pq

from perfswarm.errors import TraceFormatError
from perfswarm.trace import gunzip
from perfswarm.trace.kineto import (
    KEvent,
    KTrace,
    ReadOptions,
    TraceMeta,
    TraceTables,
    finish,
    not_a_trace,
    tables_from_events,
    trace_meta,
)
from perfswarm.trace.schema import COUNTERS, EVENTS, FLOWS, STEPS

BATCH = 50_000
# Only what the import needs: each key costs a pass over the file (the ones written before the
# events stop early), so informational keys (traceName, schemaVersion, ...) are not read here.
_META_KEYS = ("deviceProperties", "distributedInfo", "baseTimeNanoseconds")




def _errors(path: Path, exc: Exception) -> TraceFormatError:
    if isinstance(exc, EOFError | zlib.error):
        return TraceFormatError(path, "gzip", f"corrupt or truncated gzip ({exc})")
    if isinstance(exc, msgspec.ValidationError):
        return TraceFormatError(path, "json", f"wrong structure: {exc}")
    return TraceFormatError(path, "json", f"invalid JSON: {exc}")


# ijson's item prefixes grow with depth (its memory is quadratic in it: 200 KB of brackets took
# 11 GB); Kineto traces nest a handful of levels.
MAX_DEPTH = 128
_OPEN = np.zeros(256, np.int8)
_OPEN[[ord("["), ord("{")]] = 1
_OPEN[[ord("]"), ord("}")]] = -1


def check_depth(path: Path, chunk: int = 16 << 20) -> None:
    """Refuse a file whose JSON nests deeper than MAX_DEPTH, in one vectorized pass over its
    text a chunk at a time (brackets inside strings do not count)."""
    depth, inside, run = 0, 0, 0  # carried across chunks: depth, in a string, trailing '\\'s
    try:
        with gunzip.open_text(path) as f:
            while data := f.read(chunk):
                b = np.frombuffer(data, np.uint8)
                quotes = np.flatnonzero(b == 34)
                if data.find(b"\\") >= 0 or run:  # drop quotes escaped by an odd '\\' run
                    idx = np.arange(len(b))
                    last_plain = np.maximum.accumulate(np.where(b != 92, idx, -1))
                    before = np.where(quotes > 0, last_plain[np.maximum(quotes - 1, 0)], -1)
                    runs = quotes - 1 - before + np.where(before < 0, run, 0)
                    quotes = quotes[runs % 2 == 0]
                    run = len(b) - 1 - int(last_plain[-1]) + (run if last_plain[-1] < 0 else 0)
                steps = _OPEN[b]
                brackets = np.flatnonzero(steps)
                # a bracket is in a string when an odd number of real quotes precede it
                outside = (np.searchsorted(quotes, brackets) + inside) % 2 == 0
                level = depth + np.cumsum(steps[brackets[outside]], dtype=np.int64)
                if len(level) and int(level.max()) > MAX_DEPTH:
                    at = int(brackets[outside][np.argmax(level > MAX_DEPTH)])
                    raise TraceFormatError(path, "json", f"nested deeper than {MAX_DEPTH} "
                                           f"levels (at byte {f.tell() - len(b) + at:,})")
                depth = int(level[-1]) if len(level) else depth
                inside = (inside + len(quotes)) % 2
    except (EOFError, OSError, zlib.error) as exc:
        raise _errors(path, exc) from None


def _metadata(path: Path) -> KTrace:
    """Top-level keys other than traceEvents, one C-level pass per key, no events built.

    Kineto writes deviceProperties and distributedInfo before the events (those
    passes stop early) and baseTimeNanoseconds after them.
    """
    found: dict[str, Any] = {}
    try:
        for key in _META_KEYS:
            with gunzip.open_text(path) as f:
                for value in ijson.items(f, key, use_float=True):
                    found[key] = value
                    break
    except (ijson.JSONError, EOFError, OSError, zlib.error) as exc:
        raise _errors(path, exc) from None
    try:
        return msgspec.convert({"traceEvents": [], **found}, KTrace)
    except msgspec.ValidationError as exc:
        raise _errors(path, exc) from None


def _batches(path: Path) -> Iterator[list[KEvent]]:
    saw_events = False
    try:
        with gunzip.open_text(path) as f:
            items = ijson.items(f, "traceEvents.item", use_float=True)
            while batch := list(itertools.islice(items, BATCH)):
                saw_events = True
                raw = orjson.dumps(batch)
                yield msgspec.json.decode(raw, type=list[KEvent])
    except (ijson.JSONError, EOFError, OSError, zlib.error, msgspec.ValidationError,
            UnicodeDecodeError) as exc:
        raise _errors(path, exc) from None
    except orjson.JSONEncodeError as exc:
        raise TraceFormatError(path, "json", f"unsupported value: {exc}") from None
    if not saw_events:
        with gunzip.open_text(path) as f:
            try:
                has_key = any(True for _ in ijson.items(f, "traceEvents"))
            except ijson.JSONError as exc:
                raise _errors(path, exc) from None
        if not has_key:
            with gunzip.open_text(path) as f:
                head = f.read(64)
            keys: list[str] = []
            if head.lstrip()[:1] == b"{":
                with gunzip.open_text(path) as f:
                    keys = [value for prefix, event, value in ijson.parse(f)
                            if prefix == "" and event == "map_key"]
            raise not_a_trace(path, head, keys)


SPILLED = ("events", "flows", "counters", "steps")


def _write(writers: dict[str, pq.ParquetWriter], part: TraceTables) -> None:
    for name, table in zip(SPILLED, (part.events, part.flows, part.counters, part.steps),
                           strict=True):
        if table.num_rows:
            writers[name].write_table(table.cast(_SCHEMAS[name]))
_SCHEMAS = {"events": EVENTS, "flows": FLOWS, "counters": COUNTERS, "steps": STEPS}


def spill_trace(path: Path, rank_hint: int, opts: ReadOptions, scratch: Path,
                rank_override: int | None = None) -> tuple[TraceMeta, dict[str, Path], int]:
    """Decode `path` in batches and write its tables to Parquet files under `scratch`.

    Returns the metadata, the spilled file per table, and the number of events.
    """
    check_depth(path)
    meta = trace_meta(path, _metadata(path))
    rank = rank_override if rank_override is not None else (
        meta.rank if meta.rank is not None else rank_hint)
    scratch.mkdir(parents=True, exist_ok=True)
    spill = {name: scratch / f"{name}.parquet" for name in SPILLED}
    writers = {name: pq.ParquetWriter(spill[name], _SCHEMAS[name]) for name in SPILLED}
    rows = 0
    try:
        first = 0
        for batch in _batches(path):
            part = tables_from_events(path, batch, meta, rank, opts, first_index=first)
            first += len(batch)
            rows += part.events.num_rows
            _write(writers, part)
        _write(writers, finish(path, meta, rank, opts))
    finally:
        for w in writers.values():
            w.close()
    return meta, spill, rows
