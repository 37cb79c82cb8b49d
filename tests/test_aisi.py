"""Iterations from syscalls and stack samples, per-window analysis of runs without
iterations, and --window, on real recordings and corpus traces."""

from __future__ import annotations

import gzip
import itertools
import sys
import textwrap
from decimal import Decimal
from pathlib import Path

import numpy as np
import orjson
import pyarrow.parquet as pq
import pytest

from conftest import corpus
from perfswarm.analyze.aisi import _windows, repeating_stretch, sample_steps
from perfswarm.analyze.summary import analyze
from perfswarm.analyze.window import parse_window, windowed
from perfswarm.cli.main import main
from perfswarm.errors import ParameterError
from perfswarm.recorder.session import RecordOptions, record
from perfswarm.trace.ingest import ImportOptions, import_traces
from perfswarm.trace.store import Run

LOOP = textwrap.dedent("""
    import os, sys, time
    path = sys.argv[1]
    with open(path, "wb") as f:
        f.write(b"x" * 65536)
    marks, data = [], bytearray(65536)  # no allocation in the loop: no brk between its calls
    for i in range(12):
        marks.append(time.time_ns())
        with open(path, "rb", buffering=0) as f:
            f.readinto(data)
        fd = os.open(os.devnull, os.O_WRONLY)
        os.write(fd, data)
        os.close(fd)
        time.sleep(0.02)
    marks.append(time.time_ns())
    print(*marks)
""")


def test_iterations_from_syscalls(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """A loop after Python's start-up (hundreds of syscalls that repeat otherwise: one
    module import each): its 8 iterations, each inside the times the child took around it."""
    result = record([sys.executable, "-c", LOOP, str(tmp_path / "data")], tmp_path / "l.run",
                    RecordOptions(collectors=("strace",)))
    marks = [int(t) for t in capfd.readouterr().out.split()]
    its = analyze(result.run).iterations
    assert its.used == "detected"
    (steps,) = its.steps.values()
    # each detected iteration is one of the loop's, in order, from its first syscall (openat)
    # to the next one's; an iteration strace saw differently (a page fault's brk) may be lost
    # at the ends, so 10 of the 12 at least
    k = next(k for k in range(12) if marks[k] <= steps[0].start < marks[k + 1])
    assert len(steps) >= 10
    for i, w in enumerate(steps):
        assert marks[k + i] <= w.start < marks[k + i + 1] and w.end <= marks[min(k + i + 2, 12)]
        assert w.end == (steps[i + 1].start if i + 1 < len(steps) else w.end)


ALTERNATING = textwrap.dedent("""
    import hashlib, time, zlib
    data = bytes(range(256)) * 4096
    def busy(fn, seconds):  # CPU time, so each phase gets its samples however loaded the host
        t = time.process_time()
        while time.process_time() - t < seconds:
            fn(data)
    for _ in range(6):
        print(time.time_ns())
        busy(lambda d: zlib.compress(d, 6), 0.1)
        print(time.time_ns())
        busy(lambda d: hashlib.sha256(d).digest(), 0.1)
    print(time.time_ns())
""")


def test_iterations_from_a_live_perf_recording(tmp_path: Path,
                                                capfd: pytest.CaptureFixture[str]) -> None:
    """Only perf's samples of a loop that alternates between libz and libcrypto, recorded
    here on the loaded VM: each iteration found starts in the same phase of the next
    iteration of the loop. Which phase that is depends on where perf's first samples fall
    (perf attaches while the child starts, often after its first phase): a cycle of samples
    does not say where the program's loop begins."""
    # 99 Hz of the child's CPU time: about 10 samples a phase
    result = record([sys.executable, "-c", ALTERNATING], tmp_path / "p.run",
                    RecordOptions(collectors=("perf",)))
    if result.run.manifest()["collectors"]["perf"]["status"] != "ok":
        pytest.skip("perf cannot sample here")
    edges = np.array([int(t) for t in capfd.readouterr().out.split()])  # libz, libcrypto, ...
    its = analyze(result.run).iterations
    assert its.used == "detected"
    (steps,) = its.steps.values()
    assert len(steps) >= 4
    # each start after the first is at a phase's start (10 ms of CPU a sample, a few samples
    # late at most: within 150 ms of wall time, a fifth of an iteration here), the same
    # phase one iteration later each time
    nearest = [int(np.argmin(abs(edges - w.start))) for w in steps[1:]]
    assert all(abs(w.start - edges[j]) < 150_000_000 for w, j in zip(steps[1:], nearest,
                                                                      strict=True))
    assert [b - a for a, b in itertools.pairwise(nearest)] == [2] * (len(nearest) - 1)
    assert all(a.end == b.start for a, b in itertools.pairwise(steps))


def test_iterations_from_perf_samples() -> None:
    """No events, only perf's samples (tests/data/perf_alternating: `perfswarm record -c perf`
    of alternating.py on this VM, its samples and stacks tables and the loop's own times).
    The phases live in libz and libcrypto."""
    data = Path(__file__).with_name("data") / "perf_alternating"
    marks = [int(t) for t in (data / "marks.txt").read_text().split()]
    found = sample_steps(pq.read_table(data / "samples.parquet"),
                         pq.read_table(data / "stacks.parquet"))
    (steps,) = found.values()
    # perf attached inside the first iteration; the others each start within 50 ms of the
    # loop's time for them (samples are 10 ms apart, voted over 5)
    assert len(steps) == 6 and marks[0] <= steps[0].start < marks[1]
    for i, w in enumerate(steps[1:], 1):
        assert marks[i] <= w.start < marks[i] + 50_000_000
        assert steps[i - 1].end == w.start


@pytest.mark.parametrize("recording", ["chance", "unsteady"])
def test_no_iterations_where_samples_cannot_tell(recording: str) -> None:
    """tests/data/perf_sklearn: a 40-iteration scikit-learn loop sampled at 3 samples an
    iteration. Its leaf modules (three in one recording, two in the other) repeated by chance
    and had given 2 and 10 iterations of 37-948 ms; nothing is found now."""
    data = Path(__file__).with_name("data") / "perf_sklearn"
    assert sample_steps(pq.read_table(data / f"{recording}_samples.parquet"),
                        pq.read_table(data / f"{recording}_stacks.parquet")) == {}


def test_chance_repeats_are_no_loop() -> None:
    """Sequences of 3-6 names drawn at random (merged runs, as detection sees them): a
    repeating stretch is found in at most 1% of them, where a loop of the same names
    repeated 8 times is found every time."""
    rng = np.random.default_rng(7)
    found, loops = 0, 0
    for _ in range(300):
        k = int(rng.integers(3, 7))
        names = rng.integers(0, k, int(rng.integers(20, 200)))
        names = names[np.r_[True, names[1:] != names[:-1]]]
        times = np.cumsum(rng.integers(1, 100, len(names)))
        lo, hi = repeating_stretch(names, times, times)
        found += hi > lo
        body = np.array(rng.permutation(k).tolist() * 2)[: int(rng.integers(k, 2 * k))]
        body = body[np.r_[True, body[1:] != body[:-1]]]
        loop = np.tile(body, 8)
        times = np.arange(len(loop))
        lo, hi = repeating_stretch(loop, times, times)
        loops += (lo, hi) == (0, len(loop)) or hi - lo >= 7 * len(body)
    assert found <= 3 and loops == 300


def test_a_short_tight_loop_is_not_the_program_loop() -> None:
    """A stretch repeating 50 times within the first tenth of the span (an import's tight
    loop), then names at random: no iterations; the same loop over the whole span is found,
    50 of them."""
    rng = np.random.default_rng(3)
    tight = np.tile([0, 1, 2, 3], 50)
    rest = rng.integers(0, 6, 400)
    names = np.r_[tight, rest]
    ts = np.r_[np.arange(200), 200 + 10 * np.arange(400)].astype(np.int64)
    assert _windows(names, ts, ts + 1) == []
    ts = 10 * np.arange(200, dtype=np.int64)
    assert len(_windows(tight, ts, ts + 1)) == 50


@pytest.fixture(scope="module")
def inference(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """A real inference trace: no step markers, no repeating loop."""
    out = tmp_path_factory.mktemp("inf") / "i.run"
    return import_traces([corpus("old_format")], out, ImportOptions(), ["test"])


def test_windows_when_no_iterations(inference: Run) -> None:
    a = analyze(inference)
    assert a.iterations.used is None and list(a.windows) == [1]
    windows = a.windows[1]
    # over the work of the raw JSON (its ops, runtime calls and kernels: 1.6 ms), not the
    # profiler's own range (1.05 s) and closing instant, `Record Window End`, 2.1 s after the
    # last op: windows over those had been 9 in 10 idle
    with gzip.open(corpus("old_format"), "rt") as f:
        raw = orjson.loads(f.read())
    work = [(Decimal(str(e["ts"])), Decimal(str(e["ts"])) + Decimal(str(e["dur"])))
            for e in raw["traceEvents"] if e.get("ph") == "X" and e.get("dur", 0) > 0
            and e.get("cat") in ("Operator", "Runtime", "Kernel", "Memcpy", "Memset")]
    first, last = (min(a for a, _ in work), max(b for _, b in work))
    assert len(windows) == 10
    assert windows[-1].end - windows[0].start == int((last - first) * 1000) == 1_641_000
    assert all(a.end == b.start for a, b in itertools.pairwise(windows))
    (rank,) = a.concurrency.ranks
    assert [i.step for i in rank.iterations] == list(range(10))
    # the windows tile the span: their states add up to the whole's
    assert rank.total.ns["host_busy_device_idle"] > 0 and rank.total.ns["compute_only"] > 0
    for state, ns in rank.total.ns.items():
        assert sum(i.breakdown.ns[state] for i in rank.iterations) == ns
    assert orjson.loads(orjson.dumps(a.to_dict()))["windows"]["1"][3]["source"] == "window"


BUSY_THEN_IDLE = "import time\nt = time.time()\nwhile time.time() - t < 0.5: pass\ntime.sleep(0.5)"


def test_system_load_per_window(tmp_path: Path) -> None:
    """No events at all: the host's counters per window (usr dominates the busy half)."""
    run = record([sys.executable, "-c", BUSY_THEN_IDLE], tmp_path / "b.run",
                 RecordOptions(collectors=("system",), hz=50.0)).run
    a = analyze(run)
    (load,) = a.system
    windows = a.windows[-1]
    assert load.rank == -1 and [w.step for w in load.windows] == list(range(10))
    c = run.table("counters").to_pydict()
    names = np.array(c["name"])
    ts, value = np.array(c["ts"]), np.array(c["value"])
    usr = np.char.endswith(names.astype(str), ".usr") & np.char.startswith(names.astype(str),
                                                                           "cpu.")
    for w, got in zip(windows, load.windows, strict=True):
        inside = usr & (ts >= w.start) & (ts < w.end)
        if inside.any():
            assert got.mean["usr"] == pytest.approx(value[inside].mean(), rel=1e-12)
    # the busy loop's clock reads are system calls on this VM: usr or sys dominates
    busy = [g for g in load.windows[:3] if "usr" in g.mean]
    assert busy and all(g.dominator in ("usr", "sys") and g.mean["usr"] + g.mean["sys"] > 0.3
                        for g in busy)


def test_window_option(inference: Run, capsys: pytest.CaptureFixture[str]) -> None:
    events = inference.table("events").to_pydict()
    first = min(events["ts"])
    lo, hi = first + 72_000_000, first + 72_800_000  # clips a launch, holds its kernel
    inside = [(t, d) for t, d in zip(events["ts"], events["dur"], strict=True)
              if (t < hi and t + d > lo) or (d == 0 and lo <= t < hi)]
    w = windowed(inference, "0.072:0.0728")
    got = w.table("events", ["ts", "dur"]).to_pydict()
    assert len(got["ts"]) == len(inside) and min(got["ts"]) >= lo
    assert max(t + d for t, d in zip(got["ts"], got["dur"], strict=True)) <= hi
    assert sum(got["dur"]) == sum(min(t + d, hi) - max(t, lo) for t, d in inside)
    assert len(inside) >= 2 and any(t < lo for t, _ in inside)
    assert main(["analyze", str(inference.path), "--window", "0.072:0.0728", "--json"]) == 0
    out = orjson.loads(capsys.readouterr().out)
    assert out["events"] == len(inside)
    (rank,) = out["concurrency"]["ranks"]
    assert rank["total"]["start"] >= lo and rank["total"]["end"] <= hi
    # the report sees the same window: its timeline holds those events, within 0.8 ms
    assert main(["report", str(inference.path), "--window", "0.072:0.0728", "--json"]) == 0
    timeline = orjson.loads(capsys.readouterr().out)["timeline"]
    assert timeline["events"] == len(inside) and timeline["end_ns"] <= hi - lo
    # a window past every event holds none: said of the window, not the Run
    assert main(["analyze", str(inference.path), "--window", "900:901"]) == 2
    err = capsys.readouterr().err
    assert "the window 900:901 (s from its start) holds no events" in err and \
        err.count("\n") == 1


@pytest.mark.parametrize("text", ["5", "3:2", "-1:2", "a:b", "nan:1", "1:1"])
def test_bad_window(text: str, inference: Run, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ParameterError, match=r"^window .*: expected START:END") as caught:
        parse_window(text)
    assert caught.value.param == "window"  # the library names its parameter; the CLI its flag
    assert main(["analyze", str(inference.path), f"--window={text}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"--window {text}: expected START:END" in err


def test_no_iterations_in_a_spin() -> None:
    """tests/data/perf_noloop: `perfswarm record` of noloop.py, no torch: one 2 s spin reading
    the clock, then half-idle, disk and idle phases; no loop. perf's leaf modules alternate
    between libpython and the kernel's clock reads, the kernel's 1-5 samples a run, which the
    smoother (5 samples) cannot tell from strays: 5 iterations of 182-797 ms had been found in
    the spin; none now (the run gets time windows)."""
    data = Path(__file__).with_name("data") / "perf_noloop"
    assert sample_steps(pq.read_table(data / "spin_samples.parquet"),
                        pq.read_table(data / "spin_stacks.parquet")) == {}
