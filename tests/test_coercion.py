"""Command-line values converted without pydantic: the same values, and the same errors, as
typer's own conversion."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import pytest
import typer
import typer.main
from hypothesis import given, settings
from hypothesis import strategies as st
from typer import _click

from perfswarm.cli.coercion import PlainParam, plain

NUMBERS = st.from_regex(r"\A[ +-]?\d{0,4}(\.\d{0,2})?([eE][+-]?\d)?[ ]?\Z")
TEXT = st.text(alphabet="0123456789.-+eE _abcinf/", max_size=8)


def _command(tmp: Path, converted: bool) -> _click.Command:
    """A command of the option kinds perfswarm's commands take, returning what it was given."""
    app = typer.Typer()

    @app.command()
    def probe(
        count: Annotated[int, typer.Option(min=0, max=100)] = 1,
        rate: Annotated[float, typer.Option(min=0.1)] = 2.0,
        maybe: Annotated[int | None, typer.Option()] = None,
        name: Annotated[str, typer.Option()] = "x",
        path: Annotated[Path, typer.Option()] = tmp,
        existing: Annotated[Path | None, typer.Option(exists=True, dir_okay=False)] = None,
        sizes: Annotated[list[int] | None, typer.Option()] = None,
        mode: Annotated[Literal["fast", "slow"], typer.Option()] = "fast",
        flag: Annotated[bool, typer.Option()] = False,
    ) -> dict[str, Any]:
        return dict(locals())

    command = typer.main.get_command(app)
    if converted:
        plain([*command.params, command.get_help_option(_click.Context(command))])
    return command


def _outcome(command: _click.Command, args: list[str]) -> object:
    try:
        return command.main(args=args, standalone_mode=False)
    except _click.exceptions.ClickException as exc:
        return type(exc).__name__, exc.format_message()


@pytest.fixture(scope="module")
def commands(tmp_path_factory: pytest.TempPathFactory) -> tuple[_click.Command, _click.Command]:
    tmp = tmp_path_factory.mktemp("coercion")
    (tmp / "file").write_text("")
    return _command(tmp, True), _command(tmp, False)


def test_the_plain_conversion_is_installed(commands: tuple[_click.Command, _click.Command]
                                           ) -> None:
    mine, _typers = commands
    kinds = {type(getattr(p, "_runtime_param", None)).__name__ for p in mine.params}
    assert kinds == {PlainParam.__name__}


@settings(max_examples=300, deadline=None)
@given(option=st.sampled_from(["--count", "--rate", "--maybe", "--sizes", "--name", "--mode"]),
       values=st.lists(NUMBERS | TEXT | st.sampled_from(["fast", "slow", "Fast"]), min_size=1,
                       max_size=3))
def test_values_and_errors_are_typers(commands: tuple[_click.Command, _click.Command],
                                      option: str, values: list[str]) -> None:
    mine, typers = commands
    args = [a for v in values for a in (option, v)]
    assert _outcome(mine, args) == _outcome(typers, args)


@pytest.mark.parametrize("args", [
    [], ["--flag"], ["--path", "some/where"], ["--existing", "{tmp}/file"],
    ["--existing", "{tmp}"], ["--existing", "{tmp}/none"], ["--count", "101"],
    ["--rate", "0.05"], ["--sizes", "1", "--sizes", "2"],
])
def test_paths_flags_and_bounds_are_typers(commands: tuple[_click.Command, _click.Command],
                                           tmp_path_factory: pytest.TempPathFactory,
                                           args: list[str]) -> None:
    mine, typers = commands
    tmp = str(mine.params[4].default)
    args = [a.replace("{tmp}", tmp) for a in args]
    assert _outcome(mine, args) == _outcome(typers, args)
