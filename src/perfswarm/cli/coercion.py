"""Command-line values converted without pydantic where a plain conversion gives typer's answer.

typer (0.2x) converts every non-flag parameter through a pydantic TypeAdapter: importing
pydantic and building the adapters cost 0.08-0.11 CPU s of every command, 7% of analyzing a
200k-event trace (docs/benchmarks.md). The values perfswarm's commands take are text, paths,
integers, numbers and fixed choices, and for those a plain conversion gives what typer's
would: text and flags as given, a `Path` checked by typer's own path check, a number in plain
digits within the option's bounds, a choice given exactly. Anything else (a value such a
conversion refuses, an option with other rules) goes to typer's own conversion, so every error
message and every unusual form it accepts stays typer's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from typer import _click
from typer._coercion import RuntimeParam, TypeDescriptor, build_runtime_param
from typer._param_types import coerce_cli_path, lenient_issubclass
from typer.core import _TyperParameter

from perfswarm.arguments import number_text


class _Refused(Exception):
    """A value the plain conversion does not take: typer's own conversion decides."""


@dataclass(frozen=True)
class PlainParam(RuntimeParam):
    """A parameter's conversion: plain where it gives typer's answer, else typer's."""

    descriptor: TypeDescriptor

    def _coerce_value(self, value: Any, param: _TyperParameter, ctx: _click.Context) -> Any:
        try:
            annotation: Any = self.annotation
            if get_origin(annotation) is list and isinstance(value, list | tuple):
                (item,) = get_args(annotation)
                return [self._one(item, v, param, ctx) for v in value]
            return self._one(annotation, value, param, ctx)
        except _Refused:
            return build_runtime_param(self.descriptor)._coerce_value(value, param, ctx)

    def _one(self, annotation: Any, value: Any, param: _TyperParameter,
             ctx: _click.Context) -> Any:
        info = self.parameter_info
        if (annotation is str and isinstance(value, str)) or (
                annotation is bool and isinstance(value, bool)):
            return value
        if annotation in (int, float) and not info.clamp and not isinstance(value, bool):
            return self._number(annotation, value)
        path_type: Any = info.path_type or annotation
        if lenient_issubclass(annotation, Path) and lenient_issubclass(path_type, Path):
            # typer's own check of existence, kind and access (it needs no pydantic for a Path)
            return coerce_cli_path(path_type(value) if isinstance(value, str) else value, info,
                                   path_type=path_type, param=param, ctx=ctx)
        if get_origin(annotation) is Literal and value in get_args(annotation):
            return value
        raise _Refused

    def _number(self, annotation: type[int] | type[float], value: Any) -> int | float:
        info = self.parameter_info
        if isinstance(value, str):
            # the forms the API takes as text too (arguments.py): plain digits, no "1_0"
            found = number_text(value, annotation)
            if found is None:
                raise _Refused
            number = found
        elif isinstance(value, annotation) or (annotation is float and isinstance(value, int)):
            number = annotation(value)
        else:
            raise _Refused
        if (info.min is not None and number < info.min) or (
                info.max is not None and number > info.max):
            raise _Refused  # typer's message says which bound
        return number


def plain(params: Iterable[_click.Parameter | None]) -> None:
    """Give these parameters the plain conversion (file parameters keep typer's)."""
    for param in params:
        if isinstance(param, _TyperParameter) and param.type_descriptor.file_annotation is None \
                and not isinstance(param._runtime_param, PlainParam):
            d = param.type_descriptor
            param._runtime_param = PlainParam(parameter_info=d.parameter_info,
                                              annotation=d.annotation, descriptor=d)
