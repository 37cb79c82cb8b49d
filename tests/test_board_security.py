"""The board against a hostile web page, a hostile DIR and hostile clients (issue 23): Host
check, security headers, links out of runs, broken runs, loops, idle clients, a flood."""

from __future__ import annotations

import gzip
import http.client
import json
import shutil
import socket
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import corpus
from perfswarm.report import board as board_module
from perfswarm.report.board import CACHED_PAGES, BoardHandler, BoardServer, _ReportCache, list_runs
from perfswarm.report.data import report_data
from perfswarm.report.text import ms
from perfswarm.trace.ingest import ImportOptions, import_traces
from perfswarm.trace.store import Run


@pytest.fixture(scope="module")
def hostile_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    top = tmp_path_factory.mktemp("hostile")
    root = top / "runs"
    root.mkdir()
    good = import_traces([corpus("compare_base")], root / "good", ImportOptions(), ["t"]).path
    outside = shutil.copytree(good, top / "outside.run")
    (outside / "manifest.json").write_text(json.dumps(
        {**json.loads((good / "manifest.json").read_text()), "command": ["SECRET"]}))
    linked = shutil.copytree(good, root / "linked-manifest")
    (linked / "manifest.json").unlink()
    (linked / "manifest.json").symlink_to(outside / "manifest.json")
    table = shutil.copytree(good, root / "linked-table")
    (table / "tables" / "events.parquet").unlink()
    (table / "tables" / "events.parquet").symlink_to(outside / "tables" / "events.parquet")
    broken = shutil.copytree(good, root / "broken")
    (broken / "manifest.json").write_text("{")
    damaged = shutil.copytree(good, root / "no-steps")  # had failed the whole index
    (damaged / "tables" / "steps.parquet").unlink()
    (root / "loop-a").symlink_to(root / "loop-b")
    (root / "loop-b").symlink_to(root / "loop-a")
    return root


def raw_device(path: Path) -> str:
    """The GPU names of a trace's deviceProperties, as the index lists them."""
    props = json.loads(gzip.decompress(path.read_bytes())).get("deviceProperties", [])
    return ", ".join(sorted({d["name"] for d in props}))


@pytest.fixture
def board(hostile_dir: Path) -> Iterator[BoardServer]:
    server = BoardServer(hostile_dir, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def request(server: BoardServer, path: str, method: str = "GET", host: str | None = None
            ) -> http.client.HTTPResponse:
    addr, port = server.server_address[:2]
    conn = http.client.HTTPConnection(str(addr), port, timeout=30)
    conn.putrequest(method, path, skip_host=host is not None)
    if host:
        conn.putheader("Host", host)
    conn.endheaders()
    resp = conn.getresponse()
    resp.read()
    conn.close()
    return resp


def body(server: BoardServer, path: str) -> bytes:
    addr, port = server.server_address[:2]
    conn = http.client.HTTPConnection(str(addr), port, timeout=60)
    conn.request("GET", path)
    data = conn.getresponse().read()
    conn.close()
    return data


def test_security_headers_and_methods(board: BoardServer) -> None:
    resp = request(board, "/")
    assert resp.status == 200
    assert resp.getheader("X-Frame-Options") == "DENY"
    assert resp.getheader("X-Content-Type-Options") == "nosniff"
    assert resp.getheader("Referrer-Policy") == "no-referrer"
    assert "frame-ancestors 'none'" in (resp.getheader("Content-Security-Policy") or "")
    options = request(board, "/", "OPTIONS")
    assert (options.status, options.getheader("Allow")) == (204, "GET, HEAD, OPTIONS")
    assert request(board, "/", "TRACE").status == 405


def test_only_local_host_names(board: BoardServer) -> None:
    port = board.server_address[1]
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", "LOCALHOST"):
        assert request(board, "/api/runs", host=host).status == 200, host
    for host in (f"evil.example:{port}", "127.0.0.1.evil.example", f"10.0.0.1:{port}"):
        assert request(board, "/api/runs", host=host).status == 403, host
    assert request(board, "/report/good", host="evil.example").status == 403


def test_links_out_and_broken_runs_are_listed_as_broken(board: BoardServer,
                                                        hostile_dir: Path) -> None:
    assert list(list_runs(hostile_dir)) == ["broken", "good", "linked-manifest", "linked-table",
                                            "no-steps"]
    runs = {r["name"]: r for r in json.loads(body(board, "/api/runs"))}
    good = runs["good"]
    raw = json.loads(gzip.decompress(corpus("compare_base").read_bytes()))["traceEvents"]
    steps = [e["dur"] / 1e3 for e in raw if e["name"].startswith("ProfilerStep#")]
    assert good["command"] == ["t"] and good["directory"] == str(hostile_dir / "good")
    assert good["step_ms"] == pytest.approx(statistics.median(steps), abs=1e-6)
    # no deviceProperties in this trace: no device (the machine it was imported on is not
    # the one it ran on)
    assert good["device"] == raw_device(corpus("compare_base"))
    assert runs["linked-manifest"]["broken"] == ("linked-manifest/manifest.json: links outside "
                                                 "the run")
    assert runs["linked-table"]["broken"] == ("linked-table/tables/events.parquet: links outside "
                                              "the run")
    assert "unreadable manifest" in runs["broken"]["broken"]
    assert runs["no-steps"]["broken"] == ("no-steps/tables/steps.parquet: missing (every Run "
                                          "has its steps table; a damaged Run)")
    index = body(board, "/")
    assert b"broken: broken" in index and b"SECRET" not in index
    for name in ("linked-manifest", "linked-table", "broken"):
        resp = request(board, f"/report/{name}")
        assert resp.status == 422, name
    assert b"SECRET" not in body(board, "/report/linked-manifest")


def test_idle_clients_are_dropped_and_a_flood_is_bounded(
        hostile_dir: Path, monkeypatch: pytest.MonkeyPatch,
        capfd: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(BoardHandler, "timeout", 0.5)
    monkeypatch.setattr(board_module, "MAX_CONNECTIONS", 4)
    server = BoardServer(hostile_dir, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        idle = [socket.create_connection(server.server_address[:2]) for _ in range(4)]
        time.sleep(0.2)
        extra = socket.create_connection(server.server_address[:2])
        extra.settimeout(5)
        assert extra.recv(100).startswith(b"HTTP/1.0 503")
        for s in idle:  # each idle one is closed by the server after its timeout
            s.settimeout(5)
            assert s.recv(100) == b""
            s.close()
        gone = socket.create_connection(server.server_address[:2])  # asks, then hangs up
        gone.sendall(b"GET /report/good HTTP/1.1\r\nHost: localhost\r\n\r\n")
        gone.close()
        flood = [socket.create_connection(server.server_address[:2]) for _ in range(100)]
        for s in flood:
            s.close()
        assert request(server, "/api/runs").status == 200
    finally:
        server.shutdown()
        server.server_close()
    assert "Traceback" not in capfd.readouterr().err


def test_report_cache_is_bounded() -> None:
    cache = _ReportCache()
    for i in range(3 * CACHED_PAGES):
        entry = cache.get(("report", (str(i), i)), lambda _, i=i: str(i).encode())
        assert entry.done.wait(10) and entry.page == str(i).encode()
    cache.get(("report", ("last", 0)), lambda _: b"").done.wait(10)
    assert len(cache.pages) == CACHED_PAGES + 1  # the finished ones, and the one just asked


def test_a_recorded_runs_step_time_is_the_reports(trainer_run: Run, tmp_path: Path) -> None:
    """The index's step time is the report card's: with two steps after the profiler's
    window (under the three that would time the program), the profiled steps' median, not
    that of every step the recorder listed (its warm-up, export and unprofiled ones); its
    device, the recording machine's CPU."""
    shutil.copytree(trainer_run.path, tmp_path / "t.run")
    row = board_module._summary(list_runs(tmp_path)["t.run"])
    steps = trainer_run.table("steps").to_pylist()
    marked = [s["end"] - s["start"] for s in steps if s["source"] == "marker"]
    assert row["step_ms"] == pytest.approx(statistics.median(marked) / 1e6)
    card = report_data(trainer_run)["cards"][0]
    assert (card["label"], card["value"]) == ("step time", ms(statistics.median(marked)))
    assert row["device"] == trainer_run.manifest()["host"]["cpu_model"]
