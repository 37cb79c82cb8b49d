"""What a careless user or an attacker can do with sql, import --force and names from data: no
write through the query face, no lost folder, no lost text, no hang (issue 23)."""

from __future__ import annotations

import gzip
import json
import os
from collections import Counter
from pathlib import Path

import pytest

from conftest import corpus
from perfswarm.cli.main import main
from perfswarm.cli.output import console
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
