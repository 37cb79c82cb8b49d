"""The documentation against the code: every command's flags in the README's list and in
docs/cli.md's usage lines as the CLI defines them (name, literal default, a help text), and the
`--json` keys docs/cli.md lists as the ones the commands print."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer.main
from typer import _click
from typer.core import TyperOption

from perfswarm.cli.app import app, command_names
from perfswarm.cli.main import main
from perfswarm.trace.store import Run

REPO = Path(__file__).resolve().parents[1]
CLI_MD = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
README = (REPO / "README.md").read_text(encoding="utf-8")

FLAG = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")
# `[--flag VALUE]`: VALUE in lower case (no placeholder such as N or RUN, no choices a|b, no
# example in quotes) is the default the usage line promises
OPTIONAL = re.compile(r"\[(--?[A-Za-z][\w-]*) ([a-z0-9][a-z0-9._:-]*)\]")


def cli_options(name: str) -> list[TyperOption]:
    group = typer.main.get_group(app)
    command = group.get_command(_click.Context(group), name)
    assert command is not None
    return [p for p in command.params if isinstance(p, TyperOption)]


def section(text: str, title: str) -> str:
    """The text under `## title`, up to the next `## `."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"no section ## {title}"
    return match.group(1)


def cli_md_usage(name: str) -> list[str]:
    """docs/cli.md's usage lines of command NAME: its `perfswarm NAME ...` spans (`recover`'s
    is under `record`, whose recordings it recovers)."""
    return re.findall(rf"`(perfswarm {name}\b[^`]*)`", CLI_MD)


def readme_usage(name: str) -> list[str]:
    """The README's lines of command NAME in its list of commands."""
    block = re.search(r"^## Commands.*?```\n(.*?)```", README, re.M | re.S)
    assert block
    return [line for line in block.group(1).splitlines() if line.startswith(f"perfswarm {name} ")
            or line == f"perfswarm {name}"]


USAGES = {"docs/cli.md": cli_md_usage, "README.md": readme_usage}


@pytest.mark.parametrize("doc", USAGES)
@pytest.mark.parametrize("name", command_names())
def test_usage_lines_name_every_flag_and_no_other(name: str, doc: str) -> None:
    lines = USAGES[doc](name)
    assert lines, f"{doc} has no usage line of {name}"
    named = {f for line in lines for f in FLAG.findall(line)}
    options = cli_options(name)
    assert [o.opts for o in options if not named & set(o.opts)] == [], f"{doc} lacks these"
    assert named - {n for o in options for n in o.opts} == set(), f"{doc} names flags {name} lacks"


@pytest.mark.parametrize("doc", USAGES)
@pytest.mark.parametrize("name", command_names())
def test_usage_lines_give_the_defaults(name: str, doc: str) -> None:
    """A literal value in a usage line is the option's default, or, where the default is
    worked out at run time, the one its help text names."""
    by_flag = {n: o for o in cli_options(name) for n in o.opts}
    for line in USAGES[doc](name):
        for flag, value in OPTIONAL.findall(line):
            option = by_flag[flag]
            if option.default is None:
                assert value in (option.help or ""), (flag, value, option.help)
            elif isinstance(option.default, int | float):
                assert float(value) == option.default, (flag, value)
            else:
                assert value == str(option.default), (flag, value)


@pytest.mark.parametrize("name", command_names())
def test_every_option_says_what_it_does(name: str) -> None:
    assert [o.opts for o in cli_options(name) if not (o.help or "").strip()] == []


def documented_keys(text: str) -> list[str]:
    """The keys a passage names outside parentheses (inside them: what a key holds)."""
    keys, depth = [], 0
    for match in re.finditer(r"[()]|`([^`]+)`", text):
        if match.group(0) in "()":
            depth += 1 if match.group(0) == "(" else -1
        elif depth == 0:
            keys.append(match.group(1))
    assert depth == 0, "unbalanced parentheses"
    return keys


def paragraph(text: str, opening: str) -> str:
    start = text.index(opening) + len(opening)
    return text[start:text.find("\n\n", start)]


def bullet_keys(text: str, opening: str) -> list[str]:
    """The keys heading each `- ` item of the list after OPENING (before its first ':' outside
    parentheses)."""
    keys = []
    for item in re.findall(r"^- (.*?)(?=^- |\Z)", text[text.index(opening):], re.M | re.S):
        depth, head = 0, item
        for i, char in enumerate(item):
            depth += {"(": 1, ")": -1}.get(char, 0)
            if char == ":" and depth == 0:
                head = item[:i]
                break
        keys += documented_keys(head)
    return keys


JSON_KEYS = {
    "analyze": bullet_keys(section(CLI_MD, "analyze"), "JSON keys (all times"),
    "advise": documented_keys(paragraph(section(CLI_MD, "advise"), "JSON keys:")),
    "predict": documented_keys(paragraph(section(CLI_MD, "predict"), "JSON keys:")),
    "report": documented_keys(paragraph(section(CLI_MD, "report"),
                                        "`--json` prints the report data instead:")),
}


@pytest.mark.parametrize("trace", ["nccl", "cpu_only"])
@pytest.mark.parametrize("name", JSON_KEYS)
def test_json_keys_are_the_documented_ones(name: str, trace: str, corpus_runs: dict[str, Run],
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """On a GPU trace and a CPU one: each key docs/cli.md lists is printed, and each printed
    key is listed, once."""
    assert main([name, str(corpus_runs[trace].path), "--json"]) == 0
    data: dict[str, Any] = json.loads(capsys.readouterr().out)
    documented = JSON_KEYS[name]
    assert len(documented) == len(set(documented))
    assert sorted(documented) == sorted(data)


BENCHMARKS = REPO / "benchmarks"


def benchmarks_table() -> list[str]:
    """The scripts docs/benchmarks.md's first table lists, in its order."""
    text = (REPO / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    table = re.search(r"^\| script \|.*?\n\n", text, re.M | re.S)
    assert table
    return re.findall(r"^\| `benchmarks/([^`]+)` \|", table.group(0), re.M)


def test_the_benchmarks_table_lists_every_script_once() -> None:
    listed = benchmarks_table()
    assert len(listed) == len(set(listed))
    assert sorted(listed) == sorted(p.name for p in BENCHMARKS.iterdir() if p.is_file())


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(p.name for p in BENCHMARKS.iterdir() if p.is_file()))
def test_every_benchmark_has_its_help(script: str) -> None:
    """`--help` prints the usage and does nothing else (a script without a parser had run
    whole, or read `--help` as its input)."""
    runner = ["bash"] if script.endswith(".sh") else [sys.executable]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    out = subprocess.run([*runner, str(BENCHMARKS / script), "--help"], check=False,
                         capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    assert (out.returncode, out.stdout.startswith("usage:")) == (0, True), out.stderr[-2000:]
