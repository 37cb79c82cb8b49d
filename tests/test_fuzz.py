"""Fuzzing every reader: any input gives a Run (or tables) or the typed error (exit 2), nothing
else. Kineto and execution traces through both import paths; perf script, py-spy raw, strace,
sampler lines and the manifest from mutations of real samples (tests/data/) and from
hypothesis grammars of each format."""

from __future__ import annotations

import contextlib
import io
import math
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import markupsafe
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.table import Table
from rich.text import Text

from conftest import CORPUS, ET, corpus
from fuzz_cases import cases
from fuzz_readers import READERS, SAMPLES, outcome, text_cases
from perfswarm.cli.json_output import print_json
from perfswarm.cli.output import console
from perfswarm.errors import PerfswarmError, TraceFormatError
from perfswarm.report import html
from perfswarm.shown import visible
from perfswarm.trace.ingest import ImportOptions, import_traces
from perfswarm.trace.readers import perf, pyspy, sampler, strace
from perfswarm.trace.readers.fields import Placement
from perfswarm.trace.readers.sampler import read_jsonl, value_rows
from perfswarm.trace.store import Manifest

T = TypeVar("T")
SMALL = [corpus(n) for n in ("event_sync", "compare_base", "old_format", "triton", "amd")]


def _import(path: Path, streaming: str = "never") -> None:
    try:
        import_traces([path], path.with_suffix(".run"),
                      ImportOptions(streaming=streaming), ["fuzz"])  # type: ignore[arg-type]
    except PerfswarmError as exc:
        assert exc.exit_code == 2
        assert "\n" not in str(exc)
        assert not path.with_suffix(".run").exists()


@pytest.mark.parametrize("streaming", ["never", "always"])
def test_mutated_corpus(tmp_path: Path, streaming: str) -> None:
    for name, data in cases(SMALL, 60 if streaming == "never" else 25, seed=7):
        path = tmp_path / name
        path.write_bytes(data)
        _import(path, streaming)


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
def test_arbitrary_bytes(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.json"
        path.write_bytes(data)
        _import(path)


# -- the record side's readers and the manifest ---------------------------------------------
@pytest.fixture(scope="module")
def samples(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, bytes]]:
    """Per reader: the directory its file goes in, and the real sample the cases mutate."""
    root = tmp_path_factory.mktemp("fuzz-readers")
    run = import_traces([corpus("et_trace")], root / "t.run",
                        ImportOptions(execution_traces=(CORPUS / ET,)), ["fuzz"])
    out = {name: (root, path.read_bytes()) for name, path in SAMPLES.items()}
    out["manifest"] = (run.path, run.manifest_path.read_bytes())
    return out


@pytest.mark.parametrize("name", sorted(READERS))
def test_mutated_samples(samples: dict[str, tuple[Path, bytes]], name: str) -> None:
    reader = READERS[name]
    where, sample = samples[name]
    path = where / reader.file_name
    seen = Counter()
    for data in text_cases(reader, sample, 150, seed=11):
        path.write_bytes(data)
        seen[outcome(reader, path)] += 1
    assert seen["ok"] and seen["typed"], seen  # the cases reach both sides
    path.write_bytes(sample)
    assert outcome(reader, path) == "ok"


def test_samples_parse_to_exact_counts() -> None:
    """The real samples themselves: counts the tools reported, or grep finds."""
    perf_samples = perf.parse_script(SAMPLES["perf"].read_text(), SAMPLES["perf"])
    assert len(perf_samples) == 64  # perf record: "64 samples"
    assert sum(len(s.frames) for s in perf_samples) == 274  # lines starting with a tab
    folded = pyspy.read(SAMPLES["pystacks"])
    assert [f.count for f in folded] == [6, 2, 1, 7, 6, 1, 2]  # py-spy: "Samples: 25"
    calls = strace.parse(SAMPLES["strace"].read_text(), SAMPLES["strace"])
    # lines ending in <duration>; 13 unfinished calls resume in the sample, exit_group never
    assert len(calls) == 282 and {c.tid for c in calls} == {9021, 9022, 9023}
    assert len(value_rows(read_jsonl(SAMPLES["sampler"]))) == 86  # values in its 6 lines


def _parsed_unless_too_big(parse: Callable[[str, Path], list[T]], lines: list[str], path: Path,
                           too_big: bool) -> list[T] | None:
    """parse(text, path), which must refuse with the typed error exactly when a number in
    the text cannot be what the tool writes (then None)."""
    text = "\n".join(lines)
    if too_big:
        with pytest.raises(TraceFormatError, match=r"out of range|beyond 64 bits"):
            parse(text, path)
        return None
    return parse(text, path)


WORD = st.text(st.characters(whitelist_categories=("Lu", "Ll", "Nd"), max_codepoint=127),
               min_size=1, max_size=12)
NUMBER = st.integers(0, 10**6) | st.integers(0, 2**70)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(NUMBER, NUMBER, NUMBER, st.integers(0, 10**9 - 1),
                          st.lists(st.tuples(st.integers(0, 2**68), WORD, WORD), max_size=4)),
                max_size=6))
def test_perf_script_grammar(samples_: list[tuple[int, int, int, int,
                                                  list[tuple[int, str, str]]]]) -> None:
    """Well-formed perf script text parses to exactly its samples, unless a number cannot
    be what perf writes: then (only then) the typed error."""
    lines = []
    for pid, tid, sec, nsec, frames in samples_:
        lines.append(f"python {pid}/{tid} {sec}.{nsec:09d}:")
        lines += [f"\t{addr:x} {sym} ({dso})" for addr, sym, dso in frames]
        lines.append("")
    too_big = any(pid >= 2**63 or tid >= 2**63 or sec >= 2**62 // 10**9
                  or any(a >= 2**64 for a, _, _ in frames)
                  for pid, tid, sec, _, frames in samples_)
    parsed = _parsed_unless_too_big(perf.parse_script, lines, Path("perf.data"), too_big)
    if parsed is None:
        return
    assert [(s.pid, s.tid, s.mono_ns) for s in parsed] == [
        (pid, tid, sec * 10**9 + nsec) for pid, tid, sec, nsec, _ in samples_]
    assert [[(sym, dso) for sym, dso, _ in s.frames] for s in parsed] == [
        [(sym, dso) for _, sym, dso in frames] for *_, frames in samples_]
    assert all(-(2**63) <= a < 2**63 for s in parsed for _, _, a in s.frames)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(NUMBER, NUMBER, st.booleans(),
                          st.lists(st.tuples(WORD, WORD, NUMBER), min_size=1, max_size=4),
                          NUMBER), max_size=6))
def test_pyspy_raw_grammar(lines_: list[tuple[int, int, bool, list[tuple[str, str, int]],
                                               int]]) -> None:
    lines = []
    for pid, tid, hex_tid, frames, count in lines_:
        stack = ";".join(f"{fn} ({file}:{line})" for fn, file, line in frames)
        lines.append(f'process {pid}:"python x.py";thread ({hex(tid) if hex_tid else tid});'
                     f"{stack} {count}")
    too_big = any(max(pid, tid, count, *(ln for *_, ln in frames)) >= 2**63
                  for pid, tid, _, frames, count in lines_)
    parsed = _parsed_unless_too_big(pyspy.parse_raw, lines, Path("pystacks.txt"), too_big)
    if parsed is None:
        return
    assert [(f.pid, f.tid, f.count, f.frames) for f in parsed] == [
        (pid, tid, count, tuple(reversed(frames))) for pid, tid, _, frames, count in lines_]


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(NUMBER, NUMBER, st.integers(0, 999_999), WORD, NUMBER,
                          st.booleans()), max_size=6))
def test_strace_grammar(calls: list[tuple[int, int, int, str, int, bool]]) -> None:
    """Each call written whole or as an unfinished/resumed pair gives one syscall."""
    lines = []
    for tid, sec, usec, name, dur, split in calls:
        ts = f"{sec}.{usec:06d}"
        if split:
            lines += [f"{tid} {ts} {name}(1,  <unfinished ...>",
                      f"{tid} {ts} <... {name} resumed>2) = 0 <{dur}.000001>"]
        else:
            lines.append(f"{tid} {ts} {name}(1, 2) = 0 <{dur}.000001>")
    too_big = any(tid >= 2**63 or sec >= 2**62 // 10**9 or dur >= 2**62 // 10**9
                  for tid, sec, _, _, dur, _ in calls)
    parsed = _parsed_unless_too_big(strace.parse, lines, Path("strace.txt"), too_big)
    if parsed is None:
        return
    expected = [(tid, sec * 10**9 + usec * 1000, dur * 10**9 + 1000, name)
                for tid, sec, usec, name, dur, split in calls]
    got = [(c.tid, c.ts_ns, c.dur_ns, c.name) for c in parsed]
    assert sorted(got) == sorted(expected)  # a split call is emitted when it resumes
    assert all(orjson.loads(c.args)["args"] == "1, 2" for c in parsed)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(-(2**64), 2**64),
                          st.dictionaries(WORD, st.floats() | st.none() | st.integers(0, 9),
                                          max_size=4)), min_size=1, max_size=5),
       st.integers(0, 30))
def test_sampler_lines(readings: list[tuple[int, dict[str, float | None]]], torn: int) -> None:
    """Sampler lines give one row per (time, non-null value); a torn last line is skipped."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "system.jsonl"
        text = b"".join(orjson.dumps({"ts": ts, "values": v}, option=orjson.OPT_NON_STR_KEYS)
                        + b"\n" for ts, v in readings if abs(ts) < 2**63)
        path.write_bytes(text + b'{"ts": 1, "val'[:torn])
        if any(not 0 <= ts < 2**62 for ts, _ in readings if abs(ts) < 2**63):
            with pytest.raises(TraceFormatError, match="time out of range"):
                read_jsonl(path)
            return
        rows = value_rows(read_jsonl(path))  # orjson writes NaN and infinities as null: none
        assert len(rows) == sum(1 for ts, v in readings if abs(ts) < 2**63
                                for x in v.values() if x is not None and math.isfinite(x))


def _nested(inner: st.SearchStrategy[object]) -> st.SearchStrategy[object]:
    return st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)


JSON = st.recursive(st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats()
                    | st.text(max_size=10), _nested, max_leaves=8)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(sorted(Manifest.__annotations__)), JSON)
def test_manifest_fields(samples: dict[str, tuple[Path, bytes]], key: str, value: object) -> None:
    """Any value in any manifest field: the Run opens and reads, or the typed error."""
    where, sample = samples["manifest"]
    manifest = orjson.loads(sample)
    manifest[key] = value
    path = where / "manifest.json"
    path.write_bytes(orjson.dumps(manifest))
    try:
        assert outcome(READERS["manifest"], path) in ("ok", "typed")
    finally:
        path.write_bytes(sample)


@pytest.mark.parametrize("stat", ["cpu0 1 2 3 4 5 6 7 8 9 10\ncpu1 1 2", "garbage", "cpu0 1 2"])
def test_system_sampler_stat_lines(tmp_path: Path, stat: str) -> None:
    """The raw per-core lines the system sampler keeps: a mangled one is the typed error."""
    path = tmp_path / "system.jsonl"
    path.write_bytes(b"".join(orjson.dumps({"ts": ts, "values": {}, "stat": stat}) + b"\n"
                              for ts in (1, 2)))
    with pytest.raises(TraceFormatError, match="per-core lines"):
        sampler.read(path, Placement())


# -- the printers: names from all of Unicode plus markup and HTML fragments are text --------
FRAGMENTS = ["[", "]", "[/", "[bold]", "[/x]", "[param|cuda]", "[link=http://e.example]", ":smile:",
             "<script>", "</script>", "<b>", "&amp;", '"', "'", "{{", "}}", "{%", "\\", "\x1b[31m",
             "\n", "\t", "\u202e", "\x00", "é", "中文", "\U0001f600"]
NAMES = (st.text(max_size=30) | st.sampled_from(FRAGMENTS)
         | st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=4), max_size=5).map("".join))


@settings(max_examples=150, deadline=None)
@given(st.lists(NAMES, min_size=1, max_size=4))
def test_printers_keep_names_as_text(names: list[str]) -> None:
    """The CLI's consoles (tables and lines), its JSON and the HTML templates: nothing raises,
    printable names come out as themselves (on the page, control characters and bidirectional
    marks as their escapes), and no name's markup or HTML is interpreted."""
    width = console.width
    console.width = 1000  # no wrapping inside a name
    try:
        with console.capture() as captured:
            table = Table("name")
            for name in names:
                table.add_row(name)
            console.print(table)
            console.print(Text.assemble((names[0], "bold"), ": ", names[-1]))
    finally:
        console.width = width
    text = captured.get()
    for name in names:
        if name.isprintable() and name.strip() == name and name:
            assert name in text, name
    with contextlib.redirect_stdout(io.StringIO()) as out:
        print_json({"names": names})
    assert orjson.loads(out.getvalue()) == {"names": names}
    def board(shown: list[str]) -> str:
        return html.render_board("root", [{"name": n, "complete": True, "ranks": [0],
                                           "command": [n], "date": n, "device": n,
                                           "step_ms": 1.0, "directory": n} for n in shown])

    page = board(names)
    for name in names:  # as the terminal shows them: control characters as escapes
        assert str(markupsafe.escape(visible(name))) in page
    # every tag and entity is the template's: the same count as with harmless names
    plain = board([f"n{i}" for i in range(len(names))])
    assert (page.count("<"), page.count(">")) == (plain.count("<"), plain.count(">"))
