"""torch.profiler's memory timeline: imported into counters, memory by category in analyze.

tests/data/mlp_adam_cpu*: a real recording (torch 2.13, CPU): an MLP (256-512-10) trained with
Adam for 3 steps, each in a ProfilerStep#i record_function, under torch.profiler with
profile_memory, record_shapes and with_stack; then export_chrome_trace and
export_memory_timeline(device="cpu") to memory.json.gz (`[times us, sizes]`) and to
memory.raw.json.gz (`[[t ns, action, bytes, category], ...]`).
"""

from __future__ import annotations

import gzip
import pickle
from decimal import Decimal
from pathlib import Path

import orjson
import pytest

from perfswarm.analyze.summary import analyze
from perfswarm.cli.main import main
from perfswarm.optimize.advise import advise
from perfswarm.report import html
from perfswarm.report.data import report_data
from perfswarm.trace.ingest import ImportOptions, import_traces
from perfswarm.trace.memory_timeline import CATEGORIES
from perfswarm.trace.store import Run

DATA = Path(__file__).parent / "data"
TRACE = DATA / "mlp_adam_cpu.pt.trace.json.gz"
TIMELINE = DATA / "mlp_adam_cpu_memory.json.gz"
RAW = DATA / "mlp_adam_cpu_memory.raw.json.gz"


@pytest.fixture(scope="module", params=[TIMELINE, RAW], ids=["timeline", "raw"])
def imported(request: pytest.FixtureRequest,
             tmp_path_factory: pytest.TempPathFactory) -> tuple[Run, Path]:
    out = tmp_path_factory.mktemp("memory") / "mlp.run"
    options = ImportOptions(memory_timelines=(request.param,))
    return import_traces([TRACE], out, options, ["t"]), request.param


def _truth(path: Path) -> tuple[list[int], list[dict[str, int]]]:
    """From the file's JSON: the bytes per category alive at each time (ns) where they
    changed. `[times us, sizes]`: the last row of a time (torch repeats the first time for what
    was alive before). Raw: the changes summed in time order, those before profiling (t -1)
    at the first time."""
    data = orjson.loads(gzip.decompress(path.read_bytes()))
    state: dict[int, dict[str, int]] = {}
    if path == TIMELINE:
        times, sizes = data
        for t, row in zip(times, sizes, strict=True):
            state[t * 1000] = dict(zip(CATEGORIES, row[1:], strict=True))
    else:
        first = min(t for t, *_ in data if t >= 0)
        alive = dict.fromkeys(CATEGORIES, 0)
        for t, _action, delta, category in sorted(data, key=lambda r: max(r[0], first)):
            alive[CATEGORIES[category]] += delta
            state[max(t, first)] = dict(alive)
    times, states = [], []
    for t in sorted(state):
        if not states or state[t] != states[-1]:
            times.append(t)
            states.append(state[t])
    return times, states


def test_peak_by_category_and_per_step(imported: tuple[Run, Path]) -> None:
    run, source = imported
    (rank,) = analyze(run).memory
    times, states = _truth(source)
    totals = [sum(s.values()) for s in states]
    top = totals.index(max(totals))
    assert (rank.peak.total_bytes, rank.peak.by_category) == (totals[top], states[top])
    # both forms of the export: 3.15 MiB, Adam's state a third of it
    assert rank.peak.total_bytes == 3_302_080
    assert rank.peak.by_category["optimizer_state"] == 1_093_728
    assert rank.category_peak_bytes == {c: max(s[c] for s in states) for c in CATEGORIES}
    # each step: the state it began with and every change in it, the markers' times in ns
    raw = orjson.loads(gzip.decompress(TRACE.read_bytes()))
    base = raw["baseTimeNanoseconds"]
    ns = [(base + int(Decimal(str(e["ts"])) * 1000),
           base + int(Decimal(str(e["ts"])) * 1000) + int(Decimal(str(e["dur"])) * 1000))
          for e in raw["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")]
    assert len(rank.steps) == len(ns) == 3
    for (step, peak), (lo, hi) in zip(rank.steps, sorted(ns), strict=True):
        inside = [i for i, t in enumerate(times) if lo <= t < hi]
        before = [i for i, t in enumerate(times) if t <= lo]
        rows = ([before[-1]] if before else []) + [i for i in inside if i not in before]
        assert peak.total_bytes == max(totals[i] for i in rows), step


def test_timeline_in_the_json(imported: tuple[Run, Path],
                              capsys: pytest.CaptureFixture[str]) -> None:
    run, source = imported
    assert main(["analyze", str(run.path), "--json"]) == 0
    (rank,) = orjson.loads(capsys.readouterr().out)["memory"]
    times, states = _truth(source)
    assert rank["t"] == times and len(times) < 400  # every change: fewer than the cap
    assert rank["bytes"] == {c: [s[c] for s in states] for c in CATEGORIES}
    assert main(["analyze", str(run.path)]) == 0
    assert "memory rank 0: peak 3.149 MiB" in capsys.readouterr().out


def test_advice_and_report(imported: tuple[Run, Path]) -> None:
    """Adam's state (two moments per parameter) is a third of the peak: the advice names it;
    the report's Memory view has a row per rank and step with what the peak held."""
    run, source = imported
    _, states = _truth(source)
    totals = [sum(s.values()) for s in states]
    at_peak = states[totals.index(max(totals))]
    (found,) = [a for a in advise(run).advice if a.rule == "memory_breakdown"]
    assert found.evidence == {
        "rank": 0, "peak_bytes": 3_302_080, "group": "optimizer_state",
        "group_bytes": at_peak["optimizer_state"], "used_pct": 33.12,
        "held_bytes": {c: v for c, v in at_peak.items() if v}}
    assert found.title == "optimizer state holds 33% of the peak memory"
    rows = report_data(run)["memory_timeline"]
    assert [(r["step"], r["total_bytes"]) for r in rows] == [
        ("all", 3_302_080), *((i, 3_302_080) for i in range(3))]
    assert rows[0]["by_category"] == at_peak
    page = html.render(report_data(run))
    assert '<table id="memory-timeline">' in page and "<td>all</td><td>3.3 MB</td>" in page


@pytest.mark.parametrize(("text", "why"), [
    (b"[[1], [[0, 1]]]", " ($[1][0]): expected 9 integers (0, then bytes per category)"),
    (b"[[5, 1, 10, 9]]", " ($[0][3]): category 9 is not one of 0..7"),
    (b'{"traceEvents": []}', " ($): not a torch.profiler memory timeline"),
    (b"[[1, 0], [[0, 5, 0, 0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0, 0, 0]]]",
     " ($[0]): times go backwards"),
    (b"[[1], [[0, -5, 0, 0, 0, 0, 0, 0, 0]]]", " ($): bytes alive fall below 0"),
    (b"[[1", " (json): invalid JSON: unexpected end of data"),
    (pickle.dumps({"segments": [], "device_traces": [[]]}),  # a memory snapshot: never loaded
     ": a Python pickle (as torch.cuda.memory._dump_snapshot writes), not JSON"),
])
def test_bad_timelines_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                    text: bytes, why: str) -> None:
    bad = tmp_path / "bad.json"
    bad.write_bytes(text)
    out = tmp_path / "x.run"
    assert main(["import", str(TRACE), "--memory-timeline", str(bad), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"perfswarm: error: {bad}{why}") and "\n" not in err
    assert not out.exists()
