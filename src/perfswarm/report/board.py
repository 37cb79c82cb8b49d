"""`perfswarm board`: a read-only local web app over a directory of Runs.

No request path is ever joined onto the filesystem: the runs are listed once per
request by scanning DIR, and a URL can only name one of those listed runs (by its
directory name). Entries that resolve outside DIR (symlinks) are never listed, so no
spelling of `..` can reach anything else.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import orjson

from perfswarm.errors import PerfswarmError
from perfswarm.report import html
from perfswarm.report.data import compare_data, report_data
from perfswarm.trace.store import MANIFEST, Run


@dataclass(frozen=True)
class Listed:
    name: str
    path: Path


def list_runs(root: Path) -> dict[str, Listed]:
    """Run directories directly inside `root` (resolved inside it), by name."""
    base = root.resolve()
    found: dict[str, Listed] = {}
    for entry in sorted(base.iterdir()):
        real = entry.resolve()
        if base not in real.parents:
            continue  # a symlink out of DIR
        if real.is_dir() and (real / MANIFEST).is_file() and not entry.name.startswith("."):
            found[entry.name] = Listed(entry.name, real)
    return found


def _summary(listed: Listed) -> dict[str, Any]:
    manifest = Run.open(listed.path).manifest()
    return {"name": listed.name, "complete": manifest["complete"], "ranks": manifest["ranks"],
            "command": manifest["command"]}


class _ReportCache:
    """Rendered pages by (run names, manifest mtimes): a report is built once per change."""

    def __init__(self) -> None:
        self.pages: dict[tuple[Any, ...], bytes] = {}
        self.lock = threading.Lock()

    def get(self, key: tuple[Any, ...], build: Any) -> bytes:
        with self.lock:
            if key not in self.pages:
                self.pages[key] = build()
            return self.pages[key]


def _stamp(listed: Listed) -> tuple[str, int]:
    return listed.name, (listed.path / MANIFEST).stat().st_mtime_ns


class BoardHandler(BaseHTTPRequestHandler):
    server: BoardServer

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the board prints its address once, not a line per request."""

    def _send(self, status: HTTPStatus, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Content-Security-Policy",
                         "default-src 'none'; script-src 'unsafe-inline'; "
                         "style-src 'unsafe-inline'; img-src data:; form-action 'self'")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, status: HTTPStatus, why: str) -> None:
        self._send(status, f"{status.value} {status.phrase}: {why}\n".encode(),
                   "text/plain; charset=utf-8")

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        runs = list_runs(self.server.root)
        parts = [unquote(p) for p in url.path.split("/") if p]
        try:
            if not parts:
                page = html.render_board(str(self.server.root),
                                         [_summary(r) for r in runs.values()])
                self._send(HTTPStatus.OK, page.encode(), "text/html; charset=utf-8")
            elif parts == ["api", "runs"]:
                body = orjson.dumps([_summary(r) for r in runs.values()])
                self._send(HTTPStatus.OK, body, "application/json")
            elif len(parts) == 2 and parts[0] == "report" and parts[1] in runs:
                listed = runs[parts[1]]
                body = self.server.cache.get(("report", _stamp(listed)),
                                             lambda: self.server.report_page(listed.path))
                self._send(HTTPStatus.OK, body, "text/html; charset=utf-8")
            elif parts == ["compare"]:
                self._compare(runs, parse_qs(url.query))
            else:
                self._error(HTTPStatus.NOT_FOUND, "no such page or run")
        except PerfswarmError as exc:
            self._error(HTTPStatus.UNPROCESSABLE_ENTITY, str(exc))

    def _compare(self, runs: dict[str, Listed], query: dict[str, list[str]]) -> None:
        names = [query.get(side, [""])[0] for side in ("a", "b")]
        if not all(n in runs for n in names):
            self._error(HTTPStatus.NOT_FOUND, "compare needs ?a=RUN&b=RUN naming listed runs")
            return
        a, b = (runs[n] for n in names)
        body = self.server.cache.get(("compare", _stamp(a), _stamp(b)), lambda: (
            html.render_compare(compare_data(Run.open(a.path), Run.open(b.path),
                                             a.name, b.name)).encode()))
        self._send(HTTPStatus.OK, body, "text/html; charset=utf-8")

    def _read_only(self) -> None:
        self._error(HTTPStatus.METHOD_NOT_ALLOWED, "the board is read-only")

    do_POST = do_PUT = do_DELETE = do_PATCH = _read_only


class BoardServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, root: Path, host: str = "127.0.0.1", port: int = 0,
                 advice: Callable[[Run], Sequence[Mapping[str, Any]]] | None = None,
                 projection: Callable[[Run], tuple[Mapping[str, Any] | None, str]] | None
                 = None) -> None:
        """`advice` (optimize.advise, given by the CLI) adds advice cards to reports, and
        `projection` (optimize.project.report_projection) the scaling projection."""
        if not root.is_dir():
            raise PerfswarmError(f"{root}: not a directory")
        self.root = root.resolve()
        self.cache = _ReportCache()
        self.advice = advice
        self.projection = projection
        try:
            super().__init__((host, port), BoardHandler)
        except OSError as exc:
            raise PerfswarmError(f"{host}:{port}: cannot listen ({exc.strerror or exc})") from None

    def report_page(self, path: Path) -> bytes:
        run = Run.open(path)
        advice = self.advice(run) if self.advice else ()
        if self.projection is None:
            return html.render(report_data(run, advice=advice)).encode()
        return html.render(report_data(run, advice=advice,
                                       projection=self.projection(run))).encode()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}/"
