"""Hostile values in every writer: a Run directory name, a device and host name, a command line
and advice texts carrying rich markup, HTML, control characters, an RTL override and a long run
of text reach the terminal (info, analyze, advise), --json and the report HTML as text."""

from __future__ import annotations

import io
import json
import sys
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import markupsafe
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.progress import Progress

from conftest import corpus
from perfswarm.cli.json_output import print_json
from perfswarm.cli.main import main
from perfswarm.cli.output import console, err_console, progress_bar, spinner
from perfswarm.optimize import advise as advise_module
from perfswarm.optimize.rules.base import Advice, advice
from perfswarm.optimize.rules.facts import Facts
from perfswarm.report import board, html
from perfswarm.shown import json_escaped, json_visible, visible

MARKUP = "[/x] [link=http://x]y[/link] [bold]b"
SCRIPT = "<script>alert(1)</script>"
CONTROL = "\x1b[31mred\x1b]0;title\x07 \u202eRTL\u202c \x9b31m"
HOSTILE = f"{MARKUP} {SCRIPT} {CONTROL}"
LONG = "W" * 5000


def _shown(text: str) -> str:
    """What the terminal shows: control characters as escapes (the bell too, but rich drops it
    from styled Text, so it is left out of the comparison)."""
    return (text.replace("\x07", "").replace("\x1b", "\\x1b").replace("\u202e", "\\u202e")
            .replace("\u202c", "\\u202c").replace("\x9b", "\\x9b"))


SHOWN = _shown(HOSTILE)


def _hostile_rule(facts: Facts) -> Advice:
    return advice(facts, f"rule {HOSTILE}", f"title {HOSTILE}",
                  {f"key {HOSTILE}": f"value {HOSTILE}"}, facts.wall_ns / 2,
                  f"basis {HOSTILE}", f"change {HOSTILE} {LONG}")


@pytest.fixture
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A real Run (a GPU trace from the corpus) at a hostile path, with a hostile host, device
    and command in its manifest, and one rule whose every text is hostile."""
    path = tmp_path / f"{MARKUP} {SCRIPT} {CONTROL}.run"
    assert main(["import", str(corpus("event_sync")), "-o", str(path), "-q"]) == 0
    manifest_path = path / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    assert manifest["devices"], "the trace must name a device"
    manifest["host"]["hostname"] = f"host {HOSTILE}"
    for device in manifest["devices"]:
        device["name"] = f"gpu {HOSTILE}"
    manifest["command"] = ["python", f"train {HOSTILE}", LONG]
    manifest_path.write_text(json.dumps(manifest))
    monkeypatch.setattr(advise_module, "RULES", (*advise_module.RULES, _hostile_rule))
    monkeypatch.setattr(console, "width", 1000)  # no wrapping inside a value
    return path


def test_terminal_shows_hostile_text_literally(run: Path, capsys: pytest.CaptureFixture[str]
                                               ) -> None:
    for command, expect in [("info", [f"gpu {SHOWN}"]), ("analyze", []),
                            ("advise", [f"title {SHOWN}", f"basis {SHOWN}", f"value {SHOWN}"])]:
        assert main([command, str(run)]) == 0, command
        out = capsys.readouterr().out
        flat = out.replace("\n", "").replace("\\x07", "")
        assert "\x1b" not in out and "\u202e" not in out, command  # nothing reaches the tty raw
        assert _shown(str(run)) in flat, command
        for text in expect:
            assert text in flat, (command, text)
    assert main(["advise", str(run)]) == 0
    assert LONG in capsys.readouterr().out.replace("\n", "").replace(" ", "")


def test_a_newline_in_a_name_keeps_its_row() -> None:
    """A name holding a newline (torch records a record_function name as given) is one cell
    of one row, its newline an escape (it had split the row into rows of empty cells); text
    printed as lines stays lines."""
    from rich.table import Table

    table = Table("name", "calls")
    table.add_row("first line\nsecond line", "3")
    with console.capture() as captured:
        console.print(table)
        console.print("done")
    rows = [line for line in captured.get().splitlines() if "line" in line]
    assert len(rows) == 1 and "first line\\nsecond line" in rows[0] and "3" in rows[0]
    assert captured.get().endswith("done\n")


def _strings(data: object) -> Iterator[str]:
    """Every string in decoded JSON, keys included."""
    if isinstance(data, str):
        yield data
    elif isinstance(data, dict):
        for key, value in data.items():
            yield key
            yield from _strings(value)
    elif isinstance(data, list):
        for value in data:
            yield from _strings(value)


@pytest.mark.parametrize("command", ["info", "analyze", "advise", "report"])
def test_json_round_trips_hostile_text(run: Path, capsys: pytest.CaptureFixture[str],
                                       command: str) -> None:
    assert main([command, str(run), "--json"]) == 0
    out = capsys.readouterr().out
    # the same text once parsed; on the terminal no control character or bidirectional mark
    assert not set(out) & {"\x1b", "\x07", "\x9b", "\u202e", "\u202c"}
    data = json.loads(out)
    strings = set(_strings(data))
    assert str(run) in strings, command
    if command in ("info", "report"):
        assert f"gpu {HOSTILE}" in strings
    if command == "report":
        assert f"train {HOSTILE}" in strings and LONG in strings
    if command == "advise":
        mine = [a for a in data["advice"] if a["rule"] == f"rule {HOSTILE}"]
        assert mine and mine[0]["title"] == f"title {HOSTILE}"
        assert mine[0]["change"] == f"change {HOSTILE} {LONG}"
        assert mine[0]["gain_basis"] == f"basis {HOSTILE}"
        assert mine[0]["evidence"] == {f"key {HOSTILE}": f"value {HOSTILE}"}


def test_report_and_board_html_escape_hostile_text(run: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    assert main(["report", str(run), "-o", str(out)]) == 0
    listed = board.list_runs(run.parent)[run.name]
    index = html.render_board(str(run.parent), [board._summary(listed)])
    # shown as the terminal shows it: control characters and bidirectional marks as escapes
    escaped = str(markupsafe.escape(visible(HOSTILE)))
    # the report names the Run, its command and advice; the board index its device too
    for page, texts in [(out.read_text(), [f"title {escaped}", f"change {escaped} {LONG}",
                                           f"basis {escaped}", f"train {escaped}",
                                           str(markupsafe.escape(visible(run.name)))]),
                        (index, [f"gpu {escaped}", f"train {escaped}",
                                 str(markupsafe.escape(visible(run.name)))])]:
        assert "<script>alert" not in page and "alert(1)</script>" not in page
        assert not set(page) & {"\x1b", "\x07", "\x9b", "\u202e", "\u202c"}
        for text in texts:
            assert text in page, text[:80]


@pytest.mark.parametrize("make", [progress_bar, spinner])
def test_progress_shows_file_names_as_text(make: Callable[[], Progress],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(err_console, "width", 1000)
    bar = make()  # import puts the file it reads in the description
    bar.add_task(f"reading {HOSTILE}.json", total=2)
    with err_console.capture() as seen:
        err_console.print(bar.make_tasks_table(bar.tasks))
    assert f"reading {SHOWN}.json" in seen.get().replace("\\x07", "")


@given(st.text())
def test_json_text_escaped_and_shown(text: str) -> None:
    """Printed JSON parses back to the same text with no character that acts on a terminal
    left raw; the page's JSON parses to what the terminal shows (control characters and
    bidirectional marks as escapes), whatever backslashes come before them."""
    raw = orjson.dumps({"t": text})
    escaped = json_escaped(raw).decode()
    assert json.loads(escaped) == {"t": text}
    assert not any(c in escaped for c in ("\x7f", "\x9b", "\u202e", "\u2066", "\u061c"))
    assert json.loads(json_visible(raw.decode())) == {"t": visible(text)}


def test_json_visible_on_a_page_of_escaped_angles() -> None:
    """The report's page data, where every kernel name's `<` is safe_json's "\\u003c": the
    scan goes from backslash to backslash (its speed beside `visible`'s scan is
    benchmarks/report.py's `escape_scan_ratio`), and the names parse back as they were, a
    C0 control as its escape, an escaped backslash before "u001b" as text."""
    names = [f"void at::native::kernel<float, {i}>(int&)" for i in range(2_000)]
    text = html.safe_json({"names": names, "path": "C:\\bin\\u001b \x1b"})
    assert text.count("\\u003c") == 2_000
    assert json.loads(text) == {"names": names, "path": "C:\\bin\\u001b \\x1b"}


def test_json_written_as_orjsons_bytes_held_once(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """--json writes orjson's bytes to the stream beneath stdout, escaped where need be: the
    document is held once while it is written, not decoded, joined to the newline and encoded
    again (a 200k-event report's 5 MB had been held four times over, at the command's peak);
    what comes out is the text it was, after what was printed before it."""
    made: list[tuple[int, int]] = []  # each document's size, and what was held with it
    dumps = orjson.dumps

    def measured(*args: object, **kwargs: object) -> bytes:
        out = dumps(*args, **kwargs)  # type: ignore[arg-type]
        # (orjson's bytes take more than their length: tracemalloc counts the allocation)
        made.append((len(out), tracemalloc.get_traced_memory()[0]))
        tracemalloc.reset_peak()  # orjson's own work is not the write's
        return out

    monkeypatch.setattr(orjson, "dumps", measured)
    path = tmp_path / "out.json"
    data = {"spans": list(range(100_000)), "names": [f"op{i}" for i in range(20_000)]}
    with path.open("wb", buffering=0) as file:  # raw, as under python -u
        stdout = io.TextIOWrapper(file, encoding="utf-8", write_through=True)
        monkeypatch.setattr(sys, "stdout", stdout)
        print("before")
        tracemalloc.start()
        try:
            print_json(data)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        print_json({"name": HOSTILE})
        stdout.flush()
    first, second = path.read_bytes().removeprefix(b"before\n").split(b"\n}\n", 1)
    assert orjson.loads(first + b"}") == data
    size, held = made[0]
    assert size > 1_000_000 and peak - held < size / 4, (peak - held, size)  # main: 2x
    assert second == json_escaped(dumps({"name": HOSTILE}, option=orjson.OPT_INDENT_2)) + b"\n"
    assert b"\xe2\x80\xae" not in second and b"\\u202e" in second


class _Sips(io.RawIOBase):
    """A raw stream that takes at most 1,000 bytes a call, as a pipe may of a raw write."""

    def __init__(self) -> None:
        self.got = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        taken = bytes(data[:1000])
        self.got += taken
        return len(taken)


def test_json_written_whole_to_a_raw_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under python -u stdout's bytes are a raw stream, which may take part of a write: the
    JSON is written whole all the same."""
    sips = _Sips()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(sips, encoding="utf-8",
                                                        write_through=True))
    data = {"spans": list(range(10_000))}
    print_json(data)
    assert sips.got.endswith(b"}\n") and orjson.loads(sips.got) == data


def test_sql_csv_shows_escapes_on_a_terminal_and_data_elsewhere(
        run: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    query = "SELECT 'a' || chr(27) || '[31m' || chr(8238) AS x"
    assert main(["sql", str(run), query, "--csv"]) == 0
    assert capsys.readouterr().out == "x\na\x1b[31m\u202e\n"  # a file or a pipe: the data
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert main(["sql", str(run), query, "--csv"]) == 0
    assert capsys.readouterr().out == "x\na\\x1b[31m\\u202e\n"
