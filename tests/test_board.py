"""The board: lists runs, serves reports and comparisons, read-only, nothing outside DIR."""

from __future__ import annotations

import http.client
import json
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from perfswarm.errors import PerfswarmError
from perfswarm.report.board import BoardServer, list_runs
from perfswarm.trace.store import Run


@pytest.fixture(scope="module")
def board_dir(corpus_runs: dict[str, Run], tmp_path_factory: pytest.TempPathFactory) -> Path:
    top = tmp_path_factory.mktemp("board")
    root = top / "runs"
    root.mkdir()
    for name in ("event_sync", "simple_add"):
        shutil.copytree(corpus_runs[name].path, root / name)
    (top / "secret.txt").write_text("outside")
    shutil.copytree(corpus_runs["nccl"].path, top / "outside.run")
    (root / "escape").symlink_to(top / "outside.run")
    (root / "secret-link").symlink_to(top / "secret.txt")
    (root / "not-a-run").mkdir()
    return root


@pytest.fixture(scope="module")
def board(board_dir: Path) -> Iterator[BoardServer]:
    server = BoardServer(board_dir, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def get(server: BoardServer, path: str, method: str = "GET") -> tuple[int, bytes]:
    host, port = server.server_address[:2]
    conn = http.client.HTTPConnection(str(host), port, timeout=60)
    conn.request(method, path)
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    return resp.status, body


def test_lists_only_runs_inside_dir(board_dir: Path) -> None:
    assert list(list_runs(board_dir)) == ["event_sync", "simple_add"]


def test_index_and_api(board: BoardServer) -> None:
    status, body = get(board, "/")
    assert status == 200 and b'href="/report/event_sync"' in body and b"escape" not in body
    status, body = get(board, "/api/runs")
    assert status == 200
    assert [r["name"] for r in json.loads(body)] == ["event_sync", "simple_add"]


def test_report_and_compare(board: BoardServer) -> None:
    status, body = get(board, "/report/simple_add")
    assert status == 200 and body.startswith(b"<!DOCTYPE html>") and b"Plotly.newPlot" in body
    status, body = get(board, "/compare?a=simple_add&b=event_sync")
    assert status == 200 and b"perfswarm compare: simple_add vs event_sync" in body


@pytest.mark.parametrize("path", [
    "/report/../../secret.txt", "/report/..%2f..%2fsecret.txt", "/report/%2e%2e/secret.txt",
    "/report/%2e%2e%2fsecret.txt", "/report/escape", "/report/secret-link", "/report/not-a-run",
    "/..%2fsecret.txt", "/%2e%2e/%2e%2e/etc/passwd", "/report/simple_add/manifest.json",
    "/report/simple_add%2fmanifest.json", "/compare?a=escape&b=simple_add",
    "/compare?a=../outside.run&b=simple_add", "/secret.txt",
])
def test_nothing_outside_the_listed_runs(board: BoardServer, path: str) -> None:
    status, body = get(board, path)
    assert status == 404 and b"outside" not in body


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE"])
def test_read_only(board: BoardServer, method: str) -> None:
    assert get(board, "/", method)[0] == 405


def test_bad_dir(tmp_path: Path) -> None:
    with pytest.raises(PerfswarmError, match="not a directory"):
        BoardServer(tmp_path / "missing")
