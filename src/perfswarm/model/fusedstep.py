"""What one step of a fused optimizer (torch.optim's Adam, AdamW and SGD with fused=True) costs
on the host's CPU, unprofiled: a cost a call (step()'s own work around the kernel: its wrapper,
its parameter groups), a cost a parameter tensor (its state gathered in Python, its step count,
the kernel's start on it) and a cost a byte of parameters (the kernel's one pass over them and
their state). Measured by `perfswarm calibrate` on the host (recorder/bench/optimizer.py: the
fused step timed over parameter lists of several counts and sizes, its state out of the cache
as a training step leaves it, and fitted) and kept in its CPU profile (`fused_optimizer_step`);
without one, the defaults below, as calibrate measured them on the 2-core VM the project is
built on (docs/benchmarks.md, thirty-third pass).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypedDict

from perfswarm.errors import PerfswarmError
from perfswarm.model.receive import CALIBRATED, DEFAULTS
from perfswarm.userfiles import read_json

KEY: Final = "fused_optimizer_step"  # the profile's field
OPTIMIZERS: Final = ("Adam", "AdamW", "SGD")  # the torch.optim classes with fused=True
CPU_SINCE: Final = (2, 4)  # the torch version whose fused Adam, AdamW and SGD run on the CPU too


def on_cpu(version: str) -> bool:
    """Whether torch `version` (e.g. "2.13.0+cpu") runs a fused step on the CPU."""
    return tuple(int(x) for x in re.findall(r"\d+", version)[:2]) >= CPU_SINCE


class StepCostDict(TypedDict):
    call_ns: float
    tensor_ns: float
    byte_ns: float


@dataclass(frozen=True)
class StepCost:
    """CPU ns of one fused step of one optimizer."""

    call_ns: float  # a call, whatever it updates
    tensor_ns: float  # each parameter tensor it updates
    byte_ns: float  # each byte of those parameters

    def of(self, tensors: float, parameter_bytes: float) -> float:
        """A step over `tensors` parameters of `parameter_bytes` bytes in all."""
        return self.call_ns + tensors * self.tensor_ns + parameter_bytes * self.byte_ns


@dataclass(frozen=True)
class FusedStepCosts:
    """A fused step's cost by optimizer (OPTIMIZERS), and where the figures come from."""

    steps: Mapping[str, StepCost]
    source: str  # as the advice says it


# calibrate's fit on the 2-core VM, each figure the median of three runs' (thirty-third pass,
# load 4.3-5.1: /tmp/p33/fusedgain/fusedcal-runs.txt)
DEFAULT = FusedStepCosts({"Adam": StepCost(173_627.0, 5_163.0, 0.1762),
                          "AdamW": StepCost(150_401.0, 5_520.0, 0.2057),
                          "SGD": StepCost(107_171.0, 1_876.0, 0.1348)}, DEFAULTS)


def _cost(path: Path, name: str, entry: Any) -> StepCost:
    try:
        cost = StepCost(float(entry["call_ns"]), float(entry["tensor_ns"]),
                        float(entry["byte_ns"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise PerfswarmError(f"{path}: {KEY}'s {name} is not a step cost ({exc})") from None
    if not (cost.call_ns >= 0 and cost.tensor_ns >= 0 and cost.byte_ns >= 0):  # nan too
        raise PerfswarmError(f"{path}: {KEY}'s {name} needs non-negative call_ns, tensor_ns "
                             "and byte_ns")
    return cost


def fused_of(path: Path) -> FusedStepCosts:
    """The fused step's costs a calibrate profile holds; one-line errors naming the file. A
    profile calibrated before they were measured gives the defaults, and the advice says so."""
    data = read_json(path)
    entry: Any = data.get(KEY) if isinstance(data, dict) else None
    if entry is None:
        return FusedStepCosts(DEFAULT.steps, f"{DEFAULT.source} ({path.name} has none: "
                                             "calibrate again to measure them on this host)")
    if not isinstance(entry, dict) or any(name not in entry for name in OPTIMIZERS):
        raise PerfswarmError(f"{path}: {KEY} needs a step cost for each of "
                             f"{', '.join(OPTIMIZERS)}")
    return FusedStepCosts({name: _cost(path, name, entry[name]) for name in OPTIMIZERS},
                          f"{CALIBRATED} ({path.name})")
