"""`perfswarm board`: a read-only local web app over a directory of Runs.

No request path is ever joined onto the filesystem: the runs are listed once per
request by scanning DIR, and a URL can only name one of those listed runs (by its
directory name). Entries that resolve outside DIR (symlinks) are never listed, so no
spelling of `..` can reach anything else; a run whose manifest or tables link outside its
directory is listed as broken and never read.

Against other web pages (DNS rebinding) only requests whose Host header names this machine
(localhost, a loopback address, or the --host given) are answered. Against idle or slow
clients each connection has a socket timeout and at most MAX_CONNECTIONS are served at once
(more are answered 503 and closed); clients that go away end their thread quietly.
It stays on http.server (no new dependency): the board serves one user on loopback, and
these few limits cover what a server stack would add here.
"""

from __future__ import annotations

import contextlib
import queue
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import orjson

from perfswarm.analyze.iterations import batch_sizes, step_time
from perfswarm.errors import PerfswarmError, RunError
from perfswarm.report import html
from perfswarm.report.data import compare_data, report_data
from perfswarm.trace.store import MANIFEST, Run

MAX_CONNECTIONS = 32
IDLE_SECONDS = 10.0
CACHED_PAGES = 8
FIRST_WAIT_S = 1.0  # a page built within this is sent at once, with no building page first
LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})
SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; "
                               "style-src 'unsafe-inline'; img-src data:; form-action 'self'; "
                               "frame-ancestors 'none'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Cache-Control": "no-store",
}


@dataclass(frozen=True)
class Listed:
    name: str
    path: Path


def list_runs(root: Path) -> dict[str, Listed]:
    """Run directories directly inside `root` (resolved inside it), by name."""
    base = root.resolve()
    found: dict[str, Listed] = {}
    for entry in sorted(base.iterdir()):
        try:
            real = entry.resolve(strict=True)
            if base not in real.parents or entry.name.startswith("."):
                continue  # a symlink out of DIR
            if real.is_dir() and (real / MANIFEST).exists():
                found[entry.name] = Listed(entry.name, real)
        except (OSError, RuntimeError):
            continue  # a dangling link, a symlink loop, a file that went away
    return found


def open_listed(listed: Listed) -> Run:
    """The Run, refused (RunError) when its manifest or any table links outside it."""
    for path in (listed.path / MANIFEST, *sorted((listed.path / "tables").glob("*"))):
        try:
            inside = listed.path in path.resolve(strict=True).parents
        except (OSError, RuntimeError):
            inside = False
        if not inside:
            raise RunError(f"{listed.name}/{path.relative_to(listed.path)}: links outside the run")
    return Run.open(listed.path)


def _summary(listed: Listed) -> dict[str, Any]:
    """One index row: what ran, when, on what, how long a step took, and where it lies."""
    try:
        run = open_listed(listed)
        manifest = run.manifest()
        # (a damaged table: this Run is broken)
        steps = run.table("steps", ["rank", "step", "start", "end", "source"])
    except RunError as exc:
        return {"name": listed.name, "broken": str(exc).replace(str(listed.path), listed.name)}
    start = manifest.get("extra", {}).get("record", {}).get("start_ns")
    when = start / 1e9 if isinstance(start, int) else run.manifest_path.stat().st_mtime
    devices = sorted({str(d.get("name")) for d in manifest["devices"] if d.get("name")})
    timing = step_time(steps, batch_sizes(run))  # the report's step time
    # the host is the recording machine's; an imported trace's is the importer's, not its own
    recorded = "record" in manifest.get("extra", {})
    return {"name": listed.name, "complete": manifest["complete"], "ranks": manifest["ranks"],
            "command": manifest["command"], "directory": str(listed.path),
            "date": datetime.fromtimestamp(when, UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "device": ", ".join(devices) or (str(manifest["host"].get("cpu_model", ""))
                                             if recorded else ""),
            "step_ms": timing.median_ns / 1e6 if timing is not None else None}


@dataclass
class Build:
    """One page being built in the background: its stage, then the page or the reason."""

    stage: str = "queued"
    asked: float = field(default_factory=time.monotonic)
    page: bytes | None = None
    error: str | None = None
    status: HTTPStatus = HTTPStatus.OK
    done: threading.Event = field(default_factory=threading.Event)

    def at(self, stage: str) -> None:
        self.stage = stage


class _ReportCache:
    """Pages built in the background, one at a time (a report is seconds of CPU), by (run
    names, manifest mtimes): each built once per change of its runs. The last CACHED_PAGES
    finished ones are kept (memory stays bounded however many runs are opened); a build
    still queued or running is never dropped."""

    def __init__(self) -> None:
        self.pages: OrderedDict[tuple[Any, ...], Build] = OrderedDict()
        self.lock = threading.Lock()
        self.queue: queue.SimpleQueue[tuple[Build, Callable[[Build], bytes]]] = queue.SimpleQueue()
        # a daemon: Ctrl-C on the board does not wait for a report being built
        threading.Thread(target=self._work, name="board-build", daemon=True).start()

    def get(self, key: tuple[Any, ...], build: Callable[[Build], bytes]) -> Build:
        """The page's build, started (queued behind the others) on first ask."""
        with self.lock:
            found = self.pages.get(key)
            if found is None:
                found = self.pages[key] = Build()
                self.queue.put((found, build))
                finished = [k for k, b in self.pages.items() if b.done.is_set()]
                for old in finished[:max(0, len(finished) - CACHED_PAGES)]:
                    del self.pages[old]
            self.pages.move_to_end(key)
            return found

    def ahead_of(self, entry: Build) -> int:
        """How many builds run or wait before this one."""
        with self.lock:
            waiting = [b for b in self.pages.values() if not b.done.is_set()]
        return sum(1 for b in waiting if b.asked < entry.asked)

    def _work(self) -> None:
        while True:
            self._build(*self.queue.get())

    @staticmethod
    def _build(entry: Build, build: Callable[[Build], bytes]) -> None:
        try:
            entry.page = build(entry)
        except PerfswarmError as exc:
            entry.error, entry.status = str(exc), HTTPStatus.UNPROCESSABLE_ENTITY
        except Exception as exc:  # a defect: say it on the page, keep the board serving
            entry.error = f"building the page failed ({type(exc).__name__}: {exc})"
            entry.status = HTTPStatus.INTERNAL_SERVER_ERROR
        finally:
            entry.done.set()


def _stamp(listed: Listed) -> tuple[str, int]:
    return listed.name, (listed.path / MANIFEST).stat().st_mtime_ns


class BoardHandler(BaseHTTPRequestHandler):
    server: BoardServer
    timeout = IDLE_SECONDS  # a socket timeout: an idle or slow client loses its connection

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the board prints its address once, not a line per request."""

    def _send(self, status: HTTPStatus, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in SECURITY_HEADERS.items():
            self.send_header(name, value)
        if status == HTTPStatus.METHOD_NOT_ALLOWED or self.command == "OPTIONS":
            self.send_header("Allow", "GET, HEAD, OPTIONS")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, status: HTTPStatus, why: str) -> None:
        self._send(status, f"{status.value} {status.phrase}: {why}\n".encode(),
                   "text/plain; charset=utf-8")

    def do_HEAD(self) -> None:
        self.do_GET()

    def _host_allowed(self) -> bool:
        host = self.headers.get("Host", "")
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        return name.lower() in self.server.allowed_hosts

    def do_OPTIONS(self) -> None:
        if not self._host_allowed():
            self._error(HTTPStatus.FORBIDDEN, "unknown Host (use localhost)")
            return
        self._send(HTTPStatus.NO_CONTENT, b"", "text/plain; charset=utf-8")

    def do_GET(self) -> None:
        if not self._host_allowed():
            self._error(HTTPStatus.FORBIDDEN, "unknown Host (use localhost)")
            return
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
                run = open_listed(listed)
                self._page(self.server.cache.get(
                    ("report", _stamp(listed)), lambda b: self.server.report_page(run, b)),
                    f"the report of {listed.name}")
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
        run_a, run_b = open_listed(a), open_listed(b)

        def build(entry: Build) -> bytes:
            entry.at("diff")
            return html.render_compare(compare_data(run_a, run_b, a.name, b.name)).encode()

        self._page(self.server.cache.get(("compare", _stamp(a), _stamp(b)), build),
                   f"{a.name} vs {b.name}")

    def _page(self, entry: Build, what: str) -> None:
        """The page when built (waiting up to FIRST_WAIT_S for it), else 202 and a page
        that says what the build is doing and reloads itself every second."""
        if entry.done.wait(FIRST_WAIT_S) and entry.page is not None:
            self._send(HTTPStatus.OK, entry.page, "text/html; charset=utf-8")
        elif entry.error is not None:
            self._error(entry.status, entry.error)
        else:
            page = html.render_building(what, entry.stage, time.monotonic() - entry.asked,
                                        self.server.cache.ahead_of(entry))
            self._send(HTTPStatus.ACCEPTED, page.encode(), "text/html; charset=utf-8")

    def _read_only(self) -> None:
        self._error(HTTPStatus.METHOD_NOT_ALLOWED, "the board is read-only")

    do_POST = do_PUT = do_DELETE = do_PATCH = do_TRACE = do_CONNECT = _read_only


class BoardServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = MAX_CONNECTIONS

    def __init__(self, root: Path, host: str = "127.0.0.1", port: int = 0,
                 advice: Callable[[Run], Sequence[Mapping[str, Any]]] | None = None,
                 projection: Callable[[Run], Mapping[str, Any]] | None = None) -> None:
        """`advice` (optimize.advise, given by the CLI) adds advice cards to reports, and
        `projection` (optimize.project.report_projection) the scaling projection."""
        if not root.is_dir():
            raise PerfswarmError(f"{root}: not a directory")
        self.root = root.resolve()
        self.allowed_hosts = LOCAL_HOSTS | {host.lower(), f"[{host.lower()}]"} - {"0.0.0.0", "::"}
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.cache = _ReportCache()
        self.advice = advice
        self.projection = projection
        try:
            super().__init__((host, port), BoardHandler)
        except OSError as exc:
            raise PerfswarmError(f"{host}:{port}: cannot listen ({exc.strerror or exc})") from None

    def process_request(self, request: Any, client_address: Any) -> None:
        """A thread per connection, at most MAX_CONNECTIONS at once; past that, 503."""
        if not self.slots.acquire(blocking=False):
            with contextlib.suppress(OSError):
                request.sendall(b"HTTP/1.0 503 Service Unavailable\r\nRetry-After: 1\r\n"
                                b"Content-Length: 0\r\n\r\n")
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hung up or timed out is no error worth a traceback."""
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)

    def report_page(self, run: Run, entry: Build) -> bytes:
        """The report's page, saying each stage to `entry` as it goes."""
        data = report_data(run, advice=self.advice, projection=self.projection,
                           on_stage=entry.at)
        entry.at("page")
        return html.render(data).encode()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}/"
