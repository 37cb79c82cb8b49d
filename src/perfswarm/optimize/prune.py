"""Pruning tune trials that cannot win: a bound on a trial's final throughput from its first steps.

A trial's objective is its throughput, one over the median steady-state step time. After n
steady steps, the distribution-free lower confidence bound of that median is the j-th fastest
step so far, j the largest with P(Binomial(n, 1/2) < j) <= alpha: if the true median were
any lower, at least j of n independent steps would fall below it with probability over
1 - alpha (the sign test). One over that step is the trial's optimistic throughput. When even
that cannot beat the best throughput over as many first steps (the best completed trial's, or
the command's as given, its slowest repeat's), the trial is hopeless and is stopped.

Why order statistics and not a mean and standard deviation: step times on a shared machine
are skewed, with rare long steps (garbage collection, another process); a normal bound would
be pulled around by them, while this one only counts how many steps beat the best. The noise
still sets the bound: the wider the spread of the steps, the further the j-th fastest step
lies below the median. With alpha = 0.05 the first decision comes at the fifth steady step
(0.5^5 = 0.031), when all five were slower than the best trial's median of its first five.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import optuna

ALPHA = 0.05  # chance of stopping a trial whose median step in fact equals the best's


def binomial_half_cdf(k: int, n: int) -> float:
    """P(Binomial(n, 1/2) <= k)."""
    return sum(math.comb(n, i) for i in range(min(k, n) + 1)) / 2**n if k >= 0 else 0.0


def bound_rank(n: int, alpha: float = ALPHA) -> int:
    """The largest j with P(Binomial(n, 1/2) <= j - 1) <= alpha; 0 when n steps are too few
    for any bound at that confidence."""
    j = 0
    while j < n and binomial_half_cdf(j, n) <= alpha:
        j += 1
    return j


@dataclass(frozen=True)
class Estimate:
    """What the steps so far say about a trial's final throughput (steps per second)."""

    steps: int
    throughput: float  # one over the median step so far
    optimistic: float | None  # one over the lower confidence bound of the median; None: too few

    def to_dict(self) -> dict[str, object]:
        return {"steps": self.steps, "throughput": self.throughput, "optimistic": self.optimistic}


def estimate(step_s: Sequence[float], alpha: float = ALPHA) -> Estimate:
    """The throughput so far and its optimistic bound, from the steady-state step times."""
    if not step_s:
        return Estimate(0, 0.0, None)
    median = statistics.median(step_s)
    j = bound_rank(len(step_s), alpha)
    fast = sorted(step_s)[j - 1] if j else None
    return Estimate(len(step_s), 1 / median if median > 0 else math.inf,
                    None if fast is None else 1 / fast if fast > 0 else math.inf)


def hopeless(step_s: Sequence[float], best: float, alpha: float = ALPHA) -> bool:
    """Even the optimistic throughput of these steps stays below `best` (steps per second)."""
    bound = estimate(step_s, alpha).optimistic
    return bound is not None and bound < best


def prefix_rate(step_s: Sequence[float], n: int) -> float:
    """One over the median of the first `n` steady steps (all of them, where fewer)."""
    median = statistics.median(step_s[:n]) if step_s else 0.0
    return 1 / median if median > 0 else 0.0


class BoundPruner(optuna.pruners.BasePruner):
    """Optuna pruner over the step times a trial reports (`trial.report(step_s, step)`).

    After n steady steps a trial must beat the best over their own first n: a completed
    trial's (its `step_s`, over its `per_step`), or the command as given, the slowest of its
    repeats (`baselines`, per-sample step times). A run's first steady steps are slower than
    its median, and runs of one command differ by the machine's noise: against the whole
    run's median of the middle repeat, a trial identical to the command was pruned in 3 of 6
    studies.
    """

    def __init__(self, baselines: Sequence[Sequence[float]] = (), alpha: float = ALPHA) -> None:
        self.baselines, self.alpha = [list(b) for b in baselines if b], alpha

    def best(self, study: optuna.Study, n: int) -> float:
        done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        rates = [min(prefix_rate(b, n) for b in self.baselines)] if self.baselines else []
        for t in done:
            steps = t.user_attrs.get("step_s")
            if steps:
                per_step = float(t.user_attrs.get("per_step", 1.0))
                rates.append(prefix_rate([s / per_step for s in steps], n))
            elif t.value is not None:
                rates.append(float(t.value))
        return max(rates, default=0.0)

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        steps = [trial.intermediate_values[k] for k in sorted(trial.intermediate_values)]
        best = self.best(study, len(steps))
        return best > 0 and hopeless(steps, best, self.alpha)
