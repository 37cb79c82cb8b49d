"""Import raw traces into a Run: read each file, merge ranks, mark steps, write tables."""

from __future__ import annotations

import os
import shutil
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from perfswarm.errors import PerfswarmError
from perfswarm.trace import execution_trace, nsys
from perfswarm.trace.cluster import ClusterOptions, connect
from perfswarm.trace.kineto import (
    ReadOptions,
    TraceMeta,
    TraceTables,
    concat,
    memory_bytes,
    read_trace,
)
from perfswarm.trace.schema import COUNTERS, DEVICE_KINDS, EVENTS, FLOWS, NONE, STEPS
from perfswarm.trace.store import Manifest, Run, Warning_, creating, new_manifest

Streaming = Literal["auto", "always", "never"]
Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class ImportOptions:
    ranks: tuple[int, ...] = ()
    execution_traces: tuple[Path, ...] = ()
    drop_bad_events: bool = False
    streaming: Streaming = "auto"
    force: bool = False
    cluster: ClusterOptions = field(default_factory=ClusterOptions)  # not when streaming


def uncompressed_size(path: Path) -> int:
    """Size of the JSON text: the gzip trailer's ISIZE (mod 4 GiB, so bounded below by the file)."""
    size = path.stat().st_size
    with path.open("rb") as f:
        if f.read(2) != b"\x1f\x8b" or size < 18:  # 18: the smallest gzip file
            return size
        f.seek(-4, os.SEEK_END)
        isize = int.from_bytes(f.read(4), "little")
    # ISIZE wraps at 4 GiB; compressed traces shrink about 10x, so never trust less than that.
    return max(isize, size * 10) if size > (1 << 31) // 10 else isize


def wants_streaming(path: Path, mode: Streaming) -> bool:
    """Stream files whose JSON exceeds a quarter of RAM (decoded, a trace takes ~3x its text)."""
    if nsys.is_nsys(path):
        return False  # SQLite is read with queries, not decoded whole
    if mode != "auto":
        return mode == "always"
    return uncompressed_size(path) > memory_bytes() // 4


def assign_steps(events: pa.Table, steps: pa.Table) -> pa.Table:
    """Set `step` on every event: host events by time, device events by their launch's step."""
    if steps.num_rows == 0 or events.num_rows == 0:
        return events
    return events.set_column(events.schema.get_field_index("step"), "step",
                             pa.array(step_column(events, steps), pa.int32()))


def step_column(events: pa.Table, steps: pa.Table) -> npt.NDArray[np.int32]:
    """The step of each row of `events` (sorted by rank, ts; needs rank, ts, kind, correlation)."""
    rank = events.column("rank").to_numpy()
    ts = events.column("ts").to_numpy()
    step = np.full(events.num_rows, NONE, np.int32)
    s_rank = steps.column("rank").to_numpy()
    s_start = steps.column("start").to_numpy()
    s_end = steps.column("end").to_numpy()
    s_num = steps.column("step").to_numpy()
    for r in np.unique(s_rank):
        mine = np.flatnonzero(s_rank == r)
        mine = mine[np.argsort(s_start[mine], kind="stable")]
        rows = np.flatnonzero(rank == r)
        idx = np.searchsorted(s_start[mine], ts[rows], side="right") - 1
        inside = idx >= 0
        inside[inside] = ts[rows][inside] < s_end[mine][idx[inside]]
        step[rows[inside]] = s_num[mine][idx[inside]]

    kinds = events.column("kind").combine_chunks()
    assert isinstance(kinds, pa.DictionaryArray)
    kind_names = kinds.dictionary.to_pylist()
    kind_idx = kinds.indices.to_numpy(zero_copy_only=False)
    launch_codes = [i for i, k in enumerate(kind_names) if k in ("runtime", "driver")]
    device_codes = [i for i, k in enumerate(kind_names) if k in DEVICE_KINDS]
    corr = events.column("correlation").to_numpy()
    is_launch = np.isin(kind_idx, launch_codes) & (corr != NONE)
    is_device = np.isin(kind_idx, device_codes) & (corr != NONE)
    for r in np.unique(rank[is_device]):
        launches = np.flatnonzero(is_launch & (rank == r))
        devices = np.flatnonzero(is_device & (rank == r))
        order = launches[np.argsort(corr[launches], kind="stable")]
        keys = corr[order]
        pos = np.clip(np.searchsorted(keys, corr[devices]), 0, max(len(keys) - 1, 0))
        if not len(keys):
            continue
        found = keys[pos] == corr[devices]
        step[devices[found]] = step[order[pos[found]]]
    return step


def event_order(events: pa.Table) -> npt.NDArray[np.int64]:
    """Order by rank then time, stable: the same input always gives the same table."""
    return np.lexsort((events.column("ts").to_numpy(), events.column("rank").to_numpy()))


def sort_events(events: pa.Table) -> pa.Table:
    return events.take(pa.array(event_order(events)))


SLICE = 16_384


def take_rows(batches: Sequence[pa.RecordBatch], starts: npt.NDArray[np.int64],
              rows: npt.NDArray[np.int64]) -> pa.Table:
    """table.take(rows) for a chunked table without concatenating its chunks first
    (pyarrow's take on chunked columns copies each whole column)."""
    chunk = np.searchsorted(starts, rows, side="right") - 1
    grouped = np.argsort(chunk, kind="stable")
    parts = []
    for c in np.unique(chunk):
        mine = grouped[chunk[grouped] == c]
        parts.append(pa.Table.from_batches([batches[c].take(pa.array(rows[mine] - starts[c]))]))
    table = pa.concat_tables(parts).combine_chunks()
    back = np.empty(len(rows), np.int64)
    back[grouped] = np.arange(len(rows))
    return table.take(pa.array(back))


def sorted_slices(events: pa.Table, steps: pa.Table) -> Iterator[pa.Table]:
    """`events` sorted by (rank, ts) with steps marked, in slices: memory holds the table
    plus one slice."""
    order = event_order(events)
    keys = events.select(["rank", "ts", "kind", "correlation"]).take(pa.array(order))
    step = (step_column(keys, steps) if steps.num_rows and events.num_rows
            else np.full(events.num_rows, NONE, np.int32))
    del keys
    at = events.schema.get_field_index("step")
    batches = events.to_batches()
    starts = np.cumsum([0] + [b.num_rows for b in batches[:-1]], dtype=np.int64)
    for i in range(0, len(order), SLICE):
        part = take_rows(batches, starts, order[i:i + SLICE])
        yield part.set_column(at, "step", pa.array(step[i:i + SLICE], pa.int32()))


def _warnings(source: str, counts: Counter[str]) -> list[Warning_]:
    return [Warning_(source=source, what=w, count=n) for w, n in sorted(counts.items()) if n]


def file_rank(options: ImportOptions, i: int, meta: TraceMeta) -> int:
    if options.ranks:
        if meta.rank not in (None, options.ranks[i]):
            meta.warnings[f"--rank {options.ranks[i]} overrides distributedInfo rank "
                          f"{meta.rank}"] += 1
        return options.ranks[i]
    return meta.rank if meta.rank is not None else i


def _read_all(run: Run, paths: Sequence[Path], options: ImportOptions, manifest: Manifest,
              progress: Progress | None) -> pa.Table:
    """In memory: read every file, then sort and mark steps with numpy. Returns events."""
    opts = ReadOptions(drop_bad_events=options.drop_bad_events)
    events_parts: list[pa.Table] = []
    others: list[TraceTables] = []
    for i, path in enumerate(paths):
        if progress:
            progress(f"reading {path.name}", i, len(paths))
        meta, tables = (nsys.read(path, i) if nsys.is_nsys(path)
                        else read_trace(path, i, opts, spill_dir=run.path))
        rank = file_rank(options, i, meta)
        tables = with_rank(tables, rank)
        events_parts.append(tables.events)
        others.append(TraceTables(EVENTS.empty_table(), tables.flows, tables.counters,
                                  tables.steps))
        del tables
        describe(manifest, run.add_raw(path), rank, meta, events_parts[-1].num_rows)
    if progress:
        progress("writing tables", len(paths), len(paths))
    steps = concat([p.steps for p in others], STEPS)
    run.write_table("steps", steps)
    run.write_table("flows", concat([p.flows for p in others], FLOWS))
    run.write_table("counters", concat([p.counters for p in others], COUNTERS))
    del others
    unsorted = concat(events_parts, EVENTS)
    del events_parts
    run.write_batches("events", sorted_slices(unsorted, steps))
    return unsorted.select(["rank", "rf_id", "external_id"])


def _stream_all(run: Run, paths: Sequence[Path], options: ImportOptions, manifest: Manifest,
                progress: Progress | None) -> pa.Table:
    """Bounded memory: spill each file's tables in batches, then merge out of core."""
    from perfswarm.trace import merge, stream

    opts = ReadOptions(drop_bad_events=options.drop_bad_events)
    scratch = run.path / ".scratch"
    spills = []
    for i, path in enumerate(paths):
        if progress:
            progress(f"streaming {path.name}", i, len(paths))
        override = options.ranks[i] if options.ranks else None
        meta, spill, rows = stream.spill_trace(path, i, opts, scratch / str(i), override)
        spills.append(spill)
        describe(manifest, run.add_raw(path), file_rank(options, i, meta), meta, rows)
    if progress:
        progress("merging (out of core)", len(paths), len(paths))
    # A fixed budget, not a share of RAM: this path exists for inputs that do not fit,
    # and DuckDB spills its sort and joins to disk past it.
    limit = "512MB"
    merge.merge(run, spills, scratch, limit)
    shutil.rmtree(scratch, ignore_errors=True)
    return run.table("events", ["rank", "rf_id", "external_id"])


_TRACE_SUFFIXES = (".pt.trace.json", ".pt.trace.json.gz")


def trace_files(paths: Sequence[Path]) -> list[Path]:
    """`paths` with each directory replaced by the trace files under it (what TensorBoard's
    profiler plugin writes, `*.pt.trace.json[.gz]`; else every `*.json[.gz]`), sorted."""
    out: list[Path] = []
    for p in paths:
        if not p.is_dir():
            out.append(p)
            continue
        files = sorted(f for f in p.rglob("*") if f.is_file())
        found = ([f for f in files if f.name.endswith(_TRACE_SUFFIXES)]
                 or [f for f in files if f.name.endswith((".json", ".json.gz", ".sqlite"))])
        if not found:
            raise PerfswarmError(f"{p}: a directory with no trace files (*.json, *.json.gz,"
                                 " *.sqlite)")
        out += found
    return out


def import_traces(paths: Sequence[Path], out: Path, options: ImportOptions,
                  command: list[str], progress: Progress | None = None) -> Run:
    """Create the Run `out` from Kineto trace files or Nsight Systems SQLite exports (one per
    rank; a directory stands for the trace files under it) and execution traces."""
    paths = trace_files(paths)
    if not paths:
        raise PerfswarmError("no trace files given")
    if options.ranks and len(options.ranks) != len(paths):
        raise PerfswarmError(f"--rank given {len(options.ranks)} times for {len(paths)} files")
    for r in options.ranks:
        if not 0 <= r < 2**31:
            raise PerfswarmError(f"--rank {r}: out of range (0 to {2**31 - 1})")
    for p in (*paths, *options.execution_traces):
        if not p.is_file():
            raise PerfswarmError(f"{p}: no such file")
    manifest = new_manifest(command, complete=True)
    manifest["exit_status"] = 0
    streamed = any(wants_streaming(p, options.streaming) for p in paths)
    with creating(out, force=options.force,
                  inputs=(*paths, *options.execution_traces)) as run:
        if (not streamed and options.cluster.parallel(len(paths))
                and not any(map(nsys.is_nsys, paths))):
            from perfswarm.trace.parallel import import_parallel

            with connect(options.cluster, len(paths)) as client:
                events = import_parallel(run, paths, options, manifest, progress, client)
        else:
            read = _stream_all if streamed else _read_all
            events = read(run, paths, options, manifest, progress)
        ranks_seen(manifest)
        for j, et_path in enumerate(options.execution_traces):
            et_rank = manifest["ranks"][j] if j < len(manifest["ranks"]) else j
            nodes, edges, counts = execution_trace.read(et_path, et_rank, events)
            run.add_raw(et_path)
            run.write_table("graph_nodes", nodes)
            run.write_table("graph_edges", edges)
            manifest["warnings"] += _warnings(et_path.name, counts)
            manifest["sources"].append({"file": et_path.name, "format": "execution_trace",
                                        "rank": et_rank, "nodes": nodes.num_rows})
        run.write_manifest(manifest)
    if progress:
        progress("done", len(paths), len(paths))
    return Run(out)


def with_rank(tables: TraceTables, rank: int) -> TraceTables:
    def set_rank(t: pa.Table) -> pa.Table:
        col = pa.array(np.full(t.num_rows, rank, np.int32))
        return t.set_column(t.schema.get_field_index("rank"), "rank", col)

    return TraceTables(set_rank(tables.events), set_rank(tables.flows),
                       set_rank(tables.counters), set_rank(tables.steps))


def describe(manifest: Manifest, raw: Path, rank: int, meta: TraceMeta, events: int) -> None:
    manifest["sources"].append(
        {
            "file": raw.name,
            "format": meta.info.get("format", "kineto"),
            "rank": rank,
            "base_time_ns": meta.base_ns,
            "events": events,
            "distributed": meta.distributed,
            "info": meta.info,
        }
    )
    manifest["clock_offsets"][f"{meta.info.get('format', 'kineto')}:{raw.name}"] = meta.base_ns
    for dev in meta.devices:
        manifest["devices"].append({"rank": rank, **dev})
    for pid, name in meta.processes.items():
        manifest["processes"][f"{rank}:{pid}"] = name
    for key, name in meta.threads.items():
        manifest["threads"][f"{rank}:{key}"] = name
    manifest["warnings"] += _warnings(raw.name, meta.warnings)


def ranks_seen(manifest: Manifest) -> None:
    ranks = [int(s["rank"]) for s in manifest["sources"]]
    dupes = sorted({r for r in ranks if ranks.count(r) > 1})
    for r in dupes:
        manifest["warnings"].append(Warning_(source="import", count=ranks.count(r),
                                             what=f"several files claim rank {r}"))
    manifest["ranks"] = sorted(set(ranks))
