"""Model-based pruning: the optimistic bound on a trial's throughput from its first steps."""

from __future__ import annotations

import math
import statistics

import optuna
import pytest
from hypothesis import given
from hypothesis import strategies as st

from perfswarm.optimize.prune import (
    BoundPruner,
    binomial_half_cdf,
    bound_rank,
    estimate,
    hopeless,
)

BEST = 100.0  # steps/s: the best trial's median step is 10 ms


@given(st.integers(1, 80), st.sampled_from([0.01, 0.05, 0.1, 0.25]))
def test_bound_rank_is_the_sign_test_quantile(n: int, alpha: float) -> None:
    j = bound_rank(n, alpha)
    assert 0 <= j <= n
    if j:
        assert binomial_half_cdf(j - 1, n) <= alpha  # at most alpha of wrongly stopping
    assert j == n or binomial_half_cdf(j, n) > alpha  # and the tightest such bound


def test_binomial_against_a_brute_force_count() -> None:
    n = 7
    counts = [bin(x).count("1") for x in range(2**n)]
    for k in range(-1, n + 1):
        assert binomial_half_cdf(k, n) == sum(c <= k for c in counts) / 2**n


def test_five_steps_all_slower_than_the_best_are_pruned() -> None:
    slow = [0.0125, 0.0131, 0.0128, 0.0122, 0.0140]  # every step slower than 10 ms
    assert bound_rank(5) == 1
    e = estimate(slow)
    assert e.optimistic == pytest.approx(1 / 0.0122)  # the fastest step: 82 steps/s < 100
    assert hopeless(slow, BEST)


def test_too_few_or_promising_steps_are_not_pruned() -> None:
    assert not hopeless([0.02, 0.02, 0.02, 0.02], BEST)  # 4 steps: 0.5^4 > alpha, no bound
    assert estimate([0.02] * 4).optimistic is None
    # Slower on median (11 ms), but two steps beat 10 ms: the noise leaves it a chance.
    noisy = [0.011, 0.009, 0.012, 0.0095, 0.011, 0.013]
    assert 1 / estimate(noisy).throughput > 0.010 and not hopeless(noisy, BEST)
    assert not hopeless([0.008] * 10, BEST)  # faster than the best


def test_more_steps_tighten_the_bound() -> None:
    # 12 steps, three of them fast: j = 3, so the bound is the third fastest (10.5 ms).
    steps = [0.009, 0.0095, 0.0105] + [0.012] * 9
    assert bound_rank(12) == 3
    assert estimate(steps).optimistic == pytest.approx(1 / 0.0105)
    assert hopeless(steps, BEST)
    assert not hopeless(steps[:6], BEST)  # after 6 of them (j = 1) the 9 ms step keeps it


def _study(completed: list[float], baselines: tuple[list[float], ...] = ()) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(direction="maximize", pruner=BoundPruner(baselines))
    for value in completed:
        study.tell(study.ask(), value)
    return study


def _report(study: optuna.Study, steps: list[float]) -> optuna.Trial:
    trial = study.ask()
    for i, s in enumerate(steps):
        trial.report(s, i + 2)  # step numbers start past the warm-up
    return trial


def test_pruner_against_the_best_completed_trial() -> None:
    study = _study([50.0, BEST, 80.0])
    assert _report(study, [0.0125] * 5).should_prune()
    assert not _report(study, [0.009] * 5).should_prune()
    assert not _report(study, [0.0125] * 4).should_prune()  # too few yet


def test_pruner_uses_the_baseline_before_any_trial_completes() -> None:
    assert not _report(_study([]), [1.0] * 8).should_prune()  # nothing to beat
    assert _report(_study([], ([0.01] * 9,)), [0.0125] * 5).should_prune()
    assert math.isclose(BoundPruner([[1 / 3] * 5]).best(_study([2.0]), 5), 3.0)


def test_a_trial_is_judged_against_the_first_steps_of_the_others() -> None:
    """A run's first steady steps are slower than its median (warming up): a trial as fast
    as the command, its first five at 12-11 ms, is not pruned against the command's whole
    median of 10 ms, but against the first five of the command's slowest repeat (it had been,
    in 3 of 6 studies of a trial identical to the command)."""
    warming = [0.0125, 0.012, 0.0115, 0.011, 0.0105] + [0.01] * 30
    assert statistics.median(warming) == 0.01
    study = _study([], (warming, [s * 0.95 for s in warming]))
    assert BoundPruner((warming, [s * 0.95 for s in warming])).best(study, 5) == (
        pytest.approx(1 / 0.0115))
    assert not _report(study, warming[:5]).should_prune()
    assert _report(study, [0.013] * 5).should_prune()  # slower than either repeat was
    # a completed trial's own first steps, per sample (its step_s over its per_step)
    done = optuna.create_study(direction="maximize", pruner=BoundPruner())
    trial = done.ask()
    trial.set_user_attr("step_s", [s * 4 for s in warming])
    trial.set_user_attr("per_step", 4.0)
    done.tell(trial, 100.0)
    assert BoundPruner().best(done, 5) == pytest.approx(1 / 0.0115)
