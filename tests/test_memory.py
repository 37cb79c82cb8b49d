"""torch.profiler's memory timeline: imported into counters, memory by category in analyze.

tests/data/mlp_adam_cpu*: a real recording (torch 2.13, CPU): an MLP (256-512-10) trained with
Adam for 3 steps, each in a ProfilerStep#i record_function, under torch.profiler with
profile_memory, record_shapes and with_stack; then export_chrome_trace and
export_memory_timeline(device="cpu") to memory.json.gz (`[times us, sizes]`) and to
memory.raw.json.gz (`[[t ns, action, bytes, category], ...]`).
"""

from __future__ import annotations

import gzip
import os
import pickle
from decimal import Decimal
from pathlib import Path
from typing import Any, Final

import orjson
import pytest

from perfswarm.analyze.summary import analyze
from perfswarm.cli.main import main
from perfswarm.optimize.advise import advise
from perfswarm.report import html
from perfswarm.report.data import report_data
from perfswarm.trace.ingest import ImportOptions, import_traces
from perfswarm.trace.readers.memory_timeline import CATEGORIES
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
    assert rank["reserved"] is None  # a timeline does not say what the allocator reserved
    assert rank["bytes"] == {c: [s[c] for s in states] for c in CATEGORIES}
    assert main(["analyze", str(run.path)]) == 0
    assert "memory rank 0: peak 3.1 MiB" in capsys.readouterr().out  # 3,302,080 B


def test_advice_and_report(imported: tuple[Run, Path]) -> None:
    """Adam's state (two moments per parameter) is a third of the peak: the advice names it;
    the report's Memory view has a row per rank and step with what the peak held."""
    run, source = imported
    _, states = _truth(source)
    totals = [sum(s.values()) for s in states]
    at_peak = states[totals.index(max(totals))]
    found, *others = [a for a in advise(run).advice if a.rule.startswith(("memory_", "alloc"))]
    assert found.rule == "memory_breakdown" and not others  # no reserved bytes in a timeline
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
    assert '<table id="memory-timeline">' in page and "<td>all</td><td>3.1 MiB</td>" in page
    assert "<th>reserved</th>" not in page  # a timeline does not say what was reserved


@pytest.mark.parametrize(("text", "why"), [
    (b"[[1], [[0, 1]]]", " ($[1][0]): expected 9 integers (0, then bytes per category)"),
    (b"[[5, 1, 10, 9]]", " ($[0][3]): category 9 is not one of 0..7"),
    (b'{"traceEvents": []}', " ($): not a torch.profiler memory timeline"),
    (b"[[1, 0], [[0, 5, 0, 0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0, 0, 0]]]",
     " ($[0]): times go backwards"),
    (b"[[1], [[0, -5, 0, 0, 0, 0, 0, 0, 0]]]", " ($): bytes alive fall below 0"),
    (b"[[1", " (json): invalid JSON: unexpected end of data"),
    (pickle.dumps({"segments": [], "device_traces": [[]]}),
     " ($['device_traces']): no allocation history: take the snapshot after "
     "torch.cuda.memory._record_memory_history()"),
    (pickle.dumps([1, 2]), " ($): not a torch.cuda memory snapshot (a dict with segments and "
     "device_traces); it is a list"),
    (pickle.dumps({"segments": [], "device_traces": [[{"action": "alloc", "addr": 1}]]}),
     " ($['device_traces'][0][0]['time_us']): expected an integer; got None"),
    (pickle.dumps({"segments": []})[:-3], " (pickle): corrupt pickle"),
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


MB2: Final = 2_097_152  # a 2 MiB segment, the allocator's small-pool size


def _entry(action: str, time_us: int, addr: int, size: int, **extra: Any) -> dict[str, Any]:
    """A device trace entry with the keys torch's docs and _memory_viz.py list."""
    return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": time_us,
            "frames": [{"filename": "train.py", "line": 7, "name": "step"}], **extra}


SNAPSHOT: Final = {
    "segments": [  # the end state
        {"device": 0, "address": 4096, "total_size": MB2, "allocated_size": 4096,
         "active_size": 4096, "requested_size": 4096, "stream": 0, "segment_type": "small",
         "blocks": [  # no "address": each starts where the one before ends
             {"size": 4096, "requested_size": 4096, "state": "active_allocated", "frames": []},
             {"size": 2048, "requested_size": 2048, "state": "inactive", "frames": []},
             # freed before the history, awaiting another stream: still held
             {"size": 1024, "requested_size": 1024, "state": "active_pending_free", "frames": []},
             {"size": MB2 - 7168, "requested_size": 0, "state": "inactive", "frames": []}]},
        {"device": 0, "address": 1_048_576, "total_size": MB2, "allocated_size": 6144,
         "active_size": 6144, "requested_size": 6144, "stream": 0, "segment_type": "small",
         "blocks": [
             {"address": 1_048_576, "size": 512, "requested_size": 512,
              "state": "active_allocated", "frames": []},
             {"address": 1_049_088, "size": 1536, "requested_size": 1500,
              "state": "active_allocated", "frames": []},
             {"address": 1_050_624, "size": 4096, "requested_size": 4096,
              "state": "active_allocated", "frames": []},
             {"address": 1_054_720, "size": MB2 - 6144, "requested_size": 0,
              "state": "inactive", "frames": []}]}],
    "device_traces": [[
        _entry("segment_alloc", 100, 1_048_576, MB2),
        _entry("alloc", 110, 1_048_576, 512, category="parameter"),
        _entry("alloc", 120, 1_049_088, 1536),  # no category: unknown
        _entry("alloc", 130, 1_050_624, 8192, category="activation"),
        _entry("free_requested", 150, 8192, 2048),  # allocated before the history began
        _entry("free_completed", 151, 8192, 2048),
        _entry("free_requested", 160, 1_050_624, 8192),
        _entry("free_completed", 165, 1_050_624, 8192),
        _entry("alloc", 170, 1_050_624, 4096, category="gradient"),
        _entry("segment_alloc", 180, 4_194_304, 10 * MB2),
        _entry("alloc", 190, 4_194_304, 1_000_000, category="optimizer_state"),
        _entry("free_requested", 200, 4_194_304, 1_000_000),
        _entry("free_completed", 205, 4_194_304, 1_000_000),
        _entry("segment_free", 210, 4_194_304, 10 * MB2),
        _entry("snapshot", 220, 0, 0)]],
    "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1},
}


def test_memory_snapshot_as_a_timeline(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    """A snapshot (pickled as _dump_snapshot does) becomes the same counters as a timeline.
    By hand: before the history, 4096 B and 1024 B (active and pending free at the end, never
    allocated in it) and 2048 B (freed at 151, never allocated in it) were held, as unknown; the
    reserved bytes at the start are the end's 2 x 2 MiB less the history's net +2 MiB. A block
    is held until its free_completed. The peak is at 190 us: unknown 5120 + 1536, parameter 512,
    gradient 4096, optimizer_state 1,000,000."""
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(pickle.dumps(SNAPSHOT))
    out = tmp_path / "s.run"
    assert main(["import", str(TRACE), "--memory-timeline", str(path), "-o", str(out), "-q"]) == 0
    assert main(["analyze", str(out), "--json"]) == 0
    (rank,) = orjson.loads(capsys.readouterr().out)["memory"]
    assert rank["peak"] == {"ts": 190_000, "total_bytes": 1_011_264, "by_category": {
        **dict.fromkeys(CATEGORIES, 0), "unknown": 6656, "parameter": 512, "gradient": 4096,
        "optimizer_state": 1_000_000}}
    # frees end at free_completed; the segments change at 180 and 210 us, no allocation there
    times = [100, 110, 120, 130, 151, 165, 170, 180, 190, 205, 210]
    assert rank["t"] == [t * 1000 for t in times]
    totals = [7168, 7680, 9216, 17408, 15360, 7168, 11264, 11264, 1_011_264, 11264, 11264]
    assert [sum(b) for b in zip(*rank["bytes"].values(), strict=True)] == totals
    assert rank["bytes"]["activation"] == [0, 0, 0, 8192, 8192, 0, 0, 0, 0, 0, 0]
    # reserved: 2 MiB before the history, 4 from 100 us, 24 from 180 to 210 us, 4 again at the
    # end (the segment freed at 210 us had been missing: the series ended at 24)
    assert rank["reserved"] == {"peak_bytes": 12 * MB2, "at_peak_bytes": 12 * MB2,
                                "bytes": [2 * MB2] * 7 + [12 * MB2] * 3 + [2 * MB2]}
    assert main(["analyze", str(out)]) == 0
    # in binary units: 1,011,264 B = 987.6 KiB, 1,000,000 B = 976.6 KiB, 6656 B = 6.5 KiB
    assert ("memory rank 0: peak 987.6 KiB at +0.090 ms from the Run's start (optimizer_state "
            "976.6 KiB, unknown "
            "6.5 KiB, gradient 4.0 KiB, parameter 512 B); reserved 24.0 MiB then, at "
            "most 24.0 MiB") in " ".join(capsys.readouterr().out.split())  # as wrapped
    # the allocator holds 24 MiB at the peak, of which 1,011,264 B are held by blocks
    (found,) = [a for a in advise(Run(out)).advice if a.rule == "allocator_cache"]
    assert found.evidence == {"rank": 0, "peak_bytes": 1_011_264,
                              "reserved_at_peak_bytes": 12 * MB2, "reserved_peak_bytes": 12 * MB2,
                              "unallocated_bytes": 12 * MB2 - 1_011_264, "unallocated_pct": 95.98}
    assert found.title == "96% of the reserved memory is unallocated at the peak"
    page = html.render(report_data(Run(out)))
    assert ("<th>peak</th><th>reserved</th>" in page
            and "<td>0</td><td>all</td><td>987.6 KiB</td><td>24.0 MiB</td>" in page)
    (source,) = [s for s in Run(out).manifest()["sources"] if s["file"] == path.name]
    assert source["format"] == "memory_snapshot"
    reserved = Run(out).table("counters").to_pylist()
    assert [(r["ts"] // 1000, r["value"], r["device"]) for r in reserved
            if r["name"] == "memory_reserved"] == [
        (100, 2 * MB2, 0), (180, 12 * MB2, 0), (210, 2 * MB2, 0)]


class _Hostile:
    """A pickle that, loaded by pickle.load, would run a shell command."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def test_a_hostile_pickle_runs_nothing(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    marker = tmp_path / "ran"
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [[_Hostile(marker)]]}))
    out = tmp_path / "x.run"
    assert main(["import", str(TRACE), "--memory-timeline", str(path), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"perfswarm: error: {path} (pickle): a pickle that is not a torch.cuda memory "
                   f"snapshot: it names the global {os.name}.system, and perfswarm loads no "
                   "globals (loading one runs code from the file)")
    assert not marker.exists() and not out.exists()
    pickle.loads(path.read_bytes())  # the test's own check that it would have run
    assert marker.exists()


def test_a_snapshot_torch_wrote_agrees_with_its_timeline(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One CPU recording (an MLP and Adam, 3 steps, profile_memory=True, torch 2.13), written
    twice by torch: its memory timeline (export_memory_timeline, raw) and a snapshot built by
    torch's own torch.cuda._memory_viz._profile_to_snapshot (entries with `category`; torch
    gives them no time_us, so each was given its profiler action's time, in us; made by
    data/mlp_adam_cpu_snapshot.py). Read by the two readers, the peaks agree to the byte; so do
    the categories the
    history allocates, and what it does not (parameters and the input, alive before
    profiling) is unknown in the snapshot: 1,071,144 - 524,288 + 66,056 - 8 B."""
    tops = []
    for name in ("mlp_adam_cpu_snapshot.pickle.gz", "mlp_adam_cpu_snapshot_memory.raw.json.gz"):
        out = tmp_path / f"{name}.run"
        assert main(["import", str(TRACE), "--memory-timeline", str(DATA / name), "-o",
                     str(out), "-q"]) == 0
        assert main(["analyze", str(out), "--json"]) == 0
        (rank,) = orjson.loads(capsys.readouterr().out)["memory"]
        tops.append((rank["peak"]["total_bytes"], rank["peak"]["by_category"]))
    (snapshot, held), (timeline, alive) = tops
    assert snapshot == timeline == 3_302_076
    for c in ("activation", "gradient", "optimizer_state", "temporary", "autograd_detail"):
        assert held[c] == alive[c], c
    assert (alive["parameter"], held["parameter"], alive["input"], held["input"]) == (
        1_071_144, 524_288, 66_056, 8)
    assert held["unknown"] == 1_071_144 - 524_288 + 66_056 - 8 and alive["unknown"] == 0


def test_a_snapshot_over_two_devices_merges_them_by_time(tmp_path: Path) -> None:
    """Each device's history in its order, the two merged by time_us; the readings then belong
    to no one device (-1)."""
    snapshot = {"segments": [], "device_traces": [
        [_entry("alloc", 10, 4096, 100), _entry("free_completed", 30, 4096, 100)],
        [_entry("alloc", 20, 4096, 50, category="activation")]]}
    path = tmp_path / "two.pickle"
    path.write_bytes(pickle.dumps(snapshot))
    out = tmp_path / "two.run"
    assert main(["import", str(TRACE), "--memory-timeline", str(path), "-o", str(out), "-q"]) == 0
    readings = [(r["ts"] // 1000, r["name"], r["value"], r["device"])
                for r in Run(out).table("counters").to_pylist()
                if r["name"] in ("memory.unknown", "memory.activation")]
    assert readings == [(10, "memory.activation", 0, -1), (10, "memory.unknown", 100, -1),
                        (20, "memory.activation", 50, -1), (30, "memory.unknown", 0, -1)]


def test_a_snapshots_reserved_bytes_near_capacity(tmp_path: Path) -> None:
    """The snapshot's allocator reserved 24 MiB at most on device 0, whose trace says it has
    26,000,000 B: memory_capacity names the snapshot as its source."""
    trace = tmp_path / "t.json"
    trace.write_bytes(orjson.dumps({
        "deviceProperties": [{"id": 0, "name": "NVIDIA H100", "totalGlobalMem": 26_000_000}],
        "traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1,
                         "ts": 0, "dur": 300}]}))
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(pickle.dumps(SNAPSHOT))
    out = tmp_path / "cap.run"
    assert main(["import", str(trace), "--memory-timeline", str(path), "-o", str(out), "-q"]) == 0
    (found,) = [a for a in advise(Run(out)).advice if a.rule == "memory_capacity"]
    assert found.evidence == {"devices": [{
        "rank": 0, "device": 0, "peak_bytes": 12 * MB2, "capacity_bytes": 26_000_000,
        "used_pct": round(100 * 12 * MB2 / 26_000_000, 2), "source": "snapshot"}]}


def test_memory_that_grows_every_step(tmp_path: Path) -> None:
    """tests/data/mlp_leak_cpu.txt: a loop that keeps a 256 x 2048 fp32 clone each step (a
    leak of 2,097,152 bytes a step by construction). Its memory timeline's steps' peaks rise
    by that much (the first step, building Adam's state, and the last, cut by the timeline's
    end, aside); the leak is an activation's clone, and memory_growth says so. The timeline
    without a leak (the fixture's) has no such finding."""
    out = tmp_path / "leak.run"
    options = ImportOptions(memory_timelines=(DATA / "mlp_leak_cpu_memory.json.gz",))
    run = import_traces([DATA / "mlp_leak_cpu.pt.trace.json.gz"], out, options, ["t"])
    (found,) = [a for a in advise(run).advice if a.rule == "memory_growth"]
    assert found.evidence["growth_bytes_per_step"] == 256 * 2048 * 4
    steps = found.evidence["steps"]
    assert steps >= 4
    assert found.evidence["grew_bytes"] == {"activation": (steps - 1) * 256 * 2048 * 4}
    assert found.gain_ns is None and "loss.item()" in found.change


def test_no_growth_finding_without_a_leak(imported: tuple[Run, Path]) -> None:
    run, _ = imported
    assert not [a for a in advise(run).advice if a.rule == "memory_growth"]


def test_a_growing_batch_is_no_leak(imported: tuple[Run, Path]) -> None:
    """memory_growth reads what each step began with: the fixture's steps, which keep nothing,
    begin alike; a peak that rises with a growing batch is no leak (the steps' start_bytes,
    not their peaks)."""
    run, _ = imported
    (m,) = analyze(run).memory
    starts = [sum(b.values()) for b in m.step_starts]
    assert len(starts) == len(m.steps) >= 3
    assert len(set(starts[1:])) == 1  # nothing kept from step to step
