"""Bad input: one line naming the file and the problem, exit 2, nothing half-written."""

from __future__ import annotations

import gzip
import json
import pickle
import re
import shutil
import warnings
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import corpus
from perfswarm.cli.main import main
from perfswarm.errors import PerfswarmError, RunError
from perfswarm.trace.schema import EVENTS
from perfswarm.trace.store import Run


def _event(**over: object) -> dict[str, object]:
    base: dict[str, object] = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1,
                               "tid": 1, "ts": 10.0, "dur": 5.0, "args": {"External id": 1}}
    base.update(over)
    return base


def _write(tmp: Path, name: str, data: bytes) -> Path:
    path = tmp / name
    path.write_bytes(data)
    return path


def _trace(*events: dict[str, object]) -> bytes:
    return json.dumps({"traceEvents": list(events)}).encode()


CASES = {
    "truncated gzip": ("t.json.gz", gzip.compress(_trace(_event()) * 50)[:-20],
                       "corrupt or truncated gzip"),
    # both had read "(json): invalid JSON: Input data was truncated" (byte 0 for the SQLite one)
    "empty file": ("t.json", b"", "t.json: empty: the file holds no data"),
    "empty gzip": ("t.json.gz", gzip.compress(b""), "t.json.gz: empty: the file holds no data"),
    "sqlite without its header": ("t.sqlite", b"garbage\n", "t.sqlite: neither an SQLite "
                                  "database (no SQLite header) nor JSON"),
    "invalid json": ("t.json", b'{"traceEvents": [{"ph": "X",, }]}', "invalid JSON"),
    "truncated json": ("t.json", _trace(_event())[:-5], "invalid JSON"),
    "memory snapshot pickle": ("snapshot.pickle", pickle.dumps({"segments": []}),
                               "a Python pickle (as torch.cuda.memory._dump_snapshot writes), "
                               "not a JSON trace; a memory snapshot is read by --memory-timeline"),
    "no traceEvents": ("t.json", b'{"schemaVersion": 1}',
                       "not a Kineto trace (a JSON object with `traceEvents`, or an array of trace "
                       "events); it is an object with keys `schemaVersion`"),
    # it had described only export_memory_timeline's form and named no flag that reads it
    "memory timeline": ("t.json", b"[[1.0, 2.0], [[0, 1], [2, 3]]]",
                        "not a Kineto trace (a JSON object with `traceEvents`, or an array of "
                        "trace events); it is a top-level array of arrays, as torch.profiler's "
                        "memory timeline exports write ([times, bytes per category], or raw rows "
                        "[time, action, bytes, category]); the trace is what export_chrome_trace "
                        "writes; a memory timeline is read by --memory-timeline, beside its "
                        "Kineto trace"),
    "memory snapshot": ("t.json", b'{"segments": [], "device_traces": []}',
                        "it is an object with keys `segments`, `device_traces`: a torch.cuda "
                        "memory snapshot"),
    "execution trace": ("t.json", b'{"schema": "1.0.1", "pid": 1, "nodes": []}',
                        "it is an object with keys `schema`, `pid`, `nodes`: a PyTorch execution "
                        "trace (ExecutionTraceObserver); an execution trace is read by --et, "
                        "beside its Kineto trace"),
    "ts is a string": ("t.json", _trace(_event(), _event(ts="soon")),
                       "Expected `float`, got `str` - at `$.traceEvents[1].ts`"),
    "correlation is a list": ("t.json", _trace(_event(args={"correlation": [1]})),
                              "wrong field type"),
    "negative duration": ("t.json", _trace(_event(), _event(dur=-3.0)),
                          "(traceEvents[1]): negative duration: ts=10.0 dur=-3.0 us"),
    "absurd duration": ("t.json", _trace(_event(dur=1e15)), "absurd duration"),
    # without a ts it had been placed at the clock's origin: a span of 54 years in `info`
    "no timestamp": ("t.json", _trace(_event(), {k: v for k, v in _event().items() if k != "ts"}),
                     "(traceEvents[1]): timestamp missing or out of range: ts=nan dur=5.0 us"),
    "flow point without a timestamp": ("t.json", _trace(_event(), _event(), {
        "ph": "s", "id": 1, "pid": 1, "tid": 1, "cat": "ac2g", "name": "ac2g"}),
        "(traceEvents[2]): timestamp missing or out of range: ts=nan"),  # was traceEvents[0]
    "counter without a timestamp": ("t.json", _trace(_event(), {
        "ph": "C", "name": "mem", "pid": 1, "args": {"bytes": 3}}),
        "(traceEvents[1]): timestamp missing or out of range: ts=nan"),
    # each had imported as an empty Run ("imported 0 events", exit 0) that every command refused
    "objects without ph": ("t.json", b'[{"id": 1, "title": "hello"}, {"id": 2}]',
                           "it is an array of 2 objects without `ph`"),
    "empty events": ("t.json", b'{"traceEvents": []}',
                     "(traceEvents): empty: the trace holds no events"),
    "empty array": ("t.json", b"[]", "(traceEvents): empty: the trace holds no events"),
    "not an object": ("t.json", b'"hello"', "not a Kineto trace (a JSON object with "
                      "`traceEvents`, or an array of trace events); it is a JSON string"),
    # a field the decoder skips: the args are stored as text, and read again by every command
    "args not utf-8": ("t.json", _trace(_event()).replace(b'"External id"', b'"Ex\xfft"'),
                       "(traceEvents[0]): args that are not UTF-8 text (1 such events)"),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("streaming", ["never", "always"])
def test_bad_trace_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         case: str, streaming: str) -> None:
    name, data, message = CASES[case]
    path = _write(tmp_path, name, data)
    out = tmp_path / "out.run"
    code = main(["import", str(path), "-o", str(out), "-q", "--streaming", streaming])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1, err
    assert str(path) in err
    assert message in err
    assert not out.exists()
    assert list(tmp_path.iterdir()) == [path]  # no partial run directory left


def test_drop_bad_events_keeps_the_rest_and_warns(tmp_path: Path) -> None:
    """Each bad event is dropped and counted, quietly (a missing timestamp's NaN had been
    cast before it was dropped: numpy's RuntimeWarning on stderr)."""
    bad_text = json.dumps(_event(ts=30.0, args={"Input type": ["tag"]})).encode().replace(
        b"tag", b"t\xffg")
    no_ts = {k: v for k, v in _event(ts=40.0).items() if k != "ts"}
    path = _write(tmp_path, "t.json", _trace(_event(), _event(dur=-3.0), _event(ts=20.0), no_ts)
                  .replace(b"]}", b", " + bad_text + b"]}"))
    out = tmp_path / "out.run"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert main(["import", str(path), "-o", str(out), "-q", "--drop-bad-events"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    for what in ("dropped events with negative duration",
                 "dropped events with timestamp missing or out of range",
                 "dropped events with args that are not UTF-8 text"):
        assert {"source": "t.json", "what": what, "count": 1} in manifest["warnings"]
    assert main(["sql", str(out), "select count(*) from events"]) == 0
    assert main(["analyze", str(out)]) == 0


def test_suspicious_data_is_kept_and_counted(tmp_path: Path) -> None:
    path = _write(tmp_path, "t.json", _trace(_event(cat="brand_new_cat"), _event(ph="Q"),
                                             _event(ph="B", ts=1.0), _event(ph="E", ts=4.0)))
    out = tmp_path / "out.run"
    assert main(["import", str(path), "-o", str(out), "-q"]) == 0
    warnings = {w["what"]: w["count"] for w in
                json.loads((out / "manifest.json").read_text())["warnings"]}
    assert warnings == {"unknown category 'brand_new_cat' (kept as kind 'other')": 1,
                        "unsupported event phase 'Q' (skipped)": 1}


def test_missing_file_and_existing_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["import", str(tmp_path / "nope.json"), "-o", str(tmp_path / "r")]) == 2
    assert "nope.json: no such file" in capsys.readouterr().err
    out = tmp_path / "r.run"
    assert main(["import", str(corpus("compare_base")), "-o", str(out), "-q"]) == 0
    before = (out / "manifest.json").read_bytes()
    assert main(["import", str(corpus("compare_test")), "-o", str(out), "-q"]) == 2
    assert "already exists" in capsys.readouterr().err
    assert (out / "manifest.json").read_bytes() == before


def test_not_a_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", str(tmp_path)]) == 2
    assert "not a perfswarm Run" in capsys.readouterr().err


@pytest.mark.parametrize(("damage", "message"), [
    ("drop name", "unreadable table (no column name)"),
    ("not parquet", "unreadable table"),
    # a traceback in info, report and export before; a missing table read as an empty one
    ("ts as text", "unreadable table (column ts is string, not int64)"),
    ("missing", "missing (every Run has its events table; a damaged Run)"),
    # pyarrow's message ends in a line break (two lines before), DuckDB's names no file
    ("thrift", "unreadable table (Couldn't deserialize thrift: don't know what type: \\x0f)"),
])
def test_damaged_events_table(corpus_runs: dict[str, Run], tmp_path: Path, damage: str,
                              message: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A Run whose events table lost a column, or is not Parquet, is one line and exit 2."""
    run = shutil.copytree(corpus_runs["nccl"].path, tmp_path / "r.run")
    events = run / "tables" / "events.parquet"
    if damage == "drop name":
        pq.write_table(pq.read_table(events).drop_columns(["name"]), events)
    elif damage == "ts as text":
        table = pq.read_table(events)
        pq.write_table(table.set_column(1, "ts", table.column("ts").cast(pa.string())), events)
    elif damage == "missing":
        events.unlink()
    elif damage == "thrift":  # the first byte of the footer's metadata
        data = bytearray(events.read_bytes())
        data[len(data) - 8 - int.from_bytes(data[-8:-4], "little")] = 0x0F
        events.write_bytes(bytes(data))
    else:
        events.write_bytes(b"not a table")
    for command in ("analyze", "export", "report", *(("info",) if damage != "drop name" else ())):
        assert main([command, str(run)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err and "events.parquet" in err, err
    if damage in ("thrift", "not parquet", "missing"):  # a query of it names the file too
        assert main(["sql", str(run), "SELECT count(*) FROM events"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err and "events.parquet" in err, err


def test_a_missing_flows_table_is_said_by_info_too(corpus_runs: dict[str, Run],
                                                    tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """info, the command that inspects a Run, says the damage sql and export refuse on (it
    had reported nothing wrong)."""
    run = shutil.copytree(corpus_runs["nccl"].path, tmp_path / "r.run")
    (run / "tables" / "flows.parquet").unlink()
    for command in ("info", "export", "sql"):
        assert main([command, str(run), *(["SELECT 1"] if command == "sql" else [])]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.endswith(
            "flows.parquet: missing (every Run has its flows table; a damaged Run)\n"), err


def test_a_recorded_runs_missing_samples(corpus_runs: dict[str, Run], tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """An imported trace has no samples table: its query finds no rows (it had been DuckDB's
    "Table with name samples does not exist", the docs naming the view); a recording whose
    perf sampled has one, and without it is damaged (analyze had gone on without its swarms,
    exit 0)."""
    run = Run(shutil.copytree(corpus_runs["nccl"].path, tmp_path / "r.run"))
    assert main(["analyze", str(run.path)]) == 0
    capsys.readouterr()
    assert main(["sql", str(run.path), "SELECT count(*) AS n, count(DISTINCT stack_id) AS s "
                 "FROM samples", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"n": 0, "s": 0}]
    manifest = run.manifest()
    manifest["collectors"]["perf"] = {"status": "ok", "files": ["perf.data"]}
    run.write_manifest(manifest)
    assert main(["analyze", str(run.path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "samples.parquet: missing (perf recorded samples" in err


@pytest.mark.parametrize(("damage", "columns", "message"), [
    ("external_id", ["external_id"], "no column external_id"),  # a KeyError before
    ("rank", None, "no column rank"),  # an IndexError before
    ("extra", None, ""),  # a KeyError before; a newer writer's column is left unread
])
def test_a_ranks_rows_of_a_damaged_table(corpus_runs: dict[str, Run], tmp_path: Path,
                                         damage: str, columns: list[str] | None,
                                         message: str) -> None:
    """One rank's rows (read by row groups) are checked as the whole table's are."""
    run = Run(shutil.copytree(corpus_runs["nccl"].path, tmp_path / "r.run"))
    events = run.path / "tables" / "events.parquet"
    table = pq.read_table(events)
    table = (table.append_column("extra", pa.array([0] * table.num_rows)) if damage == "extra"
             else table.drop_columns([damage]))
    pq.write_table(table, events)
    if not message:
        assert run.table("events", columns, rank=0).column_names == EVENTS.names
        return
    with pytest.raises(RunError, match=re.escape(f"unreadable table ({message})")):
        run.table("events", columns, rank=0)


def test_outputs_never_replace_a_runs_own_files(corpus_runs: dict[str, Run], tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """report and export refuse a path that is a Run's manifest or lies in its raw/ or tables/
    (also through a linked folder); the Run is left byte for byte; beside them is allowed."""
    run = shutil.copytree(corpus_runs["event_sync"].path, tmp_path / "r.run")
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    (tmp_path / "raw-link").symlink_to(run / "raw")
    for argv in (["report", str(run), "-o", str(run / "manifest.json")],
                 ["report", str(run), "-o", str(run / "tables" / "events.parquet")],
                 ["export", str(run), "--format", "perfetto", "-o",
                  str(tmp_path / "raw-link" / "x.json.gz")]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"would replace a file of the Run {run}" in err
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    assert main(["report", str(run)]) == 0 and (run / "report.html").is_file()


def test_sql_is_read_only(corpus_runs: dict[str, object], capsys: pytest.CaptureFixture[str]
                          ) -> None:
    run = corpus_runs["compare_base"]
    path = str(run.path)  # type: ignore[attr-defined]
    for sql in ("DELETE FROM events", "CREATE TABLE x AS SELECT 1",
                "COPY (SELECT 1) TO 'x.csv'", "SELECT 1; DROP VIEW events",
                "SELECT * FROM read_csv('/etc/passwd')", "SET enable_external_access = true"):
        assert main(["sql", path, sql]) == 2, sql
        err = capsys.readouterr().err
        assert err.startswith("perfswarm: error: sql:"), err
    assert main(["sql", path, "SELECT count(*) AS n FROM events", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"n": 33}]


@pytest.mark.parametrize("argv", [["info"], ["nosuch"], ["import"], ["sql", "x"],
                                  ["import", "a.json", "--streaming", "sometimes"]])
def test_usage_errors_exit_2_without_traceback(argv: list[str],
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("perfswarm: error: ") and err.count("\n") == 1, err
    command = "perfswarm" if argv[0] == "nosuch" else f"perfswarm {argv[0]}"
    assert err.rstrip().endswith(f"(see {command} -h)")


@pytest.mark.parametrize(("command", "flag", "said"), [
    ("report", ["-o"], "no such directory (for out.html)"),
    ("project", ["--html"], "no such directory (for out.html)"),
    ("predict", ["--save-overheads"], "no such directory (for out.html)"),
    ("calibrate", ["-o"], "no such directory (for out.html)"),
])
def test_outputs_in_a_missing_directory(corpus_runs: dict[str, object], tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str], command: str,
                                        flag: list[str], said: str) -> None:
    """A file a user names in a directory that is not there: one line, exit 2, nothing left."""
    out = tmp_path / "missing" / "out.html"
    run = [] if command == "calibrate" else [str(corpus_runs["nccl"].path)]  # type: ignore[attr-defined]
    assert main([command, *run, *flag, str(out)]) == 2
    err = capsys.readouterr().err
    assert said in err and err.strip().count("\n") == 0 and "Traceback" not in err
    assert not (tmp_path / "missing").exists()


@pytest.mark.parametrize("argv", [
    ["board", ".", "--port", "-1"],  # a bind() OverflowError traceback before
    ["board", ".", "--port", "70000"],
    ["calibrate", "--budget", "nan"],  # a sweep that never ended
    ["calibrate", "--collectives", "--world-size", "100000"],  # 100,000 processes spawned
    ["demo", "--loader-delay-ms", "-5"],  # recorded a failing workload, then exit 1
    ["demo", "--loader-delay-ms", "nan"],
    ["fuse", "--layer", "dw3x3:C=8,H=8,W=8 -> pw:K=8", "--threads", "0", "--predict-only"],
    ["record", "--pid", "-5", "-o", "x.run"],  # a psutil ValueError traceback before
    # the model's own check had named no flag ("model: every size must be positive")
    ["layouts", "--params", "0", "--layers", "2", "--hidden", "64", "--heads", "4", "--seq", "8",
     "--batch", "2", "--devices", "8"],
    ["layouts", "--params", "nan", "--layers", "2", "--hidden", "64", "--heads", "4", "--seq",
     "8", "--batch", "2", "--devices", "8"],
    # a billion devices had run out of memory; a layer count past 64 bits, a traceback
    ["layouts", "--params", "1e9", "--layers", "2", "--hidden", "64", "--heads", "4", "--seq",
     "8", "--batch", "2", "--devices", "1000000000"],
    ["layouts", "--params", "inf", "--layers", "2", "--hidden", "64", "--heads", "4", "--seq",
     "8", "--batch", "2", "--devices", "8"],
    ["layouts", "--params", "1e9", "--layers", "99999999999999999999", "--hidden", "64",
     "--heads", "4", "--seq", "8", "--batch", "2", "--devices", "8", "--json"],
])
def test_numeric_flags_out_of_range_are_one_line_before_any_work(
        argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("perfswarm: error: ") and err.count("\n") == 1, err
    assert not list(tmp_path.iterdir())  # nothing recorded, swept or written


@pytest.mark.parametrize("argv", [
    # each printed nonsense, or a JSON TypeError past 64 bits ("Integer exceeds 64-bit range")
    ["predict", "--batch-size", "99999999999999999999", "--recorded-batch-size", "1", "--json"],
    ["predict", "--dim", "3=99999999999999999999", "--json"],
    ["predict", "--dim", "0=5"],
    ["project", "--grad-bytes", "99999999999999999999999", "--json"],
    ["project", "--devices", "99999999999999999999", "--grad-bytes", "1000", "--json"],
    ["project", "--bandwidth", "inf", "--json"],
    ["project", "--bandwidth", "nan"],
])
def test_sizes_past_their_range_on_a_run(argv: list[str], corpus_runs: dict[str, Run],
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main([argv[0], str(corpus_runs["nccl"].path), *argv[1:]]) == 2
    out, err = capsys.readouterr()
    assert not out and err.startswith("perfswarm: error: ") and err.count("\n") == 1, err


@pytest.mark.parametrize(("content", "said"), [
    (b"", "not a GPU kernel model (empty)"),  # was "perfswarm: aborted", exit 130 (an EOFError)
    (None, "not a GPU kernel model (no op family in it)"),
])
def test_gpu_model_that_is_no_model(content: bytes | None, said: str, tmp_path: Path,
                                    corpus_runs: dict[str, Run],
                                    capsys: pytest.CaptureFixture[str]) -> None:
    import numpy as np

    model = tmp_path / "m.npz"
    if content is None:
        np.savez(model, gpus=np.array(["V100"]))
    else:
        model.write_bytes(content)
    assert main(["predict", str(corpus_runs["nccl"].path), "--gpu-model", str(model)]) == 2
    assert capsys.readouterr().err == f"perfswarm: error: {model}: {said}\n"


def test_shard_table_past_its_range_names_the_file(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    tables = tmp_path / "t.yaml"
    tables.write_text("tables:\n  - {name: a, rows: 99999999999999999999999, dim: 4}\n")
    assert main(["shard", "--tables", str(tables), "--devices", "2", "--json"]) == 2
    out, err = capsys.readouterr()
    assert not out and err == (f"perfswarm: error: {tables}: tables[0] (a): rows must be at "
                               "most 281,474,976,710,656\n")


def test_layouts_names_the_size_that_is_not_positive(capsys: pytest.CaptureFixture[str]) -> None:
    sizes = {"--params": "1e9", "--layers": "2", "--hidden": "64", "--heads": "4", "--seq": "8",
             "--batch": "2"}
    for name in sizes:
        argv = [x for k, v in {**sizes, name: "0"}.items() for x in (k, v)]
        assert main(["layouts", *argv, "--devices", "8"]) == 2
        assert f"error: {name} 0" in capsys.readouterr().err


def test_an_error_is_one_line_whatever_it_quotes() -> None:
    """A library's text with its own line breaks (pyarrow's ends in one) stays one line."""
    assert str(PerfswarmError("x.parquet: unreadable (thrift:\n bad\r\n\u2028type)\n")) == (
        "x.parquet: unreadable (thrift: bad type)")


def test_demo_replaces_only_its_own_run(corpus_runs: dict[str, object], tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """`demo --out` at a Run another command made refuses before recording (it had replaced a
    user's recording silently); a file or a plain folder there is refused even with --force,
    before any work (it had run the whole workload first)."""
    monkeypatch.chdir(tmp_path)
    theirs = tmp_path / "theirs.run"
    shutil.copytree(corpus_runs["nccl"].path, theirs)  # type: ignore[attr-defined]
    before = (theirs / "manifest.json").read_bytes()
    plain = tmp_path / "plain"
    plain.mkdir()
    (tmp_path / "file.txt").write_text("x")
    for out, force, said in ((theirs, [], "holds a Run the demo did not record (use --force "
                              "to replace it)"),
                             (plain, ["--force"], "exists and is not a perfswarm Run"),
                             (tmp_path / "file.txt", [], "exists and is not a perfswarm Run")):
        assert main(["demo", "--out", str(out), "--steps", "4", *force]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"perfswarm: error: {out}: {said}") and err.count("\n") == 1
    assert (theirs / "manifest.json").read_bytes() == before
    # a report into a folder that is not there: said before recording (it had run the whole
    # workload and replaced --out first)
    assert main(["demo", "--out", str(tmp_path / "new.run"), "--steps", "4", "--report",
                 str(tmp_path / "missing" / "r.html")]) == 2
    assert capsys.readouterr().err == (f"perfswarm: error: {tmp_path / 'missing'}: no such "
                                       "directory (for r.html)\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.txt", "plain", "theirs.run"]
