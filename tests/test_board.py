"""The board: lists runs, serves reports and comparisons, read-only, nothing outside DIR."""

from __future__ import annotations

import http.client
import json
import shutil
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from perfswarm.errors import PerfswarmError
from perfswarm.report import board as board_module
from perfswarm.report import data, html
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


def built(server: BoardServer, path: str) -> tuple[int, bytes]:
    """The page once built: 202 building pages are asked again, as their refresh does."""
    for _ in range(600):
        status, body = get(server, path)
        if status != 202:
            return status, body
        assert b'http-equiv="refresh"' in body
        time.sleep(0.1)
    raise AssertionError(f"{path}: still building after a minute")


def test_report_and_compare(board: BoardServer) -> None:
    status, body = built(board, "/report/simple_add")
    assert status == 200 and body.startswith(b"<!DOCTYPE html>") and b"Plotly.newPlot" in body
    status, body = built(board, "/compare?a=simple_add&b=event_sync")
    assert status == 200 and b"perfswarm compare: simple_add vs event_sync" in body


def test_reports_build_in_the_background_with_their_stage(
        board_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A slow report answers at once with a page naming its stage; a second one waits behind
    it and says so; both are served when done, each built once."""
    release, stages = threading.Event(), []
    real = data.report_data

    def slow(run: Run, **kw: Any) -> dict[str, Any]:
        def on_stage(stage: str) -> None:
            stages.append((run.path.name, stage))
            kw_stage(stage)
            if stage == "prediction":
                assert release.wait(60)
        kw_stage = kw.pop("on_stage")
        return real(run, on_stage=on_stage, **kw)

    monkeypatch.setattr(board_module, "report_data", slow)
    monkeypatch.setattr(board_module, "FIRST_WAIT_S", 0.05)
    server = BoardServer(board_dir, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        status, body = get(server, "/report/simple_add")
        assert status == 202 and b"building the report of simple_add" in body
        for _ in range(600):
            status, body = get(server, "/report/simple_add")
            if b"prediction" in body:
                break
            time.sleep(0.1)
        assert status == 202 and b"building the report of simple_add: prediction" in body
        status, body = get(server, "/report/event_sync")
        assert status == 202 and b"queued behind 1" in body
        release.set()
        assert built(server, "/report/simple_add")[0] == 200
        assert built(server, "/report/event_sync")[0] == 200
        assert get(server, "/report/simple_add")[0] == 200
    finally:
        server.shutdown()
        server.server_close()
    for name in ("simple_add", "event_sync"):
        assert [s for n, s in stages if n == name] == [
            "prediction", "analysis", "timeline", "op costs", "views"]


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


def test_compare_shows_slower_and_faster_beyond_noise(corpus_runs: dict[str, Run]) -> None:
    """The board's comparison lists what got slower and what got faster, as `diff` does: HTA's
    trace_compare test run adds three ops inside step 1010 (slower, 155.5, 103.5 and 5.5 us an
    iteration) and calls nccl:all_reduce once instead of twice: 33.5 us an iteration faster,
    inside its noise band of 66.0 us (its 2 steps vary that much), so counted, not listed."""
    base, test = corpus_runs["compare_base"], corpus_runs["compare_test"]
    compared = data.compare_data(base, test, "base", "test")
    slower, faster = compared["changes"]
    # headed by the step time (the profiled steps' medians: an imported trace has no others)
    medians = [statistics.median(s["end"] - s["start"] for s in run.table("steps").to_pylist())
               for run in (base, test)]
    (card,) = [c for c in compared["cards"] if c["label"] == "step time"]
    assert card["value"] == f"{medians[0] / 1e6:,.3f} ms -> {medians[1] / 1e6:,.3f} ms"
    assert card["detail"].endswith("the steps profiled")
    assert slower["title"] == "slower in test" and faster["title"] == "faster in test"
    assert [(o["name"], o["per_iteration_delta_ns"]) for o in slower["ops"][:3]] == [
        ("All2All_Pooled_Req", 155_500), ("AddmmBackward0", 103_500), ("CatBackward0", 5_500)]
    assert all(o["beyond_noise"] for o in slower["ops"]) and slower["within_noise"] == 0
    # faster: nccl:all_reduce, an add kernel (3 calls -> 2) and the steps' time no op covers
    # (the three ops fell where nothing ran: 264.5 us an iteration), each within its band
    assert (faster["ops"], faster["within_noise"]) == ([], 3)
    page = html.render_compare(data.compare_data(base, test, "base", "test"))
    assert "slower in test" in page and "All2All_Pooled_Req" in page
    assert "faster in test (3 more within their noise band)" in page
