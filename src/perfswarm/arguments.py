"""A public function's arguments checked against its type hints: the Python API's one boundary.

The API's type hints are its contract (docs/api.md). `checked` wraps a function so that every
argument is converted to what its hint says, or refused, before the function runs: a value of
the wrong type is a `ParameterError` naming the parameter, the type it takes and the value
(as text), never a TypeError from deep inside a stage, nor a value taken for another (a
widget's `"no"` had been a true `ignore_markers`). One rule for every function:

- `bool` takes a bool only: `"no"`, `0` and `1` are not taken for one;
- `int` takes an integer (numpy's too; not a bool), or its plain digits as text (`"8"`), and
  `float` a real number or its text (`"0.5"`, `"2e9"`): the texts the command line's options
  take (`NUMERALS`, shared with cli/coercion.py), so a value read from a config or a text box
  means what it means on the command line;
- `str` takes text, a `Literal` one of its values exactly, `Path` a path (`os.PathLike`), a
  class (`Run`) an instance of it;
- `Sequence[X]` takes a sequence (not text), `Iterable[X]` an iterable (not text; read once),
  `Mapping[K, V]` a mapping, `tuple[X, Y]` a sequence of that length: each item by its hint;
- `X | Y` takes what the first of them that takes it gives.

Only types are checked here; each function still checks its values (a batch size of 0, an
unknown device name), with its own words.
"""

from __future__ import annotations

import functools
import inspect
import numbers
import os
import re
import reprlib
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final, Literal, ParamSpec, TypeVar, get_args, get_origin

from perfswarm.errors import ParameterError

# Numbers as text, as the command line's options take them: plain ASCII digits (Python's own
# int() also takes other scripts' digits, "1_0" and blanks around), no inf or nan.
INT_TEXT: Final = re.compile(r"[+-]?[0-9]+")
FLOAT_TEXT: Final = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")

P = ParamSpec("P")
R = TypeVar("R")
_TEXT: Final = (str, bytes, bytearray)  # sequences of characters, never a sequence of items
_SHOWN: Final = reprlib.Repr()
_SHOWN.maxstring = _SHOWN.maxother = 60


def number_text(text: str, kind: type[int] | type[float]) -> int | float | None:
    """The number `text` writes in the command line's forms, or None."""
    if not (INT_TEXT if kind is int else FLOAT_TEXT).fullmatch(text):
        return None
    return kind(text)


class _Refused(Exception):
    """A value a hint does not take; `detail` says which item of a container, if one."""

    def __init__(self, detail: str = "") -> None:
        super().__init__(detail)
        self.detail = detail


def shown(value: object) -> str:
    """A value as text for a message: its repr, cut short."""
    return _SHOWN.repr(value)


def describe(hint: Any) -> str:
    """A hint as Python writes it (`int | None`, `Sequence[int]`, `'ring' | 'tree'`)."""
    if hint is type(None) or hint is None:
        return "None"
    origin = get_origin(hint)
    if origin is Literal:
        return " | ".join(repr(a) for a in get_args(hint))
    if origin in (types.UnionType, typing.Union):
        return " | ".join(describe(a) for a in get_args(hint))
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join(map(describe, get_args(hint)))}]"
    return _type_name(hint) if isinstance(hint, type) else str(hint)


def _type_name(kind: type) -> str:
    """A type's name; a class of a library in full (perfswarm.api.Run is not a store's Run)."""
    bare = kind.__module__ in ("builtins", "pathlib") or kind.__module__.startswith("collections")
    return kind.__qualname__ if bare else f"{kind.__module__}.{kind.__qualname__}"


def _numbers(hint: Any) -> set[Any]:
    """The number types a hint takes (`int | None`: int; `Sequence[int]`: none)."""
    if get_origin(hint) in (types.UnionType, typing.Union):
        return {t for a in get_args(hint) for t in _numbers(a)}
    return {hint} & {int, float}


def conform(hint: Any, value: Any) -> Any:
    """`value` as `hint` takes it (converted: "8" for an int is 8); `_Refused` if it does not."""
    if hint is Any:
        return value
    if hint is type(None) or hint is None:
        if value is None:
            return None
        raise _Refused
    origin = get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        details = []
        for member in get_args(hint):
            try:
                return conform(member, value)
            except _Refused as refused:
                details.append(refused.detail)
        raise _Refused(next((d for d in details if d), ""))
    if origin is Literal:  # the literal itself (text of a str subclass, numpy's, is text)
        found = next((a for a in get_args(hint) if (type(value) is type(a) or (
            isinstance(a, str) and isinstance(value, str))) and value == a), _NOTHING)
        if found is not _NOTHING:
            return found
        raise _Refused
    if origin is not None:
        return _container(origin, get_args(hint), value)
    if hint is bool:
        if isinstance(value, bool) or _numpy_bool(value):
            return bool(value)
        raise _Refused
    if hint in (int, float):
        return _number(hint, value)
    if hint is str:
        if isinstance(value, str):
            return value
        raise _Refused
    if isinstance(hint, type) and issubclass(hint, os.PathLike):  # Path: any path object
        if isinstance(value, os.PathLike):
            return value
        raise _Refused
    if isinstance(hint, type) and isinstance(value, hint):
        return value
    raise _Refused


def _number(kind: type[int] | type[float], value: Any) -> int | float:
    if isinstance(value, bool):
        raise _Refused
    if isinstance(value, str):
        number = number_text(value, kind)
        if number is None:
            raise _Refused
        return number
    if isinstance(value, int):
        return value
    if isinstance(value, numbers.Integral):  # numpy's integers become ints
        return int(value)
    if kind is float and isinstance(value, numbers.Real):
        return float(value)  # numpy's float64, a float subclass, as a float (JSON takes it)
    raise _Refused


_NOTHING: Final = object()


def _numpy_bool(value: Any) -> bool:
    """Whether `value` is numpy's bool (np.True_: no subclass of bool), told without importing
    numpy (the command line's start-up does not)."""
    kind = type(value)
    return kind.__module__ == "numpy" and kind.__name__ in ("bool", "bool_")


def _container(origin: Any, args: tuple[Any, ...], value: Any) -> Any:
    if isinstance(value, _TEXT):
        raise _Refused
    if origin in (Mapping, dict):
        if not isinstance(value, Mapping):
            raise _Refused
        key_hint, value_hint = args or (Any, Any)
        out = {}
        for key, item in value.items():
            out[_item(key_hint, key, f"key {shown(key)}")] = _item(
                value_hint, item, f"the value of {shown(key)}")
        return out
    if origin is tuple and args and args[-1] is not Ellipsis:
        if not isinstance(value, Sequence) or len(value) != len(args):
            raise _Refused(f"{len(args)} items" if isinstance(value, Sequence) else "")
        return tuple(_item(h, v, f"item {i}") for i, (h, v) in enumerate(zip(args, value,
                                                                              strict=True)))
    if origin in (Sequence, list, tuple) and not isinstance(value, Sequence):
        raise _Refused
    if not isinstance(value, Iterable) or isinstance(value, Mapping):
        raise _Refused
    items = list(value)  # an iterator is read once, here
    item_hint = args[0] if args else Any
    converted = [_item(item_hint, v, f"item {i}") for i, v in enumerate(items)]
    if origin is tuple:
        return tuple(converted)
    if isinstance(value, Sequence) and all(a is b for a, b in zip(converted, items,
                                                                 strict=True)):
        return value  # as given (a range stays a range)
    return converted


def _item(hint: Any, value: Any, where: str) -> Any:
    try:
        return conform(hint, value)
    except _Refused as refused:
        raise _Refused(refused.detail or f"{where}: {shown(value)} is "
                       f"{_type_name(type(value))}, not {describe(hint)}") from None


def refusal(param: str, hint: Any, value: Any, detail: str = "") -> ParameterError:
    """The error for a value of the wrong type: the parameter, the value, the type it takes."""
    why = f"expected {describe(hint)}"
    kinds = _numbers(hint) if isinstance(value, str) else set()
    if kinds:
        forms = " or ".join(f for kind, f in ((int, "'8'"), (float, "'0.5'")) if kind in kinds)
        why += f" (or its text as the command line takes it: {forms})"
    got = detail or f"got {_type_name(type(value))}"
    return ParameterError(param, f"{why}; {got}", value=shown(value))


def checked(function: Callable[P, R]) -> Callable[P, R]:
    """`function` with each argument given conformed to its type hint first (`conform`), or
    refused with a `ParameterError` that names it."""
    signature = inspect.signature(function)
    resolved: list[dict[str, Any]] = []  # on the first call: a hint may name a later class

    @functools.wraps(function)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        if not resolved:
            resolved.append(_hints(function))
        hints = resolved[0]
        bound = signature.bind(*args, **kwargs)
        for name, value in bound.arguments.items():
            if name in hints:
                try:
                    bound.arguments[name] = conform(hints[name], value)
                except _Refused as refused:
                    raise refusal(name, hints[name], value, refused.detail) from None
        return function(*bound.args, **bound.kwargs)

    return call


def _hints(function: Callable[..., Any]) -> dict[str, Any]:
    """The parameters' hints, evaluated in the function's module (its return hint may name
    what is imported only for the type checker, so it is left out)."""
    params = {k: v for k, v in function.__annotations__.items() if k != "return"}
    holder = types.SimpleNamespace(__annotations__=params)
    return typing.get_type_hints(holder, globalns=function.__globals__)
