"""Measurements over interleaved rounds: the order each round takes them in, and what a row of
benchmarks/realworld.py's `--only predict --rounds N` makes of its rounds."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from realworld import Paired, Row, Tally, median_row, over_rounds, round_orders, round_spread


def test_five_configurations_over_three_rounds() -> None:
    # realworld.py's base, batch x0.5, x2, x4 and width x2: round 0 in their own order (what
    # one round recorded before rounds)
    assert round_orders(5, 3) == [(0, 1, 2, 3, 4), (1, 3, 0, 4, 2), (3, 4, 1, 2, 0)]


@pytest.mark.parametrize("n", range(1, 9))
def test_each_configuration_takes_each_place_once_in_n_rounds(n: int) -> None:
    orders = round_orders(n, 2 * n)
    assert orders[:n] == orders[n:]
    assert all(sorted(order) == list(range(n)) for order in orders)
    assert all(sorted(order[k] for order in orders[:n]) == list(range(n)) for k in range(n))


def _before(orders: list[tuple[int, ...]]) -> list[tuple[int | None, int]]:
    return [pair for order in orders for pair in zip((None, *order), order, strict=False)]


# (3, 2) left out: no order of 3 moves each from its place and from what it followed
@pytest.mark.parametrize(("n", "rounds"), [(n, rounds) for n in range(2, 9) for rounds in (2, 3, 5)
                                           if (n, rounds) != (3, 2)])
def test_no_configuration_follows_the_same_one_in_every_round(n: int, rounds: int) -> None:
    """A rotation (r, r + 1, ...) puts configuration c after c - 1 in every round where c is
    not first: with 3 rounds of 5, x4 always after x2 and width x2 after x4."""
    seen: dict[int, set[int | None]] = {c: set() for c in range(n)}
    for prev, c in _before(round_orders(n, rounds)):
        seen[c].add(prev)
    assert all(len(prevs) > 1 for prevs in seen.values()), seen


@pytest.mark.parametrize("n", [2, 4, 6, 8])
def test_of_an_even_number_each_follows_each_other_once_in_n_rounds(n: int) -> None:
    pairs = [pair for pair in _before(round_orders(n, n)) if pair[0] is not None]
    assert sorted(pairs) == [(a, b) for a in range(n) for b in range(n) if a != b]


def test_over_rounds_is_the_median_of_the_rounds_that_took_a_figure() -> None:
    assert over_rounds([6.6, 9.9, 6.8]) == 6.8  # one disturbed round outvoted
    assert over_rounds([None, 4.0, 2.0]) == 3.0
    assert over_rounds([None, None]) is None
    assert round_spread([10.0, 12.5, 11.0]) == pytest.approx(0.25)


def _row(measured: float, predicted: float, quiet: bool, own: float | None = None) -> Row:
    return Row(measured=measured, predicted=predicted, others=0.0 if quiet else 0.5,
               quiet=quiet, clock=(measured, 1.0 if quiet else 0.5), own_measured=own,
               own_predicted=None if own is None else 1.1 * own, own_after=None)


def test_a_row_over_rounds_is_judged_on_its_medians_where_most_rounds_were_quiet(
        capsys: pytest.CaptureFixture[str]) -> None:
    base = median_row([_row(10, 10, True), _row(10, 10, True), _row(30, 30, False)])
    # measured 12 and predicted 13 in their median rounds, though no round read that pair
    held = median_row([_row(10, 13, True, 4.0), _row(20, 30, True), _row(12, 11, False, 6.0)])
    lost = median_row([_row(10, 11, True), _row(10, 11, False), _row(10, 11, False)])
    assert (held.measured, held.predicted, held.quiet, held.own_measured) == (12, 13, True, 5.0)
    assert held.clock == (12, 1.0)
    assert (base.quiet, lost.quiet) == (True, False)
    tally = Tally()
    for label, row in (("base", base), ("batch x2", held), ("batch x4", lost)):
        tally.add("lstm", label, row, base, "", "")
    assert tally.wall == [pytest.approx(13 / 12 - 1)]
    assert tally.own == [pytest.approx(0.1)]
    assert (tally.recorded, tally.contended) == ([0.0], 1)
    assert " 0.50*" in capsys.readouterr().out.splitlines()[2]  # the median others, not judged
    # a base quiet in one round of three leaves every row of its script unjudged
    tally = Tally()
    tally.add("lstm", "batch x2", held, median_row([_row(10, 10, True)] + 2 * [
        _row(10, 10, False)]), "", "")
    assert (tally.wall, tally.contended) == ([], 1)


def test_a_changed_row_is_judged_against_its_paired_ratio_quiet_or_not(
        capsys: pytest.CaptureFixture[str]) -> None:
    """predict's ratio to the base (the predicted step over the base's measured one) against
    the paired steps' ratio: every changed row, where the wall time judges the quiet ones."""
    base = replace(_row(10, 10, True), faults=300)
    quiet = replace(_row(25, 21, True), paired=Paired(2.0, (310, 900)), faults=800)
    loud = replace(_row(60, 42, False), paired=Paired(4.2, (290, 2400)), faults=None)
    tally = Tally()
    for label, row in (("base", base), ("batch x2", quiet), ("batch x4", loud)):
        tally.add("lstm", label, row, base, "", "")
    assert tally.paired == [pytest.approx(0.05), pytest.approx(0.0)]
    assert tally.wall == [pytest.approx(21 / 25 - 1)]
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[-3:] == ["-", "-", "-"]  # the base has none
    assert "  x2.000  x2.100    +5.0%  faults paired 310/900, Runs 300/800; " in lines[1]
    assert "  x4.200  x4.200    +0.0%  faults paired 290/2400, Runs 300/-; " in lines[2]
    tally.summary()
    assert ("changed configurations, ratio to the base, against the paired ratio (one step of "
            "each in turn, in the same minutes; every row) (2): geomean |error| 2.5% (goal <= "
            "5%), max 5.0% (goal <= 15%)") in capsys.readouterr().out


def test_the_paired_ratio_over_rounds_is_the_median_of_the_rounds_that_measured_one() -> None:
    rows = [replace(_row(20, 20, True), paired=Paired(r, (f, 2 * f)))
            for r, f in ((1.5, 100), (2.5, 300), (2.0, 200))]
    assert median_row(rows).paired == Paired(2.0, (200, 400))
    assert median_row([*rows[:2], _row(20, 20, True)]).paired == Paired(2.0, (200, 400))
    assert median_row([_row(20, 20, True)]).paired is None
