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

from collections.abc import Iterator, Sequence
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
    process_ranks,
    set_rank,
    shift_steps,
    sorted_slices,
    step_offsets,
    with_rank,
)
from perfswarm.trace.cluster import run_all
from perfswarm.trace.kineto import MappedFile, ReadOptions, TraceMeta, concat
from perfswarm.trace.schema import EVENTS, STEPS
from perfswarm.trace.store import Manifest, Run, statistics_columns

SMALL_TABLES = ("steps", "flows", "counters")


@dataclass(frozen=True)
class FilePart:
    """One trace file as a worker left it: its tables as Parquet files under scratch."""

    rank: int
    meta: TraceMeta
    events: int
    extent: Extent | None
    tables: dict[str, Path]  # events sorted by time with the file's steps marked; the others


def _write_sorted(events: pa.Table, steps: pa.Table, path: Path,
                  mapped: Sequence[MappedFile] = ()) -> None:
    with pq.ParquetWriter(path, EVENTS, write_statistics=statistics_columns(EVENTS)) as writer:
        for part in sorted_slices(events, steps, mapped):
            writer.write_table(part.cast(EVENTS))


def read_file(path: Path, index: int, options: ImportOptions, scratch: Path) -> FilePart:
    """Worker task: read one trace file into sorted, step-marked Parquet files."""
    scratch.mkdir(parents=True, exist_ok=True)
    meta, tables = readers.read_file(path, index,
                                     ReadOptions(drop_bad_events=options.drop_bad_events),
                                     spill_dir=scratch)
    rank = file_rank(options, index, meta)  # the driver's process_ranks may move it
    tables = with_rank(tables, rank)
    out = {name: scratch / f"{name}.parquet" for name in ("events", *SMALL_TABLES)}
    for name in SMALL_TABLES:
        pq.write_table(getattr(tables, name), out[name])
    _write_sorted(tables.events, tables.steps, out["events"], tables.mapped)
    return FilePart(rank, meta, tables.events.num_rows, Extent.of(tables.events), out)


def merge_rank(parts: Sequence[dict[str, Path]], rank: int, offsets: Sequence[int],
               out: Path) -> Path:
    """Worker task: the files of one rank together (file order, then time), steps re-marked
    from all of their markers (each file's moved by its offset), every row of `rank`."""
    events = concat([set_rank(pq.read_table(p["events"]), rank) for p in parts], EVENTS)
    steps = concat([shift_steps(set_rank(pq.read_table(p["steps"]), rank), offset)
                    for p, offset in zip(parts, offsets, strict=True)], STEPS)
    _write_sorted(events, steps, out)
    return out


def _ranked(files: Sequence[FilePart], ranks: Sequence[int], offsets: Sequence[int] | None,
            name: str) -> Iterator[pa.Table]:
    """The table `name` of each file, its rows of the file's rank (a steps table's numbers
    moved by the file's offset)."""
    for i, (part, rank) in enumerate(zip(files, ranks, strict=True)):
        for table in parquet_parts([part.tables[name]]):
            yield shift_steps(set_rank(table, rank), offsets[i]) if offsets else set_rank(
                table, rank)


def import_parallel(run: Run, paths: Sequence[Path], options: ImportOptions, manifest: Manifest,
                    progress: Progress | None, client: Any, scratch: Path) -> TableParts:
    """ingest._read_all on a Dask cluster, the workers' files left in `scratch`."""
    total = len(paths)

    def done(n: int) -> None:
        if progress:
            progress(f"reading on {len(client.scheduler_info()['workers'])} workers", n, total)

    files: list[FilePart] = run_all(
        client, read_file, [(p, i, options, scratch / str(i)) for i, p in enumerate(paths)], done)
    ranks = process_ranks(options, paths, [f.meta for f in files],
                          [f.extent for f in files])
    offsets = step_offsets(ranks, [f.extent for f in files], [
        pq.read_table(f.tables["steps"], columns=["step"]).column("step").to_numpy()
        for f in files])
    by_rank: dict[int, list[tuple[FilePart, int]]] = {}
    for path, part, rank, offset in zip(paths, files, ranks, offsets, strict=True):
        describe(manifest, run.add_raw(path), rank, part.meta, part.events, part.extent)
        by_rank.setdefault(rank, []).append((part, offset))
    # a rank of several files, or of one its worker gave another rank, is written again
    moved = sorted(r for r, group in by_rank.items() if len(group) > 1 or group[0][0].rank != r)
    merged = dict(zip(moved, run_all(client, merge_rank, [
        ([p.tables for p, _ in by_rank[r]], r, [o for _, o in by_rank[r]],
         scratch / f"rank{r}.parquet") for r in moved]), strict=True))
    if progress:
        progress("writing tables", total, total)
    steps, flows, counters = (_ranked(files, ranks, offsets if name == "steps" else None, name)
                              for name in SMALL_TABLES)
    return TableParts(steps, flows, counters, parquet_parts([
        merged.get(r) or by_rank[r][0][0].tables["events"] for r in sorted(by_rank)]))
