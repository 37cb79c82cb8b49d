"""The tuner: space files, step-time parsing, trials of a tiny command, pruning, storage, CLI."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from perfswarm.cli.main import main
from perfswarm.errors import PerfswarmError
from perfswarm.optimize.tune import (
    STEP_PATTERN,
    CommandFailed,
    Param,
    TuneOptions,
    configure,
    load_space,
    step_time_s,
    tune,
)

# Step time 10 ms / (1 + WORKERS), halved by --fast; WORKERS=2 crashes (a bad configuration).
SCRIPT = """\
import os, sys
w = int(os.environ.get("WORKERS", "0"))
if w == 2:
    sys.exit("bad config")
for i in range(5):
    print(f"step {i} {10 / (1 + w) * (0.5 if '--fast' in sys.argv else 1):.3f} ms loss 0.1")
"""
COMMAND = [sys.executable, "-c", SCRIPT]
SPACE = """\
params:
  - {name: workers, type: categorical, choices: [0, 1, 2, 3], env: WORKERS}
  - {name: fast, type: bool, flag: --fast}
"""


@pytest.fixture
def space(tmp_path: Path) -> Path:
    path = tmp_path / "space.yaml"
    path.write_text(SPACE)
    return path


def test_a_short_search_finds_the_best_configuration(space: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = tune(COMMAND, load_space(space), TuneOptions(out=out, trials=8, seed=1))
    assert result.baseline.throughput == pytest.approx(100.0)
    assert result.best is not None and result.best["params"] == {"fast": True, "workers": 3}
    assert result.speedup == 8.0
    states = {t["state"] for t in result.trials}
    assert "FAIL" in states  # workers=2 exits 1: the trial fails, the search goes on
    pruned = [t for t in result.trials if t["state"] == "PRUNED"]
    assert pruned and all(t["steps"] < 5 for t in pruned)  # stopped early
    summary = orjson.loads((out / "tune.json").read_bytes())
    assert summary == orjson.loads(orjson.dumps(result.to_dict()))
    assert set(summary) == {"command", "study", "storage", "baseline", "best", "speedup",
                            "trials", "pruned", "failed", "importance"}
    assert summary["storage"] == f"sqlite:///{(out / 'tune.db').resolve()}"
    trials = orjson.loads((out / "trials.json").read_bytes())
    assert [t["number"] for t in trials] == list(range(8))
    importance = orjson.loads((out / "importance.json").read_bytes())
    assert set(importance) == {"fast", "workers"}
    assert sum(importance.values()) == pytest.approx(1.0, abs=1e-5)


def test_workers_sharing_a_storage_share_one_study(space: Path, tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'shared.db'}"
    params = load_space(space)
    tune(COMMAND, params, TuneOptions(out=tmp_path / "a", trials=2, storage=storage))
    second = tune(COMMAND, params, TuneOptions(out=tmp_path / "b", trials=2, storage=storage,
                                               seed=1))
    assert [t["number"] for t in second.trials] == [0, 1, 2, 3]


def test_a_failing_baseline_is_an_error(space: Path, tmp_path: Path) -> None:
    with pytest.raises(CommandFailed, match="exited with 1"):
        tune([sys.executable, "-c", "raise SystemExit(1)"], load_space(space),
             TuneOptions(out=tmp_path, trials=1))
    with pytest.raises(CommandFailed, match="printed 1 step time"):
        tune([sys.executable, "-c", "print('step 0 1 ms')"], load_space(space),
             TuneOptions(out=tmp_path, trials=1))
    with pytest.raises(CommandFailed, match="exited with -9"):
        tune([sys.executable, "-c", "import time; time.sleep(30)"], load_space(space),
             TuneOptions(out=tmp_path, trials=1, timeout_s=0.5))


@pytest.mark.parametrize(("text", "problem"), [
    ("{}", "non-empty `params` list"),
    ("params: [{name: a, type: int, low: 1, high: 2}]", "needs `env`"),
    ("params: [{name: a, type: number, env: A}]", "`type` must be one of"),
    ("params: [{name: a, type: int, low: 3, high: 2, env: A}]", "`low` <= `high`"),
    ("params: [{name: a, type: int, low: 0.5, high: 2, env: A}]", "whole `low`"),
    ("params: [{name: a, type: categorical, choices: [], env: A}]", "non-empty `choices`"),
    ("params: [{name: a, type: bool, env: A}, {name: a, type: bool, env: B}]", "unique"),
    ("params: [", "invalid YAML"),
])
def test_bad_space_files(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    with pytest.raises(PerfswarmError, match=re.escape(problem)) as info:
        load_space(path)
    assert str(info.value).startswith(str(path))


def test_values_go_to_env_and_flags() -> None:
    params = (Param("threads", "int", 1, 8, env="OMP_NUM_THREADS"),
              Param("workers", "int", 0, 8, flag="--num-workers"),
              Param("pin", "bool", env="PIN", flag="--pin-memory"),
              Param("compile", "bool", flag="--compile"))
    cmd, env = configure(params, {"threads": 2, "workers": 4, "pin": True, "compile": False},
                         ["train.py", "--num-workers", "0"], {"HOME": "/root"})
    assert cmd == ["train.py", "--num-workers", "0", "--num-workers", "4", "--pin-memory"]
    assert env == {"HOME": "/root", "OMP_NUM_THREADS": "2", "PIN": "1"}


@pytest.mark.parametrize(("line", "seconds"), [
    ("step 3 12.500 ms loss 0.25", 0.0125),
    ("step=4 time=2.5s", 2.5),
    ("Step 7: 150 us", 150e-6),
    ("step 1 took 3e-3 s", 3e-3),
    ("loss 0.25", None),
])
def test_step_lines(line: str, seconds: float | None) -> None:
    got = step_time_s(line, re.compile(STEP_PATTERN))
    assert got == (None if seconds is None else pytest.approx(seconds))


@given(st.integers(0, 10**6), st.floats(0.001, 1e5, allow_nan=False))
def test_bundled_workload_lines_parse_back(step: int, ms: float) -> None:
    line = f"step {step} {ms:.3f} ms loss 1.2345"
    assert step_time_s(line, re.compile(STEP_PATTERN)) == pytest.approx(float(f"{ms:.3f}") / 1e3)


def test_tune_cli(space: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli"
    code = main(["tune", "--space", str(space), "-n", "3", "-o", str(out), "-q", "--json", "--",
                 *COMMAND])
    assert code == 0
    summary = orjson.loads(capsys.readouterr().out)
    assert summary["trials"] == 3 and summary["command"] == COMMAND
    assert main(["tune", "--space", str(tmp_path / "none.yaml"), "--", "true"]) == 2
    assert "cannot read" in capsys.readouterr().err
