"""Microseconds to nanoseconds: exact for Kineto's 3-decimal text, monotone, no drift."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from perfswarm.trace.timebase import ns_to_us_text, us_texts, us_to_ns

# Kineto timestamps relative to baseTimeNanoseconds stay below 2**43 us (about 100 days).
RELATIVE_NS = st.integers(min_value=0, max_value=(2**43) * 1000 - 1)


@given(st.lists(RELATIVE_NS, min_size=1, max_size=200))
def test_three_decimal_text_round_trips_exactly(values: list[int]) -> None:
    floats = np.array([float(ns_to_us_text(v)) for v in values])
    assert us_to_ns(floats).tolist() == values


@given(st.lists(st.integers(min_value=0, max_value=2**53 // 1000), min_size=1, max_size=200))
def test_integer_epoch_microseconds_are_exact(values: list[int]) -> None:
    assert us_to_ns(np.array(values, dtype=np.float64)).tolist() == [v * 1000 for v in values]


@given(st.lists(st.floats(min_value=-1e12, max_value=1e12, allow_nan=False), min_size=2,
                max_size=200))
def test_conversion_is_monotone(values: list[float]) -> None:
    us = np.sort(np.array(values))
    ns = us_to_ns(us)
    assert (np.diff(ns) >= 0).all()
    assert (np.abs(ns - us * 1000.0) <= 0.5 + np.abs(us) * 1e-13).all()


@given(st.integers(min_value=-(10**15), max_value=10**15))
def test_text_form(ns: int) -> None:
    text = ns_to_us_text(ns)
    whole, frac = text.lstrip("-").split(".")
    assert len(frac) == 3
    assert (-1 if text.startswith("-") else 1) * (int(whole) * 1000 + int(frac)) == ns


@given(st.lists(st.integers(min_value=-(2**63), max_value=2**63 - 1), max_size=50))
def test_column_text_is_each_values_text(values: list[int]) -> None:
    """The export's times, formatted a column at a time: each as ns_to_us_text writes it,
    int64's ends included, and uint64's top (a time less the base past int64)."""
    ns = np.array([*values, -(2**63), 2**63 - 1, -1, 0, 999], dtype=np.int64)
    assert us_texts(ns) == [ns_to_us_text(v) for v in ns.tolist()]
    top = np.array([2**64 - 1, 2**63], dtype=np.uint64)
    assert us_texts(top) == ["18446744073709551.615", "9223372036854775.808"]
