"""Start-up stays light: `--help`, every command's `--help` and usage error, and `info` import no
heavy library; the lazy listing is true."""

from __future__ import annotations

import importlib
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest
import typer.main

from conftest import corpus
from perfswarm.cli.app import CommandsOnDemand, app, command_doc, command_names
from perfswarm.trace.ingest import ImportOptions, import_traces

HEAVY = ("sklearn", "scipy", "optuna", "plotly", "torch", "dask")
# what no help needs: the heavy libraries, and those a table command reads with
LIBRARIES = (*HEAVY, "polars", "pyarrow", "duckdb", "numpy", "pandas", "distributed", "jinja2",
             "pydantic")

CHILD = """import json, sys
from perfswarm.cli.main import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""


def loaded_modules(*argv: str) -> set[str]:
    """Every module a command's process holds once it has run (its output: the last line)."""
    out = subprocess.run([sys.executable, "-c", CHILD, *argv], check=True, capture_output=True,
                         text=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["code"] == 0
    return set(result["modules"])


def modules_after(*argv: str) -> set[str]:
    """The top-level packages a command loaded."""
    return {m.split(".")[0] for m in loaded_modules(*argv)}


@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> str:
    out = tmp_path_factory.mktemp("startup") / "run"
    return str(import_traces([corpus("cpu_only")], out, ImportOptions(), ["test"]).path)


def test_help_imports_no_heavy_library() -> None:
    loaded = modules_after("--help")
    assert "typer" in loaded  # the probe sees what the CLI imported
    assert loaded.isdisjoint(LIBRARIES)


def app_commands() -> list[str]:
    """The commands the application lists."""
    group = typer.main.get_group(app)
    return group.list_commands(click.Context(group))


def third_party(packages: set[str]) -> set[str]:
    return {p for p in packages if p not in sys.stdlib_module_names and p != "perfswarm"}


HELP_AND_USAGE = """import json, sys
from perfswarm.cli.main import main
codes = [main([sys.argv[1], "--help"]), main([sys.argv[1], "--no-such-option"])]
print(json.dumps({"codes": codes, "modules": sorted(sys.modules)}))
"""


@pytest.fixture(scope="module")
def listing_packages() -> set[str]:
    return third_party(modules_after("--help"))


@pytest.mark.parametrize("name", app_commands())
def test_each_commands_help_and_usage_error_import_no_library(
        name: str, listing_packages: set[str]) -> None:
    """`perfswarm NAME --help` and `perfswarm NAME --no-such-option` (its usage error) load no
    library of the command's, nor any package the top-level help does not load: a command's
    module imports only what its options show (typer, perfswarm/defaults.py). A constant of a
    heavy module in an option's default or help had brought that module's libraries: the
    --help of `report`, `tune` or `advise` had cost 3-4 times the peer typer app's
    (benchmarks/startup.py)."""
    out = subprocess.run([sys.executable, "-c", HELP_AND_USAGE, name], check=True,
                         capture_output=True, text=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["codes"] == [0, 2]
    assert f"perfswarm.cli.{name}_cmd" in result["modules"]  # the command's module was read
    loaded = {m.split(".")[0] for m in result["modules"]}
    assert sorted(loaded.intersection(LIBRARIES)) == []
    assert sorted(third_party(loaded) - listing_packages) == []


LOADED = """import sys
from perfswarm.cli.main import main
from perfswarm.model.gpu.learned import bundled
code = main(sys.argv[1:])
print(code, bundled.cache_info().currsize)
"""


@pytest.mark.parametrize(("change", "loads"), [([], False), (["--device", "H100"], True)])
def test_predict_loads_the_gpu_kernel_model_only_to_price_a_change(
        tmp_path: Path, change: list[str], loads: bool) -> None:
    """At its recorded configuration a GPU Run's kernels keep their measured times: the
    bundled model is not loaded (it had been, whatever the change; nothing priced with it)."""
    run = import_traces([Path(__file__).parent / "data" / "conv1d_h200.pt.trace.json.gz"],
                        tmp_path / "run", ImportOptions(), ["test"]).path
    out = subprocess.run([sys.executable, "-c", LOADED, "predict", str(run), "--json", *change],
                         check=True, capture_output=True, text=True)
    assert out.stdout.split()[-2:] == ["0", str(int(loads))]


@pytest.mark.parametrize(("argv", "needs", "unneeded"), [
    (["info"], "pyarrow", ("polars", "duckdb", "pydantic")),
    # sklearn clusters sampled stacks: a Run without them needs none; pydantic converts typer's
    # parameters unless cli/coercion.py does
    (["analyze", "--workers", "0"], "numpy", ("pydantic", "polars")),
    # the advice reads pyarrow tables and numpy arrays: polars is the notebook API's alone
    # (api.py's frames), not a command's
    (["advise", "--json"], "pyarrow", ("pydantic", "polars")),
    (["report", "--json"], "pyarrow", ("jinja2", "pydantic", "polars")),  # HTML: not for --json
])
def test_command_imports_only_what_it_needs(small_run: str, argv: list[str], needs: str,
                                            unneeded: tuple[str, ...]) -> None:
    loaded = modules_after(argv[0], small_run, *argv[1:])
    assert needs in loaded
    assert loaded.isdisjoint((*HEAVY, *unneeded))


def test_analyze_json_loads_no_terminal_output_trace_reader_or_run_diff(small_run: str) -> None:
    """`analyze --json` prints JSON alone: no rich (the terminal's tables, 40-75 CPU ms of its
    start), no trace reader (the memory counters' names are the schema's; the readers had
    brought Kineto's parser and SQLite), no diff of two Runs."""
    loaded = loaded_modules("analyze", small_run, "--json", "--workers", "0")
    assert {"perfswarm.analyze.summary", "perfswarm.analyze.memory", "perfswarm.cli.json_output"} \
        <= loaded  # the probe sees the command's own modules
    assert not {m for m in loaded if m.split(".")[0] == "rich" or m.startswith(
        ("perfswarm.trace.readers", "perfswarm.trace.kineto", "perfswarm.trace.nsys",
         "perfswarm.analyze.diff", "perfswarm.cli.output"))}
    assert "rich" in modules_after("analyze", small_run, "--workers", "0")  # its tables


@pytest.mark.parametrize("name", command_names())
def test_listing_shows_each_commands_own_docstring(name: str) -> None:
    importlib.import_module(f"perfswarm.cli.{name}_cmd")
    info = next(i for i in app.registered_commands if i.name == name)
    assert info.callback is not None
    assert command_doc(name) == inspect.getdoc(info.callback)


def test_every_registered_command_has_its_module() -> None:
    for name in command_names():
        importlib.import_module(f"perfswarm.cli.{name}_cmd")
    assert sorted(i.name or "" for i in app.registered_commands) == list(command_names())


def test_listing_summaries_are_unwrapped_first_paragraphs() -> None:
    """The top-level help's summary of a command is its docstring's first paragraph as one line
    (the docstring's own line breaks had been printed inside the help's table)."""
    group = CommandsOnDemand(name="perfswarm")
    group.listing = True
    try:
        summary = group.get_command(click.Context(group), "calibrate")
    finally:
        group.listing = False
    assert summary is not None
    first = command_doc("calibrate").split("\n\n")[0]
    assert "\n" in first   # the docstring wraps its first paragraph
    assert summary.short_help == " ".join(first.split())


POOL = """import json, os, sys
from perfswarm.cli.main import main
code = main(sys.argv[1:])
import pyarrow as pa
print(json.dumps({"code": code, "pool": pa.default_memory_pool().backend_name,
                  "env": os.environ.get("ARROW_DEFAULT_MEMORY_POOL")}))
"""


@pytest.mark.parametrize(("given", "pool"), [(None, "system"), ("mimalloc", "mimalloc")])
def test_a_table_command_uses_the_system_allocator_unless_told(
        small_run: str, given: str | None, pool: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    if given is not None:
        env["ARROW_DEFAULT_MEMORY_POOL"] = given
    out = subprocess.run([sys.executable, "-c", POOL, "info", small_run], check=True,
                         capture_output=True, text=True, env=env)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    # the variables are the user's again once the command runs (what record's child inherits)
    assert result == {"code": 0, "pool": pool, "env": given}
