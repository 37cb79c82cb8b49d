"""Nsight Systems SQLite exports (`nsys export --type sqlite`) into the Run's tables.

Tables read (any may be missing: nsys creates them lazily), as NVIDIA's "SQLite
Export Schema Reference" documents them:

- CUPTI_ACTIVITY_KIND_KERNEL: start, end, deviceId, streamId, correlationId, globalPid,
  demangledName (else shortName) -> StringIds, gridX..Z, blockX..Z, registersPerThread,
  staticSharedMemory, dynamicSharedMemory                       -> `kernel` events
  (NCCL's and RCCL's: `collective` events, as the Kineto reader makes them)
- CUPTI_ACTIVITY_KIND_RUNTIME: start, end, globalTid, correlationId, nameId
                                                                -> `runtime` events
- CUPTI_ACTIVITY_KIND_MEMCPY: start, end, deviceId, streamId, correlationId, globalPid,
  bytes, copyKind                                               -> `memcpy` events
- CUPTI_ACTIVITY_KIND_MEMSET: the same with value               -> `memset` events
- NVTX_EVENTS: start, end, eventType (59 push/pop and 60 start/end ranges, 34 marks),
  text or textId -> StringIds, globalTid                        -> `user_annotation`, `instant`
- OSRT_API: start, end, globalTid, nameId (OS runtime: libc, pthread, I/O calls)
                                                                -> `syscall` events
- TARGET_INFO_SESSION_START_TIME.utcEpochNs: the epoch time of timestamp 0, so events land
  on the Unix-epoch ns clock every Run uses; TARGET_INFO_GPU (or TARGET_INFO_CUDA_DEVICE)
  names the devices.

Times are ns already. globalTid packs the pid and tid (pid = globalTid / 2**24 % 2**24,
tid = globalTid % 2**24; globalPid holds the pid alone, the same way). CUDA API names
lose nsys's `_vNNNN` version suffix (`cudaLaunchKernel_v7000` -> `cudaLaunchKernel`), as
Kineto names them. NVTX ranges named `ProfilerStep#N` become step markers.
"""

from __future__ import annotations

import re
import sqlite3
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa

from perfswarm.errors import TraceFormatError
from perfswarm.trace.detail import with_detail
from perfswarm.trace.kineto import COLLECTIVE_KERNEL, TraceMeta, TraceTables, _steps
from perfswarm.trace.schema import COUNTERS, EVENTS, FLOWS, NONE

MAGIC = b"SQLite format 3\x00"
_VERSION = re.compile(r"_v\d+$")
PUSH_POP, START_END, MARK = 59, 60, 34
# CUpti_ActivityMemcpyKind, as Kineto names the copies
COPY_KINDS = {1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA",
              8: "DtoD", 9: "HtoH", 10: "PtoP"}
ACTIVITY = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME",
            "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET", "NVTX_EVENTS",
            "OSRT_API")


def is_nsys(path: Path) -> bool:
    """Whether `path` is an SQLite database (an nsys export is one)."""
    try:
        with path.open("rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


Row = tuple[int, int, str, str, int, int, int, int, int, str]
# ts, dur, kind, name, pid, tid, device, stream, correlation, args


class _Db:
    def __init__(self, path: Path) -> None:
        self.path = path
        # read-only: an export is never modified, and a bad file is not created or repaired
        self.con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            self.tables = {r[0] for r in self.con.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")}
        except sqlite3.DatabaseError as exc:
            self.con.close()
            raise TraceFormatError(path, "", f"not a readable SQLite database ({exc})") from None
        self.columns: dict[str, set[str]] = {}

    def has(self, table: str, *columns: str) -> bool:
        if table not in self.tables:
            return False
        if table not in self.columns:
            self.columns[table] = {r[1] for r in self.con.execute(
                f'PRAGMA table_info("{table}")')}
        return set(columns) <= self.columns[table]

    def rows(self, table: str, columns: Sequence[str]) -> list[tuple[Any, ...]]:
        missing = [c for c in columns if not self.has(table, c)]
        if missing:
            raise TraceFormatError(self.path, table, f"no column {', '.join(missing)}"
                                   " (not the nsys export schema)")
        cols = ", ".join(f'"{c}"' for c in columns)
        try:
            return self.con.execute(f'SELECT {cols} FROM "{table}" ORDER BY "start"').fetchall()
        except sqlite3.DatabaseError as exc:
            raise TraceFormatError(self.path, table, str(exc)) from None


def _int(value: Any, path: Path, where: str, what: str) -> int:
    if isinstance(value, int) and -(1 << 62) < value < 1 << 62:
        return value
    raise TraceFormatError(path, where, f"{what} is not a time or id: {value!r}")


def read(path: Path, rank: int) -> tuple[TraceMeta, TraceTables]:
    """One export's events (on the epoch clock), ProfilerStep markers, and metadata."""
    db = _Db(path)
    try:
        return _read(db, rank)
    finally:
        db.con.close()


def _read(db: _Db, rank: int) -> tuple[TraceMeta, TraceTables]:
    path = db.path
    if not any(t in db.tables for t in ACTIVITY):
        raise TraceFormatError(path, "", "not an Nsight Systems export: none of the tables "
                               + ", ".join(ACTIVITY))
    strings: dict[int, str] = (dict(db.con.execute("SELECT id, value FROM StringIds"))
                               if db.has("StringIds", "id", "value") else {})

    def text(sid: Any, table: str) -> str:
        if sid in strings:
            return strings[sid]
        raise TraceFormatError(path, table, f"string id {sid!r} not in StringIds")

    base = 0
    if db.has("TARGET_INFO_SESSION_START_TIME", "utcEpochNs"):
        got = db.con.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()
        base = _int(got[0], path, "TARGET_INFO_SESSION_START_TIME", "utcEpochNs") if got else 0
    warnings: Counter[str] = Counter()
    rows: list[Row] = []

    def span(table: str, start: Any, end: Any) -> tuple[int, int] | None:
        s, e = _int(start, path, table, "start"), _int(end, path, table, "end")
        if e < s:
            warnings[f"{table}: rows ending before they start, dropped"] += 1
            return None
        return base + s, e - s

    kernels = "CUPTI_ACTIVITY_KIND_KERNEL"
    if kernels in db.tables:
        name_col = "demangledName" if db.has(kernels, "demangledName") else "shortName"
        cols = ["start", "end", "deviceId", "streamId", "correlationId", "globalPid", name_col,
                "gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ"]
        extra = [c for c in ("registersPerThread", "staticSharedMemory", "dynamicSharedMemory")
                 if db.has(kernels, c)]
        for r in db.rows(kernels, cols + extra):
            if (t := span(kernels, r[0], r[1])) is None:
                continue
            more = dict(zip(extra, r[13:], strict=True))
            args = {"grid": list(r[7:10]), "block": list(r[10:13])}
            if "registersPerThread" in more:
                args["registers per thread"] = more["registersPerThread"]
            if "staticSharedMemory" in more:
                args["shared memory"] = (more["staticSharedMemory"]
                                         + more.get("dynamicSharedMemory", 0))
            name = text(r[6], kernels)
            kind = "collective" if COLLECTIVE_KERNEL.search(name) else "kernel"
            rows.append((*t, kind, name, _pid(r[5]), _id(r[3]), _id(r[2]),
                         _id(r[3]), _id(r[4]), orjson.dumps(args).decode()))
    for table, kind in (("CUPTI_ACTIVITY_KIND_MEMCPY", "memcpy"),
                        ("CUPTI_ACTIVITY_KIND_MEMSET", "memset")):
        if table not in db.tables:
            continue
        what = "copyKind" if kind == "memcpy" else "value"
        for r in db.rows(table, ["start", "end", "deviceId", "streamId", "correlationId",
                                 "globalPid", "bytes", what]):
            if (t := span(table, r[0], r[1])) is None:
                continue
            name = (f"Memcpy {COPY_KINDS.get(r[7], str(r[7]))}" if kind == "memcpy"
                    else "Memset (Device)")
            rows.append((*t, kind, name, _pid(r[5]), _id(r[3]), _id(r[2]), _id(r[3]), _id(r[4]),
                         orjson.dumps({"bytes": r[6]}).decode()))
    calls: list[tuple[str, str, Callable[[str], str]]] = [
        ("CUPTI_ACTIVITY_KIND_RUNTIME", "runtime", lambda n: _VERSION.sub("", n)),
        ("OSRT_API", "syscall", lambda n: n)]
    for table, kind, rename in calls:
        if table not in db.tables:
            continue
        corr = ["correlationId"] if kind == "runtime" else []
        for r in db.rows(table, ["start", "end", "globalTid", "nameId", *corr]):
            if (t := span(table, r[0], r[1])) is None:
                continue
            rows.append((*t, kind, rename(text(r[3], table)), _pid(r[2]), _tid(r[2]), NONE,
                         NONE, _id(r[4]) if corr else NONE, "{}"))
    nvtx = "NVTX_EVENTS"
    if nvtx in db.tables:
        for r in db.rows(nvtx, ["start", "end", "eventType", "text", "textId", "globalTid"]):
            if r[2] not in (PUSH_POP, START_END, MARK):
                continue
            name = r[3] if r[3] is not None else (text(r[4], nvtx) if r[4] is not None else "")
            end = r[0] if r[2] == MARK else r[1]
            if end is None or (isinstance(end, int) and end < 0):
                warnings["NVTX_EVENTS: ranges never closed, dropped"] += 1
                continue
            if (t := span(nvtx, r[0], end)) is None:
                continue
            rows.append((*t, "instant" if r[2] == MARK else "user_annotation", name,
                         _pid(r[5]), _tid(r[5]), NONE, NONE, NONE, "{}"))
    events = _table(rows, rank)
    meta = TraceMeta(rank=None, base_ns=base, devices=_devices(db), distributed={},
                     info={"format": "nsys"}, warnings=warnings)
    return meta, TraceTables(events, FLOWS.empty_table(), COUNTERS.empty_table(),
                             _steps(events, rank))


def _id(value: Any) -> int:
    """An id column's value; NONE where nsys left it NULL."""
    return value if isinstance(value, int) else NONE


def _pid(global_id: Any) -> int:
    return int(global_id) // (1 << 24) % (1 << 24) if isinstance(global_id, int) else NONE


def _tid(global_id: Any) -> int:
    return int(global_id) % (1 << 24) if isinstance(global_id, int) else NONE


def _devices(db: _Db) -> list[dict[str, Any]]:
    for table in ("TARGET_INFO_GPU", "TARGET_INFO_CUDA_DEVICE"):
        if db.has(table, "id", "name") or db.has(table, "cudaId", "name"):
            key = "id" if db.has(table, "id") else "cudaId"
            return [{"id": r[0], "name": r[1]} for r in db.con.execute(
                f'SELECT "{key}", name FROM "{table}" ORDER BY "{key}"')]
    return []


def _table(rows: list[Row], rank: int) -> pa.Table:
    if not rows:
        return EVENTS.empty_table()
    rows.sort(key=lambda r: (r[0], -r[1]))
    cols = list(zip(*rows, strict=True))
    n = len(rows)
    none = pa.array(np.full(n, NONE, np.int64))
    return with_detail(pa.table({
        "rank": pa.array(np.full(n, rank, np.int32)),
        "ts": pa.array(cols[0], pa.int64()), "dur": pa.array(cols[1], pa.int64()),
        "kind": pa.array(cols[2]).dictionary_encode(),
        "name": pa.array(cols[3]).dictionary_encode(),
        "pid": pa.array(cols[4], pa.int64()), "tid": pa.array(cols[5], pa.int64()),
        "device": pa.array(cols[6], pa.int32()), "stream": pa.array(cols[7], pa.int64()),
        "correlation": pa.array(cols[8], pa.int64()), "external_id": none, "rf_id": none,
        "step": pa.array(np.full(n, NONE, np.int32)), "args": pa.array(cols[9], pa.string()),
    })).cast(EVENTS)
