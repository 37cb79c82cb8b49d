"""What `perfswarm fuse` works on and what it reports: the candidate pairs (from layer specs or a
Run) with the roofline's prediction on this CPU, then each one fused, tuned and measured."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfswarm.errors import ParameterError
from perfswarm.model.fusion import ConvPair, PairPrediction
from perfswarm.model.opstats import op_sequence
from perfswarm.model.specs import DeviceSpec
from perfswarm.optimize.fuse.layers import parse_pair, run_pairs
from perfswarm.optimize.fuse.tune import (
    FuseResult,
    Progress,
    ScheduleCache,
    confirm_pair,
    fuse_pair,
)
from perfswarm.trace.store import Run


@dataclass(frozen=True)
class Candidate:
    index: int
    pair: ConvPair
    prediction: PairPrediction

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "pair": self.pair.label, "kind": self.pair.kind,
                "prediction": self.prediction.to_dict()}


@dataclass(frozen=True)
class Options:
    trials: int = 24         # schedules tried per kernel
    budget_s: float = 120.0  # tuning time for all pairs together
    rounds: int = 15         # side-by-side rounds
    threads: int = 1

    def __post_init__(self) -> None:
        for name, value in (("trials", self.trials), ("budget_s", self.budget_s),
                            ("rounds", self.rounds), ("threads", self.threads)):
            if not value > 0:
                raise ParameterError(name, "must be positive", value=f"{value:g}")


def find_pairs(layers: Sequence[str] = (), run: Run | None = None, batch: int | None = None
               ) -> list[ConvPair]:
    """The pairs of the layer specs, else of the Run's first rank."""
    if layers:
        return [parse_pair(text, batch) for text in layers]
    if run is not None:
        ranks = run.manifest()["ranks"] or [0]
        return run_pairs(op_sequence(run, ranks[0]))
    raise ParameterError(None, "give a RUN or at least one {layers}", subject="fuse")


def candidates(pairs: Sequence[ConvPair], spec: DeviceSpec) -> list[Candidate]:
    """Each pair with the roofline's prediction on the device."""
    return [Candidate(i, p, p.predict(spec)) for i, p in enumerate(pairs)]


def pick(found: list[Candidate], wanted: str | None) -> list[Candidate]:
    """The candidates whose indexes `--pairs` names (comma-separated), or all of them."""
    if not wanted:
        return found
    try:
        indexes = [int(t) for t in wanted.split(",") if t.strip()]
    except ValueError:
        raise ParameterError("pairs", "expected comma-separated indexes", value=wanted) from None
    missing = [i for i in indexes if not 0 <= i < len(found)]
    if missing or not indexes:
        raise ParameterError("pairs", f"no candidate {missing or wanted}; there are "
                             f"{len(found)} (0-{len(found) - 1})", value=wanted)
    return [found[i] for i in indexes]


def default_cache() -> Path:
    """Where tuned schedules are kept between runs: $XDG_CACHE_HOME/perfswarm (~/.cache)."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "perfswarm" / "fuse-schedules.json"


def fuse_all(found: Sequence[Candidate], options: Options, cache: ScheduleCache,
             progress: Progress) -> list[FuseResult]:
    """Each candidate fused, tuned and measured, the tuning budget shared out evenly among the
    pairs still to come; then each that gained measured once more, apart (`confirm_pair`)."""
    end = time.monotonic() + options.budget_s
    results = []
    for i, c in enumerate(found):
        share = (end - time.monotonic()) / (len(found) - i)
        results.append(fuse_pair(c.pair, c.prediction, options.threads, options.trials,
                                 time.monotonic() + share, options.rounds, cache, progress))
    return [confirm_pair(r, options.rounds, cache, progress) if r.gains else r
            for r in results]
