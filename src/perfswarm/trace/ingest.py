"""Import raw traces into a Run: read each file, merge ranks, mark steps, write tables (the
steps every path shares are trace/build.py's)."""

from __future__ import annotations

import os
import re
import shutil
import zlib
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from perfswarm.errors import ParameterError, PerfswarmError
from perfswarm.trace import gunzip, nsys
from perfswarm.trace.build import (
    Extent,
    ImportOptions,
    Progress,
    Streaming,
    TableParts,
    add_execution_traces,
    describe,
    in_memory,
    mend_steps,
    one_recording,
    process_ranks,
    ranks_seen,
    step_offsets,
    with_rank,
    write_tables,
)
from perfswarm.trace.cluster import connect
from perfswarm.trace.kineto import ReadOptions, TraceMeta, TraceTables, concat, memory_bytes
from perfswarm.trace.readers import execution_trace, memory_timeline, read_file
from perfswarm.trace.readers.fields import Placement
from perfswarm.trace.schema import COUNTERS
from perfswarm.trace.store import Manifest, Run, creating, new_manifest

__all__ = ["ImportOptions", "Streaming", "import_traces", "passed_over", "trace_files"]

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


def _read_all(run: Run, paths: Sequence[Path], options: ImportOptions, manifest: Manifest,
              progress: Progress | None) -> TableParts:
    """In memory: read every file, then sort and mark steps with numpy."""
    opts = ReadOptions(drop_bad_events=options.drop_bad_events)
    parts: list[TraceTables] = []
    read: list[tuple[Path, TraceMeta]] = []
    for i, path in enumerate(paths):
        if progress:
            progress(f"reading {path.name}", i, len(paths))
        meta, tables = read_file(path, i, opts, spill_dir=run.path)
        parts.append(tables)
        read.append((run.add_raw(path), meta))
    extents = [Extent.of(p.events) for p in parts]
    ranks = process_ranks(options, paths, [meta for _, meta in read], extents)
    offsets = step_offsets(ranks, extents, [p.steps.column("step").to_numpy() for p in parts])
    parts = [with_rank(p, rank, offset)
             for p, rank, offset in zip(parts, ranks, offsets, strict=True)]
    for (raw, meta), rank, p, extent in zip(read, ranks, parts, extents, strict=True):
        describe(manifest, raw, rank, meta, p.events.num_rows, extent)
    if progress:
        progress("writing tables", len(paths), len(paths))
    return in_memory(parts)


def _stream_all(run: Run, paths: Sequence[Path], options: ImportOptions, manifest: Manifest,
                progress: Progress | None) -> TableParts:
    """Bounded memory: spill each file's tables in batches, then merge out of core."""
    from perfswarm.trace import merge, stream

    opts = ReadOptions(drop_bad_events=options.drop_bad_events)
    spills = []
    read: list[tuple[Path, TraceMeta, int, Extent | None]] = []
    for i, path in enumerate(paths):
        if progress:
            progress(f"streaming {path.name}", i, len(paths))
        override = options.ranks[i] if options.ranks else None
        meta, spill, rows, extent = stream.spill_trace(path, i, opts, _scratch(run) / str(i),
                                                       override)
        spills.append(spill)
        read.append((run.add_raw(path), meta, rows, extent))
    ranks = process_ranks(options, paths, [r[1] for r in read], [r[3] for r in read])
    offsets = step_offsets(ranks, [r[3] for r in read], [
        pq.read_table(s["steps"], columns=["step"]).column("step").to_numpy() for s in spills])
    for (raw, meta, rows, extent), rank in zip(read, ranks, strict=True):
        describe(manifest, raw, rank, meta, rows, extent)
    if progress:
        progress("merging (out of core)", len(paths), len(paths))
    # A fixed budget, not a share of RAM: this path exists for inputs that do not fit,
    # and DuckDB spills its sort and joins to disk past it.
    return merge.merge(run, spills, ranks, offsets, _scratch(run), "512MB")


def _scratch(run: Run) -> Path:
    """Where the streaming and Dask paths leave their files until the tables are written."""
    return run.path / ".scratch"


_TRACE_SUFFIXES = (".pt.trace.json", ".pt.trace.json.gz")


def trace_files(paths: Sequence[Path]) -> list[Path]:
    """`paths` with each directory replaced by the trace files under it (what TensorBoard's
    profiler plugin writes, `*.pt.trace.json[.gz]`; else every `*.json[.gz]` but execution
    traces, `directory_execution_traces`), sorted."""
    out: list[Path] = []
    for p in paths:
        if not p.is_dir():
            out.append(p)
            continue
        found = [f for f in _under(p)[0] if not is_execution_trace(f)]
        if not found:
            raise PerfswarmError(f"{p}: a directory of execution traces only; one is read "
                                 "beside its Kineto trace (torch.profiler's export)")
        out += found
    return out


def directory_execution_traces(paths: Sequence[Path]) -> list[Path]:
    """The execution traces (ExecutionTraceObserver's) among the files a directory of `paths`
    stands for, as torch's docs lay them out beside the Kineto trace: read as `--et` (the
    directory had been refused, its execution trace read as a Kineto one)."""
    return [f for p in paths if p.is_dir() for f in _under(p)[0] if is_execution_trace(f)]


_ET_HEAD: Final = re.compile(rb'^\s*\{\s*"schema"\s*:')  # Kineto's is "schemaVersion"


def is_execution_trace(path: Path) -> bool:
    """Whether a JSON file opens as an execution trace does (`{"schema": ...`)."""
    return _ET_HEAD.match(_head(path, 256)) is not None


def _head(path: Path, size: int) -> bytes:
    """The first `size` bytes of a file's text (gunzipped if gzip by its magic, as every
    reader takes it); b"" where it cannot be read (its import says why)."""
    try:
        with gunzip.open_text(path) as f:
            return f.read(size)
    except (OSError, EOFError, zlib.error):
        return b""


def passed_over(paths: Sequence[Path]) -> list[Path]:
    """The files under the directories among `paths` that look like traces and that
    `trace_files` leaves out (the other `*.json[.gz]` and `*.sqlite` where it found
    `*.pt.trace.json[.gz]`)."""
    return [f for p in paths if p.is_dir() for f in _under(p)[1]]


def _under(directory: Path) -> tuple[list[Path], list[Path]]:
    """The trace files under `directory` and the others that look like traces."""
    files = sorted(f for f in directory.rglob("*") if f.is_file())
    named = [f for f in files if f.name.endswith(_TRACE_SUFFIXES)]
    other = [f for f in files if f.name.endswith((".json", ".json.gz", ".sqlite"))
             and f not in named]
    if not named and not other:
        raise PerfswarmError(f"{directory}: a directory with no trace files (*.json, "
                             "*.json.gz, *.sqlite)")
    return (named, other) if named else (other, [])


def import_traces(paths: Sequence[Path], out: Path, options: ImportOptions,
                  command: list[str], progress: Progress | None = None) -> Run:
    """Create the Run `out` from Kineto trace files or Nsight Systems SQLite exports (one per
    rank; a directory stands for the trace files under it) and execution traces."""
    if not options.execution_traces:
        options = replace(options, execution_traces=tuple(directory_execution_traces(paths)))
    paths = trace_files(paths)
    if not paths:
        raise PerfswarmError("no trace files given")
    if options.ranks and len(options.ranks) != len(paths):
        raise ParameterError("ranks", f"given {len(options.ranks)} times for {len(paths)} files")
    for r in options.ranks:
        if not 0 <= r < 2**31:
            raise ParameterError("ranks", f"out of range (0 to {2**31 - 1})", value=r)
    extras = (*options.execution_traces, *options.memory_timelines)
    for p in (*paths, *extras):
        if not p.is_file():
            raise PerfswarmError(f"{p}: no such file")
    manifest = new_manifest(command, complete=True)
    # a trace does not say what host recorded it: this one only imported it
    manifest["host"] = {"cores": None, "imported_on": manifest["host"]}
    manifest["exit_status"] = 0
    streamed = any(wants_streaming(p, options.streaming) for p in paths)
    with creating(out, force=options.force, inputs=(*paths, *extras)) as run:
        if not streamed and options.cluster.parallel(len(paths)):
            from perfswarm.trace.parallel import import_parallel

            with connect(options.cluster, len(paths)) as client:
                tables = import_parallel(run, paths, options, manifest, progress, client,
                                         _scratch(run))
        else:
            read = _stream_all if streamed else _read_all
            tables = read(run, paths, options, manifest, progress)
        one_recording(manifest, paths)
        write_tables(run, tables)
        mend_steps(run)
        shutil.rmtree(_scratch(run), ignore_errors=True)
        ranks_seen(manifest)
        if options.execution_traces:
            for et_path in options.execution_traces:
                run.add_raw(et_path)
            add_execution_traces(run, manifest, _et_ranks(options.execution_traces, manifest),
                                 execution_trace.read)
        if options.memory_timelines:
            _add_memory_timelines(run, _by_rank(options.memory_timelines, manifest), manifest)
        run.write_manifest(manifest)
    if progress:
        progress("done", len(paths), len(paths))
    return Run(out)


def _by_rank(paths: Sequence[Path], manifest: Manifest) -> list[tuple[Path, int]]:
    """Each file beside the traces with its rank: the j-th belongs to the j-th rank imported
    (past the last, rank j)."""
    ranks = manifest["ranks"]
    return [(p, ranks[j] if j < len(ranks) else j) for j, p in enumerate(paths)]


_ET_PID: Final = re.compile(rb'"pid"\s*:\s*(\d+)')


def _et_ranks(paths: Sequence[Path], manifest: Manifest) -> list[tuple[Path, int]]:
    """Each execution trace with the rank of the trace files whose host process it names
    (its header's `pid`: a directory's ETs in name order had landed on each other's ranks,
    and a process's second window's on a rank the Run does not have), else by order
    (_by_rank)."""
    by_pid: dict[int, set[int]] = {}
    for source in manifest["sources"]:
        for pid in source.get("host_pids", ()):
            by_pid.setdefault(int(pid), set()).add(int(source["rank"]))
    out = []
    for path, rank in _by_rank(paths, manifest):
        found = _ET_PID.search(_head(path, 512))
        ranks = by_pid.get(int(found[1]), set()) if found else set()
        out.append((path, next(iter(ranks)) if len(ranks) == 1 else rank))
    return out


def _add_memory_timelines(run: Run, paths: Sequence[tuple[Path, int]],
                          manifest: Manifest) -> None:
    """Each memory timeline's counters join the Run's."""
    parts = [run.table("counters")]
    for path, rank in paths:
        found = memory_timeline.read(path, Placement(rank=rank))
        parts.append(found.counters)
        run.add_raw(path)
        manifest["sources"].append({"file": path.name, "format": found.format,
                                    "rank": rank, "counters": parts[-1].num_rows})
    counters = concat(parts, COUNTERS)
    order = np.lexsort((counters.column("ts").to_numpy(), counters.column("rank").to_numpy()))
    run.write_table("counters", counters.take(pa.array(order)))
