"""Reader for Kineto / Chrome-trace JSON (`.json`, `.json.gz`), as written by torch.profiler.

Decoding is typed (msgspec): the event fields we index are decoded straight into
a struct and `args` is kept as raw JSON text, which is stored as is. The fields
of `args` that become columns (correlation, external id, ...) come from a second
typed decode over all args at once, and the fields the analyses read (`detail`,
trace/detail.py) from a third over the args of the kinds that have them. The passes
run in C; the Python side only works on whole columns.
"""

from __future__ import annotations

import math
import mmap
import os
import re
import zlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import msgspec
import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from perfswarm.errors import TraceFormatError
from perfswarm.trace import gunzip
from perfswarm.trace.detail import detail_column, detail_rows
from perfswarm.trace.schema import (
    COUNTERS,
    DEVICE_KINDS,
    EVENTS,
    FLOWS,
    KIND_CODE,
    KINDS,
    NONE,
    PROFILER_STEP,
    STEPS,
    among,
)
from perfswarm.trace.timebase import MAX_ABS_US, us_to_ns

_EMPTY_ARGS = msgspec.Raw(b"{}")

# Seven days: no single profiled event lasts longer; a longer one is corrupt.
MAX_DUR_US = 7 * 24 * 3600 * 1e6


class KEvent(msgspec.Struct):
    """One Chrome-trace event; unknown keys (s, bp, ...) are skipped by the decoder."""

    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float = math.nan  # none: a bad event (_check_times), not one at the clock's origin
    dur: float = 0.0
    id: int | str | None = None
    args: msgspec.Raw = _EMPTY_ARGS


class KArgs(msgspec.Struct):
    """The `args` fields that become columns. Old traces spell `external id` in lower case."""

    external_id: int | None = msgspec.field(default=None, name="External id")
    external_id_old: int | None = msgspec.field(default=None, name="external id")
    correlation: int | None = None
    device: int | None = None
    stream: int | str | None = None
    rf_id: int | None = msgspec.field(default=None, name="Record function id")
    name: Any = None  # process_name / thread_name metadata
    labels: Any = None  # process_labels metadata


class KTrace(msgspec.Struct):
    """A whole trace file; events stay raw text until decoded chunk by chunk."""

    traceEvents: list[msgspec.Raw]
    baseTimeNanoseconds: int | None = None
    deviceProperties: list[dict[str, Any]] = []
    distributedInfo: dict[str, Any] = {}
    schemaVersion: Any = None
    traceName: Any = None
    displayTimeUnit: Any = None
    record_shapes: Any = None
    cupti_version: Any = None
    cuda_runtime_version: Any = None
    cuda_driver_version: Any = None


# Kineto's activity categories across versions and vendors -> our kinds.
CAT_KIND: dict[str, str] = {
    "cpu_op": "cpu_op",
    "operator": "cpu_op",
    "user_annotation": "user_annotation",
    "gpu_user_annotation": "gpu_annotation",
    "python_function": "python_function",
    "cuda_runtime": "runtime",
    "runtime": "runtime",
    "mtia_runtime": "runtime",
    "xpu_runtime": "runtime",
    "glow_runtime": "runtime",
    "privateuse1_runtime": "runtime",
    "cuda_driver": "driver",
    "driver": "driver",
    "privateuse1_driver": "driver",
    "kernel": "kernel",
    "mtia_ccp_events": "kernel",
    "hpu_op": "kernel",
    "gpu_memcpy": "memcpy",
    "memcpy": "memcpy",
    "gpu_memset": "memset",
    "memset": "memset",
    "cuda_sync": "sync",
    "cpu_instant_event": "instant",
    "cuda_profiler_range": "profiler_range",
    "overhead": "overhead",
    "trace": "trace_span",
    "collective_comm": "collective",
    "syscall": "syscall",
    # perfswarm's export writes stack samples as thread instants of these (Perfetto's JSON
    # import reads no samples)
    "perf_sample": "instant",
    "py-spy_sample": "instant",
}
COLLECTIVE_KERNEL = re.compile(r"^(void )?(nccl|rccl)|nccl(Dev)?Kernel_", re.IGNORECASE)
# The category of the counters perfswarm's export derives from the events (queue length,
# bandwidth, utilization): skipped here, a re-import derives them again.
DERIVED_COUNTERS: Final = "perfswarm_derived"


@dataclass
class TraceMeta:
    """Everything in a trace file besides its events."""

    rank: int | None
    base_ns: int
    devices: list[dict[str, Any]]
    distributed: dict[str, Any]
    info: dict[str, Any]
    processes: dict[str, str] = field(default_factory=dict)
    threads: dict[str, str] = field(default_factory=dict)
    process_labels: dict[str, str] = field(default_factory=dict)
    warnings: Counter[str] = field(default_factory=Counter)
    begin_end: list[KEvent] = field(default_factory=list)


class MappedFile:
    """A file mapped read-only, for Arrow to read its record batches in place: no copy in
    memory, the pages read come from the page cache. `drop_pages` unmaps the pages read so far
    (a later read maps them again), so a reader that takes a slice at a time holds one slice's
    pages, not the whole file's."""

    def __init__(self, path: Path) -> None:
        with path.open("rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)

    def read_table(self) -> pa.Table:
        """The Arrow IPC file's record batches, their buffers views of the mapping."""
        return pa.ipc.open_file(pa.py_buffer(self._map)).read_all()

    def drop_pages(self) -> None:
        self._map.madvise(mmap.MADV_DONTNEED)


@dataclass
class TraceTables:
    """One file's (or one batch's) rows, before ranks are merged and steps assigned."""

    events: pa.Table
    flows: pa.Table
    counters: pa.Table
    steps: pa.Table
    # the files the events' columns are read from in place (the in-memory path's spill):
    # whoever takes the events a slice at a time drops the pages each slice read
    mapped: tuple[MappedFile, ...] = ()


@dataclass(frozen=True)
class ReadOptions:
    drop_bad_events: bool = False


def memory_bytes() -> int:
    """This machine's RAM."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def read_bytes(path: Path, limit: int | None = None) -> bytes | bytearray:
    """The file's JSON text, gunzipped when it is gzip (by magic, not by name), refused when it
    would expand past `limit` bytes (default: a quarter of RAM, what the in-memory path takes)
    or is a gzip bomb (gunzip.chunks). Inflated text grows in place, a chunk at a time: joining
    the chunks held the text twice (a list of chunks and their join), 2x the JSON at once."""
    try:
        with path.open("rb") as f:
            if f.read(2) != gunzip.MAGIC:
                f.seek(0)
                return f.read()
            f.seek(0)
            text = bytearray()
            for chunk in gunzip.chunks(path, f, memory_bytes() // 4 if limit is None else limit):
                text += chunk
            return text
    except (EOFError, OSError, zlib.error) as exc:
        raise gunzip.read_error(path, exc) from None


TOO_DEEP = "nested deeper than the JSON decoder allows"
NOT_A_TRACE = "not a Kineto trace (a JSON object with `traceEvents`, or an array of trace events)"
_ITEMS = {b"{": "objects", b"[": "arrays", b'"': "strings", b"t": "booleans", b"f": "booleans",
          b"n": "nulls"}
_VALUE = {b'"': "string", b"t": "boolean", b"f": "boolean", b"n": "null"}


def not_a_trace(path: Path, head: bytes, keys: Sequence[str] = ()) -> TraceFormatError:
    """The error for a JSON file that is no trace, saying what it is from its first bytes (and
    its top-level keys, for an object)."""
    text = head.lstrip()
    first, hint = text[:1], ""
    if first == b"[":
        inner = text[1:].lstrip()[:1]
        what = f"a top-level array of {_ITEMS.get(inner, 'numbers')}"
        if inner == b"[":
            what += (", as torch.profiler's memory timeline exports write ([times, bytes per "
                     "category], or raw rows [time, action, bytes, category]); the trace is "
                     "what export_chrome_trace writes")
            hint = "a memory timeline is read by {memory_timelines}, beside its Kineto trace"
    elif first == b"{":
        shown = ", ".join(f"`{k}`" for k in keys[:8]) + (", ..." if len(keys) > 8 else "")
        what = f"an object with keys {shown}" if keys else "an empty object"
        if {"segments", "device_traces"} & set(keys):
            what += ": a torch.cuda memory snapshot"
        elif {"schema", "nodes"} <= set(keys):
            what += ": a PyTorch execution trace (ExecutionTraceObserver)"
            hint = "an execution trace is read by {execution_traces}, beside its Kineto trace"
    else:
        what = f"a JSON {_VALUE.get(first, 'number')}"
    return TraceFormatError(path, "json", f"{NOT_A_TRACE}; it is {what}", hint)


PICKLE: Final = b"\x80"  # a pickle's first byte (the protocol opcode, protocol 2 on)


def invalid_json(path: Path, head: bytes, exc: Exception) -> TraceFormatError:
    """The error for a file that is not JSON, naming a pickle as one, an empty file as empty
    and a `.sqlite` file as no SQLite database (read as JSON for want of its header)."""
    if not head.strip():
        return TraceFormatError(path, "", "empty: the file holds no data")
    if path.suffix == ".sqlite":
        return TraceFormatError(path, "", "neither an SQLite database (no SQLite header) nor JSON")
    if head[:1] == PICKLE:
        return TraceFormatError(path, "", "a Python pickle (as torch.cuda.memory._dump_snapshot "
                                "writes), not a JSON trace",
                                "a memory snapshot is read by {memory_timelines}")
    return TraceFormatError(path, "json", f"invalid JSON: {exc}")


def _no_phase(n: int) -> str:
    return (f"{'an array' if n > 1 else 'one'} of {n:,} object{'s' if n > 1 else ''} without "
            "`ph` (a trace event has `ph`, `name` and `ts`)")


def decode(path: Path, data: bytes | bytearray) -> KTrace:
    """Split a trace into metadata and raw events; a bare array is the Chrome 'array' format."""
    head = bytes(data[:64])  # bytes: a key of the tables naming what a file is
    try:
        if head.lstrip()[:1] == b"[":
            raws = msgspec.json.decode(data, type=list[msgspec.Raw])
            if raws and bytes(raws[0]).lstrip()[:1] != b"{":
                raise not_a_trace(path, head)
            return KTrace(traceEvents=raws)
        return msgspec.json.decode(data, type=KTrace)
    except msgspec.ValidationError as exc:
        if head.lstrip()[:1] != b"{":
            raise not_a_trace(path, head) from None
        if "missing required field `traceEvents`" in str(exc):
            keys = list(msgspec.json.decode(data, type=dict[str, msgspec.Raw]))
            raise not_a_trace(path, head, keys) from None
        raise TraceFormatError(path, "json", f"wrong structure: {exc}") from None
    except msgspec.DecodeError as exc:
        raise invalid_json(path, head, exc) from None
    except RecursionError:
        raise TraceFormatError(path, "json", TOO_DEEP) from None


def no_events(path: Path) -> TraceFormatError:
    """A trace without events (an empty array, `traceEvents: []`): nothing to analyze."""
    return TraceFormatError(path, "traceEvents", "empty: the trace holds no events")


_AT_INDEX = re.compile(r"\$\[(\d+)\]")


def decode_events(path: Path, raws: Sequence[msgspec.Raw], first: int) -> list[KEvent]:
    """Typed decode of a slice of traceEvents; errors name the index in the whole file."""
    return decode_event_text(path, b"[" + b",".join(raws) + b"]", first)


def decode_event_text(path: Path, text: bytes, first: int) -> list[KEvent]:
    """Typed decode of a JSON array of events, the `first`-th of the file's onwards."""
    try:
        return msgspec.json.decode(text, type=list[KEvent])
    except msgspec.ValidationError as exc:
        where = _AT_INDEX.sub(lambda m: f"$.traceEvents[{int(m.group(1)) + first}]", str(exc))
        raise TraceFormatError(path, "json", f"wrong structure: {where}") from None
    except msgspec.DecodeError as exc:
        raise TraceFormatError(path, "json", f"invalid JSON: {exc}") from None


def _int_or_none(values: Sequence[int | None]) -> npt.NDArray[np.int64]:
    """Ints with None as NONE, converted in C (an int past 64 bits raises OverflowError)."""
    column: npt.NDArray[np.int64] = pa.array(values, pa.int64()).fill_null(NONE).to_numpy()
    return column


def _ids(values: Sequence[int | str]) -> npt.NDArray[np.int64]:
    """pid/tid/flow-id columns: ints as they are; strings ('Spans', '0x1f') parsed or -1."""
    try:
        return np.asarray(values, dtype=np.int64)
    except (TypeError, ValueError):
        return np.fromiter((_one_id(v) for v in values), np.int64, len(values))


def _one_id(value: object) -> int:
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value, 0)
        except ValueError:
            return NONE
    return NONE


def _string_array(raws: Sequence[msgspec.Raw]) -> pa.Array:
    """Arrow strings built from the raw args buffers in one join, no per-row objects."""
    lengths = np.fromiter(map(len, raws), np.int64, len(raws))
    offsets = np.zeros(len(raws) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    data = b"".join(raws)
    if offsets[-1] < 2**31:
        return pa.StringArray.from_buffers(len(raws), pa.py_buffer(offsets.astype(np.int32)),
                                           pa.py_buffer(data))
    return pa.LargeStringArray.from_buffers(
        len(raws), pa.py_buffer(offsets), pa.py_buffer(data)
    ).cast(pa.string())


def _decode_args(path: Path, raws: Sequence[msgspec.Raw]) -> list[KArgs]:
    if not raws:
        return []
    joined = b"[" + b",".join(raws) + b"]"
    try:
        return msgspec.json.decode(joined, type=list[KArgs])
    except msgspec.ValidationError as exc:
        where = str(exc).replace("$[", "args of event [", 1)
        raise TraceFormatError(path, "json", f"wrong field type: {where}") from None


def _kinds(cats: pa.Array, names: pa.DictionaryArray, meta: TraceMeta) -> pa.Array:
    """Kind codes per event from its category, with communication kernels made `collective`."""
    cat_dict = pc.utf8_lower(cats).dictionary_encode()
    cat_idx = cat_dict.indices.to_numpy(zero_copy_only=False)
    cat_codes = np.empty(len(cat_dict.dictionary), dtype=np.int8)
    for i, cat in enumerate(cat_dict.dictionary.to_pylist()):
        kind = CAT_KIND.get(cat, "other") if cat else "instant"
        cat_codes[i] = KIND_CODE[kind]
        if kind == "other":
            count = int(np.count_nonzero(cat_idx == i))
            meta.warnings[f"unknown category '{cat}' (kept as kind 'other')"] += count
    codes = cat_codes[cat_idx]
    name_values = names.dictionary.to_pylist()
    is_comm = np.fromiter(
        (bool(COLLECTIVE_KERNEL.search(n)) for n in name_values), bool, len(name_values)
    )
    comm_rows = is_comm[names.indices.to_numpy(zero_copy_only=False)] & (
        codes == KIND_CODE["kernel"]
    )
    codes[comm_rows] = KIND_CODE["collective"]
    return pa.DictionaryArray.from_arrays(pa.array(codes, pa.int8()), pa.array(KINDS, pa.string()))


def _check_times(path: Path, ts: npt.NDArray[np.float64], dur: npt.NDArray[np.float64],
                 index: npt.NDArray[np.int64], opts: ReadOptions,
                 meta: TraceMeta) -> npt.NDArray[np.bool_]:
    """Rows to keep. Bad rows are an error, or dropped and counted with --drop-bad-events."""
    checks = (
        (~np.isfinite(ts) | (np.abs(ts) > MAX_ABS_US), "timestamp missing or out of range"),
        (~np.isfinite(dur) | (dur > MAX_DUR_US), "absurd duration (over 7 days)"),
        (dur < 0, "negative duration"),
    )
    keep = np.ones(len(ts), dtype=bool)
    for bad, what in checks:
        if not bad.any():
            continue
        if not opts.drop_bad_events:
            first = int(np.flatnonzero(bad)[0])
            raise TraceFormatError(
                path,
                f"traceEvents[{int(index[first])}]",
                f"{what}: ts={float(ts[first])} dur={float(dur[first])} us"
                f" ({int(bad.sum())} such events)", "{drop_bad_events} drops them",
            )
        meta.warnings[f"dropped events with {what}"] += int(bad.sum())
        keep &= ~bad
    return keep


def _check_text(path: Path, args: pa.Array, raws: Sequence[msgspec.Raw],
                index: npt.NDArray[np.int64], opts: ReadOptions,
                meta: TraceMeta) -> npt.NDArray[np.bool_] | None:
    """Rows whose args are UTF-8 text, as JSON is (None: all are; the decoder checks only the
    fields it reads). Others are an error, or dropped and counted with --drop-bad-events."""
    try:
        args.validate(full=True)
        return None
    except pa.ArrowInvalid:
        pass
    ok = np.array([_is_utf8(bytes(r)) for r in raws], bool)
    bad = int((~ok).sum())
    if not opts.drop_bad_events:
        first = int(np.flatnonzero(~ok)[0])
        raise TraceFormatError(path, f"traceEvents[{int(index[first])}]",
                               f"args that are not UTF-8 text ({bad} such events)",
                               "{drop_bad_events} drops them")
    meta.warnings["dropped events with args that are not UTF-8 text"] += bad
    return ok


def _is_utf8(text: bytes) -> bool:
    try:
        text.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _metadata(events: Sequence[KEvent], args: list[KArgs], meta: TraceMeta) -> None:
    for ev, a in zip(events, args, strict=True):
        if ev.name == "process_labels" and a.labels is not None:
            meta.process_labels[str(_one_id(ev.pid))] = str(a.labels)
        if a.name is None:
            continue
        # Keyed by the ids the events table holds ('Spans' -> -1), so names join to rows.
        if ev.name == "process_name":
            meta.processes[str(_one_id(ev.pid))] = str(a.name)
        elif ev.name == "thread_name":
            meta.threads[f"{_one_id(ev.pid)}:{_one_id(ev.tid)}"] = str(a.name).strip()


def _pair_begin_end(events: list[KEvent], meta: TraceMeta) -> list[KEvent]:
    """Turn B/E pairs (per pid/tid, properly nested) into complete X events."""
    stacks: dict[tuple[object, object], list[KEvent]] = {}
    out: list[KEvent] = []
    for ev in sorted(events, key=lambda e: e.ts):
        key = (ev.pid, ev.tid)
        if ev.ph == "B":
            stacks.setdefault(key, []).append(ev)
        elif stacks.get(key):
            begin = stacks[key].pop()
            out.append(msgspec.structs.replace(begin, ph="X", dur=ev.ts - begin.ts))
        else:
            meta.warnings["'E' event without a matching 'B' (dropped)"] += 1
    unmatched = sum(len(s) for s in stacks.values())
    if unmatched:
        meta.warnings["'B' event without a matching 'E' (dropped)"] += unmatched
    return out


def _counters(events: Sequence[KEvent], ts_ns: npt.NDArray[np.int64], rank: int) -> pa.Table:
    rows: dict[str, list[Any]] = {"rank": [], "ts": [], "name": [], "device": [], "value": []}
    for ev, t in zip(events, ts_ns.tolist(), strict=True):
        for key, value in msgspec.json.decode(ev.args).items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                rows["rank"].append(rank)
                rows["ts"].append(t)
                rows["name"].append(f"{ev.name}.{key}" if ev.name else key)
                rows["device"].append(NONE)
                rows["value"].append(float(value))
    return pa.table(rows).cast(COUNTERS) if rows["ts"] else COUNTERS.empty_table()


def tables_from_events(path: Path, events: list[KEvent], meta: TraceMeta, rank: int,
                       opts: ReadOptions, first_index: int = 0) -> TraceTables:
    """Columns from decoded events: events, flows, counters and ProfilerStep markers."""
    try:
        return _tables_from_events(path, events, meta, rank, opts, first_index)
    except OverflowError:
        raise TraceFormatError(path, f"traceEvents[{first_index}:{first_index + len(events)}]",
                               "an integer field (pid, tid, id, correlation, ...) is out of "
                               "the 64-bit range") from None
    except msgspec.DecodeError as exc:  # args of counter events
        raise TraceFormatError(path, "json", f"invalid JSON: {exc}") from None


def _tables_from_events(path: Path, events: list[KEvent], meta: TraceMeta, rank: int,
                        opts: ReadOptions, first_index: int) -> TraceTables:
    if not events:
        return TraceTables(EVENTS.empty_table(), FLOWS.empty_table(),
                           COUNTERS.empty_table(), STEPS.empty_table())
    ph = pa.array([e.ph for e in events], pa.string())
    ph_codes = ph.dictionary_encode()
    ph_values = ph_codes.dictionary.to_pylist()
    if first_index == 0 and ph_values == [""]:
        raise TraceFormatError(path, "json", f"{NOT_A_TRACE}; it is {_no_phase(len(events))}")
    ph_idx = ph_codes.indices.to_numpy(zero_copy_only=False)

    def rows_with(*phases: str) -> npt.NDArray[np.int64]:
        wanted = [i for i, p in enumerate(ph_values) if p in phases]
        return np.flatnonzero(among(ph_idx, wanted, len(ph_values)))

    meta_rows = rows_with("M")
    if len(meta_rows):
        chosen = [events[i] for i in meta_rows.tolist()]
        _metadata(chosen, _decode_args(path, [e.args for e in chosen]), meta)
    known = {"X", "i", "I", "s", "f", "t", "M", "C", "B", "E"}
    for p in ph_values:
        if p not in known:
            n = int(np.count_nonzero(ph_idx == ph_values.index(p)))
            meta.warnings[f"unsupported event phase '{p}' (skipped)"] += n

    spans = [events[i] for i in rows_with("X", "i", "I").tolist()]
    span_index = rows_with("X", "i", "I") + first_index
    # B/E pairs may straddle chunks: they are paired once, in finish().
    meta.begin_end += [events[i] for i in rows_with("B", "E").tolist()]

    flow_rows = rows_with("s", "f", "t")
    flows = _flow_table(path, [events[i] for i in flow_rows.tolist()], flow_rows + first_index,
                        meta, rank, opts)
    # counters perfswarm's export derived from the events come back from the events
    counter_rows = np.array([i for i in rows_with("C").tolist()
                             if events[i].cat != DERIVED_COUNTERS], np.int64)
    counters = COUNTERS.empty_table()
    if len(counter_rows):
        cts = np.array([events[i].ts for i in counter_rows.tolist()], np.float64)
        keep = _check_times(path, cts, np.zeros(len(cts)), counter_rows + first_index, opts,
                            meta)
        counters = _counters([events[i] for i in counter_rows[keep].tolist()],
                             us_to_ns(cts[keep]) + meta.base_ns, rank)

    events_table, steps = _span_table(path, spans, span_index, meta, rank, opts)
    return TraceTables(events_table, flows, counters, steps)


def _flow_table(path: Path, flows: list[KEvent], index: npt.NDArray[np.int64],
                meta: TraceMeta, rank: int, opts: ReadOptions) -> pa.Table:
    """The flow points (`index`: where each is in traceEvents)."""
    if not flows:
        return FLOWS.empty_table()
    ts = np.array([e.ts for e in flows], np.float64)
    keep = _check_times(path, ts, np.zeros(len(ts)), index, opts, meta)
    ts = np.where(keep, ts, 0.0)  # a dropped bad time (NaN) is not converted, only left out
    n = len(flows)
    # Python values typed here and in every chunk's arrays: pyarrow's inference of a type
    # imports dateutil each time, a search of sys.path where it is not installed (0.15 ms)
    table = pa.table(
        {
            "rank": pa.array(np.full(n, rank, np.int32)),
            "id": pa.array(_ids([NONE if e.id is None else e.id for e in flows])),
            "cat": pa.array([e.cat for e in flows], pa.string()).dictionary_encode(),
            "phase": pa.array([e.ph for e in flows], pa.string()).dictionary_encode(),
            "pid": pa.array(_ids([e.pid for e in flows])),
            "tid": pa.array(_ids([e.tid for e in flows])),
            "ts": pa.array(us_to_ns(ts) + meta.base_ns),
        }
    )
    return (table if keep.all() else table.filter(pa.array(keep))).cast(FLOWS)


def _span_table(path: Path, spans: list[KEvent], index: npt.NDArray[np.int64],
                meta: TraceMeta, rank: int, opts: ReadOptions) -> tuple[pa.Table, pa.Table]:
    if not spans:
        return EVENTS.empty_table(), STEPS.empty_table()
    # One list per field (not a tuple per event): the per-event Python work is attribute reads.
    ts_us = np.array([e.ts for e in spans], np.float64)
    dur_us = np.array([e.dur for e in spans], np.float64)
    # instants ('i', 'I') take no time (a mask from a list of bools: a NumPy array of the
    # phase strings cost 4x more)
    dur_us[np.array([e.ph != "X" for e in spans], bool)] = 0.0
    keep = _check_times(path, ts_us, dur_us, index, opts, meta)
    # a dropped bad time (NaN, out of range) is not converted, only left out
    ts_us, dur_us = np.where(keep, ts_us, 0.0), np.where(keep, dur_us, 0.0)

    raws = [e.args for e in spans]
    args_text = _string_array(raws)
    text = _check_text(path, args_text, raws, index, opts, meta)
    if text is not None:  # dropped: their args are neither decoded nor stored
        keep &= text
        raws = [r if ok else _EMPTY_ARGS for r, ok in zip(raws, text.tolist(), strict=True)]
        args_text = _string_array(raws)
    args = _decode_args(path, raws)
    names = pa.array([e.name for e in spans], pa.string()).dictionary_encode()
    kinds = _kinds(pa.array([e.cat for e in spans], pa.string()), names, meta)
    kind_idx = kinds.indices.to_numpy(zero_copy_only=False)
    on_device = among(kind_idx, [KIND_CODE[k] for k in DEVICE_KINDS], len(KINDS))

    pid_a = _ids([e.pid for e in spans])
    tid_a = _ids([e.tid for e in spans])
    device = _int_or_none([a.device for a in args])
    device_a = np.where(on_device, np.where(device >= 0, device, pid_a), NONE).astype(np.int32)
    stream_int = _ids([a.stream if isinstance(a.stream, int) else NONE for a in args])
    stream_a = np.where(on_device, np.where(stream_int >= 0, stream_int, tid_a), NONE)
    ext_a = _int_or_none([a.external_id for a in args])
    ext_old_a = _int_or_none([a.external_id_old for a in args])
    ext_a = np.where(ext_a == NONE, ext_old_a, ext_a)
    n = len(spans)
    read = detail_rows(kinds)
    table = pa.table(
        {
            "rank": pa.array(np.full(n, rank, np.int32)),
            "ts": pa.array(us_to_ns(ts_us) + meta.base_ns),
            "dur": pa.array(us_to_ns(dur_us)),
            "kind": kinds,
            "name": names,
            "pid": pa.array(pid_a),
            "tid": pa.array(tid_a),
            "device": pa.array(device_a),
            "stream": pa.array(stream_a),
            "correlation": pa.array(_int_or_none([a.correlation for a in args])),
            "external_id": pa.array(ext_a),
            "rf_id": pa.array(_int_or_none([a.rf_id for a in args])),
            "step": pa.array(np.full(n, NONE, np.int32)),
            "args": args_text,
            "detail": detail_column([raws[i] for i in read.tolist()], read, n),
        }
    )
    if not keep.all():
        table = table.filter(pa.array(keep))
    return table, _steps(table, rank)


def _steps(events: pa.Table, rank: int) -> pa.Table:
    """ProfilerStep#N annotations on the host as step markers (one row per step and rank).
    Kineto also copies the annotation onto the GPU's timeline (`gpu_user_annotation`, from the
    step's first kernel to its last: a CUDA H200 trace's ProfilerStep#10 there ran 131 ms, to
    the window's end); that copy is no step."""
    names = events.column("name").combine_chunks()
    assert isinstance(names, pa.DictionaryArray)
    values = names.dictionary.to_pylist()
    step_of_code = {i: int(m.group(1)) for i, v in enumerate(values)
                    if v and (m := PROFILER_STEP.match(v))}
    if not step_of_code:
        return STEPS.empty_table()
    on_host = pc.equal(events.column("kind").cast(pa.string()),
                       pa.scalar("user_annotation", pa.string()))
    rows = np.flatnonzero(among(names.indices.to_numpy(zero_copy_only=False),
                                list(step_of_code), len(values))
                          & on_host.to_numpy(zero_copy_only=False))
    codes = names.indices.to_numpy(zero_copy_only=False)[rows]
    ts = events.column("ts").to_numpy()[rows]
    dur = events.column("dur").to_numpy()[rows]
    order = np.argsort(ts, kind="stable")
    return pa.table(
        {
            "rank": pa.array(np.full(len(rows), rank, np.int32)),
            "step": pa.array(np.array([step_of_code[int(c)] for c in codes[order]], np.int32)),
            "start": pa.array(ts[order]),
            "end": pa.array(ts[order] + dur[order]),
            "source": pa.array(["marker"] * len(rows), pa.string()).dictionary_encode(),
        }
    ).cast(STEPS)


def json_safe(value: Any) -> Any:
    """Metadata as the manifest can hold it: integers beyond 64 bits become text."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_safe(v) for v in value]
    if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**63:
        return str(value)
    return value


# A rank in a trace's file name: the recorder's torch-rank{R}-pid{P}.pt.trace.json (a
# DataLoader worker's too, which has no distributedInfo), a script's trace_rank{R}.json,
# tensorboard_trace_handler's with worker_name=f"rank-{R}" (HTA's rank-34.*), HTA's rank_{R}
NAMED_RANK: Final = re.compile(r"(?:^|[-_.])rank[-_]?(\d{1,9})(?=[-_.]|$)")
# tensorboard_trace_handler's name with its default worker_name, {hostname}_{pid}.{time}
# .pt.trace.json[.gz], {time} the epoch in ns (torch 2; ms before): the host is everything
# before the last _{pid}, whatever it holds ('_' too: my_host-rank2), and a rank-like token in
# it (gpu-rank3-node) no rank; a worker_name that ends in a rank (rank_3, trace_rank_3, whose
# number stands where the pid would, as if of a host named "...rank") is that rank
HANDLER_DEFAULT: Final = re.compile(
    r"^(?P<worker>.+_\d+)\.\d{10,}\.pt\.trace\.json(?:\.gz)?$")
RANK_LAST: Final = re.compile(r"(?:^|[-_.])rank[-_]?(\d{1,9})$")


def rank_in_name(name: str) -> int | None:
    """The rank a trace's file name says (NAMED_RANK); of tensorboard_trace_handler's default
    name (HANDLER_DEFAULT), only a rank that ends its worker (RANK_LAST), never one in its
    host part."""
    handler = HANDLER_DEFAULT.match(name)
    named = RANK_LAST.search(handler["worker"]) if handler else NAMED_RANK.search(name)
    return int(named[1]) if named else None


def trace_meta(path: Path, trace: KTrace) -> TraceMeta:
    """The trace's metadata; its rank from distributedInfo, else from its file name
    (rank_in_name)."""
    base = trace.baseTimeNanoseconds or 0
    if not 0 <= base < 2**62:
        raise TraceFormatError(path, "baseTimeNanoseconds", f"out of range: {base}")
    rank = trace.distributedInfo.get("rank")
    if rank is None:
        rank = rank_in_name(path.name)
    info = {k: v for k, v in msgspec.structs.asdict(trace).items()
            if k not in ("traceEvents", "deviceProperties", "distributedInfo") and v is not None}
    return TraceMeta(
        rank=rank if isinstance(rank, int) and 0 <= rank < 2**31 else None,
        base_ns=base,
        devices=json_safe([d for d in trace.deviceProperties if isinstance(d, dict)]),
        distributed=json_safe(dict(trace.distributedInfo)),
        info=json_safe(info),
    )


CHUNK = 5_000


def finish(path: Path, meta: TraceMeta, rank: int, opts: ReadOptions) -> TraceTables:
    """The rows that need the whole file: B/E events paired into complete events."""
    paired = _pair_begin_end(meta.begin_end, meta) if meta.begin_end else []
    meta.begin_end = []
    index = np.full(len(paired), NONE, np.int64)
    events, steps = _span_table(path, paired, index, meta, rank, opts)
    return TraceTables(events, FLOWS.empty_table(), COUNTERS.empty_table(), steps)


def concat(tables: Sequence[pa.Table], schema: pa.Schema) -> pa.Table:
    """Concatenate same-schema tables (zero-copy), merging their dictionaries."""
    parts = [t.cast(schema) for t in tables if t.num_rows]
    if not parts:
        return schema.empty_table()
    return pa.concat_tables(parts).unify_dictionaries().cast(schema)


def concat_parts(parts: Sequence[TraceTables]) -> TraceTables:
    return TraceTables(
        concat([p.events for p in parts], EVENTS), concat([p.flows for p in parts], FLOWS),
        concat([p.counters for p in parts], COUNTERS), concat([p.steps for p in parts], STEPS))


def read_trace(path: Path, rank_hint: int, opts: ReadOptions,
               spill_dir: Path | None = None) -> tuple[TraceMeta, TraceTables]:
    """Read one trace file in memory, decoding events a chunk at a time.

    Only one chunk of event structs exists at once; the rest stay as raw views
    into the JSON text. With `spill_dir`, finished event rows wait in an
    uncompressed Arrow file until the text is freed, so text and table never
    coexist in memory: the peak is about the text plus one chunk. The events
    table's columns are then read from that file in place (`mapped`), never
    copied whole into memory: sorted and written a slice at a time
    (build.sorted_slices), memory holds one slice's rows of it.
    """
    trace = decode(path, read_bytes(path))
    if not trace.traceEvents:
        raise no_events(path)
    meta = trace_meta(path, trace)
    rank = meta.rank if meta.rank is not None else rank_hint
    raws, trace.traceEvents = trace.traceEvents, []
    parts = []
    spill = _EventSpill(spill_dir / f".{path.name}.events.arrow") if spill_dir else None
    try:
        for first in range(0, len(raws), CHUNK):
            events = decode_events(path, raws[first:first + CHUNK], first)
            part = tables_from_events(path, events, meta, rank, opts, first_index=first)
            del events
            parts.append(spill.add(part) if spill else part)
        del raws
        parts.append(finish(path, meta, rank, opts))
        tables = concat_parts(parts)
        if spill and (spilled := spill.read()) is not None:
            events, mapped = spilled
            tables.events = concat([events, tables.events], EVENTS)
            tables.mapped = (mapped,)
    finally:
        if spill:
            spill.close()
    return meta, tables


class _EventSpill:
    """Event rows parked in an uncompressed Arrow IPC file (fast to write, read back in
    place: MappedFile).

    The dictionary columns (kind, name) are small and differ per chunk, which IPC
    files cannot hold, so they stay in memory.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.writer: pa.ipc.RecordBatchFileWriter | None = None
        self.kept: list[pa.Table] = []

    def add(self, part: TraceTables) -> TraceTables:
        if part.events.num_rows:
            if self.writer is None:
                self.writer = pa.ipc.new_file(self.path, _SPILLED)
            self.writer.write_table(part.events.select(_SPILLED.names))
            self.kept.append(part.events.select(_KEPT))
        return TraceTables(EVENTS.empty_table(), part.flows, part.counters, part.steps)

    def read(self) -> tuple[pa.Table, MappedFile] | None:
        """The events parked (None: none were), their spilled columns views of the file
        mapped (the file may be unlinked while they live)."""
        if self.writer is None:
            return None
        self.writer.close()
        self.writer = None
        # Both halves keep one chunk per decoded chunk, so their columns line up.
        kept = pa.concat_tables(self.kept).unify_dictionaries()
        self.kept = []
        mapped = MappedFile(self.path)
        spilled = mapped.read_table()
        columns = {name: kept.column(name) for name in _KEPT}
        columns.update({name: spilled.column(name) for name in _SPILLED.names})
        return pa.table({name: columns[name] for name in EVENTS.names}).cast(EVENTS), mapped

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.path.unlink(missing_ok=True)


_KEPT = [f.name for f in EVENTS if pa.types.is_dictionary(f.type)]
_SPILLED = pa.schema([f for f in EVENTS if f.name not in _KEPT])
