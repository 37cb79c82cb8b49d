"""What every path that builds a Run from traces shares (in memory, streaming, Dask, record):
the import options, the events' order and step marks, each file's rank, the one writer of the
trace tables (`write_tables`), the execution traces' graph tables, and the manifest's account
of its sources.

Each path hands `write_tables` its tables as `TableParts`: in memory (import and record) they
are sorted and marked with numpy (`in_memory`); Dask workers sort and mark each rank with the
same `sorted_slices` (trace/parallel.py); the streaming path sorts and marks out of core with
DuckDB, in the same order (trace/merge.py, tested against the in-memory path).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from perfswarm.errors import PerfswarmError
from perfswarm.trace import store
from perfswarm.trace.cluster import ClusterOptions
from perfswarm.trace.kineto import MappedFile, TraceMeta, TraceTables, concat
from perfswarm.trace.readers import execution_trace
from perfswarm.trace.readers.fields import Placement, SideTables
from perfswarm.trace.schema import (
    COUNTERS,
    DEVICE_KINDS,
    EVENTS,
    FLOWS,
    GRAPH_EDGES,
    GRAPH_NODES,
    NONE,
    PROFILED,
    PROFILER_STEP,
    STEPS,
    TAIL,
    TRACE_TABLES,
    among,
    window_ends,
)
from perfswarm.trace.store import Manifest, Run, Warning_

Streaming = Literal["auto", "always", "never"]
Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class ImportOptions:
    ranks: tuple[int, ...] = ()
    execution_traces: tuple[Path, ...] = ()
    memory_timelines: tuple[Path, ...] = ()  # torch.profiler's, one per rank, in rank order
    drop_bad_events: bool = False
    streaming: Streaming = "auto"
    force: bool = False
    cluster: ClusterOptions = field(default_factory=ClusterOptions)  # not when streaming


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
    is_launch = among(kind_idx, launch_codes, len(kind_names)) & (corr != NONE)
    is_device = among(kind_idx, device_codes, len(kind_names)) & (corr != NONE)
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
    del parts  # the per-batch takes, before the last take copies the rows once more
    back = np.empty(len(rows), np.int64)
    back[grouped] = np.arange(len(rows))
    return table.take(pa.array(back))


def sorted_slices(events: pa.Table, steps: pa.Table,
                  mapped: Sequence[MappedFile] = ()) -> Iterator[pa.Table]:
    """`events` sorted by (rank, ts) with steps marked, in slices: memory holds the table
    plus one slice. Where the table's columns are read from `mapped` files in place (the
    in-memory path's spill), the pages each slice read are dropped before the next is taken:
    memory holds one slice's pages of them, not the whole table."""
    order = event_order(events)
    keys = events.select(["rank", "ts", "kind", "correlation"]).take(pa.array(order))
    step = (step_column(keys, steps) if steps.num_rows and events.num_rows
            else np.full(events.num_rows, NONE, np.int32))
    del keys
    at = events.schema.get_field_index("step")
    batches = events.to_batches()
    starts = np.cumsum([0] + [b.num_rows for b in batches[:-1]], dtype=np.int64)
    for i in range(0, len(order), SLICE):
        for file in mapped:  # the pages the slice before read (the first: the sort's)
            file.drop_pages()
        # yielded, not kept: the slice before is not held while the next one is taken
        yield take_rows(batches, starts, order[i:i + SLICE]).set_column(
            at, "step", pa.array(step[i:i + SLICE], pa.int32()))


@dataclass(frozen=True)
class TableParts:
    """A Run's trace tables as a path that builds them hands them over, each in consecutive
    parts (memory holds one part): steps, flows and counters in their sources' order, the
    events sorted by rank then time with their steps marked."""

    steps: Iterable[pa.Table]
    flows: Iterable[pa.Table]
    counters: Iterable[pa.Table]
    events: Iterable[pa.Table]


def write_tables(run: Run, tables: TableParts) -> None:
    """The one writer of a Run's trace tables, whichever path built them: in memory and
    record (`in_memory`), streaming (trace/merge.py) or Dask (trace/parallel.py)."""
    for name in TRACE_TABLES:
        run.write_batches(name, getattr(tables, name))


def in_memory(parts: Sequence[TraceTables]) -> TableParts:
    """The trace tables of every source's parts held in memory (trace files, the recorder's
    syscalls, counters and hook steps): the events sorted and marked with numpy, in slices."""
    steps = concat([p.steps for p in parts], STEPS)
    return TableParts([steps], [concat([p.flows for p in parts], FLOWS)],
                      [concat([p.counters for p in parts], COUNTERS)],
                      sorted_slices(concat([p.events for p in parts], EVENTS), steps,
                                    [file for p in parts for file in p.mapped]))


def parquet_parts(paths: Iterable[Path]) -> Iterator[pa.Table]:
    """The rows of Parquet files a path left in scratch, in order, ROW_GROUP rows at a time."""
    for path in paths:
        for batch in pq.ParquetFile(path).iter_batches(batch_size=store.ROW_GROUP):
            yield pa.Table.from_batches([batch])


def add_execution_traces(run: Run, manifest: Manifest, traces: Sequence[tuple[Path, int]],
                         read: Callable[[Path, Placement], SideTables | None]) -> None:
    """The graph tables of every (execution trace, rank) as `read` gives them (None: that
    trace is left out, its reason already in the manifest), written together; each trace a
    source in the manifest, what its join to the Run's events found amiss a warning."""
    nodes, edges = [], []
    events: pa.Table | None = None
    for path, rank in traces:
        found = read(path, Placement(rank=rank))
        if found is None:
            continue
        if events is None:
            events = run.table("events", ["rank", "rf_id", "external_id", "name"])
        nodes.append(found.graph_nodes)
        edges.append(found.graph_edges)
        manifest["warnings"] += source_warnings(path.name, Counter(found.warnings)
                                                + execution_trace.join_warnings(
                                                    found.graph_nodes, events, rank))
        manifest["sources"].append({"file": path.name, "format": found.format,
                                    "rank": rank, "nodes": found.graph_nodes.num_rows})
    run.write_table("graph_nodes", concat(nodes, GRAPH_NODES))
    run.write_table("graph_edges", concat(edges, GRAPH_EDGES))


def source_warnings(source: str, counts: Counter[str]) -> list[Warning_]:
    return [Warning_(source=source, what=w, count=n) for w, n in sorted(counts.items()) if n]


def file_rank(options: ImportOptions, i: int, meta: TraceMeta) -> int:
    """The rank the `i`-th file names (`--rank`, else its distributedInfo or file name), else
    `i` (see `process_ranks`)."""
    if options.ranks:
        return options.ranks[i]
    return meta.rank if meta.rank is not None else i


SEPARATE_RUNS_NS = 1_000_000_000  # processes whose recordings are this far apart are two runs
DATA_WORKER: Final = "pt_data_worker"  # the name torch's DataLoader gives its workers' threads


def data_worker(meta: TraceMeta) -> bool:
    """A DataLoader worker process's trace: each thread it names is `DATA_WORKER`
    ("thread 19328 (pt_data_worker)")."""
    return bool(meta.threads) and all(DATA_WORKER in n for n in meta.threads.values())


def process_ranks(options: ImportOptions, paths: Sequence[Path], metas: Sequence[TraceMeta],
                  extents: Sequence[Extent | None]) -> list[int]:
    """Each file's rank. One that names its rank (`--rank`, distributedInfo, its file name)
    keeps it; the others take one rank per host process: a file whose host process is one an
    earlier file's group holds, at other times than every file of that group, is that
    process's next window (a profiler schedule's cycles, or a process exporting each window
    to a file of its own, as torch's docs show in `on_trace_ready`: each had been a rank, and
    advise had called the one holding the warm-up step a straggler). Files of one process id
    over the same time stay apart (hosts reuse ids: two containers' ranks may both be pid 1).
    Numbered by their first file, 0, 1, ..., past the ranks other files name (by a file's
    position, a process had taken rank 2 beside a file named rank-2). Where no file names a
    rank, processes whose recordings lie apart from every
    other's, by a second and ten times the longer one, are other runs of the program, not
    ranks of one job (a script run twice into one TensorBoard log dir had been two ranks of a
    job spanning 9.5 minutes): refused. A DataLoader worker's file that names no rank
    (`data_worker`) is of the one rank the other files make, where they make one: the
    recorder's files renamed (the worker's name, `torch-rank0-pid{P}`, had given the rank) had
    each worker a rank of its own, a phantom rank that ran no step."""
    named = [bool(options.ranks) or m.rank is not None for m in metas]
    for given, meta in zip(options.ranks, metas, strict=False):  # no --rank: none
        if meta.rank not in (None, given):
            meta.warnings[f"--rank {given} overrides distributedInfo rank {meta.rank}"] += 1
    groups: list[tuple[int, list[Extent]]] = []  # (first file, its files' extents)
    out = []
    for i, (meta, extent) in enumerate(zip(metas, extents, strict=True)):
        if named[i]:
            out.append(file_rank(options, i, meta))
            continue
        joined = next((g for g, (_, seen) in enumerate(groups) if extent is not None and any(
            extent.pids & e.pids for e in seen) and not any(
            extent.start < e.end and e.start < extent.end for e in seen)), None)
        if joined is None:
            joined = len(groups)
            groups.append((i, []))
        if extent is not None:
            groups[joined][1].append(extent)
        out.append(joined)
    taken = {r for r, n in zip(out, named, strict=True) if n}
    free = iter(r for r in itertools.count() if r not in taken)
    number = [next(free) for _ in groups]  # each process's, by its first file
    out = [r if n else number[r] for r, n in zip(out, named, strict=True)]
    workers = [not n and data_worker(m) for m, n in zip(metas, named, strict=True)]
    parents = {r for r, w in zip(out, workers, strict=True) if not w}
    if len(parents) == 1:
        parent = parents.pop()
        out = [parent if w else r for r, w in zip(out, workers, strict=True)]
    spans = [(min(e.start for e in seen), max(e.end for e in seen), first)
             for first, seen in groups if seen]
    for start, end, first in spans if len(spans) > 1 and not any(named) else ():
        others = [(s, e, f) for s, e, f in spans if f != first]
        gap, nearest = min((max(start, s) - min(end, e), f) for s, e, f in others)
        longest = max(end - start, *(e - s for s, e, f in others if f == nearest))
        # apart by a second and ten times the longer one: processes that ran together may
        # profile windows tens of ms apart
        if gap >= max(SEPARATE_RUNS_NS, 10 * longest):
            raise _two_recordings(paths[min(first, nearest)], paths[max(first, nearest)],
                                  "with no rank named", _apart(gap))
    return out


def step_offsets(ranks: Sequence[int], extents: Sequence[Extent | None],
                 steps: Sequence[npt.NDArray[np.int32]]) -> list[int]:
    """What to add to each file's step numbers: a rank's files in time order, a file whose
    numbers meet an earlier file's continues after them. Each profiler counts its
    ProfilerStep#N from 0, so two profilers of one process (a training window, then an
    evaluation one, into one log dir) both held steps 2-4: each step had merged a training
    step and an evaluation step 30 ms later."""
    seen: dict[int, set[int]] = {}
    out = [0] * len(ranks)
    order = sorted(range(len(ranks)), key=lambda i: (e.start if (e := extents[i]) else 0, i))
    for i in order:
        mine, before = set(steps[i].tolist()), seen.setdefault(ranks[i], set())
        if mine & before:
            out[i] = max(before) + 1 - min(mine)
        before.update(n + out[i] for n in mine)
    return out


def shift_steps(table: pa.Table, offset: int) -> pa.Table:
    """A steps table with `offset` added to its step numbers."""
    if not offset:
        return table
    col = pa.array(table.column("step").to_numpy() + offset, pa.int32())
    return table.set_column(table.schema.get_field_index("step"), "step", col)


def set_rank(table: pa.Table, rank: int) -> pa.Table:
    """`table` with every row's rank `rank`."""
    col = pa.array(np.full(table.num_rows, rank, np.int32))
    return table.set_column(table.schema.get_field_index("rank"), "rank", col)


def with_rank(tables: TraceTables, rank: int, step_offset: int = 0) -> TraceTables:
    """`tables` with every row's rank `rank`, `step_offset` added to the step numbers."""
    return TraceTables(set_rank(tables.events, rank), set_rank(tables.flows, rank),
                       set_rank(tables.counters, rank),
                       shift_steps(set_rank(tables.steps, rank), step_offset), tables.mapped)


@dataclass(frozen=True)
class Extent:
    """Where a trace file's events lie: the processes of its host events (the OS's ids; a
    trace's instants and counters carry 0 or -1) and the time its events span (ns): what tells
    one recording from another."""

    pids: frozenset[int]
    start: int
    end: int

    @staticmethod
    def of(events: pa.Table) -> Extent | None:
        """The extent of an events table (None without events)."""
        if not events.num_rows:
            return None
        ts = events.column("ts").to_numpy()
        end = ts + events.column("dur").to_numpy()
        pids = events.column("pid").to_numpy()
        pids = pids[(events.column("device").to_numpy() == NONE) & (pids > 0)]  # an OS's
        return Extent(frozenset(np.unique(pids).tolist()), int(ts.min()), int(end.max()))

    def union(self, other: Extent | None) -> Extent:
        if other is None:
            return self
        return Extent(self.pids | other.pids, min(self.start, other.start),
                      max(self.end, other.end))


def describe(manifest: Manifest, raw: Path, rank: int, meta: TraceMeta, events: int,
             extent: Extent | None) -> None:
    manifest["sources"].append(
        {
            "file": raw.name,
            "format": meta.info.get("format", "kineto"),
            "rank": rank,
            "base_time_ns": meta.base_ns,
            "events": events,
            "distributed": meta.distributed,
            "info": meta.info,
            **({"host_pids": sorted(extent.pids), "span_ns": [extent.start, extent.end]}
               if extent is not None else {}),
            **({"data_worker": True} if data_worker(meta) else {}),
        }
    )
    manifest["clock_offsets"][f"{meta.info.get('format', 'kineto')}:{raw.name}"] = meta.base_ns
    for dev in meta.devices:
        manifest["devices"].append({"rank": rank, **dev})
    for pid, name in meta.processes.items():
        manifest["processes"][f"{rank}:{pid}"] = name
    for key, name in meta.threads.items():
        manifest["threads"][f"{rank}:{key}"] = name
    labels = manifest.setdefault("process_labels", {})
    for pid, label in meta.process_labels.items():
        labels[f"{rank}:{pid}"] = label
    manifest["warnings"] += source_warnings(raw.name, meta.warnings)


def one_recording(manifest: Manifest, paths: Sequence[Path]) -> None:
    """Refuse files of one rank that are two recordings, not parts of one: the same host
    process over the same time (a copy, or a recording of it edited), or files that nothing
    ties together, other processes at other times (another run of the program: a restart,
    another day). The files of one recording of a rank are tied by a process (its windows one
    after another, a profiler schedule's cycles) or by time (its DataLoader workers' files
    beside its own). `paths`: the files the manifest's sources were read from, in its order."""
    sources = [(path, s) for path, s in zip(paths, manifest["sources"], strict=True)
               if "span_ns" in s]
    group = list(range(len(sources)))  # union-find: the files tied together

    def root(i: int) -> int:
        while group[i] != i:
            i = group[i]
        return i

    for i, (path_a, a) in enumerate(sources):
        for j, (path_b, b) in enumerate(sources[:i]):
            if a["rank"] != b["rank"]:
                continue
            (a0, a1), (b0, b1) = a["span_ns"], b["span_ns"]
            overlap = a0 < b1 and b0 < a1
            shared = sorted(set(a["host_pids"]) & set(b["host_pids"]))
            if overlap and shared:
                raise _two_recordings(path_b, path_a, f"of rank {a['rank']}",
                                      f"process {shared[0]} over the same time")
            if overlap or shared:
                group[root(i)] = root(j)
    seen: dict[int, tuple[int, int]] = {}  # each rank's first file: its group, its index
    for i, (path_a, a) in enumerate(sources):
        mine, (theirs, j) = root(i), seen.setdefault(a["rank"], (root(i), i))
        if mine != theirs:
            path_b, b = sources[j]
            raise _two_recordings(path_b, path_a, f"of rank {a['rank']}", _apart(
                max(a["span_ns"][0], b["span_ns"][0]) - min(a["span_ns"][1], b["span_ns"][1])))


def _apart(gap_ns: int) -> str:
    gap = gap_ns / 1e9
    unit, name = next(((u, n) for u, n in ((86400, "days"), (3600, "hours"), (60, "minutes"))
                       if gap >= u), (1, "s"))
    return f"other processes, {gap / unit:,.1f} {name} apart"


def _two_recordings(a: Path, b: Path, of: str, why: str) -> PerfswarmError:
    return PerfswarmError(f"{a} and {b}: two recordings {of} ({why}); a Run holds one: "
                          "import each alone (`perfswarm diff A.run B.run` compares them)")


TAIL_SHARE = 0.1  # a last marker holding under this share of the other steps' events: a tail


def mend_steps(run: Run) -> None:
    """The steps table's marked steps as the analyses read their events, once the tables are
    written. A marked step ends no later than the trace window it began in
    (schema.window_ends: a profiler stopped inside a step closes its marker after its stop and
    export). Each rank's last ProfilerStep that holds no event but its marker, or under a
    tenth of the events its other marked steps hold (their median, of two or more), is a
    `tail`, not a step: a loop that ends inside the profiler's active steps calls `prof.step()`
    after its last step, which opens one more marker of microseconds, perhaps holding what the
    program ran after its loop (a `loss.item()`: 2 ops beside 210 a step). It had counted as a
    step: the step time 5% low, and with two real steps the median was the smaller one."""
    steps = run.table("steps")
    marked = np.flatnonzero(pc.equal(steps.column("source").cast(pa.string()), PROFILED)
                            .to_numpy(zero_copy_only=False))
    if not len(marked):
        return
    rank, start = steps.column("rank").to_numpy(), steps.column("start").to_numpy()
    step, end = steps.column("step").to_numpy(), steps.column("end").to_numpy()
    events = run.table("events", ["rank", "step", "name", "kind", "ts", "dur"])
    windows = np.flatnonzero(pc.equal(events.column("kind").cast(pa.string()), "trace_span")
                             .to_numpy(zero_copy_only=False))
    win_ts = events.column("ts").to_numpy()[windows]
    clipped = end.copy()
    clipped[marked] = window_ends(events.column("rank").to_numpy()[windows].astype(np.int64),
                                  win_ts, win_ts + events.column("dur").to_numpy()[windows],
                                  rank[marked].astype(np.int64), start[marked], end[marked])
    names = events.column("name").combine_chunks()
    assert isinstance(names, pa.DictionaryArray)
    marker = np.array([bool(v and PROFILER_STEP.match(v)) for v in names.dictionary.to_pylist()],
                      bool)[names.indices.to_numpy(zero_copy_only=False)]
    ev_rank, ev_step = events.column("rank").to_numpy(), events.column("step").to_numpy()
    tails = []
    for r in np.unique(rank[marked]).tolist():
        mine = marked[rank[marked] == r]
        mine = mine[np.argsort(start[mine], kind="stable")]
        numbers, counts = np.unique(ev_step[(ev_rank == r) & ~marker], return_counts=True)
        count_of = dict(zip(numbers.tolist(), counts.tolist(), strict=True))
        held = [count_of.get(int(step[i]), 0) for i in mine.tolist()]
        others = held[:-1]
        if held[-1] == 0 or (len(others) >= 2
                             and held[-1] < TAIL_SHARE * float(np.median(others))):
            tails.append(int(mine[-1]))
    if tails or not np.array_equal(clipped, end):
        source = steps.column("source").to_pylist()
        for i in tails:
            source[i] = TAIL
        steps = steps.set_column(steps.schema.get_field_index("source"), "source",
                                 pa.array(source))
        run.write_table("steps", steps.set_column(steps.schema.get_field_index("end"), "end",
                                                  pa.array(clipped, pa.int64())))


def ranks_seen(manifest: Manifest) -> None:
    """The manifest's ranks, and a warning for each that several files claim, unless they are
    one process's windows (one host process in all of them) and its DataLoader workers'."""
    own = [s for s in manifest["sources"] if not s.get("data_worker")]
    ranks = [int(s["rank"]) for s in own]
    processes: dict[int, set[tuple[int, ...]]] = {}
    for s in own:
        processes.setdefault(int(s["rank"]), set()).add(tuple(s.get("host_pids", ())))
    dupes = sorted({r for r in ranks if ranks.count(r) > 1
                    and not (len(processes[r]) == 1 and len(next(iter(processes[r]))) == 1)})
    for r in dupes:
        manifest["warnings"].append(Warning_(source="import", count=ranks.count(r),
                                             what=f"several files claim rank {r}"))
    manifest["ranks"] = sorted({int(s["rank"]) for s in manifest["sources"]})
