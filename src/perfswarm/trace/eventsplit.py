"""Where a trace's events lie in its JSON text, found without decoding it.

One vectorized pass (numpy) a chunk at a time over the text's quotes and brackets: a bracket
counts when an even number of real quotes (not escaped by an odd run of backslashes) precede
it. From the nesting levels the pass checks the depth bound, finds the `traceEvents` array (or
the top-level array of Chrome's array format), keeps the text around it (the metadata), and
notes one cut per chunk just past an event's closing brace. The pieces between cuts are whole
events separated by commas, which msgspec decodes straight into structs in one call each: no
Python object per JSON value, memory bounded by a piece.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import msgspec
import numpy as np
import numpy.typing as npt

from perfswarm.errors import TraceFormatError
from perfswarm.trace import gunzip
from perfswarm.trace.kineto import (
    PICKLE,
    KTrace,
    decode,
    invalid_json,
    memory_bytes,
    not_a_trace,
)

# Kineto traces nest a handful of levels; past this the text is refused before any decoding.
MAX_DEPTH = 128
# Read a megabyte at a time (the scan's arrays stay in cache); cut pieces of about PIECE bytes.
CHUNK = 1 << 20
PIECE = 8 << 20
_QUOTE, _BACKSLASH = 34, 92
_HEAD, _EVENTS, _TAIL = 0, 1, 2


@dataclass
class Layout:
    """The text around the events and the cuts between them (offsets in the JSON text).

    Piece i is text[cuts[i - 1]:cuts[i]] (the first starts at `start`, just past the array's
    '['; the last ends at its ']'); every piece but the first starts with the comma that
    separates it from the piece before.
    """

    array_form: bool  # Chrome's array format: the text is the events array
    meta: bytes  # the whole text with the events array emptied
    start: int
    cuts: list[int] = field(default_factory=list)


class _Scan:
    """The pass's state carried from one chunk to the next."""

    def __init__(self, path: Path, piece: int) -> None:
        self.path = path
        self.piece = piece
        self.at = 0  # offset of the chunk being read
        self.depth = 0
        self.inside = 0  # 1 while in a string
        self.run = 0  # backslashes ending the text read so far
        self.phase = _HEAD
        self.level = 0  # the events' nesting level (inside their array)
        self.head = bytearray()  # the text before the events array (kept until it is found)
        self.tail = bytearray()
        self.quotes = np.zeros(2, np.int64)  # offsets of the last two real quotes
        self.start = -1
        self.cuts: list[int] = []
        self.text_limit = memory_bytes() // 4

    def feed(self, data: bytes) -> None:
        b = np.frombuffer(data, np.uint8)
        folded = b | 32  # '[' -> '{', ']' -> '}'; '"' stays
        pos = np.flatnonzero((folded == _QUOTE) | (folded == 123) | (folded == 125))
        char = b[pos]
        is_quote = char == _QUOTE
        if self.run or data.find(b"\\") >= 0:
            escaped = np.flatnonzero(is_quote)[self._escaped(b, pos[is_quote])]
            keep = np.ones(len(pos), bool)
            keep[escaped] = False
            pos, char, is_quote = pos[keep], char[keep], is_quote[keep]
        parity = (np.cumsum(is_quote, dtype=np.int64) + self.inside) & 1
        real = ~is_quote & (parity == 0)
        brackets = pos[real]
        opens = (char[real] & 2) != 0  # '[' and '{' have bit 1 set, ']' and '}' do not
        level = self.depth + np.cumsum(np.where(opens, 1, -1), dtype=np.int64)
        self._check_depth(brackets, level)
        if self.phase == _HEAD:
            quotes = pos[is_quote] + self.at
            self._find_events(data, brackets, opens, level, quotes)
            self.quotes = np.concatenate([self.quotes, quotes])[-2:]
        elif self.phase == _EVENTS:
            self._cut(data, brackets, opens, level, 0)
        else:
            self._keep_tail(data)
        self.inside = int(self.inside + np.count_nonzero(is_quote)) & 1
        self.depth = int(level[-1]) if len(level) else self.depth
        self.at += len(data)

    def _escaped(self, b: npt.NDArray[np.uint8], quotes: npt.NDArray[np.int64]
                 ) -> npt.NDArray[np.bool_]:
        """Quotes preceded by an odd run of backslashes (a run carries over from the chunk
        before when it reaches this chunk's first byte)."""
        slashes = np.flatnonzero(b == _BACKSLASH)
        carried, self.run = self.run, 0
        if not len(slashes):
            escaped: npt.NDArray[np.bool_] = (quotes == 0) & (carried % 2 == 1)
            return escaped
        index = np.arange(len(slashes))
        first = np.maximum.accumulate(np.where(np.diff(slashes, prepend=-2) != 1, index, 0))
        # each backslash's place in its run, counting the carried run when that starts at 0
        runs = index - first + 1 + np.where(slashes[first] == 0, carried, 0)
        k = np.minimum(np.searchsorted(slashes, quotes - 1), len(slashes) - 1)
        before = np.where(slashes[k] == quotes - 1, runs[k], 0)
        before = np.where(quotes == 0, carried, before)
        if int(slashes[-1]) == len(b) - 1:
            self.run = int(runs[-1])
        odd: npt.NDArray[np.bool_] = before % 2 == 1
        return odd

    def _check_depth(self, brackets: npt.NDArray[np.int64], level: npt.NDArray[np.int64]) -> None:
        if not len(level):
            return
        if int(level.max()) > MAX_DEPTH:
            at = int(brackets[np.argmax(level > MAX_DEPTH)]) + self.at
            raise TraceFormatError(self.path, "json", f"nested deeper than {MAX_DEPTH} "
                                   f"levels (at byte {at:,})")
        if int(level.min()) < 0:
            at = int(brackets[np.argmax(level < 0)]) + self.at
            raise TraceFormatError(self.path, "json", f"invalid JSON: a closing bracket "
                                   f"without its opening one (at byte {at:,})")

    def _find_events(self, data: bytes, brackets: npt.NDArray[np.int64],
                     opens: npt.NDArray[np.bool_], level: npt.NDArray[np.int64],
                     quotes: npt.NDArray[np.int64]) -> None:
        """Look for the events array among this chunk's top-level brackets."""
        self.head += data
        before = level - np.where(opens, 1, 0)
        for i in np.flatnonzero(opens & (before <= 1)).tolist():
            at = int(brackets[i]) + self.at
            if data[int(brackets[i])] != ord("["):
                continue
            if before[i] == 1:  # a value of the top-level object: is its key traceEvents?
                earlier = np.concatenate([self.quotes, quotes[quotes < at]])[-2:]
                try:
                    key = msgspec.json.decode(bytes(self.head[earlier[0]:earlier[1] + 1]),
                                              type=str)
                except msgspec.DecodeError:  # not a key: invalid JSON, which the metadata says
                    continue
                if key != "traceEvents":
                    continue
            self.level, self.start, self.phase = int(before[i]) + 1, at + 1, _EVENTS
            del self.head[at:]
            self._cut(data, brackets, opens, level, i + 1)
            return
        if len(self.head) > self.text_limit:
            raise TraceFormatError(self.path, "json", f"{NOT_FOUND} in its first "
                                   f"{self.text_limit >> 20:,} MiB")

    def _cut(self, data: bytes, brackets: npt.NDArray[np.int64], opens: npt.NDArray[np.bool_],
             level: npt.NDArray[np.int64], first: int) -> None:
        """Note a cut past the chunk's last event, and the array's end when it is here."""
        closes = ~opens[first:] & (level[first:] <= self.level)
        ends = np.flatnonzero(closes)
        array_end = np.flatnonzero(closes & (level[first:] < self.level))
        if len(array_end):
            ends = ends[ends < array_end[0]]
        last = self.cuts[-1] if self.cuts else self.start
        cut = int(brackets[first + ends[-1]]) + 1 + self.at if len(ends) else last
        if cut - last >= self.piece:
            self.cuts.append(cut)
        if len(array_end):
            end = int(brackets[first + array_end[0]])
            self.cuts.append(end + self.at)
            self.phase = _TAIL
            self._keep_tail(data[end + 1:])

    def _keep_tail(self, data: bytes) -> None:
        self.tail += data
        if len(self.tail) > self.text_limit:
            raise TraceFormatError(self.path, "json", "over "
                                   f"{self.text_limit >> 20:,} MiB of text after `traceEvents`")

    def layout(self) -> Layout:
        if self.inside or self.depth:
            what = "a string" if self.inside else f"{self.depth} open brackets"
            raise TraceFormatError(self.path, "json", f"invalid JSON: truncated (the text ends "
                                   f"inside {what})")
        if self.phase == _HEAD:  # no events array: decoding says what the text is instead
            decode(self.path, bytes(self.head))
            raise TraceFormatError(self.path, "json", NOT_FOUND)
        return Layout(self.level == 1, bytes(self.head) + b"[]" + bytes(self.tail), self.start,
                      self.cuts)


NOT_FOUND = "no `traceEvents` array"


def scan(path: Path, chunk: int = CHUNK, piece: int = PIECE) -> Layout:
    """One pass over the text (gunzipped a chunk at a time): its depth checked, the events
    array found, a cut noted past the last event of each `piece` bytes or so."""
    state = _Scan(path, piece)
    try:
        with gunzip.open_text(path) as f:
            while data := f.read(chunk):
                if state.at == 0 and data[:1] == PICKLE:
                    raise invalid_json(path, data, ValueError("not JSON"))
                state.feed(data)
    except (EOFError, OSError, zlib.error) as exc:
        raise gunzip.read_error(path, exc) from None
    return state.layout()


def metadata(path: Path, layout: Layout) -> KTrace:
    """The top-level keys besides the events, decoded as the in-memory path decodes them."""
    trace = decode(path, layout.meta)
    if trace.traceEvents:
        raise TraceFormatError(path, "json", "a second `traceEvents` array")
    return trace


def pieces(path: Path, layout: Layout) -> Iterator[bytes]:
    """The events of each piece as the text of one JSON array, in order."""
    try:
        with gunzip.open_text(path) as f:
            at = 0
            while at < layout.start:  # the text before the events, read in chunks and dropped
                at += len(_exactly(path, f, min(layout.start - at, CHUNK)))
            for i, cut in enumerate(layout.cuts):
                text = _exactly(path, f, cut - at)
                at = cut
                yield _array(path, layout, text, i)
    except (EOFError, OSError, zlib.error) as exc:
        raise gunzip.read_error(path, exc) from None


def _exactly(path: Path, f: IO[bytes], size: int) -> bytes:
    text = f.read(size)
    if len(text) != size:
        raise TraceFormatError(path, "", "changed while it was read")
    return text


def _array(path: Path, layout: Layout, text: bytes, i: int) -> bytes:
    body = text.lstrip()
    if i == 0:
        if layout.array_form and body[:1] not in (b"{", b""):
            raise not_a_trace(path, b"[" + body[:64])
    elif body:
        if body[:1] != b"," or not body[1:].strip():
            raise TraceFormatError(path, "json", f"invalid JSON: expected ',' between events "
                                   f"(at byte {layout.cuts[i - 1]:,})")
        body = body[1:]
    return b"[" + body + b"]"
