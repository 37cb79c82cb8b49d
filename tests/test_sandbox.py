"""What a careless user or an attacker can do with sql, import --force and names from data: no
write through the query face, no lost folder, no lost text, no hang (issue 23)."""

from __future__ import annotations

import gzip
import json
import os
import tempfile
import zlib
from collections import Counter
from pathlib import Path
from unittest.mock import patch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import corpus
from perfswarm.cli.main import main
from perfswarm.cli.output import console
from perfswarm.errors import TraceFormatError
from perfswarm.trace import eventsplit
from perfswarm.trace.kineto import read_bytes
from perfswarm.trace.store import _claim, _release

# Names real traces hold ("[param|cuda]") and names that rich would take for markup or emoji.
HOSTILE = ["[param|cuda]", "[/x]", "[link=http://evil.example]click[/link]", "[bold]b",
           ":smile:", "<script>alert(1)</script>", "a\\[b]"]


@pytest.fixture(scope="module")
def base_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sandbox") / "base.run"
    assert main(["import", str(corpus("compare_base")), "-o", str(out), "-q"]) == 0
    return out


def test_explain_analyze_cannot_write(base_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    events = base_run / "tables" / "events.parquet"
    before = events.read_bytes()
    for sql in (f"EXPLAIN ANALYZE COPY (SELECT 1 AS x) TO '{events}' (FORMAT parquet)",
                "EXPLAIN ANALYZE CREATE TABLE x AS SELECT 1",
                "EXPLAIN (FORMAT json, ANALYZE) CREATE TABLE x AS SELECT 1",
                "explain analyze /* c */ insert into events select * from events"):
        assert main(["sql", str(base_run), sql]) == 2, sql
        err = capsys.readouterr().err
        assert err.startswith("perfswarm: error: sql: the Run is read-only"), err
    assert events.read_bytes() == before
    assert main(["sql", str(base_run), "EXPLAIN ANALYZE SELECT count(*) FROM events"]) == 0


def test_time_and_memory_limits(base_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sql", str(base_run), "SELECT count(*) FROM range(100000000000)",
                 "--timeout", "0.5"]) == 2
    assert capsys.readouterr().err == ("perfswarm: error: sql: the query ran past its time "
                                       "limit (0.5 s)\n")
    assert main(["sql", str(base_run), "SELECT repeat('x', 600000000) AS s", "--json",
                 "--memory", "256"]) == 2
    out = capsys.readouterr()
    assert out.err == ("perfswarm: error: sql: the query needed more than its memory limit "
                       "(256 MB)\n")


def test_rows_are_capped_on_a_terminal_not_in_csv(base_run: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sql", str(base_run), "SELECT range AS i FROM range(1500)"]) == 0
    out = capsys.readouterr()
    shown = [line for line in out.out.splitlines() if line.strip("│ ").isdigit()]
    assert shown == [f"│ {i:<3} │" for i in range(1000)]
    assert "first 1,000 rows shown; --json or --csv for all" in out.err
    assert main(["sql", str(base_run), "SELECT range AS i FROM range(1500)", "--csv"]) == 0
    assert capsys.readouterr().out.splitlines() == ["i", *map(str, range(1500))]
    assert main(["sql", str(base_run), "SELECT name, count(*) AS n FROM events GROUP BY 1 "
                 "ORDER BY 2 DESC, 1 LIMIT 2", "--json"]) == 0
    raw = json.loads(gzip.decompress(corpus("compare_base").read_bytes()))["traceEvents"]
    expected = Counter(e["name"] for e in raw).most_common(2)  # 6 memsets, 5 copies
    assert json.loads(capsys.readouterr().out) == [{"name": n, "n": c} for n, c in expected]


def test_force_replaces_only_a_run(tmp_path: Path, base_run: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    trace = corpus("compare_base")
    thesis = tmp_path / "thesis"
    thesis.mkdir()
    (thesis / "thesis.tex").write_text("years of work")
    (tmp_path / "file.run").write_text("a file")
    (tmp_path / "link.run").symlink_to(base_run)
    for out in (thesis, tmp_path / "file.run", tmp_path / "link.run"):
        assert main(["import", str(trace), "-o", str(out), "--force", "-q"]) == 2
        assert capsys.readouterr().err == (f"perfswarm: error: {out}: exists and is not a "
                                           "perfswarm Run (--force replaces only a Run)\n")
    assert (thesis / "thesis.tex").read_text() == "years of work"
    assert (tmp_path / "file.run").read_text() == "a file"
    own = base_run / "raw" / trace.name
    assert main(["import", str(own), "-o", str(base_run), "--force", "-q"]) == 2
    assert "holds the input" in capsys.readouterr().err
    assert own.is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.run", "link.run", "thesis"]


def test_a_second_writer_fails_cleanly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.run"
    claim = _claim(out)  # a first import, still building
    try:
        assert main(["import", str(corpus("compare_base")), "-o", str(out), "-q"]) == 2
        assert capsys.readouterr().err == (f"perfswarm: error: {out}: another perfswarm is "
                                           "writing it\n")
    finally:
        _release(out, claim)
    assert not out.exists()
    assert main(["import", str(corpus("compare_base")), "-o", str(out), "-q"]) == 0
    assert os.listdir(tmp_path) == ["r.run"]  # the claim is gone with the writer


def _hostile_trace(tmp: Path) -> Path:
    events = [{"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": 10.0 * i,
               "dur": 5.0, "args": {"device": 0, "stream": 7, "correlation": i}}
              for i, name in enumerate(HOSTILE)]
    path = tmp / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return path


@pytest.mark.parametrize("command", [["info"], ["analyze"], ["advise"], ["sql",
                                     "SELECT name FROM events ORDER BY ts"], ["diff", "{run}"]])
def test_names_print_as_text(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                             monkeypatch: pytest.MonkeyPatch, command: list[str]) -> None:
    monkeypatch.setattr(console, "width", 400)  # no wrapping inside a name
    run = tmp_path / "[/y] [link=x].run"
    assert main(["import", str(_hostile_trace(tmp_path)), "-o", str(run)]) == 0
    assert f"into {run} (" in capsys.readouterr().out
    argv = [command[0], str(run), *(a.replace("{run}", str(run)) for a in command[1:])]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert str(run) in out or command[0] in ("sql", "diff")
    if command[0] in ("sql", "analyze"):
        for name in HOSTILE:
            assert name in out, name


def _one_line_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str], said: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and said in err, err


@pytest.mark.parametrize("streaming", ["never", "always"])
@pytest.mark.parametrize("where", ["args", "top", "events"])
def test_deep_nesting_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                  where: str, streaming: str) -> None:
    deep = "[" * 100_000 + "]" * 100_000
    text = {"args": '{"traceEvents": [{"ph": "X", "name": "a", "args": ' + deep + "}]}",
            "top": deep, "events": '{"traceEvents": ' + deep + "}"}[where]
    path = tmp_path / "t.json"
    path.write_text(text)
    _one_line_exit_2(["import", str(path), "-o", str(tmp_path / "o.run"), "--streaming",
                      streaming], capsys, f"{path} (json): nested deeper than ")
    et = ["import", str(corpus("compare_base")), "--et", str(path), "-o", str(tmp_path / "e.run")]
    _one_line_exit_2(et, capsys, f"{path} (json): ")


def test_gzip_is_bounded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    magic = tmp_path / "m.json.gz"
    magic.write_bytes(b"\x1f\x8b")
    _one_line_exit_2(["import", str(magic), "-o", str(tmp_path / "o.run")], capsys,
                     "corrupt or truncated gzip")
    body = b'{"traceEvents": [' + b" " * (8 << 20) + b"]}"
    path = tmp_path / "b.json.gz"  # two members: the cap counts both
    path.write_bytes(gzip.compress(os.urandom(1 << 20)) + gzip.compress(body))
    with pytest.raises(TraceFormatError, match=r"\(gzip\): expands past 8 MiB in memory"):
        read_bytes(path, limit=8 << 20)
    assert read_bytes(path, limit=64 << 20)[-len(body):] == body


def _spaces(mib: int, head: bytes = b"") -> bytes:
    """One gzip member of `head` then `mib` MiB of spaces (about 1029x smaller)."""
    deflate = zlib.compressobj(9, zlib.DEFLATED, 31)
    parts = [deflate.compress(head)] + [deflate.compress(b" " * (1 << 20)) for _ in range(mib)]
    return b"".join([*parts, deflate.flush()])


@pytest.fixture(scope="module")
def bombs() -> dict[str, bytes]:
    """Past the 64 MiB floor by construction: a few hundred KB inflating to 96 MiB each."""
    trace = gzip.decompress(corpus("compare_base").read_bytes())
    return {"spaces": _spaces(96),
            "padded trace": _spaces(96, trace.rstrip()[:-1] + b" "),  # before the final '}'
            # many members, the last one small (its ISIZE says nothing of the others)
            "members": _spaces(8) * 12 + gzip.compress(trace)}


@pytest.mark.parametrize("streaming", ["never", "always"])
@pytest.mark.parametrize("kind", ["spaces", "padded trace", "members"])
def test_gzip_bombs_are_refused_early(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                      bombs: dict[str, bytes], kind: str, streaming: str) -> None:
    path = tmp_path / "bomb.json.gz"
    path.write_bytes(bombs[kind])
    assert gzip.decompress(bombs[kind])[:1] in (b" ", b"{")  # a valid gzip, not a broken one
    _one_line_exit_2(["import", str(path), "-o", str(tmp_path / "o.run"), "--streaming",
                      streaming], capsys, f"{path} (gzip): inflates over 100x its compressed size")
    assert [p.name for p in tmp_path.iterdir()] == ["bomb.json.gz"]


@pytest.mark.parametrize(("flags", "said"), [
    (["--rank", "99999999999"], "--rank 99999999999: out of range"),
    (["--workers", "100000"], "--workers 100000: over 4 per core"),
    (["--worker-memory", "1KB"], "--worker-memory 1KB: under 256 MiB"),
    (["--scheduler", "not a url"], "--scheduler not a url: cannot connect"),
])
def test_numeric_flags_are_range_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         flags: list[str], said: str) -> None:
    argv = ["import", str(corpus("compare_base")), "-o", str(tmp_path / "o.run"), *flags]
    _one_line_exit_2(argv, capsys, said)
    assert not (tmp_path / "o.run").exists()


BILLION_LAUGHS = """a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x"]
b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]
c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]
tables: [{name: t, rows: *c, dim: 4}]
"""


@pytest.mark.parametrize(("text", "said"), [
    (BILLION_LAUGHS, "invalid YAML (aliases (*name) are not accepted)"),
    ("tables: " + "[" * 20_000 + "]" * 20_000, "invalid YAML (nested too deep)"),
    ("tables:\n - {name: a, rows: .inf, dim: 4}\n", ": tables[0]: rows, dim, pooling"),
    ("tables:\n - {name: a, rows: 9, dim: 4, pooling: .nan}\n", "pooling and distribution must"),
    ("tables:\n - {name: a, rows: 9, dim: 4, distribution: 'zipf:inf'}\n", "must be finite"),
    (None, "not a regular file"),
])
def test_shard_tables_are_bounded(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                  text: str | None, said: str) -> None:
    path = tmp_path / "tables.yaml"
    if text is None:
        os.mkfifo(path)  # nobody writes to it: reading it would wait for ever
    else:
        path.write_text(text)
    _one_line_exit_2(["shard", "--tables", str(path), "--devices", "2"], capsys, said)


def test_shard_devices_range(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t.yaml"
    path.write_text("tables:\n - {name: a, rows: 9, dim: 4}\n")
    assert main(["shard", "--tables", str(path), "--devices", "99999999999"]) == 2
    assert "--devices" in capsys.readouterr().err


JSON = st.recursive(st.none() | st.integers() | st.text(alphabet='[]{}"\\ab', max_size=6),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(alphabet='[]{}"\\', max_size=3), inner, max_size=3),
                    max_leaves=30)


def _depth(value: object) -> int:
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    return 0


@settings(max_examples=200, deadline=None)
@given(JSON, st.integers(1, 6), st.integers(1, 9))
def test_scan_counts_only_real_brackets(value: object, limit: int, chunk: int) -> None:
    """The vectorized scan against the decoded value's depth, with strings full of brackets,
    quotes and backslashes, and chunks as small as a byte (every carry across them)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.json"
        path.write_bytes(json.dumps(value).encode())
        with patch.object(eventsplit, "MAX_DEPTH", limit):
            if _depth(value) > limit:
                with pytest.raises(TraceFormatError, match="nested deeper than"):
                    eventsplit.scan(path, chunk)
            else:
                try:
                    eventsplit.scan(path, chunk)
                except TraceFormatError as exc:  # most values are no trace: said otherwise
                    assert "nested deeper" not in str(exc)


@pytest.mark.parametrize("flag", [["--hz", "1000000000"], ["--hz", "0"], ["--perf-hz", "0"],
                                  ["--pystacks-hz", "100000"], ["--duration", "-1"]])
def test_record_rates_are_range_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                        flag: list[str]) -> None:
    out = tmp_path / "r.run"
    assert main(["record", "--out", str(out), *flag, "--", "true"]) == 2
    assert f"Invalid value for '{flag[0]}'" in capsys.readouterr().err
    assert not out.exists()


def test_the_memory_limit_is_the_querys(base_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """At the smallest --memory a plain query runs (the limit had counted the libraries' and
    DuckDB's threads' address space, about 1 GB, so every query under 1.3 GB failed)."""
    assert main(["sql", str(base_run), "SELECT count(*) AS n FROM events", "--json",
                 "--memory", "256"]) == 0
    raw = json.loads(gzip.decompress(corpus("compare_base").read_bytes()))["traceEvents"]
    assert json.loads(capsys.readouterr().out) == [{"n": len(raw)}]
