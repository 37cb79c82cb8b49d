"""The tuner: space files, step-time parsing, recorded and printed trials, pruning, storage, CLI."""

from __future__ import annotations

import math
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from perfswarm.cli.main import main
from perfswarm.defaults import STEP_PATTERN
from perfswarm.errors import PerfswarmError
from perfswarm.optimize.space import Param, configure, load_space
from perfswarm.optimize.trial import (
    CommandFailed,
    Plan,
    Stopped,
    measure_recorded,
    step_time_s,
)
from perfswarm.optimize.tune import TuneOptions, load_results, tune
from perfswarm.report.data import report_data
from perfswarm.trace.store import Run
from tune_cases import COMMAND, printed_search, write_space

# A torch.optim loop whose steps sleep 40 ms, or 5 ms with --fast.
STEPPER = """\
import sys, time, torch
p = torch.nn.Parameter(torch.zeros(1))
opt = torch.optim.SGD([p], lr=0.1)
for _ in range(int(sys.argv[1])):
    time.sleep(0.005 if "--fast" in sys.argv else 0.04)
    opt.step()
"""


@pytest.fixture
def space(tmp_path: Path) -> Path:
    return write_space(tmp_path)


def test_a_short_search_finds_the_best_configuration(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = printed_search(out)
    assert result.baseline.throughput == pytest.approx(100.0)
    assert result.baseline.steps == tuple(range(1, 8))  # step 0 is the warm-up
    assert result.best is not None and result.best["params"] == {"fast": True, "workers": 3}
    assert result.speedup == 8.0
    states = {t["state"] for t in result.trials}
    assert "FAIL" in states  # workers=2 exits 1: the trial fails, the search goes on
    # Printed times are exact, so pruning is too: a trial stops at its fifth steady step
    # (the first the bound can decide) when all five were slower than the best so far.
    pruned = [t for t in result.trials if t["state"] == "PRUNED"]
    assert pruned and all(t["steps"] == 5 for t in pruned)
    best_before = {t["number"]: max([100.0, *(u["throughput"] or 0.0 for u in result.trials
                                              if u["number"] < t["number"])])
                   for t in pruned}
    assert all(1 / t["median_step_s"] < best_before[t["number"]] for t in pruned)
    complete = [t for t in result.trials if t["state"] == "COMPLETE"]
    assert all(t["steps"] == 7 and t["run"] is None for t in complete)
    summary = orjson.loads((out / "tune.json").read_bytes())
    assert summary == orjson.loads(orjson.dumps(result.to_dict()))
    assert set(summary) == {"command", "unit", "study", "storage", "measure", "baseline",
                            "baseline_throughputs", "noise", "noise_bound", "best", "speedup",
                            "beyond_noise",
                            "trials", "pruned", "failed", "importance"}
    assert summary["unit"] == "steps/s"
    # the baseline ran three times before the trials and once after them; printed times are
    # exact: no noise, the 8x clears it
    assert summary["baseline_throughputs"] == [100.0] * 4
    assert summary["noise"] == 0.0 and summary["beyond_noise"] is True
    assert summary["measure"] == "stdout" and summary["baseline"]["run"] is None
    assert summary["storage"] == f"sqlite:///{(out / 'tune.db').resolve()}"
    trials = orjson.loads((out / "trials.json").read_bytes())
    assert [t["number"] for t in trials] == list(range(8))
    importance = orjson.loads((out / "importance.json").read_bytes())
    # the completed trials all ran --fast (the others were pruned or failed): no importance
    # of it can be told (fANOVA said 0.0), only the workers'
    assert {tuple(sorted(t["params"].items())) for t in result.trials
            if t["state"] == "COMPLETE"} == {(("fast", True), ("workers", 1)),
                                             (("fast", True), ("workers", 3))}
    assert set(importance) == {"workers"}
    assert importance["workers"] == pytest.approx(1.0, abs=1e-5)


def test_workers_sharing_a_storage_share_one_study(space: Path, tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'shared.db'}"
    params = load_space(space)
    tune(COMMAND, params,
         TuneOptions(out=tmp_path / "a", trials=2, storage=storage, measure="stdout"))
    second = tune(COMMAND, params, TuneOptions(out=tmp_path / "b", trials=2, storage=storage,
                                               seed=1, measure="stdout"))
    assert [t["number"] for t in second.trials] == [0, 1, 2, 3]


def test_a_failing_baseline_is_an_error(space: Path, tmp_path: Path) -> None:
    with pytest.raises(CommandFailed, match="exited with 1"):
        tune([sys.executable, "-c", "raise SystemExit(1)"], load_space(space),
             TuneOptions(out=tmp_path, trials=1, measure="stdout"))
    with pytest.raises(CommandFailed, match=r"1 step\(s\) timed, none past the 1 warm-up"):
        tune([sys.executable, "-c", "print('step 0 1 ms')"], load_space(space),
             TuneOptions(out=tmp_path, trials=1, measure="stdout"))
    with pytest.raises(CommandFailed, match="exited with -9"):
        tune([sys.executable, "-c", "import time; time.sleep(30)"], load_space(space),
             TuneOptions(out=tmp_path, trials=1, timeout_s=0.5, measure="stdout"))
    with pytest.raises(CommandFailed, match=r"no optimizer steps seen .* needs --measure stdout"):
        tune([sys.executable, "-c", "print('step 0 1 ms')"], load_space(space),
             TuneOptions(out=tmp_path / "rec", trials=1))
    with pytest.raises(PerfswarmError, match=r"^warmup must be at least 0 and window at least 1$"):
        tune(COMMAND, load_space(space), TuneOptions(out=tmp_path, window=0))


@pytest.mark.parametrize(("text", "problem"), [
    ("{}", "non-empty `params` list"),
    ("params: [{name: a, type: int, low: 1, high: 2}]", "needs `env`"),
    ("params: [{name: a, type: number, env: A}]", "`type` must be one of"),
    ("params: [{name: a, type: int, low: 3, high: 2, env: A}]", "`low` <= `high`"),
    ("params: [{name: a, type: int, low: 0.5, high: 2, env: A}]", "whole `low`"),
    ("params: [{name: a, type: categorical, choices: [], env: A}]", "non-empty `choices`"),
    ("params: [{name: a, type: bool, env: A}, {name: a, type: bool, env: B}]", "unique"),
    ("params: [", "invalid YAML"),
    # each had failed only after the baseline's runs, with a traceback
    ("params: [{name: a, type: float, low: 0, high: 1, log: true, env: A}]",
     "a `log` scale needs `low` above 0"),
    ("params: [{name: a, type: float, low: .nan, high: 1, env: A}]", "finite numbers"),
    ("params: [{name: a, type: int, low: 1, high: 2, env: 'A=B; rm'}]", "a variable name"),
    ("params: [{name: a, type: int, low: 1, high: 8, step: 0, env: A}]", "`step` must be"),
    ("params: [{name: a, type: int, low: 1, high: 8, step: 0.5, env: A}]", "a whole `step`"),
    ("params: [{name: a, type: float, low: 0.1, high: 8, step: 0.1, log: true, env: A}]",
     "a `log` scale takes no `step`"),
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
    code = main(["tune", "--space", str(space), "-n", "3", "-o", str(out), "-q", "--json",
                 "--measure", "stdout", "--", *COMMAND])
    assert code == 0
    summary = orjson.loads(capsys.readouterr().out)
    assert summary["trials"] == 3 and summary["command"] == COMMAND
    assert main(["tune", "--space", str(tmp_path / "none.yaml"), "--", "true"]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_recorded_trials_are_measured_from_their_runs(tmp_path: Path) -> None:
    space = tmp_path / "space.yaml"
    space.write_text("params: [{name: fast, type: bool, flag: --fast}]\n")
    out = tmp_path / "rec"
    result = tune([sys.executable, "-c", STEPPER, "12"], load_space(space),
                  TuneOptions(out=out, trials=3, seed=0, baseline_repeats=1))
    # Iteration 0 is the warm-up (no hook before it either); 1-2 are profiled and 3 carries
    # the trace's export.
    assert result.baseline.steps == tuple(range(4, 12))
    assert result.baseline.run == out / "runs" / "baseline.run"
    baseline = Run.open(result.baseline.run)
    assert baseline.manifest()["complete"] is True
    assert set(baseline.manifest()["collectors"]) == {"torch", "system"}
    steps = {(s["step"], s["source"]) for s in baseline.table("steps").to_pylist()}
    assert {(1, "marker"), (2, "marker"), (3, "export")} <= steps
    assert result.baseline.median_s >= 0.04  # each step sleeps 40 ms
    best = result.best
    assert best is not None and best["params"] == {"fast": True}
    assert best["run"] == str(out / "runs" / f"trial-{best['number']:04d}.run")
    assert Run.open(Path(best["run"])).manifest()["complete"] is True
    assert result.speedup is not None and result.speedup > 2  # 40 ms steps vs 5 ms
    assert (out / "runs" / f"trial-{best['number']:04d}.log").is_file()
    # The report of the best trial's Run, with the tune output, knows which trial it shows.
    section = report_data(Run.open(Path(best["run"])), tune=load_results(out))["tune"]
    assert section["this_run"] == best["number"] and section["measure"] == "record"
    assert [t["number"] for t in section["trials"] if t["this_run"]] == [best["number"]]


def test_a_recorded_trial_is_stopped_when_its_watcher_says_so(tmp_path: Path) -> None:
    seen: list[int] = []

    def watch(steps: Sequence[tuple[int, float]]) -> bool:
        seen.append(len(steps))
        return len(steps) < 3

    run = tmp_path / "t.run"
    with pytest.raises(Stopped):
        measure_recorded([sys.executable, "-c", STEPPER, "200"], dict(os.environ), run,
                         Plan(warmup=1, window=2), watch)
    assert seen[-1] >= 3  # stopped at the first look that saw three steady steps
    m = Run.open(run).manifest()
    assert m["signal"] == "SIGKILL" and {"source": "record", "count": 1,
                                         "what": "stopped by the caller: pruned by the tuner"} in (
        m["warnings"])


def test_a_speedup_within_the_baseline_noise_is_not_called_one() -> None:
    """Three baselines at 90, 100 and 110 steps/s: noise 110 / 90 - 1 = 22.2%; one more run of
    the command stays under 100 + t(0.95, 2) 10 sqrt(4/3) = 133.7 steps/s 95% of the time, so
    a best trial at 115 (1.15x the median baseline) or even 130 is inside the noise, 140 not."""
    from perfswarm.optimize.trial import Measurement
    from perfswarm.optimize.tune import TrialDict, TuneResult

    base = Measurement(steps=(1,), step_s=(0.01,), wall_s=1.0)  # 100 steps/s
    trial = TrialDict(number=0, state="COMPLETE", params={}, throughput=115.0,
                      median_step_s=1 / 115, steps=5, run=None)
    result = TuneResult(("cmd",), "s", "sqlite://", "stdout", base, (trial,), {},
                        (90.0, 100.0, 110.0))
    assert result.noise == round(110 / 90 - 1, 4) and result.speedup == 1.15
    assert not result.beyond_noise
    assert result.noise_bound == pytest.approx(100 + 2.919986 * 10 * math.sqrt(4 / 3), abs=1e-4)

    def with_best(rate: float) -> TuneResult:
        return TuneResult(("cmd",), "s", "sqlite://", "stdout", base,
                          ({**trial, "throughput": rate},), {}, (90.0, 100.0, 110.0))

    assert not with_best(130.0).beyond_noise and with_best(140.0).beyond_noise


def test_key_equals_value_flags() -> None:
    """nanoGPT's configurator takes `--batch_size=24`, one token: a flag ending in `=`."""
    from perfswarm.optimize.space import Param

    argv: list[str] = ["train.py"]
    Param("batch", "int", low=8, high=32, flag="--batch_size=").apply(24, {}, argv)
    Param("compile", "bool", flag="--compile=").apply(False, {}, argv)
    Param("workers", "int", low=0, high=4, flag="--workers").apply(2, {}, argv)
    assert argv == ["train.py", "--batch_size=24", "--compile=False", "--workers", "2"]


# A step of B samples takes 0.4 + 0.01 B ms: a bigger batch's step is slower, and it does more
BATCHED = """\
import sys
b = int([a.split("=")[1] for a in sys.argv if a.startswith("--batch-size=")][-1])  # the last
for i in range(8):
    print(f"step {i} {0.4 + 0.01 * b:.3f} ms")
"""


def test_a_tuned_batch_size_is_judged_in_samples(tmp_path: Path) -> None:
    """With the batch size among the knobs, throughput is samples/s: batch 128 (1.68 ms a
    step, 76,190 samples/s) beats 64 (1.04 ms, 61,538) and 32 (0.72 ms, 44,444), though its
    steps are the slowest; steps/s had crowned 32 and pruned 128. The baseline is of the
    command's own --batch-size=64."""
    space = tmp_path / "space.yaml"
    space.write_text("params:\n  - {name: batch, type: categorical, choices: [32, 64, 128], "
                     "flag: '--batch-size='}\n")
    result = tune([sys.executable, "-c", BATCHED, "--batch-size=64"], load_space(space),
                  TuneOptions(out=tmp_path / "out", trials=6, seed=3, measure="stdout"))
    assert result.unit == "samples/s" and result.baseline_rate == pytest.approx(64 / 1.04e-3)
    assert result.best is not None and result.best["params"] == {"batch": 128}
    assert result.speedup == pytest.approx((128 / 1.68) / (64 / 1.04), abs=1e-3)
    assert not [t for t in result.trials if t["params"] == {"batch": 128}
                and t["state"] == "PRUNED"]
    with pytest.raises(PerfswarmError, match="batch size"):
        tune([sys.executable, "-c", BATCHED], load_space(space),
             TuneOptions(out=tmp_path / "none", trials=1, measure="stdout"))


def test_values_measured_already_are_not_run_again(tmp_path: Path) -> None:
    """Seven trials over eight configurations (TPE: the space is larger than the trials): the
    sampler proposes some values twice; each such trial takes the first measurement of its
    values (`same_as`) and runs nothing."""
    space = tmp_path / "space.yaml"
    space.write_text("params:\n  - {name: batch, type: categorical, choices: [32, 64, 128, 256],"
                     " flag: '--batch-size='}\n  - {name: fast, type: bool, flag: --fast}\n")
    runs = tmp_path / "runs.txt"
    counting = f"open({str(runs)!r}, 'a').write('run\\n')\n" + BATCHED
    result = tune([sys.executable, "-c", counting, "--batch-size=64"], load_space(space),
                  TuneOptions(out=tmp_path / "out", trials=7, seed=0, measure="stdout"))
    measured = [t for t in result.trials if "same_as" not in t]
    again = [t for t in result.trials if "same_as" in t]
    assert again
    assert len({tuple(t["params"].items()) for t in measured}) == len(measured)
    by_number = {t["number"]: t for t in result.trials}
    for t in again:
        first = by_number[t["same_as"]]
        assert first["params"] == t["params"] and "same_as" not in first
        assert t["throughput"] == first["throughput"] and t["number"] > first["number"]
    assert len(runs.read_text().splitlines()) == len(result.baseline_throughputs) + len(measured)


def test_a_small_space_is_tried_whole(tmp_path: Path) -> None:
    """Eight configurations and eight trials: each is measured once (TPE, seeded, had measured
    some three times and never tried others), the best among them."""
    space = tmp_path / "space.yaml"
    space.write_text("params:\n  - {name: batch, type: categorical, choices: [32, 64, 128, 256],"
                     " flag: '--batch-size='}\n  - {name: fast, type: bool, flag: --fast}\n")
    result = tune([sys.executable, "-c", BATCHED, "--batch-size=64"], load_space(space),
                  TuneOptions(out=tmp_path / "out", trials=8, seed=0, measure="stdout"))
    tried = sorted((t["params"]["batch"], t["params"]["fast"]) for t in result.trials)
    assert tried == [(b, f) for b in (32, 64, 128, 256) for f in (False, True)]
    assert not any("same_as" in t for t in result.trials)
    assert result.best is not None and result.best["params"]["batch"] == 256
