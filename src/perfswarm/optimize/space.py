"""The tuner's search space: parameters read from a YAML file, and where each value goes (an
environment variable or a command-line flag of the tuned command)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

import optuna

from perfswarm.errors import PerfswarmError
from perfswarm.userfiles import read_yaml

ParamKind = Literal["int", "float", "categorical", "bool"]
Value = int | float | str | bool
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

    def values(self) -> int | None:
        """How many values it can take; None for a float range without a step."""
        if self.kind == "bool":
            return 2
        if self.kind == "categorical":
            return len(self.choices)
        if self.low is None or self.high is None or (self.kind == "float" and not self.step):
            return None
        return int((self.high - self.low) // (self.step or 1)) + 1

    def apply(self, value: Value, env: dict[str, str], argv: list[str]) -> None:
        """Put `value` into the child's environment or onto its command line (appended, so it
        overrides an earlier occurrence of the flag for argparse-style parsers)."""
        text = ("1" if value else "0") if isinstance(value, bool) else str(value)
        if self.env:
            env[self.env] = text
        if self.flag and self.flag.endswith("="):  # one token, `--key=value` (nanoGPT)
            argv.append(self.flag + (str(value) if isinstance(value, bool) else text))
        elif self.flag:
            if self.kind != "bool":
                argv += [self.flag, text]
            elif value:
                argv.append(self.flag)


_ENV_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


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
    if env is not None and not (isinstance(env, str) and _ENV_NAME.fullmatch(env)):
        raise bad(f"`env` must be a variable name (letters, digits, _), got {env!r}")
    low, high, choices = raw.get("low"), raw.get("high"), raw.get("choices", ())
    if kind in ("int", "float"):
        if not isinstance(low, int | float) or not isinstance(high, int | float) \
                or not math.isfinite(low) or not math.isfinite(high) or low > high:
            raise bad("int and float parameters need finite numbers `low` <= `high`")
        if kind == "int" and not (float(low).is_integer() and float(high).is_integer()):
            raise bad("int parameters need whole `low` and `high`")
        if raw.get("log") and low <= 0:
            raise bad("a `log` scale needs `low` above 0")
    step = raw.get("step")
    if step is not None and not (isinstance(step, int | float) and 0 < step < math.inf):
        raise bad("`step` must be a number above 0")
    if step is not None and kind == "int" and not float(step).is_integer():
        raise bad("int parameters need a whole `step`")
    if step is not None and raw.get("log"):
        raise bad("a `log` scale takes no `step` (optuna samples it continuously)")
    if kind == "categorical" and (not isinstance(choices, list) or not choices
                                  or not all(isinstance(c, int | float | str) for c in choices)):
        raise bad("categorical parameters need a non-empty `choices` list of scalars")
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


def space_size(params: Sequence[Param]) -> int | None:
    """How many configurations the space holds; None when a float range has no step."""
    size = 1
    for p in params:
        values = p.values()
        if values is None:
            return None
        size *= values
    return size


def configure(params: Sequence[Param], values: Mapping[str, Value], argv: Sequence[str],
              base_env: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of one trial."""
    cmd, env = list(argv), dict(base_env)
    for p in params:
        p.apply(values[p.name], env, cmd)
    return cmd, env
