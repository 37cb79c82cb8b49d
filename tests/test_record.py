"""perfswarm record: one recorded torch run shared by most tests, plus tiny non-torch runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import orjson
import pytest

from perfswarm.errors import PerfswarmError
from perfswarm.record import perf, pystacks
from perfswarm.record.base import Sampler, read_jsonl
from perfswarm.record.clock import monotonic_offset_ns
from perfswarm.record.session import RecordOptions, parse_steps, record
from perfswarm.record.system import cpu_fractions
from perfswarm.trace.store import Run

PY = sys.executable
STEPS = 8


@pytest.fixture(scope="session")
def trainer_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    out = tmp_path_factory.mktemp("rec") / "trainer.run"
    result = record([PY, "-m", "perfswarm.workloads.trainer", "--steps", str(STEPS),
                     "--batch-size", "8", "--num-workers", "1", "--loader-delay-ms", "5"],
                    out, RecordOptions(skip=2, steps=3))
    assert result.exit_code == 0
    return result.run


def test_manifest_statuses(trainer_run: Run) -> None:
    m = trainer_run.manifest()
    assert m["complete"] is True and m["exit_status"] == 0 and m["signal"] is None
    status = {k: v["status"] for k, v in m["collectors"].items()}
    assert status["torch"] == "ok" and status["system"] == "ok" and status["pystacks"] == "ok"
    assert status["perf"] == "ok" or status["perf"].startswith("unavailable: ")
    if not Path("/dev/nvidia0").exists():
        assert status["gpu"] == "unavailable: no NVIDIA GPU"
    assert set(m["clock_offsets"]) >= {"psutil", "perf"}
    assert m["ranks"] == [0]
    files = m["collectors"]["torch"]["files"]
    assert [f.split("-")[0] for f in files] == ["et", "steps", "torch"]
    assert all((trainer_run.raw_dir / f).is_file() for f in files)


def test_steps_marker_window_and_hooks(trainer_run: Run) -> None:
    steps = trainer_run.table("steps").to_pylist()
    assert [(s["step"], s["source"]) for s in steps] == [
        (1, "detected"), (2, "marker"), (3, "marker"), (4, "marker"),
        (5, "detected"), (6, "detected"), (7, "detected")]
    events = trainer_run.table("events")
    assert {2, 3, 4} <= set(events.column("step").to_pylist()) <= {-1, 2, 3, 4, 5}
    assert events.num_rows > 300
    assert trainer_run.table("graph_nodes").num_rows > 50  # one step's execution trace


def test_torch_markers_align_with_hook_times(trainer_run: Run) -> None:
    """ProfilerStep#k (Kineto clock) ends inside the optimizer hook of iteration k (time.time_ns:
    the hook's start, and the moment prof.step() returned), to within 1 ms."""
    (hooks_file,) = trainer_run.raw_dir.glob("steps-rank0-pid*.json")
    data = orjson.loads(hooks_file.read_bytes())
    hooks, done = data["hook_ns"], data["step_done_ns"]
    assert len(hooks) == STEPS and sorted(done) == ["2", "3"]
    marker = {s["step"]: s for s in trainer_run.table("steps").to_pylist()
              if s["source"] == "marker"}
    for k in (2, 3):
        assert hooks[k] - 1_000_000 <= marker[k]["end"] <= done[str(k)] + 1_000_000


def test_system_counters_on_run_clock(trainer_run: Run) -> None:
    m = trainer_run.manifest()
    rec = m["extra"]["record"]
    c = trainer_run.table("counters").to_pydict()
    names = set(c["name"])
    assert {"cpu.core0.usr", "cpu.core0.sys", "mem.used_bytes", "proc.rss_bytes",
            "net.rx_bytes", "proc.cpu_cores"} <= names
    ts = np.array(c["ts"])
    assert rec["start_ns"] <= ts.min() and ts.max() <= rec["end_ns"]
    assert c["ts"] == sorted(c["ts"])


def test_stack_samples(trainer_run: Run) -> None:
    samples = trainer_run.table("samples").to_pydict()
    stacks = trainer_run.table("stacks").to_pydict()
    assert "py-spy" in samples["source"]
    spy_funcs = {f for f, s in zip(stacks["function"], stacks["stack_id"], strict=True)
                 if s in {sid for sid, src in zip(samples["stack_id"], samples["source"],
                                                  strict=True) if src == "py-spy"}}
    assert "train" in spy_funcs
    assert set(samples["stack_id"]) == set(stacks["stack_id"])


BUSY_SLEEP = textwrap.dedent("""
    import sys, time, json
    marks = []
    time.sleep(1.5)  # perf attaches after the child has started
    for _ in range(3):
        t0 = time.time_ns()
        while time.time_ns() - t0 < 150_000_000:
            pass
        t1 = time.time_ns()
        time.sleep(0.15)
        marks.append((t0, t1, time.time_ns()))
    open(sys.argv[1], "w").write(json.dumps(marks))
""")


def test_perf_samples_align_within_1ms(tmp_path: Path) -> None:
    """cpu-clock samples only fire while the thread runs: none may fall in its sleeps."""
    marks_path = tmp_path / "marks.json"
    result = record([PY, "-c", BUSY_SLEEP, str(marks_path)], tmp_path / "a.run",
                    RecordOptions(collectors=("perf",), perf_hz=999))
    status = result.run.manifest()["collectors"]["perf"]["status"]
    if status != "ok":
        pytest.skip(f"perf {status}")
    pid = result.run.manifest()["extra"]["record"]["pid"]
    s = result.run.table("samples").to_pydict()
    ts = np.array([t for t, p, tid in zip(s["ts"], s["pid"], s["tid"], strict=True)
                   if p == pid and tid == pid])
    ms = 1_000_000
    for busy_start, busy_end, sleep_end in orjson.loads(marks_path.read_bytes()):
        assert ((ts > busy_start) & (ts < busy_end)).sum() > 5  # it ran (a busy host: a bit)
        asleep = (ts > busy_end + ms) & (ts < sleep_end - ms)
        assert asleep.sum() == 0


def test_monotonic_offset_maps_to_epoch() -> None:
    offset = monotonic_offset_ns()
    assert abs(time.clock_gettime_ns(time.CLOCK_MONOTONIC) + offset - time.time_ns()) < 1_000_000


@pytest.mark.parametrize(("code", "exit_code", "sig"), [
    ("raise SystemExit(3)", 3, None),
    ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", 137, "SIGKILL"),
])
def test_crash_leaves_incomplete_run(tmp_path: Path, code: str, exit_code: int,
                                     sig: str | None) -> None:
    result = record([PY, "-c", code], tmp_path / "c.run", RecordOptions(collectors=("system",)))
    assert result.exit_code == exit_code
    m = Run.open(tmp_path / "c.run").manifest()
    assert m["complete"] is False and m["signal"] == sig
    assert m["exit_status"] == (None if sig else exit_code)
    assert m["collectors"]["system"]["status"] == "ok"


def test_sigint_is_forwarded_and_collectors_flush(tmp_path: Path) -> None:
    out = tmp_path / "i.run"
    child = "import time\nprint('ready', flush=True)\ntime.sleep(30)"
    proc = subprocess.Popen([PY, "-m", "perfswarm.cli.main", "record", "--quiet", "--out",
                             str(out), "--collectors", "system", "--", PY, "-c", child],
                            stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    os.kill(proc.pid, signal.SIGINT)
    assert proc.wait(timeout=60) == 130
    m = Run.open(out).manifest()
    assert m["signal"] == "SIGINT" and m["complete"] is False
    assert Run(out).table("counters").num_rows > 0


def test_bad_input_is_one_error(tmp_path: Path) -> None:
    with pytest.raises(PerfswarmError, match="no-such-program-xyz: command not found"):
        record(["no-such-program-xyz"], tmp_path / "x.run", RecordOptions())
    with pytest.raises(PerfswarmError, match="unknown bogus"):
        record([PY, "-c", "pass"], tmp_path / "y.run", RecordOptions(collectors=("bogus",)))
    assert not (tmp_path / "y.run").exists()
    assert parse_steps("5:10") == (5, 10)
    for bad in ("5", "a:b", "1:0", "-1:3"):
        with pytest.raises(PerfswarmError, match="SKIP:COUNT"):
            parse_steps(bad)


PERF_SCRIPT = """\
python  4242/4243  3836.874878123:
\tffffffff8226633f io_schedule ([kernel.kallsyms])
\t    7f7e7eaf2ad7 PyEval_EvalFrame (/usr/lib/libpython3.11.so)

python  4242/4242  3836.875358000:
\t    55d0c0ffee00 [unknown] ([unknown])
"""


def test_parse_perf_script() -> None:
    a, b = perf.parse_script(PERF_SCRIPT, Path("perf.data"))
    assert (a.pid, a.tid, a.mono_ns) == (4242, 4243, 3836874878123)
    assert a.frames == [("io_schedule", "[kernel.kallsyms]", 0xffffffff8226633f - (1 << 64)),
                        ("PyEval_EvalFrame", "/usr/lib/libpython3.11.so", 0x7f7e7eaf2ad7)]
    assert (b.tid, b.frames) == (4242, [("[unknown]", "[unknown]", 0x55d0c0ffee00)])


def test_parse_pyspy_raw() -> None:
    text = ('process 7:"python -c x;y";thread (0x1F);<module> (t.py:3);f (pkg/m.py:10) 12\n'
            'process 7:"python";thread (8): MainThread;g (a.py:1) 2\n'
            "garbage\n")
    f, g = pystacks.parse_raw(text, Path("pystacks.txt"))
    assert (g.tid, g.frames, g.count) == (8, (("g", "a.py", 1),), 2)
    assert (f.pid, f.tid, f.count) == (7, 0x1F, 12)
    assert f.frames == (("f", "pkg/m.py", 10), ("<module>", "t.py", 3))


def test_cpu_fractions() -> None:
    from psutil._pslinux import scputimes

    zero = [0.0] * len(scputimes._fields)
    a = scputimes(*zero)
    b = scputimes(*[{"user": 3.0, "system": 1.0, "idle": 4.0, "iowait": 2.0}.get(f, 0.0)
                    for f in scputimes._fields])
    assert cpu_fractions([a], [b]) == {"cpu.core0.usr": 0.3, "cpu.core0.sys": 0.1,
                                       "cpu.core0.iowait": 0.2}


class _Counting(Sampler):
    name = "fake"

    def read(self) -> dict[str, float]:
        return {"gpu1.x": 2.5, "y": 1.0}


def test_sampler_with_fake_clock(tmp_path: Path) -> None:
    ticks = iter(range(1000, 10_000, 1000))
    s = _Counting(tmp_path, 10.0, clock=lambda: next(ticks))
    with s.path.open("wb") as out:
        s.sample_once(out)
        s.sample_once(out)
        out.write(b'{"ts": 3000, "val')  # a torn last line, as after a crash
    assert read_jsonl(s.path) == [(1000, "gpu1.x", 1, 2.5), (1000, "y", -1, 1.0),
                                  (2000, "gpu1.x", 1, 2.5), (2000, "y", -1, 1.0)]
    assert s.count() == 2


def test_tree_pids_walks_descendants() -> None:
    from perfswarm.record.system import tree_pids

    child = subprocess.Popen([PY, "-c", "import subprocess, sys; subprocess.run(['sleep', '5'])"])
    try:
        deadline = time.monotonic() + 20
        while len(tree_pids(child.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        pids = tree_pids(child.pid)
        assert pids[0] == child.pid and len(pids) == 2
    finally:
        child.kill()
        child.wait()


def test_strace_syscalls_become_events(tmp_path: Path) -> None:
    child = "import os, time\ntime.sleep(1.0)\nfor _ in range(5):\n    os.write(1, b'.')\n"
    result = record([PY, "-c", child], tmp_path / "s.run", RecordOptions(collectors=("strace",)))
    status = result.run.manifest()["collectors"]["strace"]["status"]
    if status != "ok":
        pytest.skip(f"strace {status}")
    rec = result.run.manifest()["extra"]["record"]
    ev = result.run.table("events").to_pydict()
    writes = [(ts, a) for ts, n, k, a in zip(ev["ts"], ev["name"], ev["kind"], ev["args"],
                                              strict=True) if n == "write" and k == "syscall"]
    assert [orjson.loads(a) for _, a in writes] == [{"args": '1, ".", 1', "result": "1"}] * 5
    assert all(rec["start_ns"] < ts < rec["end_ns"] for ts, _ in writes)


def test_parse_strace_pairs_unfinished_calls() -> None:
    from perfswarm.record.strace import parse

    text = ('101 1700000000.000100 read(3, "ab", 4096) = 2 <0.000012>\n'
            "102 1700000000.000200 futex(0x1, FUTEX_WAIT, 0, NULL <unfinished ...>\n"
            "102 1700000000.000900 <... futex resumed>) = 0 <0.000700>\n"
            "101 1700000000.001000 +++ exited with 0 +++\n")
    read, futex = parse(text, Path("strace.txt"))
    assert (read.tid, read.ts_ns, read.dur_ns, read.name) == (101, 1700000000000100000, 12000,
                                                              "read")
    assert (futex.tid, futex.ts_ns, futex.dur_ns) == (102, 1700000000000200000, 700000)
    assert orjson.loads(futex.args) == {"args": "0x1, FUTEX_WAIT, 0, NULL", "result": "0"}
