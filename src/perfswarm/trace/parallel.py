"""Parallel import: every trace file read, sorted and step-marked on a Dask worker.

A worker reads one file (ingest's reader), gives its rows the file's rank, sorts them by
time and marks steps from that file's own markers, and leaves its tables as Parquet files
in the Run's scratch directory. Files that claim the same rank are merged by one more task
(the same sort and step marking over their rows together). The driver then hands
build.write_tables each table in order, a row group at a time: events rank by rank, the
others file by file. The result is byte for byte the in-memory path's (ingest._read_all),
tested against it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from perfswarm.trace import readers
from perfswarm.trace.build import (
    Extent,
    ImportOptions,
    Progress,
    TableParts,
    describe,
    file_rank,
    parquet_parts,
    sorted_slices,
    with_rank,
)
from perfswarm.trace.cluster import run_all
from perfswarm.trace.kineto import ReadOptions, TraceMeta, concat
from perfswarm.trace.schema import EVENTS, STEPS
from perfswarm.trace.store import Manifest, Run

SMALL_TABLES = ("steps", "flows", "counters")


@dataclass(frozen=True)
class FilePart:
    """One trace file as a worker left it: its tables as Parquet files under scratch."""

    rank: int
    meta: TraceMeta
    events: int
    extent: Extent | None
    tables: dict[str, Path]  # events sorted by time with the file's steps marked; the others


def _write_sorted(events: pa.Table, steps: pa.Table, path: Path) -> None:
    with pq.ParquetWriter(path, EVENTS) as writer:
        for part in sorted_slices(events, steps):
            writer.write_table(part.cast(EVENTS))


def read_file(path: Path, index: int, options: ImportOptions, scratch: Path) -> FilePart:
    """Worker task: read one trace file into sorted, step-marked Parquet files."""
    scratch.mkdir(parents=True, exist_ok=True)
    meta, tables = readers.read_file(path, index,
                                     ReadOptions(drop_bad_events=options.drop_bad_events),
                                     spill_dir=scratch)
    rank = file_rank(options, index, meta)
    tables = with_rank(tables, rank)
    out = {name: scratch / f"{name}.parquet" for name in ("events", *SMALL_TABLES)}
    for name in SMALL_TABLES:
        pq.write_table(getattr(tables, name), out[name])
    _write_sorted(tables.events, tables.steps, out["events"])
    return FilePart(rank, meta, tables.events.num_rows, Extent.of(tables.events), out)


def merge_rank(parts: Sequence[dict[str, Path]], out: Path) -> Path:
    """Worker task: the files of one rank together (file order, then time), steps re-marked
    from all of their markers."""
    events = concat([pq.read_table(p["events"]) for p in parts], EVENTS)
    steps = concat([pq.read_table(p["steps"]) for p in parts], STEPS)
    _write_sorted(events, steps, out)
    return out


def import_parallel(run: Run, paths: Sequence[Path], options: ImportOptions, manifest: Manifest,
                    progress: Progress | None, client: Any, scratch: Path) -> TableParts:
    """ingest._read_all on a Dask cluster, the workers' files left in `scratch`."""
    total = len(paths)

    def done(n: int) -> None:
        if progress:
            progress(f"reading on {len(client.scheduler_info()['workers'])} workers", n, total)

    files: list[FilePart] = run_all(
        client, read_file, [(p, i, options, scratch / str(i)) for i, p in enumerate(paths)], done)
    by_rank: dict[int, list[FilePart]] = {}
    for path, part in zip(paths, files, strict=True):
        describe(manifest, run.add_raw(path), part.rank, part.meta, part.events, part.extent)
        by_rank.setdefault(part.rank, []).append(part)
    shared = sorted(r for r, group in by_rank.items() if len(group) > 1)
    merged = dict(zip(shared, run_all(client, merge_rank, [
        ([p.tables for p in by_rank[r]], scratch / f"rank{r}.parquet") for r in shared]),
        strict=True))
    if progress:
        progress("writing tables", total, total)
    steps, flows, counters = (parquet_parts([p.tables[name] for p in files])
                              for name in SMALL_TABLES)
    return TableParts(steps, flows, counters, parquet_parts([
        merged.get(r) or by_rank[r][0].tables["events"] for r in sorted(by_rank)]))
