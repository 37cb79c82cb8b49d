"""`tune`: an Optuna search over environment variables and command flags for throughput.

The command runs as given (the baseline, `baseline_repeats` times, and once more after the
trials: their spread is the noise a trial must clear to count as a speedup), and once per trial
with one configuration of the space. Each run is measured by optimize.trial: by default a
light recorded run whose throughput comes from its Run's optimizer-step times (steady state:
past the warm-up and the profiling window); or, for commands the recorder cannot time, from
the step times the command prints. Each steady step is reported to the study as it arrives,
and the pruner (optimize.prune) stops a trial as soon as even its optimistic throughput
cannot beat the best so far (the best trial, or the baseline).
"""

from __future__ import annotations

import collections
import math
import re
import statistics
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NotRequired, TypedDict

import msgspec
import optuna

from perfswarm.defaults import STEP_PATTERN, Measure
from perfswarm.errors import ParameterError, PerfswarmError
from perfswarm.model.predict import batch_flag, is_batch_flag
from perfswarm.optimize.prune import BoundPruner
from perfswarm.optimize.space import Param, Value, configure, space_size
from perfswarm.optimize.trial import (
    CommandFailed,
    Measurement,
    Plan,
    Stopped,
    Watch,
    measure_printed,
    measure_recorded,
)
from perfswarm.recorder.session import program_environ
from perfswarm.userfiles import read_json, write_json

Progress = Callable[[str], None]


@dataclass(frozen=True)
class TuneOptions:
    out: Path
    trials: int = 20
    storage: str | None = None  # default: SQLite file in `out`
    study: str = "perfswarm-tune"
    measure: Measure = "record"
    step_pattern: str = STEP_PATTERN  # measure = stdout
    warmup: int = 1
    window: int = 2  # measure = record: profiled steps per trial
    seed: int = 0
    timeout_s: float | None = None  # per trial
    baseline_repeats: int = 3  # the noise estimate: the spread of the repeated baseline

    @property
    def plan(self) -> Plan:
        return Plan(self.warmup, self.window, self.timeout_s)


class TrialDict(TypedDict):
    number: int
    state: str
    params: dict[str, Value]
    throughput: float | None
    median_step_s: float | None
    steps: int  # steady-state steps measured (so far, for a pruned trial)
    run: str | None  # the trial's Run (measure = record)
    per_step: NotRequired[float]  # samples a step (its batch) where throughput is samples/s
    same_as: NotRequired[int]  # the earlier trial of the same values, whose measurement it is


class BaselineDict(TypedDict):
    throughput: float
    median_step_s: float
    steps: int
    run: str | None


class TuneDict(TypedDict):
    command: list[str]
    # what throughput counts: samples/s where the space tunes the batch size (a step of a
    # bigger batch is slower and does more), else steps/s
    unit: NotRequired[str]
    study: str
    storage: str
    measure: Measure
    baseline: BaselineDict
    baseline_throughputs: list[float]  # each repeat of the baseline
    noise: float  # their spread: max / min - 1
    noise_bound: float  # the throughput a trial must exceed: their 95% prediction bound
    best: TrialDict | None
    speedup: float | None
    beyond_noise: bool  # the best trial's throughput exceeds noise_bound
    trials: int
    pruned: int
    failed: int
    importance: dict[str, float]


@dataclass(frozen=True)
class TuneResult:
    command: tuple[str, ...]
    study: str
    storage: str
    measure: Measure
    baseline: Measurement  # the repeat of median throughput
    trials: tuple[TrialDict, ...]
    importance: Mapping[str, float] = field(default_factory=dict)
    baseline_throughputs: tuple[float, ...] = ()  # in `unit`
    unit: str = "steps/s"
    per_step: float = 1.0  # the baseline's samples per step (samples/s), else 1

    @property
    def baseline_rate(self) -> float:
        """The baseline's throughput in `unit`."""
        return self.baseline.throughput * self.per_step

    @property
    def noise(self) -> float:
        """How much the command as given moved between its repeats: max / min - 1."""
        rates = [r for r in self.baseline_throughputs if r > 0]
        return round(max(rates) / min(rates) - 1, 4) if len(rates) > 1 else 0.0

    @property
    def noise_bound(self) -> float:
        """The throughput (in `unit`) a trial must exceed for its speedup to clear the noise:
        the one-sided 95% prediction bound of one more run of the command, from its repeats,
        mean + t(0.95, n - 1) sd sqrt(1 + 1/n) (one more run exceeds the fastest of three a
        quarter of the time: the command as given had been called a 1.034x speedup of
        itself); the baseline's own throughput with fewer than two repeats."""
        from scipy import stats  # 0.4 s to import: only where a bound is computed

        rates = [r for r in self.baseline_throughputs if r > 0]
        if len(rates) < 2:
            return self.baseline_rate
        n = len(rates)
        spread = statistics.stdev(rates) * math.sqrt(1 + 1 / n)
        return round(statistics.fmean(rates) + float(stats.t.ppf(0.95, n - 1)) * spread, 6)

    @property
    def beyond_noise(self) -> bool:
        best = self.best
        return best is not None and (best["throughput"] or 0.0) > self.noise_bound

    @property
    def best(self) -> TrialDict | None:
        done = [t for t in self.trials if t["state"] == "COMPLETE" and t["throughput"]]
        return max(done, key=lambda t: (t["throughput"] or 0.0, -t["number"]), default=None)

    @property
    def speedup(self) -> float | None:
        best = self.best
        if best is None or not self.baseline_rate:
            return None
        return round((best["throughput"] or 0.0) / self.baseline_rate, 4)

    def to_dict(self) -> TuneDict:
        states = collections.Counter(t["state"] for t in self.trials)
        b = self.baseline
        return TuneDict(command=list(self.command), unit=self.unit, study=self.study,
                        storage=self.storage, measure=self.measure,
                        baseline=BaselineDict(throughput=round(self.baseline_rate, 6),
                                              median_step_s=round(b.median_s, 9),
                                              steps=len(b.step_s),
                                              run=str(b.run) if b.run else None),
                        baseline_throughputs=[round(r, 6) for r in self.baseline_throughputs],
                        noise=self.noise, noise_bound=self.noise_bound, best=self.best,
                        speedup=self.speedup,
                        beyond_noise=self.beyond_noise, trials=len(self.trials),
                        pruned=states["PRUNED"], failed=states["FAIL"],
                        importance=dict(self.importance))


def closing_repeats(repeats: int) -> int:
    """Runs of the command as given in a study: `repeats` before the trials and, where the
    noise is estimated (two or more), one more after them. The command as given, run as a
    trial after three repeats that agreed, had read as a 1.006x and a 1.029x speedup of
    itself in 2 of 6 studies: what changes on the machine over a study is noise too."""
    return repeats + 1 if repeats >= 2 else repeats


def _sampler(params: Sequence[Param], options: TuneOptions) -> optuna.samplers.BaseSampler:
    """Every configuration once, in a seeded order, where the space holds no more than the
    trials (TPE on a small space proposes some values again and never others); else TPE."""
    size = space_size(params)
    if size is not None and size <= options.trials:
        with warnings.catch_warnings():  # experimental since optuna 3.1, the same since
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.BruteForceSampler(seed=options.seed)
    return optuna.samplers.TPESampler(seed=options.seed)


def _measured_already(study: optuna.Study, trial: optuna.Trial
                      ) -> optuna.trial.FrozenTrial | None:
    """The first trial of the study that measured `trial`'s values to its end or was pruned
    (its own measurement, not a copy of another's), None if there is none."""
    done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,
                                                    optuna.trial.TrialState.PRUNED))
    return next((t for t in done if t.params == trial.params and t.number != trial.number
                 and "same_as" not in t.user_attrs), None)


def _trial_row(t: optuna.trial.FrozenTrial) -> TrialDict:
    step_s = t.user_attrs.get("step_s", [])
    complete = t.state == optuna.trial.TrialState.COMPLETE
    row = TrialDict(number=t.number, state=t.state.name, params=dict(sorted(t.params.items())),
                    throughput=round(float(t.value), 6) if complete and t.value else None,
                    median_step_s=round(statistics.median(step_s), 9) if step_s else None,
                    steps=len(step_s), run=t.user_attrs.get("run"),
                    per_step=float(t.user_attrs.get("per_step", 1.0)))
    if "same_as" in t.user_attrs:
        row["same_as"] = int(t.user_attrs["same_as"])
    return row


def _importance(study: optuna.Study, seed: int) -> dict[str, float]:
    """fANOVA importance over the trials measured to their end (a trial with another's
    measurement, `same_as`, would count it twice)."""
    done = [t for t in study.get_trials(deepcopy=False,
                                        states=(optuna.trial.TrialState.COMPLETE,))
            if "same_as" not in t.user_attrs]
    if len(done) < 2 or len({tuple(sorted(t.params.items())) for t in done}) < 2:
        return {}
    measured = optuna.create_study(direction=study.direction)
    measured.add_trials(done)
    try:
        found = optuna.importance.get_param_importances(
            measured, evaluator=optuna.importance.FanovaImportanceEvaluator(seed=seed))
    except (RuntimeError, ValueError):  # e.g. one parameter never varied
        return {}
    # a parameter no measured trial varied has no importance to tell (fANOVA says 0)
    varied = {k for k in found if len({repr(t.params.get(k)) for t in done}) > 1}
    return {k: round(float(v), 6) for k, v in sorted(found.items()) if k in varied}


def run_path(out: Path, name: str) -> Path:
    """Where a recorded run (`baseline`, `trial-0007`) leaves its Run."""
    return out / "runs" / f"{name}.run"


def _measurer(options: TuneOptions) -> Callable[[Sequence[str], Mapping[str, str], str,
                                                  Watch | None], Measurement]:
    """How one run is measured: `(argv, env, name, watch)`."""
    if options.measure == "record":
        return lambda argv, env, name, watch: measure_recorded(
            argv, env, run_path(options.out, name), options.plan, watch)
    try:
        pattern = re.compile(options.step_pattern)
    except re.error as exc:
        raise ParameterError("step_pattern", "invalid regex", note=f"({exc})") from None
    if pattern.groups < 2:
        raise ParameterError("step_pattern", "needs groups (step)(time)[(unit)]")
    return lambda argv, env, _name, watch: measure_printed(argv, env, pattern, options.plan,
                                                            watch)


def tune(argv: Sequence[str], params: Sequence[Param], options: TuneOptions,
         progress: Progress | None = None) -> TuneResult:
    """Measure the command as given, search `options.trials` configurations, write the results.

    Writes `tune.json` (summary), `trials.json` (every trial of the study, including
    ones other workers added to a shared storage) and `importance.json` into `out`, and
    (measure = record) each run's Run and output under `out/runs/`.
    """
    if not argv:
        raise PerfswarmError("tune: no command given (put it after --)")
    if options.trials < 1:
        raise ParameterError(None, "{trials} must be at least 1")
    if options.warmup < 0 or options.window < 1:
        raise ParameterError(None, "{warmup} must be at least 0 and {window} at least 1")
    if options.baseline_repeats < 1:
        raise ParameterError(None, "{baseline_repeats} must be at least 1")
    # a tuned batch size: throughput in samples/s (a bigger batch's slower step does more)
    batch = next((p for p in params if p.flag and is_batch_flag(p.flag)), None)
    base_batch = 1
    if batch is not None:
        given = batch_flag(argv)
        if given is None:
            raise ParameterError(None, f"the space tunes the batch size ({batch.flag}): give "
                                 "the command its own value of it, the baseline's batch its "
                                 "samples/s are of")
        base_batch = given
    unit = "samples/s" if batch is not None else "steps/s"
    measure = _measurer(options)
    options.out.mkdir(parents=True, exist_ok=True)
    storage = options.storage or f"sqlite:///{(options.out / 'tune.db').resolve()}"
    base_env = program_environ()
    say = progress or (lambda _msg: None)

    repeats: list[Measurement] = []
    total = closing_repeats(options.baseline_repeats)

    def repeat() -> None:
        i = len(repeats)
        say(f"baseline: the command as given ({i + 1} of {total})")
        repeats.append(measure(argv, base_env, "baseline" if i == 0 else f"baseline-{i + 1}",
                               None))
        say(f"baseline: {repeats[-1].throughput * base_batch:.3f} {unit}")

    for _ in range(options.baseline_repeats):
        repeat()

    optuna.logging.set_verbosity(optuna.logging.ERROR)  # failures: `say`
    try:
        study = optuna.create_study(
            study_name=options.study, storage=storage, direction="maximize", load_if_exists=True,
            sampler=_sampler(params, options),
            pruner=BoundPruner([[t / base_batch for t in r.step_s] for r in repeats]))
    except (ImportError, ValueError) as exc:  # unknown dialect, bad URL
        raise ParameterError("storage", "", value=storage, detail=str(exc)) from None

    def objective(trial: optuna.Trial) -> float:
        values = {p.name: p.suggest(trial) for p in params}
        per_step = float(values[batch.name]) if batch is not None else 1.0
        trial.set_user_attr("per_step", per_step)
        if (earlier := _measured_already(study, trial)) is not None:
            # the sampler proposed values measured already: their measurement, no run (pruned
            # again: the bound it fell under has only risen since)
            trial.set_user_attr("step_s", earlier.user_attrs.get("step_s", []))
            trial.set_user_attr("same_as", earlier.number)
            say(f"trial {trial.number}: {values} as trial {earlier.number}, not run again")
            if earlier.state == optuna.trial.TrialState.PRUNED:
                raise optuna.TrialPruned
            return float(earlier.value or 0.0)
        cmd, env = configure(params, values, argv, base_env)
        reported = 0

        def watch(steps: Sequence[tuple[int, float]]) -> bool:
            nonlocal reported
            for step, seconds in steps[reported:]:
                trial.report(seconds / per_step, step)  # the pruner's unit: per sample
            reported = len(steps)
            if trial.should_prune():
                trial.set_user_attr("step_s", [s for _, s in steps])
                return False
            return True

        name = f"trial-{trial.number:04d}"
        if options.measure == "record":
            trial.set_user_attr("run", str(run_path(options.out, name)))
        try:
            m = measure(cmd, env, name, watch)
        except Stopped:
            say(f"trial {trial.number}: pruned {values}")
            raise optuna.TrialPruned from None
        except CommandFailed as exc:
            trial.set_user_attr("error", str(exc))
            say(f"trial {trial.number}: failed {values}: {exc}")
            raise
        trial.set_user_attr("step_s", list(m.step_s))
        say(f"trial {trial.number}: {m.throughput * per_step:.3f} {unit} {values}")
        return m.throughput * per_step

    study.optimize(objective, n_trials=options.trials, catch=(CommandFailed,))
    while len(repeats) < total:  # the machine's drift over the study is noise too
        repeat()
    baseline = sorted(repeats, key=lambda m: m.throughput)[(len(repeats) - 1) // 2]
    rows = tuple(_trial_row(t) for t in study.get_trials(deepcopy=False))
    result = TuneResult(tuple(argv), options.study, storage, options.measure, baseline, rows,
                        _importance(study, options.seed),
                        tuple(m.throughput * base_batch for m in repeats), unit,
                        float(base_batch))
    write_json(options.out / "trials.json", list(rows))
    write_json(options.out / "importance.json", dict(result.importance))
    write_json(options.out / "tune.json", result.to_dict())
    return result


class TuneFiles(TypedDict):
    """A tune output directory as the report shows it."""

    dir: str
    summary: TuneDict
    trials: list[TrialDict]


def _read(path: Path, kind: Any) -> Any:
    """The JSON file at `path` as `kind` (every key and type checked: the report reads them)."""
    try:
        return msgspec.convert(read_json(path), kind)
    except msgspec.ValidationError as exc:
        raise PerfswarmError(f"{path}: not written by perfswarm tune ({exc})") from None


def load_results(out: Path) -> TuneFiles:
    """What `tune` wrote into `out`: its summary (tune.json) and every trial (trials.json)."""
    if not out.is_dir():
        raise ParameterError(None, "not a directory (give the {out} of perfswarm tune)",
                             subject=out)
    return TuneFiles(dir=str(out),
                     summary=_read(out / "tune.json", TuneDict),
                     trials=_read(out / "trials.json", list[TrialDict]))
