"""Gunzip a trace (or a gzipped data file) a chunk at a time, refusing a gzip bomb in bounded
time and memory.

The in-memory path (kineto.read_bytes), the streaming path (stream.py) and the GPU kernel
dataset (model/gpu/dataset.py) inflate through `chunks`, so one rule holds for all: past
INFLATE_FLOOR bytes of output, more than PLAUSIBLE_RATIO times the compressed bytes read so far
is refused.

The bounds, measured: the HTA corpus's 14 .json.gz traces inflate 6.7-22.6x as shipped,
7-26x recompressed at gzip -9, and 12-44x re-serialized with indent=4 at -9; perfswarm's
synthetic 92 MiB trace 13x at -9; the gpu-kernels dataset's 119 CSVs at most 22.5x. A run of
spaces or zeros deflates 1029x. So 100x is over twice the most compressible real file seen;
under the floor (64 MiB) any ratio is let through.
"""

from __future__ import annotations

import io
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING

from perfswarm.errors import TraceFormatError

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

PLAUSIBLE_RATIO = 100
INFLATE_FLOOR = 64 << 20
_IN = 1 << 16
_OUT = 1 << 20
MAGIC = b"\x1f\x8b"


def read_error(path: Path, exc: EOFError | OSError | zlib.error) -> TraceFormatError:
    """What reading (and gunzipping) `path` raised, as the error both import paths give."""
    if isinstance(exc, EOFError | zlib.error):
        return TraceFormatError(path, "gzip", f"corrupt or truncated gzip ({exc})")
    return TraceFormatError(path, "", f"cannot read ({exc.strerror or exc})")


def is_gzip(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(2) == MAGIC


def chunks(path: Path, f: IO[bytes], limit: int | None = None) -> Iterator[bytes]:
    """The inflated text of every gzip member in `f`, in order (zero padding between members
    skipped, as gzip does); refused past `limit` bytes or at an implausible ratio."""
    read = written = 0
    member: zlib._Decompress | None = None  # None between members
    pending, done = b"", False
    while True:
        if not pending and not done:
            pending = f.read(_IN)
            read += len(pending)
            done = not pending
        if member is None:
            pending = pending.lstrip(b"\0")
            if not pending:
                if done:
                    return
                continue
            member = zlib.decompressobj(wbits=31)
        out = member.decompress(pending, _OUT)
        pending = member.unconsumed_tail
        if member.eof:
            pending, member = member.unused_data, None
        elif done and not out and not pending:
            raise EOFError("compressed file ended before the end-of-stream marker was reached")
        written += len(out)
        if limit is not None and written > limit:
            raise TraceFormatError(path, "gzip", f"expands past {limit >> 20:,} MiB in memory",
                                   "import it with {streaming} always")
        if written > INFLATE_FLOOR and written > PLAUSIBLE_RATIO * read:
            raise TraceFormatError(path, "gzip", f"inflates over {PLAUSIBLE_RATIO}x its "
                                   f"compressed size past {INFLATE_FLOOR >> 20} MiB (traces "
                                   "and measurement CSVs deflate 5-45x): a gzip bomb")
        if out:
            yield out


class _Inflated(io.RawIOBase):
    """`chunks` as a readable file (what the streaming path's scans read), telling its offset."""

    def __init__(self, path: Path) -> None:
        self._file = path.open("rb")
        self._chunks = chunks(path, self._file)
        self._left = memoryview(b"")
        self._at = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer) -> int:
        while not self._left:
            piece = next(self._chunks, None)
            if piece is None:
                return 0
            self._left = memoryview(piece)
        target = memoryview(buffer).cast("B")
        n = min(len(target), len(self._left))
        target[:n] = self._left[:n]
        self._left = self._left[n:]
        self._at += n
        return n

    def tell(self) -> int:
        return self._at

    def close(self) -> None:
        self._file.close()
        super().close()


def open_text(path: Path) -> IO[bytes]:
    """The file's text as a binary file: gunzipped (bounded, as `chunks`) when it is gzip by
    magic, the file itself otherwise."""
    if is_gzip(path):
        return io.BufferedReader(_Inflated(path), _OUT)
    return path.open("rb")
