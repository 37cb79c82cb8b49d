"""arguments.py: an argument conformed to its type hint, or refused with the parameter's name."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pytest

import perfswarm
from perfswarm.arguments import checked, conform, describe, number_text
from perfswarm.errors import ParameterError


@pytest.mark.parametrize(("hint", "value", "expected"), [
    (int, "8", 8), (int, "-3", -3), (int, np.int64(7), 7), (float, "2e9", 2e9),
    (float, 3, 3), (float, np.float32(0.5), 0.5), (int | None, None, None),
    (bool, False, False), (str | Path, Path("a"), Path("a")),
    (Literal["ring", "tree"], "tree", "tree"),
    (Sequence[int], ["1", 2], [1, 2]), (Sequence[int], range(3), range(3)),
    (Iterable[str], (s for s in "ab"), ["a", "b"]),
    (Mapping[int, int], {"768": "1024"}, {768: 1024}),
    (tuple[float | None, float | None], [1, None], (1, None)),
    # numpy's scalars as Python's (its float64, a float subclass, had stayed one: JSON refused
    # it; its bool and str had been refused)
    (float, np.float64(5.0), 5.0), (bool, np.True_, True),
    (Literal["ring", "tree"], np.str_("tree"), "tree"),
])
def test_what_each_hint_takes(hint: Any, value: Any, expected: Any) -> None:
    got = conform(hint, value)
    assert got == expected and type(got) is type(expected)


@pytest.mark.parametrize(("hint", "value"), [
    (int, True), (int, 8.0), (int, "8.0"), (int, "1_0"), (int, "٣"), (int, " 8"),
    (float, "nan"), (float, "inf"), (bool, "no"), (bool, 0), (bool, 1), (str, 5),
    (str | Path, 5), (Literal["ring"], "RING"), (Literal[1], True), (Sequence[int], "12"),
    (Sequence[int], b"\x08"), (Sequence[int], {1, 2}), (Iterable[str], "ab"),
    (Iterable[str], {"a": 1}), (Mapping[int, int], [(1, 2)]),
    (tuple[float, float], (1.0,)), (tuple[float, float], "12"),
])
def test_what_each_hint_refuses(hint: Any, value: Any) -> None:
    @checked
    def f(x: Any) -> Any:
        return x

    f.__wrapped__.__annotations__["x"] = hint  # type: ignore[attr-defined]
    with pytest.raises(ParameterError) as caught:
        f(value)
    assert caught.value.param == "x" and str(caught.value).startswith("x ")


def test_a_checked_function_gets_the_converted_values() -> None:
    @checked
    def scaled(size: int, *, factor: float = 1.0, names: Sequence[str] = ()) -> tuple[Any, ...]:
        return size, factor, names

    assert scaled("8", factor="0.5", names=("a",)) == (8, 0.5, ("a",))
    assert scaled(np.int32(2)) == (2, 1.0, ())
    with pytest.raises(ParameterError) as caught:
        scaled(8, names=["a", 3])
    assert str(caught.value) == ("names ['a', 3]: expected Sequence[str]; item 1: 3 is int, "
                                 "not str")
    with pytest.raises(ParameterError) as caught:
        scaled("x" * 200)
    assert len(str(caught.value)) < 150  # a long value is shown cut short


def test_hints_read_as_python_writes_them() -> None:
    assert describe(int | None) == "int | None"
    assert describe(Literal["ring", "tree"]) == "'ring' | 'tree'"
    assert describe(Mapping[int, int] | None) == "Mapping[int, int] | None"
    assert describe(tuple[float | None, float | None]) == "tuple[float | None, float | None]"


def test_the_numbers_text_is_the_command_lines() -> None:
    """The CLI's options and the API read a number's text by the same rule (one function)."""
    from perfswarm.cli import coercion

    assert coercion.number_text is number_text
    assert [number_text(t, int) for t in ("8", "+8", "08", "8.", "1e3")] == [8, 8, 8, None, None]
    assert [number_text(t, float) for t in ("8", ".5", "1e3", "1e", "")] == [
        8.0, 0.5, 1000.0, None, None]


def test_a_librarys_class_is_named_in_full() -> None:
    """The API's Run and the store's Run share a name: the message tells them apart."""
    from perfswarm.trace.store import Run as StoreRun

    assert describe(perfswarm.Run | Path | None) == "perfswarm.api.Run | Path | None"

    @checked
    def compare(other: perfswarm.Run | None) -> None:
        pass

    with pytest.raises(ParameterError, match=r"expected perfswarm\.api\.Run \| None; got "
                                             r"perfswarm\.trace\.store\.Run$"):
        compare(StoreRun.__new__(StoreRun))
