"""`tune`: an Optuna search over environment variables and command flags for throughput.

Each trial runs the user's command with one configuration and reads the per-step
times it prints (`step N TIME ms`, as the bundled workloads do; the pattern is an
option). Throughput is steps per second from the median step after the warm-up
steps. Every measured step is reported to the pruner, so a configuration already
slower than the median of earlier trials at the same step is stopped there instead
of run to the end.
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import signal
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypedDict

import optuna
import orjson

from perfswarm.errors import PerfswarmError
from perfswarm.trace.store import atomic_write_bytes
from perfswarm.yamlfile import read_yaml

ParamKind = Literal["int", "float", "categorical", "bool"]
Value = int | float | str | bool
Progress = Callable[[str], None]

# `step 3 12.5 ms`, `step 3: 0.0125 s`, `step=3 time=12.5ms`: a step number, then a time and unit.
STEP_PATTERN = r"(?i)\bstep\D*?(\d+)\D*?(\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)\s*(ns|us|µs|ms|s)\b"
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0}
_KINDS = ("int", "float", "categorical", "bool")


@dataclass(frozen=True)
class Param:
    """One dimension of the search and where its value goes: an env variable or a flag."""

    name: str
    kind: ParamKind
    low: float | None = None
    high: float | None = None
    step: float | None = None
    log: bool = False
    choices: tuple[Value, ...] = ()
    env: str | None = None
    flag: str | None = None

    def suggest(self, trial: optuna.Trial) -> Value:
        if self.kind == "int":
            assert self.low is not None and self.high is not None
            return int(trial.suggest_int(self.name, int(self.low), int(self.high),
                                         step=int(self.step or 1), log=self.log))
        if self.kind == "float":
            assert self.low is not None and self.high is not None
            return float(trial.suggest_float(self.name, self.low, self.high, step=self.step,
                                             log=self.log))
        choices = (False, True) if self.kind == "bool" else self.choices
        value = trial.suggest_categorical(self.name, choices)
        assert value is not None  # choices come from YAML scalars; null is rejected on load
        return value

    def apply(self, value: Value, env: dict[str, str], argv: list[str]) -> None:
        """Put `value` into the child's environment or onto its command line (appended, so it
        overrides an earlier occurrence of the flag for argparse-style parsers)."""
        text = ("1" if value else "0") if isinstance(value, bool) else str(value)
        if self.env:
            env[self.env] = text
        if self.flag:
            if self.kind != "bool":
                argv += [self.flag, text]
            elif value:
                argv.append(self.flag)


def _param(path: Path, i: int, raw: object) -> Param:
    def bad(why: str) -> PerfswarmError:
        return PerfswarmError(f"{path}: params[{i}]: {why}")

    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
        raise bad("each parameter needs a string `name`")
    kind = raw.get("type")
    if kind not in _KINDS:
        raise bad(f"`type` must be one of {', '.join(_KINDS)}")
    env, flag = raw.get("env"), raw.get("flag")
    if env is None and flag is None:
        raise bad("needs `env` (a variable name) or `flag` (e.g. --num-workers)")
    low, high, choices = raw.get("low"), raw.get("high"), raw.get("choices", ())
    if kind in ("int", "float"):
        if not isinstance(low, int | float) or not isinstance(high, int | float) or low > high:
            raise bad("int and float parameters need numbers `low` <= `high`")
        if kind == "int" and not (float(low).is_integer() and float(high).is_integer()):
            raise bad("int parameters need whole `low` and `high`")
    if kind == "categorical" and (not isinstance(choices, list) or not choices
                                  or not all(isinstance(c, int | float | str) for c in choices)):
        raise bad("categorical parameters need a non-empty `choices` list of scalars")
    step = raw.get("step")
    return Param(name=raw["name"], kind=kind, low=low, high=high,
                 step=float(step) if isinstance(step, int | float) else None,
                 log=bool(raw.get("log", False)), choices=tuple(choices),
                 env=str(env) if env is not None else None,
                 flag=str(flag) if flag is not None else None)


def load_space(path: Path) -> tuple[Param, ...]:
    """The search space of a YAML file: `params: [{name, type, low/high/choices, env|flag}]`."""
    doc = read_yaml(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("params"), list) or not doc["params"]:
        raise PerfswarmError(f"{path}: expected a mapping with a non-empty `params` list")
    params = tuple(_param(path, i, p) for i, p in enumerate(doc["params"]))
    names = [p.name for p in params]
    if len(set(names)) != len(names):
        raise PerfswarmError(f"{path}: parameter names must be unique")
    return params


def step_time_s(line: str, pattern: re.Pattern[str]) -> float | None:
    """The step time a line reports, in seconds (group 2 the number, group 3 the unit)."""
    m = pattern.search(line)
    if m is None:
        return None
    unit = m.group(3) if m.re.groups >= 3 and m.group(3) else "s"
    return float(m.group(2)) * _UNIT_S[unit]


@dataclass(frozen=True)
class Measurement:
    step_s: tuple[float, ...]  # every step the command reported, warm-up included
    warmup: int
    wall_s: float

    @property
    def measured(self) -> tuple[float, ...]:
        return self.step_s[self.warmup:]

    @property
    def throughput(self) -> float:
        """Steps per second from the median step after warm-up: one step slowed by another
        process on a shared machine should not decide between two configurations."""
        if not self.measured:
            return 0.0
        median = statistics.median(self.measured)
        return 1 / median if median > 0 else 0.0


class Stopped(Exception):
    """The step callback asked to stop the command (the trial is pruned)."""


class CommandFailed(PerfswarmError):
    """The command exited non-zero, timed out, or printed too few step times."""


def run_command(argv: Sequence[str], env: Mapping[str, str], pattern: re.Pattern[str],
                warmup: int, on_step: Callable[[int, Measurement], bool] | None = None,
                timeout_s: float | None = None) -> Measurement:
    """Run `argv`, reading step times from its output as they appear.

    `on_step(i, so_far)` runs after each reported step; returning False kills the
    command (its whole process group: DataLoader workers too) and raises Stopped.
    """
    start = time.perf_counter()
    try:
        proc = subprocess.Popen(list(argv), env=dict(env), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, errors="replace",
                                start_new_session=True)
    except OSError as exc:
        raise CommandFailed(f"{argv[0]}: cannot run ({exc.strerror or exc})") from None
    timer = threading.Timer(timeout_s, _kill, (proc,)) if timeout_s else None
    if timer:
        timer.start()
    times: list[float] = []
    tail: collections.deque[str] = collections.deque(maxlen=5)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail.append(line.rstrip())
            t = step_time_s(line, pattern)
            if t is None:
                continue
            times.append(t)
            so_far = Measurement(tuple(times), warmup, time.perf_counter() - start)
            if on_step is not None and not on_step(len(times) - 1, so_far):
                _kill(proc)
                raise Stopped
        code = proc.wait()
    finally:
        if timer:
            timer.cancel()
        if proc.poll() is None:
            _kill(proc)
        proc.wait()
    if code != 0:
        last = " | ".join(tail) or "no output"
        raise CommandFailed(f"{' '.join(argv)}: exited with {code} ({last})")
    if len(times) <= warmup:
        raise CommandFailed(f"{' '.join(argv)}: printed {len(times)} step time(s), "
                            f"need more than the {warmup} warm-up step(s)")
    return Measurement(tuple(times), warmup, time.perf_counter() - start)


def _kill(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


@dataclass(frozen=True)
class TuneOptions:
    out: Path
    trials: int = 20
    storage: str | None = None  # default: SQLite file in `out`
    study: str = "perfswarm-tune"
    step_pattern: str = STEP_PATTERN
    warmup: int = 1
    seed: int = 0
    timeout_s: float | None = None  # per trial


class TrialDict(TypedDict):
    number: int
    state: str
    params: dict[str, Value]
    throughput: float | None
    median_step_s: float | None
    steps: int


class TuneDict(TypedDict):
    command: list[str]
    study: str
    storage: str
    baseline: dict[str, float]
    best: TrialDict | None
    speedup: float | None
    trials: int
    pruned: int
    failed: int
    importance: dict[str, float]


@dataclass(frozen=True)
class TuneResult:
    command: tuple[str, ...]
    study: str
    storage: str
    baseline: Measurement
    trials: tuple[TrialDict, ...]
    importance: Mapping[str, float] = field(default_factory=dict)

    @property
    def best(self) -> TrialDict | None:
        done = [t for t in self.trials if t["state"] == "COMPLETE" and t["throughput"]]
        return max(done, key=lambda t: (t["throughput"] or 0.0, -t["number"]), default=None)

    @property
    def speedup(self) -> float | None:
        best = self.best
        if best is None or not self.baseline.throughput:
            return None
        return round((best["throughput"] or 0.0) / self.baseline.throughput, 4)

    def to_dict(self) -> TuneDict:
        states = collections.Counter(t["state"] for t in self.trials)
        median = statistics.median(self.baseline.measured)
        return TuneDict(command=list(self.command), study=self.study, storage=self.storage,
                        baseline={"throughput": round(self.baseline.throughput, 6),
                                  "median_step_s": round(median, 9),
                                  "steps": len(self.baseline.step_s)},
                        best=self.best, speedup=self.speedup, trials=len(self.trials),
                        pruned=states["PRUNED"], failed=states["FAIL"],
                        importance=dict(self.importance))


def configure(params: Sequence[Param], values: Mapping[str, Value], argv: Sequence[str],
              base_env: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of one trial."""
    cmd, env = list(argv), dict(base_env)
    for p in params:
        p.apply(values[p.name], env, cmd)
    return cmd, env


def _trial_row(t: optuna.trial.FrozenTrial) -> TrialDict:
    step_s = t.user_attrs.get("step_s", [])
    warmup = int(t.user_attrs.get("warmup", 0))
    measured = step_s[warmup:]
    complete = t.state == optuna.trial.TrialState.COMPLETE
    return TrialDict(number=t.number, state=t.state.name, params=dict(sorted(t.params.items())),
                     throughput=round(float(t.value), 6) if complete and t.value else None,
                     median_step_s=round(statistics.median(measured), 9) if measured else None,
                     steps=len(step_s))


def _importance(study: optuna.Study, seed: int) -> dict[str, float]:
    done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    if len(done) < 2 or len({tuple(sorted(t.params.items())) for t in done}) < 2:
        return {}
    try:
        found = optuna.importance.get_param_importances(
            study, evaluator=optuna.importance.FanovaImportanceEvaluator(seed=seed))
    except (RuntimeError, ValueError):  # e.g. one parameter never varied
        return {}
    return {k: round(float(v), 6) for k, v in sorted(found.items())}


def _dump(path: Path, data: Any) -> None:
    atomic_write_bytes(path, orjson.dumps(data, option=orjson.OPT_INDENT_2
                                          | orjson.OPT_SORT_KEYS) + b"\n")


def tune(argv: Sequence[str], params: Sequence[Param], options: TuneOptions,
         progress: Progress | None = None) -> TuneResult:
    """Measure the command as given, search `options.trials` configurations, write the results.

    Writes `tune.json` (summary), `trials.json` (every trial of the study, including
    ones other workers added to a shared storage) and `importance.json` into `out`.
    """
    if not argv:
        raise PerfswarmError("tune: no command given (put it after --)")
    if options.trials < 1:
        raise PerfswarmError("--trials must be at least 1")
    try:
        pattern = re.compile(options.step_pattern)
    except re.error as exc:
        raise PerfswarmError(f"--step-pattern: invalid regex ({exc})") from None
    if pattern.groups < 2:
        raise PerfswarmError("--step-pattern: needs groups (step)(time)[(unit)]")
    options.out.mkdir(parents=True, exist_ok=True)
    storage = options.storage or f"sqlite:///{(options.out / 'tune.db').resolve()}"
    base_env = dict(os.environ)
    say = progress or (lambda _msg: None)

    say("baseline: the command as given")
    baseline = run_command(argv, base_env, pattern, options.warmup, timeout_s=options.timeout_s)
    say(f"baseline: {baseline.throughput:.3f} steps/s")

    optuna.logging.set_verbosity(optuna.logging.ERROR)  # failures: `say`
    try:
        study = optuna.create_study(
            study_name=options.study, storage=storage, direction="maximize", load_if_exists=True,
            sampler=optuna.samplers.TPESampler(seed=options.seed),
            pruner=optuna.pruners.MedianPruner(n_startup_trials=3,
                                               n_warmup_steps=options.warmup + 1))
    except (ImportError, ValueError) as exc:  # unknown dialect, bad URL
        raise PerfswarmError(f"--storage {storage}: {exc}") from None

    def objective(trial: optuna.Trial) -> float:
        values = {p.name: p.suggest(trial) for p in params}
        cmd, env = configure(params, values, argv, base_env)
        trial.set_user_attr("warmup", options.warmup)

        def on_step(i: int, so_far: Measurement) -> bool:
            trial.set_user_attr("step_s", list(so_far.step_s))
            if i < options.warmup:
                return True
            trial.report(so_far.throughput, i)
            return not trial.should_prune()

        try:
            m = run_command(cmd, env, pattern, options.warmup, on_step, options.timeout_s)
        except Stopped:
            say(f"trial {trial.number}: pruned {values}")
            raise optuna.TrialPruned from None
        except CommandFailed as exc:
            trial.set_user_attr("error", str(exc))
            say(f"trial {trial.number}: failed {values}: {exc}")
            raise
        trial.set_user_attr("step_s", list(m.step_s))
        say(f"trial {trial.number}: {m.throughput:.3f} steps/s {values}")
        return m.throughput

    study.optimize(objective, n_trials=options.trials, catch=(CommandFailed,))
    rows = tuple(_trial_row(t) for t in study.get_trials(deepcopy=False))
    result = TuneResult(tuple(argv), options.study, storage, baseline, rows,
                        _importance(study, options.seed))
    _dump(options.out / "trials.json", list(rows))
    _dump(options.out / "importance.json", dict(result.importance))
    _dump(options.out / "tune.json", result.to_dict())
    return result
