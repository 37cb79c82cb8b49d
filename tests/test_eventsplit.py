"""The streaming path's event splitter against msgspec's decode of the whole text: the same
events and metadata for real traces and for hostile ones (strings full of brackets, quotes and
backslashes, metadata before and after the events), whatever the chunk and piece sizes."""

from __future__ import annotations

import gzip
import json
import tempfile
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import corpus
from perfswarm.errors import TraceFormatError
from perfswarm.trace import eventsplit
from perfswarm.trace.kineto import KEvent, KTrace, decode, read_bytes


def _split(path: Path, chunk: int, piece: int) -> tuple[KTrace, list[KEvent], int]:
    layout = eventsplit.scan(path, chunk, piece)
    events: list[KEvent] = []
    for text in eventsplit.pieces(path, layout):
        events += msgspec.json.decode(text, type=list[KEvent])
    return eventsplit.metadata(path, layout), events, len(layout.cuts)


def _whole(path: Path) -> tuple[KTrace, list[KEvent]]:
    trace = decode(path, read_bytes(path))
    raws, trace.traceEvents = trace.traceEvents, []
    return trace, msgspec.json.decode(b"[" + b",".join(raws) + b"]", type=list[KEvent])


@pytest.mark.parametrize("name", ["nccl", "amd", "old_format", "event_sync"])
def test_corpus_traces_split_as_decoded(name: str) -> None:
    path = corpus(name)  # gzip
    meta, events = _whole(path)
    for chunk, piece in ((4093, 10_000), (1 << 20, 1 << 20)):
        got_meta, got, cuts = _split(path, chunk, piece)
        assert (got_meta, got) == (meta, events)
        assert cuts > 1 or len(read_bytes(path)) < piece
    if name in ("nccl", "amd"):  # written after the events
        assert meta.baseTimeNanoseconds and meta.traceName


TEXT = st.text(alphabet='[]{},:"\\ aé\n', max_size=8)
EVENT = st.fixed_dictionaries(
    {"ph": st.sampled_from(["X", "i", "M"]), "name": TEXT, "ts": st.floats(0, 1e6),
     "dur": st.floats(0, 1e3), "pid": st.integers(0, 9) | TEXT,
     "args": st.dictionaries(TEXT, st.recursive(st.none() | st.integers() | TEXT,
                                                lambda v: st.lists(v, max_size=3)
                                                | st.dictionaries(TEXT, v, max_size=2),
                                                max_leaves=6), max_size=3)})


@settings(max_examples=150, deadline=None)
@given(st.lists(EVENT, max_size=12), st.dictionaries(TEXT, TEXT, max_size=2),
       st.booleans(), st.integers(1, 40), st.integers(1, 200), st.booleans(), st.booleans())
def test_hostile_traces_split_as_decoded(events: list[dict[str, object]],
                                         other: dict[str, str], array_form: bool, chunk: int,
                                         piece: int, indent: bool, gz: bool) -> None:
    other.pop("traceEvents", None)
    doc: object = events if array_form else {
        **other, "deviceProperties": [{"id": 0, "name": "[\"{"}], "traceEvents": events,
        "baseTimeNanoseconds": 7}
    text = json.dumps(doc, indent=1 if indent else None, ensure_ascii=False).encode()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.json"
        path.write_bytes(gzip.compress(text) if gz else text)
        try:
            expected: tuple[KTrace, list[KEvent]] | str = _whole(path)
        except TraceFormatError as exc:  # e.g. an array of no events: both say it the same
            expected = str(exc)
        try:
            got: tuple[KTrace, list[KEvent]] | str = _split(path, chunk, piece)[:2]
        except TraceFormatError as exc:
            got = str(exc)
        assert got == expected


@pytest.mark.parametrize(("text", "said"), [
    (b'{"traceEvents": [{"ph": "X"} {"ph": "X"}]}', "invalid JSON"),
    (b'{"traceEvents": [{"ph": "X"},]}', "invalid JSON"),
    (b'{"traceEvents": [{"ph": "X"}]', "invalid JSON: truncated"),
    (b'{"traceEvents": [{"ph": "X"}]}}', "a closing bracket without its opening one"),
    (b'{"traceEvents": 3}', "wrong structure"),
    # the in-memory path takes the last one; the streaming path has spilled the first already
    (b'{"traceEvents": [{"ph": "X"}], "traceEvents": [{"ph": "i"}]}', "a second `traceEvents`"),
])
def test_broken_texts_are_refused(tmp_path: Path, text: bytes, said: str) -> None:
    path = tmp_path / "t.json"
    path.write_bytes(text)
    with pytest.raises(TraceFormatError, match=said):
        _split(path, 3, 1)
