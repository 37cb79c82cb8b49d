"""The typer application that every command module registers itself on.

Start-up stays light: `perfswarm NAME ...` imports only `cli/NAME_cmd.py`, never the other
commands, and that module imports only what its options show (typer, perfswarm/defaults.py):
the libraries a command needs are imported by the command's function when it runs, so
`perfswarm NAME --help` and a usage error load none of them. The command list of
`perfswarm --help` reads each command's docstring from its module's source rather than
importing every module.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import os
import pkgutil
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import typer
import typer.main
from typer import _click
from typer.core import TyperCommand, TyperGroup, TyperOption

from perfswarm.cli.coercion import plain

CLI_DIR = Path(__file__).parent
SUFFIX = "_cmd"


@cache
def command_names() -> tuple[str, ...]:
    """Every command, one per `NAME_cmd` module of this package."""
    return tuple(sorted(m.name.removesuffix(SUFFIX) for m in pkgutil.iter_modules([str(CLI_DIR)])
                        if m.name.endswith(SUFFIX)))


def command_doc(name: str) -> str:
    """The docstring of the function that `NAME_cmd.py` registers as command NAME, without importing it."""
    source = (CLI_DIR / f"{name}{SUFFIX}.py").read_text(encoding="utf-8")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and any(
                isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute)
                and d.func.attr == "command" and d.args
                and isinstance(d.args[0], ast.Constant) and d.args[0].value == name
                for d in node.decorator_list):
            return inspect.cleandoc(ast.get_docstring(node) or "")
    raise LookupError(f"{name}{SUFFIX}.py registers no command {name!r}")


# What a command sets for the allocators of the libraries it loads, each read from the
# environment when its library is loaded (docs/benchmarks.md):
ALLOCATORS = {
    # Arrow's default (mimalloc) keeps what table reads free: 45 MB more peak memory for a
    # 200k-event report, and no faster; the C library's allocator instead
    "ARROW_DEFAULT_MEMORY_POOL": "system",
}


def _load_arrow() -> None:
    """pyarrow, imported with ALLOCATORS in the environment, each unless the user's sets it.
    Every command loads pyarrow when it runs (its tables, or the modules it needs: the store,
    userfiles); this loads it first, just before the command's own code, which finds the
    variables gone again: the programs `record` and `tune` start see the environment they
    were given."""
    if "pyarrow" in sys.modules:  # imported already (a second command in one process)
        if "ARROW_DEFAULT_MEMORY_POOL" not in os.environ:
            pa = sys.modules["pyarrow"]
            pa.set_memory_pool(pa.system_memory_pool())
        return
    given = [name for name in ALLOCATORS if name not in os.environ]
    os.environ.update({name: ALLOCATORS[name] for name in given})
    try:
        importlib.import_module("pyarrow")
    finally:
        for name in given:
            del os.environ[name]


def _arrow_first(callback: Callable[..., Any]) -> Callable[..., Any]:
    """A command's callback that loads pyarrow first (_load_arrow). The callback runs only
    once the command's arguments are parsed: its --help and a usage error stop before it,
    and load no pyarrow."""

    @functools.wraps(callback)
    def run(*args: Any, **kwargs: Any) -> Any:
        _load_arrow()
        return callback(*args, **kwargs)

    return run


class CommandsOnDemand(TyperGroup):
    """A group whose commands are imported when named; its own help lists them from their source."""

    listing = False

    def list_commands(self, ctx: _click.Context) -> list[str]:
        return list(command_names())

    def get_command(self, ctx: _click.Context, cmd_name: str) -> _click.Command | None:
        if cmd_name in self.commands or cmd_name not in command_names():
            return self.commands.get(cmd_name)
        if self.listing:  # the top-level help needs only names and summaries
            doc = command_doc(cmd_name)  # its first paragraph, unwrapped, is the summary
            return TyperCommand(cmd_name, help=doc,
                                short_help=" ".join(doc.split("\n\n")[0].split()))
        importlib.import_module(f"{__package__}.{cmd_name}{SUFFIX}")
        info = next(i for i in app.registered_commands if i.name == cmd_name)
        command = typer.main.get_command_from_info(
            info, pretty_exceptions_short=app.pretty_exceptions_short,
            rich_markup_mode=app.rich_markup_mode)
        if command.callback is not None:
            command.callback = _arrow_first(command.callback)
        plain([*command.params, command.get_help_option(ctx)])
        self.commands[cmd_name] = command
        return command

    def get_help_option(self, ctx: _click.Context) -> TyperOption | None:
        option = super().get_help_option(ctx)  # made once
        plain([option])
        return option

    def format_help(self, ctx: _click.Context, formatter: _click.HelpFormatter) -> None:
        self.listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self.listing = False


app = typer.Typer(
    name="perfswarm",
    cls=CommandsOnDemand,
    help="Record, ingest, analyze, model, optimize and report ML workload performance.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
