"""Imports every `*_cmd` module of this package so that each registers itself on the app."""

from __future__ import annotations

import importlib
import pkgutil

import perfswarm.cli


def load_all() -> list[str]:
    names = sorted(m.name for m in pkgutil.iter_modules(perfswarm.cli.__path__)
                   if m.name.endswith("_cmd"))
    for name in names:
        importlib.import_module(f"perfswarm.cli.{name}")
    return names


COMMAND_MODULES = load_all()
