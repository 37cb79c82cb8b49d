"""What every collector is: started on the child's pid, stopped, and a status for the manifest."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
import orjson

from perfswarm.errors import TraceFormatError
from perfswarm.trace.store import CollectorStatus

Clock = Callable[[], int]
# Tools' clock readings and durations beyond this (146 years of ns) are not a clock; the bound
# leaves room to add an epoch offset, or a duration to a time, within int64.
MAX_CLOCK_NS = 1 << 62


def int64_field(text: str, path: Path, line: int, what: str, limit: int = 1 << 63) -> int:
    """A decimal (or 0x-hex) integer field of a tool's text output, checked to fit `limit`
    (an int64 column by default): anything larger means the file is not what the tool writes."""
    if len(text) <= 20:  # longer cannot fit, and int() of thousands of digits is refused
        value = int(text, 16) if text[:2] in ("0x", "0X") else int(text)
        if -limit <= value < limit:
            return value
    raise TraceFormatError(path, f"line {line}", f"{what} out of range: {text[:24]}")


class Collector:
    """A source of raw files in the recording directory. Subclasses override what they need.

    A missing tool or permission is never fatal: `status` becomes
    `unavailable: reason` and the recording goes on without this collector.
    """

    name = ""

    def __init__(self, raw: Path) -> None:
        self.raw = raw
        self.state = "ok"

    def env(self) -> dict[str, str]:
        """Variables the child needs (only the torch collector sets any)."""
        return {}

    def start(self, pid: int) -> None:
        """Begin collecting on the process tree rooted at `pid`."""

    def stop(self) -> None:
        """Flush and close; called once, after the child has exited."""

    def files(self) -> list[str]:
        return []

    def count(self) -> int:
        """Samples or events so far, for the live status line."""
        return 0

    def status(self) -> CollectorStatus:
        return CollectorStatus(status=self.state, files=sorted(self.files()))

    def unavailable(self, why: str) -> None:
        self.state = f"unavailable: {why}"

    def failed(self, why: str) -> None:
        self.state = f"failed: {why}"


class Sampler(Collector):
    """A thread that reads named values at a fixed rate into `<name>.jsonl` (one object per line).

    `clock` and the sleep are injectable so tests can drive it with a fake clock.
    """

    def __init__(self, raw: Path, hz: float, clock: Clock = time.time_ns) -> None:
        super().__init__(raw)
        self.interval = 1.0 / hz
        self.clock = clock
        self.path = raw / f"{self.name}.jsonl"
        self.samples = 0
        self.cpu_ns = 0  # the sampler thread's own CPU time
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def read(self) -> dict[str, float]:
        """One reading: counter name -> value. Subclasses implement it."""
        raise NotImplementedError

    def start(self, pid: int) -> None:
        self.pid = pid
        self._thread = threading.Thread(target=self._loop, name=f"perfswarm-{self.name}",
                                        daemon=True)
        self._thread.start()

    def sample_once(self, out: object) -> None:
        values = self.read()
        if values:
            line = orjson.dumps({"ts": self.clock(), "values": values})
            out.write(line + b"\n")  # type: ignore[attr-defined]
            self.samples += 1

    def _loop(self) -> None:
        try:
            with self.path.open("ab", buffering=0) as out:
                next_at = time.monotonic()
                while not self._stop.is_set():
                    self.sample_once(out)
                    next_at += self.interval
                    self._stop.wait(max(0.0, next_at - time.monotonic()))
                self.sample_once(out)  # the state at the end
        except OSError as exc:  # a full disk: the readings so far stay, the recording goes on
            self.failed(f"cannot write {self.path.name} ({exc.strerror or exc})")
        self.cpu_ns = time.thread_time_ns()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def files(self) -> list[str]:
        return [self.path.name] if self.path.exists() else []

    def count(self) -> int:
        return self.samples


_DEVICE = re.compile(r"^gpu(\d{1,9})\.", re.ASCII)


class Reading(msgspec.Struct):
    """One line of a sampler file."""

    ts: int
    values: dict[str, float | None]  # orjson writes NaN as null


_READING = msgspec.json.Decoder(Reading)


def read_jsonl(path: Path) -> list[tuple[int, str, int, float]]:
    """(ts, name, device, value) rows of a sampler file; a torn last line (crash) is skipped."""
    rows: list[tuple[int, str, int, float]] = []
    lines = path.read_bytes().splitlines()
    for n, line in enumerate(lines, 1):
        try:
            item = _READING.decode(line)
        except msgspec.DecodeError as exc:
            if n == len(lines):  # the write a crash cut short
                continue
            raise TraceFormatError(path, f"line {n}", f"not a sampler reading: {exc}") from None
        if not 0 <= item.ts < MAX_CLOCK_NS:
            raise TraceFormatError(path, f"line {n}", f"time out of range: {item.ts}")
        for name, value in item.values.items():
            if value is not None:
                m = _DEVICE.match(name)
                rows.append((item.ts, name, int(m.group(1)) if m else -1, value))
    return rows
