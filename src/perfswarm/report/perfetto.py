"""A Run as Chrome trace JSON in Kineto's shape: opens in Perfetto and chrome://tracing,
and imports back into the same tables (the round trip is tested), except stack samples:
they are written as thread instants (Perfetto reads no JSON samples) and come back as such.

Times are written relative to `baseTimeNanoseconds` as exact decimal microseconds
built from the integer nanoseconds (never through a float), so a re-import gets
every nanosecond back.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable, Iterator
from itertools import islice
from pathlib import Path
from typing import Any, Final

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from perfswarm.analyze.bandwidth import bandwidth
from perfswarm.analyze.frame import DEVICE_OPS, Events, group_rows, lane_key
from perfswarm.analyze.intervals import Coverage, union
from perfswarm.analyze.launch import launch_pairs, queue_steps
from perfswarm.errors import ParameterError, PerfswarmError
from perfswarm.trace.kineto import COLLECTIVE_KERNEL, DERIVED_COUNTERS
from perfswarm.trace.schema import NONE
from perfswarm.trace.store import Manifest, Run, check_output, write_output
from perfswarm.trace.timebase import us_json, us_texts

# Our kinds back to Kineto's categories (the inverse of kineto.CAT_KIND).
KIND_CATEGORY: Final[dict[str, str]] = {
    "cpu_op": "cpu_op",
    "user_annotation": "user_annotation",
    "gpu_annotation": "gpu_user_annotation",
    "python_function": "python_function",
    "runtime": "cuda_runtime",
    "driver": "cuda_driver",
    "kernel": "kernel",
    "memcpy": "gpu_memcpy",
    "memset": "gpu_memset",
    "sync": "cuda_sync",
    "collective": "collective_comm",
    "instant": "cpu_instant_event",
    "profiler_range": "cuda_profiler_range",
    "overhead": "overhead",
    "trace_span": "trace",
    "syscall": "syscall",
    "other": "other",
}

# Event columns written into `args` under Kineto's key names.
_ARG_COLUMNS: Final = (
    ("external_id", "External id"),
    ("correlation", "correlation"),
    ("device", "device"),
    ("stream", "stream"),
    ("rf_id", "Record function id"),
)
EXPORTED_ARG_KEYS: Final = frozenset(key for _, key in _ARG_COLUMNS)

UTILIZATION_BINS: Final = 100
GZIP_WBITS: Final = 31  # zlib's gzip header and trailer around the deflate stream
FLOW_ID_BITS: Final = 40  # a rank's flow ids below 2**40 (Kineto's count from 1), 2**53 in all

# Rows turned into Python objects, and events serialized, this many at a time: the trace is
# written in parts, never held whole (a 200k-event Run's had peaked at 10x its JSON's size).
BATCH: Final = 1024

_EVENT_COLUMNS: Final = ["rank", "ts", "dur", "kind", "name", "pid", "tid",
                         *(column for column, _ in _ARG_COLUMNS), "args"]


def _rows(table: pa.Table, base: int) -> Iterator[tuple[dict[str, Any], orjson.Fragment]]:
    """The table's rows as dicts, each with its `ts` less `base` as a JSON number, BATCH at a
    time."""
    for batch in table.to_batches(max_chunksize=BATCH):
        yield from zip(batch.to_pylist(), _times(batch, base), strict=True)


def _category(kind: str, name: str) -> str:
    # Communication kernels are `kernel` in Kineto; the reader turns them back by name.
    if kind == "collective" and COLLECTIVE_KERNEL.search(name):
        return "kernel"
    return KIND_CATEGORY.get(kind, "other")


def _args(raw: str | None, extra: dict[str, int]) -> orjson.Fragment | dict[str, Any]:
    if not extra:
        return orjson.Fragment((raw or "{}").encode())
    try:
        parsed = orjson.loads(raw or "{}")
    except orjson.JSONDecodeError:  # integers beyond 64 bits: the stdlib reads and writes any
        wide = json.loads(raw or "{}")
        wide = wide if isinstance(wide, dict) else {"args": wide}
        return orjson.Fragment(json.dumps({**wide, **extra}, ensure_ascii=False).encode())
    if not isinstance(parsed, dict):
        parsed = {"args": parsed}
    parsed.update(extra)
    return parsed


class _Pids:
    """pids of a one-rank run (or of the one rank exported) as they are; with several ranks,
    one number per (rank, pid) so that ranks do not share tracks, and flow ids made unique
    per rank (each rank's Kineto ids count from 1 alike: Perfetto would join the arrows of
    different ranks). An event of a rank not exported gets pid None and is dropped."""

    def __init__(self, ranks: list[int], only: int | None = None) -> None:
        self.only = only
        self.several = only is None and len(ranks) > 1
        self.ids: dict[tuple[int, int], int] = {}
        self.rank_index = {r: i for i, r in enumerate(sorted(ranks))}

    def __call__(self, rank: int, pid: int) -> int | None:
        if self.only is not None and rank != self.only:
            return None
        if not self.several:
            return pid
        return self.ids.setdefault((rank, pid), len(self.ids) + 1)

    def flow_id(self, rank: int, flow: int) -> int:
        return (self.rank_index.get(rank, 0) << FLOW_ID_BITS) | flow if self.several else flow


def _base_ns(run: Run) -> int:
    starts = [pc.min(run.table(name, ["ts"]).column("ts")).as_py()
              for name in ("events", "counters", "flows", "samples") if run.has_table(name)]
    known = [s for s in starts if s is not None]
    return min(known) if known else 0


def _times(batch: pa.RecordBatch, base: int) -> list[orjson.Fragment]:
    """The batch's `ts` less `base` as JSON numbers (us_json's), formatted a column at a time.
    ts - base >= 0 (base is the least ts) and below 2**64: exact as uint64 where the int64
    difference wraps."""
    ns = (batch.column("ts").to_numpy() - np.int64(base)).view(np.uint64)
    return [orjson.Fragment(text) for text in us_texts(ns)]


def _span_events(run: Run, base: int, pids: _Pids) -> Iterator[dict[str, Any]]:
    for batch in run.table("events", _EVENT_COLUMNS).to_batches(max_chunksize=BATCH):
        col = {name: batch.column(name).to_pylist() for name in _EVENT_COLUMNS
               if name not in ("ts", "dur")}
        ts = _times(batch, base)
        durations = batch.column("dur").to_numpy()
        dur = us_texts(durations)
        for i in range(batch.num_rows):
            kind, name = col["kind"][i], col["name"][i] or ""
            extra = {key: col[column][i] for column, key in _ARG_COLUMNS if col[column][i] != NONE}
            event: dict[str, Any] = {
                "ph": "X", "cat": _category(kind, name), "name": name,
                "pid": pids(col["rank"][i], col["pid"][i]), "tid": col["tid"][i],
                "ts": ts[i], "dur": orjson.Fragment(dur[i]),
                "args": _args(col["args"][i], extra),
            }
            if kind == "instant" and durations[i] == 0:
                event["ph"] = "i"
                event["s"] = "t"
                del event["dur"]
            yield event


def _host_pid(run: Run) -> dict[int, int]:
    """Each rank's most common host pid: where its host counters are drawn."""
    table = run.table("events", ["rank", "pid", "device"])
    host = table.filter(pc.equal(table.column("device"), NONE))
    counts = host.group_by(["rank", "pid"]).aggregate([("pid", "count")]).to_pylist()
    best: dict[int, tuple[int, int]] = {}
    for row in counts:
        key = (row["pid_count"], -row["pid"])
        if row["rank"] not in best or key > best[row["rank"]]:
            best[row["rank"]] = key
    return {rank: -key[1] for rank, key in best.items()}


def _system_pid(run: Run) -> int:
    """Where the host counters of no process are drawn (the system sampler's CPU, memory, disk
    and network, of rank -1: the machine's; a rank's without host events): pid 0, which no
    process has, unless a device's events or counters are there (Kineto's GPU 0), then one
    past every pid the Run uses."""
    used = set(pc.unique(run.table("events", ["pid"]).column("pid")).to_pylist())
    if run.has_table("counters"):
        used |= set(pc.unique(run.table("counters", ["device"]).column("device")).to_pylist())
    return 0 if 0 not in used else max(used) + 1


def _system_ranks(run: Run, host_pid: dict[int, int]) -> list[int]:
    """The ranks whose host counters are drawn on the system pid (no host process of theirs)."""
    if not run.has_table("counters"):
        return []
    table = run.table("counters", ["rank", "device"])
    host = table.filter(pc.less(table.column("device"), 0))
    return sorted(r for r in set(pc.unique(host.column("rank")).to_pylist())
                  if r not in host_pid)


def _counter_events(run: Run, base: int, pids: _Pids, system: int
                    ) -> Iterator[dict[str, Any]]:
    if not run.has_table("counters"):
        return
    table = run.table("counters")
    host_pid = _host_pid(run) if table.num_rows else {}
    for row, ts in _rows(table, base):
        # The reader names a counter `<event name>.<arg key>`; split it back the same way.
        group, _, key = str(row["name"]).rpartition(".")
        group = group or key  # a name without a dot (the recorder's `minor page faults`)
        pid = row["device"] if row["device"] >= 0 else host_pid.get(row["rank"], system)
        yield {"ph": "C", "name": group, "pid": pids(row["rank"], pid), "tid": 0,
               "ts": ts, "args": {key: row["value"]}}


def _derived_counter_events(run: Run, base: int, pids: _Pids, system: int
                            ) -> Iterator[dict[str, Any]]:
    """Per device: launched, unfinished ops per stream at every change, and the share of each
    of UTILIZATION_BINS time bins some op ran; per rank (on its host process): memory
    bandwidth per direction in analyze.bandwidth's bins."""
    ev = Events.load(run)
    host_pid = _host_pid(run) if len(ev) else {}

    def counter(name: str, rank: int, pid: int, ts: int, args: dict[str, Any]) -> dict[str, Any]:
        return {"ph": "C", "cat": DERIVED_COUNTERS, "name": name, "pid": pids(rank, pid), "tid": 0,
                "ts": us_json(ts - base), "args": args}

    dev, calls = launch_pairs(ev)
    for _key, at in sorted(group_rows(lane_key(ev.rank[dev], (ev.device[dev] << 20)
                                               | (ev.stream[dev] & 0xFFFFF)),
                                      np.arange(len(dev))).items()):
        ops = dev[at]
        rank, device, stream = (int(x[ops[0]]) for x in (ev.rank, ev.device, ev.stream))
        times, level = queue_steps(ev.ts[calls[at]], ev.end[ops])
        last = np.append(times[1:] != times[:-1], True)  # the level after all changes at a time
        for t, n in zip(times[last].tolist(), level[last].tolist(), strict=True):
            yield counter("queue length", rank, device, t, {f"stream {stream}": n})
    busy = np.flatnonzero(ev.of_kind(*DEVICE_OPS))
    for _key, ops in sorted(group_rows(lane_key(ev.rank[busy], ev.device[busy]), busy).items()):
        rank, device = int(ev.rank[ops[0]]), int(ev.device[ops[0]])
        lo, hi = int(ev.ts[ops].min()), int(ev.end[ops].max())
        width = max(-(-(hi - lo) // UTILIZATION_BINS), 1)
        edges = lo + width * np.arange(UTILIZATION_BINS + 1)
        share = np.diff(Coverage(*union(ev.ts[ops], ev.end[ops])).upto(edges)) / width
        for t, u in zip(edges[:-1].tolist(), share.tolist(), strict=True):
            yield counter("device utilization", rank, device, t, {"busy": u})
    for rank_bw in bandwidth(run, ev):
        pid = host_pid.get(rank_bw.rank, system)
        for flow in rank_bw.flows:
            for i, gbps in enumerate(flow.bins_gbps):
                yield counter("memory bandwidth (GB/s)", rank_bw.rank, pid,
                              rank_bw.start + i * rank_bw.bin_ns, {flow.direction: gbps})


def _flow_events(run: Run, base: int, pids: _Pids) -> Iterator[dict[str, Any]]:
    if not run.has_table("flows"):
        return
    for row, ts in _rows(run.table("flows"), base):
        event = {"ph": row["phase"], "id": pids.flow_id(row["rank"], row["id"]),
                 "pid": pids(row["rank"], row["pid"]), "tid": row["tid"], "ts": ts,
                 "cat": row["cat"], "name": row["cat"]}
        if row["phase"] == "f":
            event["bp"] = "e"
        yield event


def _stack_texts(run: Run) -> dict[int, tuple[str, str, str]]:
    """stack_id -> (leaf function, leaf module, the frames root first joined by `;`)."""
    frames: dict[int, list[tuple[int, str, str]]] = {}
    for row in run.table("stacks").to_pylist():
        frames.setdefault(row["stack_id"], []).append(
            (row["depth"], row["function"] or "[unknown]", row["module"] or ""))
    out = {}
    for sid, rows in frames.items():
        rows.sort()
        out[sid] = (rows[0][1], rows[0][2], ";".join(f for _, f, _ in reversed(rows)))
    return out


def _sample_events(run: Run, base: int, pids: _Pids) -> Iterator[dict[str, Any]]:
    """perf and py-spy samples as thread instants named by their leaf function (Perfetto's
    JSON import has no stack samples): category `<source>_sample`, the stack in args."""
    if not (run.has_table("samples") and run.has_table("stacks")):
        return
    stacks = _stack_texts(run)
    for row, ts in _rows(run.table("samples"), base):
        leaf, module, stack = stacks.get(row["stack_id"], ("[unknown]", "", ""))
        yield {"ph": "i", "s": "t", "cat": f"{row['source']}_sample", "name": leaf,
               "pid": pids(row["rank"], row["pid"]), "tid": row["tid"],
               "ts": ts,
               "args": {"stack": stack, "module": module, "weight": row["weight"]}}


def _key_ids(key: str, count: int) -> list[int] | None:
    """The ints of a manifest key 'RANK:PID[:TID]'; None for keys of older Runs that kept
    a trace's string ids ('0:Spans'), which no events row carries."""
    fields = key.split(":")
    if len(fields) != count or not all(f.lstrip("-").isdigit() for f in fields):
        return None
    return [int(f) for f in fields]


def _metadata_events(run: Run, pids: _Pids, system: int) -> Iterator[dict[str, Any]]:
    manifest = run.manifest()
    several = pids.several
    host = manifest.get("host", {}).get("hostname") or "host"
    named = set(manifest["processes"])
    for rank in _system_ranks(run, _host_pid(run)):
        # the system's counters had sat on an unnamed pid 0: Perfetto drew a bare "Process 0"
        if f"{rank}:{system}" not in named:
            label = f"system ({host})" if rank < 0 else f"rank {rank}: system ({host})"
            yield {"ph": "M", "name": "process_name", "pid": pids(rank, system), "tid": 0,
                   "args": {"name": label}}
    for key, name in sorted(manifest["processes"].items()):
        ids = _key_ids(key, 2)
        if ids is not None:
            rank, pid = ids
            label = f"rank {rank}: {name}" if several else name
            yield {"ph": "M", "name": "process_name", "pid": pids(rank, pid), "tid": 0,
                   "args": {"name": label}}
    for key, label in sorted(manifest.get("process_labels", {}).items()):
        ids = _key_ids(key, 2)
        if ids is not None:
            yield {"ph": "M", "name": "process_labels", "pid": pids(*ids), "tid": 0,
                   "args": {"labels": label}}
    for key, name in sorted(manifest["threads"].items()):
        ids = _key_ids(key, 3)
        if ids is not None:
            rank, pid, tid = ids
            yield {"ph": "M", "name": "thread_name", "pid": pids(rank, pid), "tid": tid,
                   "args": {"name": name}}


def chrome_trace(run: Run, rank: int | None = None) -> Iterator[bytes]:
    """The whole Run (every rank, counters, flows, step markers, stack samples) as one Chrome
    trace's JSON text, in parts (BATCH events each: the trace is never held whole); with
    `rank`, that rank's alone, as Kineto writes a trace per rank (import reads several such
    files back into one Run of their ranks). A rank the Run lacks is refused here, before
    any part."""
    manifest = run.manifest()
    if rank is not None and rank not in manifest["ranks"]:
        raise ParameterError("rank", f"{run.path}: no rank {rank} (its ranks: "
                                     f"{', '.join(map(str, manifest['ranks']))})")
    return _trace_parts(run, manifest, rank)


def _trace_parts(run: Run, manifest: Manifest, rank: int | None) -> Iterator[bytes]:
    pids = _Pids(manifest["ranks"], rank)
    base = _base_ns(run)
    system = _system_pid(run)
    head = orjson.dumps({"schemaVersion": 1, "baseTimeNanoseconds": base,
                         "displayTimeUnit": "ms", "deviceProperties": manifest["devices"]})
    yield head[:-1] + b',"traceEvents":['
    yield from _json_list_items((
        _metadata_events(run, pids, system), _span_events(run, base, pids),
        _flow_events(run, base, pids), _counter_events(run, base, pids, system),
        _derived_counter_events(run, base, pids, system), _sample_events(run, base, pids)))
    only = rank if rank is not None else (
        manifest["ranks"][0] if len(manifest["ranks"]) == 1 else None)
    tail = b"" if only is None else b',"distributedInfo":' + orjson.dumps({"rank": only})
    yield b"]" + tail + b"}"


def _json_list_items(sources: Iterable[Iterator[dict[str, Any]]]) -> Iterator[bytes]:
    """The events of every source with a pid (one of a rank not exported has none), as the
    comma-separated items of a JSON list, BATCH events a part. `ts`, `dur` and span `args`
    are `orjson.Fragment`s (exact JSON text, args as stored)."""
    first = True
    for source in sources:
        while batch := list(islice(source, BATCH)):
            kept = [e for e in batch if e["pid"] is not None]
            if kept:
                yield (b"" if first else b",") + orjson.dumps(kept)[1:-1]
                first = False


def _gzipped(parts: Iterable[bytes]) -> Iterator[bytes]:
    """`parts` as one gzip member, compressed as they come: the bytes gzip.compress writes
    of their concatenation at level 6 with mtime 0 (zlib's own gzip wrapper, as it uses)."""
    deflate = zlib.compressobj(6, zlib.DEFLATED, GZIP_WBITS)
    for part in parts:
        yield deflate.compress(part)
    yield deflate.flush()


def write(run: Run, path: str | Path, rank: int | None = None) -> Path:
    """Write the Run's Chrome trace (of `rank` alone, if given) to `path` (`.json`, or gzipped
    `.json.gz`), atomically, a part at a time."""
    out = Path(path)
    if not (out.name.endswith(".json") or out.name.endswith(".json.gz")):
        raise PerfswarmError(f"{out}: a Chrome trace is written as .json or .json.gz")
    check_output(out)
    parts = chrome_trace(run, rank)
    write_output(out, _gzipped(parts) if out.name.endswith(".gz") else parts)
    return out
