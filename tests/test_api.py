"""The Python API: docs/api.md's example runs as written, its numbers are the trace's, and the
library's errors name parameters where the CLI names flags."""

from __future__ import annotations

import gzip
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import polars as pl
import pytest

import perfswarm
from conftest import CORPUS, REPO, corpus
from perfswarm.cli.main import main

TRACE = "nccl_parser_config/nccl_data.json.gz"


def doc_blocks() -> list[str]:
    text = (REPO / "docs" / "api.md").read_text(encoding="utf-8")
    return re.findall(r"```python\n(.*?)```", text, re.DOTALL)


@pytest.fixture(scope="module")
def notebook(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """docs/api.md's code blocks run in order, in one namespace, as notebook cells would, in
    a scratch directory (the page's corpus path made absolute)."""
    blocks = doc_blocks()
    assert f'"../shared/corpus/hta/{TRACE}"' in blocks[0]
    here = tmp_path_factory.mktemp("notebook")
    namespace: dict[str, Any] = {}
    cwd = Path.cwd()
    try:
        import os

        os.chdir(here)
        for block in blocks:
            exec(compile(block.replace("../shared/corpus/hta/", f"{CORPUS}/"), "api.md", "exec"),
                 namespace)
    finally:
        os.chdir(cwd)
    namespace["here"] = here
    return namespace


def raw_events() -> list[dict[str, Any]]:
    with gzip.open(corpus("nccl")) as f:
        events: list[dict[str, Any]] = orjson.loads(f.read())["traceEvents"]
    return events


def test_the_example_gives_the_traces_numbers(notebook: dict[str, Any]) -> None:
    raw = raw_events()
    marked = sorted((int(e["name"].removeprefix("ProfilerStep#")), round(e["dur"] * 1000))
                    for e in raw if e.get("name", "").startswith("ProfilerStep#"))
    steps = notebook["steps"]
    # the columns the page's comment names
    named = re.search(r"one row per iteration: (.*)", "".join(doc_blocks()))
    assert named and steps.columns == named.group(1).split(", ")
    assert list(zip(steps["step"], steps["dur_ns"], strict=True)) == marked
    assert marked == [(4, 222442191), (5, 219726905), (6, 224936243)]
    allreduce = [e for e in raw if e.get("cat") == "kernel"
                 and e["name"] == notebook["kernels"]["name"][0]]
    assert notebook["kernels"]["count"][0] == len(allreduce) == 15
    assert notebook["kernels"]["total_ns"][0] == round(sum(e["dur"] for e in allreduce) * 1000)
    kinds = dict(zip(notebook["per_kind"]["kind"], notebook["per_kind"]["n"], strict=True))
    # NCCL kernels are the kind `collective`
    assert kinds["kernel"] + kinds["collective"] == sum(e.get("cat") == "kernel" for e in raw)
    assert kinds["collective"] == sum(e.get("cat") == "kernel" and "nccl" in e["name"]
                                      for e in raw) == 21
    assert notebook["page"] == Path("nccl-report.html")
    assert (notebook["here"] / notebook["page"]).read_text().startswith("<!DOCTYPE html>")
    assert notebook["refused"] == "devices"
    assert notebook["wrong_type"] == "ignore_markers 'no': expected bool; got str"


def test_results_are_the_clis_json(notebook: dict[str, Any],
                                   capsys: pytest.CaptureFixture[str]) -> None:
    run: perfswarm.Run = notebook["run"]
    assert main(["advise", str(run.path), "--json"]) == 0
    assert orjson.loads(capsys.readouterr().out) == run.advise().to_dict()
    assert notebook["advice"]["rule"].to_list() == [a["rule"] for a in
                                                   run.advise().to_dict()["advice"]]
    points = notebook["scaling"]
    assert points["devices"].to_list() == [1, 8, 64] and points["efficiency"][0] == 1.0


def test_load_and_tables(notebook: dict[str, Any]) -> None:
    run = perfswarm.load(notebook["run"].path)
    result = run.analyze()
    assert result.tables[0] == "steps" and result.rows() == result.rows("steps")
    with pytest.raises(perfswarm.ParameterError, match=r"^table nope: not one of steps, "):
        result.rows("nope")
    with pytest.raises(perfswarm.RunError):
        perfswarm.load(notebook["here"])


def test_every_table_keeps_its_columns(notebook: dict[str, Any], tmp_path: Path) -> None:
    """A table's declared columns are those its records have (on the corpus's DDP trace, where
    every table has records), and a table with none (a CPU trace's kernels, categories and
    sequences) is a frame of the same columns, no rows: code written against one Run runs on
    the next."""
    run = notebook["run"]
    results = [run.analyze(), run.predict(), run.advise(), run.project()]
    for result in results:
        for name in result.tables:
            frame = result.to_polars(name)
            assert frame.height, name
            declared = result._tables[name].schema()
            assert frame.columns == list(declared), name
            assert {c: t for c, t in frame.schema.items() if declared[c] != pl.Null} == {
                c: t for c, t in declared.items() if t != pl.Null}, name
    cpu = perfswarm.import_traces(corpus("cpu_only"), tmp_path / "cpu.run").analyze()
    for name in ("kernels", "categories", "sequences"):
        assert cpu.rows(name) == []
        frame = cpu.to_polars(name)
        assert (frame.height, frame.columns) == (0, results[0].to_polars(name).columns)


def test_to_pandas_needs_pandas(notebook: dict[str, Any]) -> None:
    result = notebook["run"].advise()
    try:
        import pandas  # noqa: F401
    except ImportError:
        with pytest.raises(perfswarm.PerfswarmError, match="needs pandas"):
            result.to_pandas()
    else:
        assert result.to_pandas().to_dict("records") == result.rows()


def test_library_errors_name_parameters_the_cli_flags(notebook: dict[str, Any],
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    run: perfswarm.Run = notebook["run"]
    with pytest.raises(perfswarm.ParameterError) as caught:
        run.project([0], bandwidth_gbps=-1)
    assert str(caught.value) == "devices: give device counts from 1 to 16,777,216, e.g. 1,2,4,8"
    assert main(["project", str(run.path), "--devices", "0"]) == 2
    assert capsys.readouterr().err.strip() == (
        "perfswarm: error: --devices: give device counts from 1 to 16,777,216, e.g. 1,2,4,8")
    # no collectives and no layer shapes: nothing gives the gradients' size
    bare = perfswarm.import_traces(corpus("simple_add"), out=notebook["here"] / "bare.run")
    with pytest.raises(perfswarm.ParameterError, match=r"give their size with grad_bytes$"):
        bare.project([1, 2])
    assert main(["project", str(bare.path), "--devices", "1,2"]) == 2
    assert capsys.readouterr().err.strip().endswith("give their size with --grad-bytes")


@pytest.mark.parametrize(("call", "param"), [
    (lambda run: run.project(8), "devices"),  # a TypeError before
    (lambda run: run.project(["a"]), "devices"),  # a TypeError from min()
    (lambda run: run.project([8], scheme="star"), "scheme"),  # had been priced as a tree
    (lambda run: run.project([8], scheme="RING"), "scheme"),
    (lambda run: run.project([8], interconnect="warp-drive"), "interconnect"),  # had been
    (lambda run: run.project([8], intra="warp-drive"), "intra"),  # interconnect_name, intra_name
    # the device lookup had named `device`, another parameter of the same call
    (lambda run: run.predict(source_device="warp-drive", batch_size=2, recorded_batch_size=1),
     "source_device"),
    (lambda run: run.sql("SELECT 1", timeout_s=-5), "timeout_s"),  # had blamed the query
    (lambda run: run.sql("SELECT 1", memory_mb=0), "memory_mb"),
    (lambda run: run.predict(dims="768=1024"), "dims"),  # an AttributeError before
    (lambda run: perfswarm.load(3), "path"),  # a TypeError from pathlib before
    (lambda run: run.analyze(window="1:2"), "window"),  # a ValueError before
    (lambda run: run.predict(dims={"a": 128}), "dims"),  # accepted and ignored before
    (lambda run: perfswarm.import_traces([corpus("simple_add")], out=run.path / "x.run",
                                         streaming="sometimes"), "streaming"),
    (lambda run: perfswarm.record(["python", "-c", "pass"], run.path / "r.run", skip=-1),
     "skip"),  # said "steps" before
    (lambda run: perfswarm.record("python -c pass", run.path / "r.run"), "command"),
])
def test_the_api_refuses_what_the_cli_refuses(notebook: dict[str, Any], call: Any,
                                               param: str) -> None:
    """Every bad argument is a ParameterError naming its parameter, as the CLI's bad flags
    are, never a TypeError or a result computed from a value the CLI would refuse."""
    with pytest.raises(perfswarm.ParameterError) as caught:
        call(notebook["run"])
    assert caught.value.param == param


def test_import_traces_names_its_run_as_the_cli(tmp_path: Path) -> None:
    """Without `out`, the Run is the first file's name up to its first dot, plus .run."""
    import os

    cwd = Path.cwd()
    os.chdir(tmp_path)
    try:
        run = perfswarm.import_traces(corpus("simple_add"))
    finally:
        os.chdir(cwd)
    assert run.path == tmp_path / (corpus("simple_add").name.split(".")[0] + ".run")


def test_import_perfswarm_stays_light() -> None:
    out = subprocess.run([sys.executable, "-c", "import sys, perfswarm; perfswarm.ParameterError;"
                          "print(sorted(m.split('.')[0] for m in sys.modules))"],
                         check=True, capture_output=True, text=True).stdout
    assert not {"pyarrow", "polars", "numpy", "duckdb"} & set(eval(out))


def test_record_stays_the_function() -> None:
    """perfswarm.record is the API's function even after the recorder's modules are imported
    (a subpackage perfswarm.record would be set on the package by the import system)."""
    import importlib

    import perfswarm

    importlib.import_module("perfswarm.recorder.session")
    importlib.import_module("perfswarm.report.html")
    assert callable(perfswarm.record) and perfswarm.record.__module__ == "perfswarm.api"


def test_a_notebook_sees_the_api(notebook: dict[str, Any]) -> None:
    """dir(perfswarm) lists the names loaded when first used (completion offered none), and a
    Result shows in a cell as what it holds, not its whole dataclass (40-100 KB before)."""
    assert {"load", "import_traces", "record", "Run", "ParameterError"} <= set(dir(perfswarm))
    analysis = notebook["run"].analyze()
    shown = repr(analysis)
    assert shown.startswith("perfswarm.Result(Analysis: path, events, ranks, iterations")
    assert shown.endswith(f"tables: {', '.join(analysis.tables)})") and len(shown) < 1000


@pytest.mark.parametrize(("call", "message"), [
    # each had escaped as a TypeError or AttributeError from inside a stage, or been taken
    (lambda run: run.predict(batch_size="eight"),
     "batch_size 'eight': expected int | None (or its text as the command line takes it: "
     "'8'); got str"),
    (lambda run: run.predict(device=5), "device 5: expected str | None; got int"),
    (lambda run: run.predict(profile=123), "profile 123: expected str | Path | None; got int"),
    (lambda run: run.project([1, 8], per_node="eight"),
     "per_node 'eight': expected int | None (or its text as the command line takes it: '8'); "
     "got str"),
    (lambda run: run.project([1, "x"]),
     "devices [1, 'x']: expected Sequence[int] | None; item 1: 'x' is str, not int"),
    (lambda run: run.project([1, 8], bandwidth_gbps=True),
     "bandwidth_gbps True: expected float | None; got bool"),
    (lambda run: run.analyze(ignore_markers="no"),  # had been taken for True
     "ignore_markers 'no': expected bool; got str"),
    (lambda run: run.analyze(window=(1, "end")),
     "window (1, 'end'): expected tuple[float | None, float | None] | None; item 1: 'end' is "
     "str, not float | None"),
    (lambda run: run.sql(b"SELECT 1"), "query b'SELECT 1': expected str; got bytes"),
    (lambda run: run.analyze().rows(0), "table 0: expected str | None; got int"),
    (lambda run: perfswarm.record(["true"], run.path / "r.run", skip="five"),
     "skip 'five': expected int (or its text as the command line takes it: '8'); got str"),
    (lambda run: perfswarm.record(["true"], run.path / "r.run", execution_trace="no"),
     "execution_trace 'no': expected bool; got str"),
    (lambda run: perfswarm.import_traces(corpus("simple_add"), run.path / "x.run", ranks="0"),
     "ranks '0': expected Sequence[int]; got str"),
])
def test_a_wrong_type_is_a_parameter_error(notebook: dict[str, Any], call: Any,
                                           message: str) -> None:
    """Every API function takes what its type hints say, or refuses it with a ParameterError
    naming the parameter, the value (as text) and the type it takes."""
    with pytest.raises(perfswarm.ParameterError) as caught:
        call(notebook["run"])
    assert str(caught.value) == message
    assert caught.value.param == message.split(" ", maxsplit=1)[0]
    assert isinstance(caught.value.value, str)


def test_numbers_as_text_are_the_clis(notebook: dict[str, Any]) -> None:
    """A number given as text (a widget's, a config's) is read as the command line reads its
    options' text: the same result as the number; other text is refused."""
    run: perfswarm.Run = notebook["run"]
    assert run.project(["1", "8"], per_node="4", bandwidth_gbps="400").to_dict() == \
        run.project([1, 8], per_node=4, bandwidth_gbps=400.0).to_dict()
    assert run.sql("SELECT 1 AS x", timeout_s="30", memory_mb="1024").to_dicts() == [{"x": 1}]
    for text in ("1_0", "٣", " 8", "8.0", "inf"):
        with pytest.raises(perfswarm.ParameterError, match=r"^per_node "):
            run.project([1, 8], per_node=text)


def test_a_cpu_runs_shape_change_without_a_profile_names_its_parameter(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The error names the parameter that needs the kernel profile (it named none), and the
    command line its flag."""
    run = perfswarm.import_traces(corpus("cpu_only"), tmp_path / "cpu.run")
    why = ("a changed batch size or dimension on a CPU run needs a kernel profile: run "
           "`perfswarm calibrate` and pass {} cpu-profile.json")
    with pytest.raises(perfswarm.ParameterError) as caught:
        run.predict(batch_size=8, recorded_batch_size=4)
    assert (caught.value.param, str(caught.value)) == (
        "batch_size", "predict: batch_size 8: " + why.format("profile"))
    with pytest.raises(perfswarm.ParameterError) as caught:
        run.predict(dims={64: 128})
    assert (caught.value.param, str(caught.value)) == (
        "dims", "predict: dims: " + why.format("profile"))
    assert main(["predict", str(run.path), "--batch-size", "8", "--recorded-batch-size",
                 "4"]) == 2
    assert capsys.readouterr().err.strip() == (
        "perfswarm: error: predict: --batch-size 8: " + why.format("--profile"))


def test_a_query_of_no_rows_keeps_its_column_types(notebook: dict[str, Any]) -> None:
    """DuckDB knows a query's column types without rows: the frame has them (all Null
    before), the same as the frame of the same query with rows."""
    run: perfswarm.Run = notebook["run"]
    query = "SELECT kind, ts, dur, args, dur / 1e3 AS dur_us FROM events"
    none = run.sql(query + " WHERE false")
    some = run.sql(query + " LIMIT 3")
    assert none.shape == (0, 5) and some.height == 3
    assert dict(none.schema) == dict(some.schema) == {
        "kind": pl.String, "ts": pl.Int64, "dur": pl.Int64, "args": pl.String,
        "dur_us": pl.Float64}
