"""The shape every rule returns: one piece of advice with its evidence, gain and change."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypedDict

from perfswarm.optimize.rules.facts import Facts

Severity = Literal["high", "medium", "low"]


class AdviceDict(TypedDict):
    rule: str
    title: str
    severity: Severity
    evidence: dict[str, Any]
    gain_ns: int | None
    gain_pct: float | None
    gain_of_ns: int
    gain_of: str
    gain_basis: str
    change: str


@dataclass(frozen=True)
class Advice:
    """What a rule found: numbers from the run, what fixing it should save, and how to fix it."""

    rule: str
    title: str
    severity: Severity
    evidence: Mapping[str, Any]
    gain_ns: int | None  # None where the benefit is not time (e.g. headroom against OOM)
    gain_pct: float | None  # gain_ns as a share of gain_of_ns
    gain_of_ns: int  # the measured time (profiled steps), or every timed step for evidence
    # from outside the profiling window
    gain_of: str  # what gain_of_ns is, in words ("the profiled steps", "every step the run
    # timed"): a share said without it had read as one of the measured time
    gain_basis: str  # how gain_ns was estimated, in one sentence
    change: str

    def to_dict(self) -> AdviceDict:
        return AdviceDict(rule=self.rule, title=self.title, severity=self.severity,
                          evidence=dict(self.evidence), gain_ns=self.gain_ns,
                          gain_pct=self.gain_pct, gain_of_ns=self.gain_of_ns,
                          gain_of=self.gain_of, gain_basis=self.gain_basis, change=self.change)


Rule = Callable[[Facts], "Advice | None"]


def advice(facts: Facts, rule: str, title: str, evidence: Mapping[str, Any],
           gain_ns: float | None, gain_basis: str, change: str,
           of: tuple[float, str] | None = None) -> Advice:
    """An Advice whose share and severity follow from `gain_ns` against the run's measured time
    (Facts.wall_ns, which Facts.measured_as names), or against `of` (its ns, and what it is in
    words) for evidence from outside them (every step the run timed)."""
    whole, what = (facts.wall_ns, facts.measured_as) if of is None else of
    gain = None if gain_ns is None else max(0, round(gain_ns))
    pct = None if gain is None or not whole else round(100 * gain / whole, 2)
    severity: Severity = ("medium" if pct is None else
                          "high" if pct >= 10 else "medium" if pct >= 2 else "low")
    return Advice(rule, title, severity, evidence, gain, pct, round(whole),
                  what, gain_basis, change)


def pct(part: float, whole: float) -> float:
    return round(100 * part / whole, 2) if whole else 0.0
