"""perfswarm import of an Nsight Systems SQLite export (`nsys export --type sqlite`).

No nsys here: the fixture is built with the tables and columns of NVIDIA's "SQLite Export
Schema Reference" (names, types, NOT NULL as documented; nsys creates tables lazily, so only
these exist), holding two ProfilerStep#N NVTX ranges of a small training step."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import orjson
import pytest

from perfswarm.cli.main import main
from perfswarm.trace.ingest import ImportOptions, import_traces
from perfswarm.trace.nsys import is_nsys

SCHEMA = """
CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE TARGET_INFO_SESSION_START_TIME (utcEpochNs INT, utcTime TEXT, localTime TEXT);
CREATE TABLE TARGET_INFO_GPU (id INTEGER NOT NULL PRIMARY KEY, name TEXT, busLocation TEXT,
  isDiscrete INT, l2CacheSize INT, totalMemory INT, memoryBandwidth INT, clockRate INT,
  smCount INT, pwGpuId INT, uuid TEXT, luid INT, chipName TEXT, cuDevice INT);
CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INT NOT NULL, end INT NOT NULL,
  eventClass INT NOT NULL, globalTid INT, correlationId INT, nameId INT NOT NULL,
  returnValue INT NOT NULL, callchainId INT);
CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INT NOT NULL, end INT NOT NULL,
  deviceId INT NOT NULL, contextId INT NOT NULL, streamId INT NOT NULL, correlationId INT,
  globalPid INT, demangledName INT NOT NULL, shortName INT NOT NULL, mangledName INT,
  launchType INT, cacheConfig INT, registersPerThread INT NOT NULL, gridX INT NOT NULL,
  gridY INT NOT NULL, gridZ INT NOT NULL, blockX INT NOT NULL, blockY INT NOT NULL,
  blockZ INT NOT NULL, staticSharedMemory INT NOT NULL, dynamicSharedMemory INT NOT NULL,
  localMemoryPerThread INT NOT NULL, localMemoryTotal INT NOT NULL, gridId INT NOT NULL,
  sharedMemoryExecuted INT, graphNodeId INT, sharedMemoryLimitConfig INT);
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INT NOT NULL, end INT NOT NULL,
  deviceId INT NOT NULL, contextId INT NOT NULL, streamId INT NOT NULL, correlationId INT,
  globalPid INT, bytes INT NOT NULL, copyKind INT NOT NULL, deprecatedSrcId INT,
  srcKind INT, dstKind INT, srcDeviceId INT, srcContextId INT, dstDeviceId INT,
  dstContextId INT, migrationCause INT, graphNodeId INT, virtualAddress INT);
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMSET (start INT NOT NULL, end INT NOT NULL,
  deviceId INT NOT NULL, contextId INT NOT NULL, streamId INT NOT NULL, correlationId INT,
  globalPid INT, value INT NOT NULL, bytes INT NOT NULL, graphNodeId INT, memKind INT);
CREATE TABLE NVTX_EVENTS (start INT NOT NULL, end INT, eventType INT NOT NULL, rangeId INT,
  category INT, color INT, text TEXT, globalTid INT, endGlobalTid INT, textId INT,
  domainId INT, uint64Value INT, int64Value INT, doubleValue REAL, uint32Value INT,
  int32Value INT, floatValue REAL, jsonTextId INT, jsonText TEXT);
CREATE TABLE OSRT_API (start INT NOT NULL, end INT NOT NULL, eventClass INT NOT NULL,
  globalTid INT, correlationId INT, nameId INT NOT NULL, returnValue INT NOT NULL,
  nestingLevel INT, callchainId INT);
"""
EPOCH = 1_700_000_000_000_000_000
PID, TID = 4242, 4250
GTID = (PID << 24) + TID  # serialized: pid * 2**24 + tid (the hardware/VM bits above: 0)
GPID = PID << 24


def export(path: Path) -> Path:
    db = sqlite3.connect(path)
    db.executescript(SCHEMA)
    db.executemany("INSERT INTO StringIds VALUES (?, ?)", [
        (1, "cudaLaunchKernel_v7000"), (2, "cudaMemcpyAsync_v3020"),
        (3, "void gemm_kernel<float>(float*, int)"), (4, "gemm_kernel"), (5, "read"),
        (6, "ProfilerStep#1")])
    db.execute("INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (?, '', '')", (EPOCH,))
    db.execute("INSERT INTO TARGET_INFO_GPU (id, name) VALUES (0, 'NVIDIA H100 80GB HBM3')")
    nvtx = "INSERT INTO NVTX_EVENTS (start, end, eventType, text, textId, globalTid)"
    db.execute(nvtx + " VALUES (1000, 50000, 59, NULL, 6, ?)", (GTID,))  # textId -> StringIds
    db.execute(nvtx + " VALUES (50000, 90000, 59, 'ProfilerStep#2', NULL, ?)", (GTID,))
    db.execute(nvtx + " VALUES (60000, NULL, 34, 'checkpoint', NULL, ?)", (GTID,))
    db.execute(nvtx + " VALUES (70000, NULL, 59, 'never closed', NULL, ?)", (GTID,))
    db.execute(nvtx + " VALUES (70000, 71000, 75, 'a domain create', NULL, ?)", (GTID,))
    runtime = "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, 1, ?, ?, ?, 0, NULL)"
    kernel = ("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, 0, 1, 7, ?, ?, 3, 4, NULL,"
              " 0, 0, 32, 128, 2, 1, 256, 1, 1, 1024, ?, 0, 0, ?, NULL, NULL, NULL)")
    for step, t in ((1, 2000), (2, 51000)):
        db.execute(runtime, (t, t + 3000, GTID, 10 * step, 1))
        db.execute(kernel, (t + 5000, t + 25000, 10 * step, GPID, 512 * step, step))
    db.execute(runtime, (40000, 41000, GTID, 30, 2))
    db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY (start, end, deviceId, contextId,"
               " streamId, correlationId, globalPid, bytes, copyKind) VALUES"
               " (42000, 46000, 0, 1, 7, 30, ?, 1048576, 1)", (GPID,))
    db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_MEMSET VALUES (80000, 80500, 0, 1, 7, NULL,"
               " ?, 0, 4096, NULL, NULL)", (GPID,))
    db.execute("INSERT INTO OSRT_API VALUES (30000, 39000, 27, ?, 0, 5, 4096, 0, NULL)",
               (GTID,))
    db.commit()
    db.close()
    return path


@pytest.fixture(scope="module")
def nsys_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[object]]:
    root = tmp_path_factory.mktemp("nsys")
    run = import_traces([export(root / "report1.sqlite")], root / "r.run", ImportOptions(),
                        ["test"])
    m = run.manifest()
    assert m["sources"][0]["format"] == "nsys" and m["sources"][0]["events"] == 11
    assert m["clock_offsets"] == {"nsys:report1.sqlite": EPOCH}
    assert m["devices"] == [{"rank": 0, "id": 0, "name": "NVIDIA H100 80GB HBM3"}]
    assert [w["what"] for w in m["warnings"]] == ["NVTX_EVENTS: ranges never closed, dropped"]
    assert run.table("steps").to_pydict() == {
        "rank": [0, 0], "step": [1, 2], "start": [EPOCH + 1000, EPOCH + 50000],
        "end": [EPOCH + 50000, EPOCH + 90000], "source": ["marker", "marker"]}
    return run.table("events").to_pydict()


def test_every_table_becomes_events(nsys_run: dict[str, list[object]]) -> None:
    e = nsys_run
    rows = sorted(zip(e["ts"], e["dur"], e["kind"], e["name"], e["pid"], e["tid"], e["device"],
                      e["stream"], e["correlation"], e["step"], strict=True))
    gemm = "void gemm_kernel<float>(float*, int)"
    assert [(ts - EPOCH, *rest) for ts, *rest in rows] == [  # type: ignore[operator]
        (1000, 49000, "user_annotation", "ProfilerStep#1", PID, TID, -1, -1, -1, 1),
        (2000, 3000, "runtime", "cudaLaunchKernel", PID, TID, -1, -1, 10, 1),
        (7000, 20000, "kernel", gemm, PID, 7, 0, 7, 10, 1),
        (30000, 9000, "syscall", "read", PID, TID, -1, -1, -1, 1),
        (40000, 1000, "runtime", "cudaMemcpyAsync", PID, TID, -1, -1, 30, 1),
        (42000, 4000, "memcpy", "Memcpy HtoD", PID, 7, 0, 7, 30, 1),
        (50000, 40000, "user_annotation", "ProfilerStep#2", PID, TID, -1, -1, -1, 2),
        (51000, 3000, "runtime", "cudaLaunchKernel", PID, TID, -1, -1, 20, 2),
        (56000, 20000, "kernel", gemm, PID, 7, 0, 7, 20, 2),
        (60000, 0, "instant", "checkpoint", PID, TID, -1, -1, -1, 2),
        (80000, 500, "memset", "Memset (Device)", PID, 7, 0, 7, -1, 2),
    ]
    kernel_args = [orjson.loads(a) for a, k in zip(e["args"], e["kind"], strict=True)  # type: ignore[arg-type]
                   if k == "kernel"]
    assert kernel_args == [{"grid": [128, 2, 1], "block": [256, 1, 1], "registers per thread": 32,
                            "shared memory": 1024 + 512 * s} for s in (1, 2)]
    assert [orjson.loads(a) for a, k in zip(e["args"], e["kind"], strict=True)  # type: ignore[arg-type]
            if k in ("memcpy", "memset")] == [{"bytes": 1048576}, {"bytes": 4096}]


def test_analyze_an_nsys_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = export(tmp_path / "report1.sqlite")
    assert is_nsys(path) and not is_nsys(Path(__file__))
    assert main(["import", str(tmp_path), "-o", str(tmp_path / "r.run"), "-q"]) == 0
    assert main(["analyze", str(tmp_path / "r.run"), "--json"]) == 0
    out = orjson.loads(capsys.readouterr().out)
    (rank,) = out["concurrency"]["ranks"]
    # step 1: the gemm 20 us; the copy 4 us; host busy: two launches (3 + 1 us) and the read
    # (9 us); step 2: the gemm, the 0.5 us memset, one launch
    assert [(i["step"], i["span_ns"], i["ns"]) for i in rank["iterations"]] == [
        (1, 49000, {"comm_only": 0, "compute_only": 20000, "host_busy_device_idle": 13000,
                    "idle": 12000, "memory": 4000, "overlapped": 0}),
        (2, 40000, {"comm_only": 0, "compute_only": 20000, "host_busy_device_idle": 3000,
                    "idle": 16500, "memory": 500, "overlapped": 0})]


def test_nccl_kernels_are_collectives(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An NCCL kernel of the export (step 2, 60-75 us on stream 9, under the gemm's 56-76 us
    on stream 7) is a `collective` event, as the Kineto reader makes one: analyze counts its
    15 us as communication, all of it under the gemm (it had been a second compute kernel,
    so the collective rules never saw a multi-rank nsys job's waits)."""
    path = export(tmp_path / "report1.sqlite")
    db = sqlite3.connect(path)
    nccl = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
    db.execute("INSERT INTO StringIds VALUES (7, ?)", (nccl,))
    db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (60000, 75000, 0, 1, 9, NULL, ?,"
               " 7, 7, NULL, 0, 0, 32, 2, 1, 1, 512, 1, 1, 0, 0, 0, 0, 3, NULL, NULL, NULL)",
               (GPID,))
    db.commit()
    db.close()
    run = import_traces([path], tmp_path / "r.run", ImportOptions(), ["test"])
    e = run.table("events", columns=["kind", "name"]).to_pydict()
    assert [(k, n) for k, n in zip(e["kind"], e["name"], strict=True)
            if k in ("kernel", "collective")] == [
        ("kernel", "void gemm_kernel<float>(float*, int)"),
        ("kernel", "void gemm_kernel<float>(float*, int)"), ("collective", nccl)]
    assert main(["analyze", str(tmp_path / "r.run"), "--json"]) == 0
    (rank,) = orjson.loads(capsys.readouterr().out)["concurrency"]["ranks"]
    assert rank["iterations"][1]["ns"] == {
        "comm_only": 0, "compute_only": 5000, "host_busy_device_idle": 3000, "idle": 16500,
        "memory": 500, "overlapped": 15000}


@pytest.mark.parametrize(("make", "why"), [
    (lambda p: p.write_bytes(b"SQLite format 3\x00" + b"\x00" * 100),
     "not a readable SQLite database"),
    (lambda p: sqlite3.connect(p).executescript("CREATE TABLE t (a INT)"),
     "not an Nsight Systems export: none of the tables CUPTI_ACTIVITY_KIND_KERNEL"),
    (lambda p: sqlite3.connect(p).executescript(
        "CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INT, end INT);"
        "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (1, 2)"),
     "(CUPTI_ACTIVITY_KIND_KERNEL): no column deviceId"),
    (lambda p: sqlite3.connect(p).executescript(
        "CREATE TABLE OSRT_API (start INT, end INT, globalTid INT, nameId INT);"
        "INSERT INTO OSRT_API VALUES ('soon', 2, 1, 1)"),
     "(OSRT_API): start is not a time or id: 'soon'"),
    (lambda p: sqlite3.connect(p).executescript(
        "CREATE TABLE OSRT_API (start INT, end INT, globalTid INT, nameId INT);"
        "INSERT INTO OSRT_API VALUES (1, 2, 1, 9)"),
     "(OSRT_API): string id 9 not in StringIds"),
])
def test_bad_exports_exit_2(make: object, why: str, tmp_path: Path,
                            capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.sqlite"
    make(path)  # type: ignore[operator]
    out = tmp_path / "bad.run"
    assert main(["import", str(path), "-o", str(out), "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert why in err and str(path) in err and len(err.splitlines()) == 1, err
    assert not out.exists()
