"""Start-up stays light: `--help` and `info` import no heavy library; the lazy listing is true."""

from __future__ import annotations

import importlib
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import corpus
from perfswarm.cli.app import app, command_doc, command_names
from perfswarm.trace.ingest import ImportOptions, import_traces

HEAVY = ("sklearn", "scipy", "optuna", "plotly", "torch", "dask")

CHILD = """import json, sys
from perfswarm.cli.main import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "modules": sorted({m.split(".")[0] for m in sys.modules})}))
"""


def modules_after(*argv: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", CHILD, *argv], check=True, capture_output=True,
                         text=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["code"] == 0
    return set(result["modules"])


def test_help_imports_no_heavy_library() -> None:
    loaded = modules_after("--help")
    assert "typer" in loaded  # the probe sees what the CLI imported
    assert loaded.isdisjoint((*HEAVY, "polars", "pyarrow", "duckdb", "numpy"))


def test_info_imports_only_what_it_reads_with(tmp_path: Path) -> None:
    run = import_traces([corpus("cpu_only")], tmp_path / "run", ImportOptions(), ["test"])
    loaded = modules_after("info", str(run.path))
    assert "pyarrow" in loaded
    assert loaded.isdisjoint((*HEAVY, "polars", "duckdb"))


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
