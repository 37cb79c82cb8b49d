"""record --pid (attach to a running process), --perf-events, and the system sampler's event,
disk and clock counters on real recordings."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import orjson
import psutil
import pytest

from perfswarm.cli.main import main
from perfswarm.recorder import perf
from perfswarm.recorder.attach import NO_TORCH, attach
from perfswarm.recorder.session import RecordOptions, Status
from perfswarm.trace.readers.perf import event_counters, parse_script

PY = sys.executable
# Waits for a line on stdin (sent once the recorder is attached), then page-faults PAGES fresh
# pages and ping-pongs 300 times with a thread over pipes; prints its own counts of both.
WORKER = textwrap.dedent("""
    import mmap, os, resource, sys, threading, time
    sys.stdin.readline()
    r = lambda: resource.getrusage(resource.RUSAGE_SELF)
    before = r()
    m = mmap.mmap(-1, 3000 * 4096)
    for i in range(0, len(m), 4096):
        m[i] = 1
    faulted = r().ru_minflt - before.ru_minflt
    a, b = os.pipe(), os.pipe()
    def echo():
        for _ in range(300):
            os.write(b[1], os.read(a[0], 1))
    t = threading.Thread(target=echo)
    t.start()
    for _ in range(300):
        os.write(a[1], b"x")
        os.read(b[0], 1)
    t.join()
    after = r()
    print(faulted, after.ru_nvcsw - before.ru_nvcsw, after.ru_minflt + after.ru_majflt, flush=True)
    time.sleep(0.3)
""")


def _refused_here(event: str) -> bool:
    """Whether this machine's perf counts `event` (read from perf stat directly)."""
    out = subprocess.run(["perf", "stat", "-x,", "-e", event, "--", "true"], text=True,
                         capture_output=True, check=False).stderr
    return f"<not supported>,,{event}" in out


def _last(counters: dict[str, list[object]], name: str) -> float:
    values = [v for n, v in zip(counters["name"], counters["value"], strict=True) if n == name]
    assert values, name
    return float(values[-1])  # type: ignore[arg-type]


@pytest.mark.skipif(not Path("/usr/bin/perf").exists(), reason="needs perf")
def test_attach_counts_the_process_events(tmp_path: Path) -> None:
    worker = subprocess.Popen([PY, "-c", WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    assert worker.stdin is not None and worker.stdout is not None
    events = perf.parse_events("page-faults,context-switches,cycles@1000000")

    def go(status: Status) -> None:  # perf takes a few 100 ms to attach to every thread
        if status.elapsed_s > 1.0 and not worker.stdin.closed:  # type: ignore[union-attr]
            worker.stdin.write("go\n")  # type: ignore[union-attr]
            worker.stdin.close()  # type: ignore[union-attr]

    try:
        result = attach(worker.pid, tmp_path / "w.run",
                        RecordOptions(collectors=("torch", "system", "perf"), perf_events=events),
                        None, go)
        faulted, switches, faults_total = map(int, worker.stdout.read().split())
    finally:
        worker.kill()
        worker.wait()
    m = result.run.manifest()
    rec = m["extra"]["record"]
    assert rec["attached"] == {"pid": worker.pid, "duration_s": None, "ended": "process exited"}
    assert m["complete"] and result.exit_code == 0
    assert m["collectors"]["torch"]["status"] == f"unavailable: {NO_TORCH}"
    assert m["collectors"]["perf"]["status"] == "ok"
    assert m["command"] == [PY, "-c", WORKER]
    refused = ["cycles"] if _refused_here("cycles") else []
    assert rec["perf_events"]["recorded"] == [
        "page-faults", "context-switches", *(["cycles"] if not refused else [])]
    assert list(rec["perf_events"]["refused"]) == refused
    assert [w["what"].split(":")[0] for w in m["warnings"] if w["source"] == "perf"] == [
        f"event {e} not recorded" for e in refused]
    c = result.run.table("counters").to_pydict()
    # perf counts every fault (period 1) from when it attached: those of touching the pages
    # after the go, and no more than the process's own count over its whole life
    assert faulted > 1000 and faulted <= _last(c, "perf.page-faults") <= faults_total
    assert _last(c, "perf.context-switches") >= switches >= 300  # each blocking read sleeps
    assert _last(c, "sys.ctxt") >= switches  # the host's switches include the process's
    assert _last(c, "sys.intr") > 0 and _last(c, "sys.softirq") >= 0
    names = set(c["name"])
    assert {"cpu.core0.steal", "cpu.core0.mhz", "proc.rss_bytes"} <= names
    ts = c["ts"]
    assert rec["start_ns"] <= min(ts) and max(ts) <= rec["end_ns"]  # type: ignore[operator]


def test_attach_for_a_duration_leaves_the_process_running(tmp_path: Path) -> None:
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        while psutil.Process(sleeper.pid).cmdline() != ["sleep", "30"]:  # forked, not yet exec'd
            time.sleep(0.005)
        t0 = time.monotonic()
        result = attach(sleeper.pid, tmp_path / "s.run",
                        RecordOptions(collectors=("system",), hz=50.0), 0.4)
        took = time.monotonic() - t0
        assert sleeper.poll() is None  # not ours to stop
    finally:
        sleeper.kill()
        sleeper.wait()
    m = result.run.manifest()
    assert m["extra"]["record"]["attached"]["ended"] == "duration" and took >= 0.4
    assert m["command"] == ["sleep", "30"] and "torch" not in m["collectors"]
    c = result.run.table("counters").to_pydict()
    assert _last(c, "proc.count") == 1.0


# Waits for a line on stdin (sent once strace traces it), looks up a file named for the test,
# then runs another program in its place.
EXECS_LATER = textwrap.dedent("""
    import os, sys
    sys.stdin.readline()
    os.path.exists("/perfswarm-before-its-exec")
    os.execv("/bin/true", ["true"])
""")


def test_a_process_attached_by_pid_keeps_its_calls_before_a_later_exec(tmp_path: Path) -> None:
    """strace attached by pid: the process was never held before an exec of the recorder's,
    so its calls before the exec it runs later are its own (they had been cut there)."""
    worker = subprocess.Popen([PY, "-c", EXECS_LATER], stdin=subprocess.PIPE, text=True)
    assert worker.stdin is not None

    def go(status: Status) -> None:
        if "strace" in status.active and not worker.stdin.closed:  # type: ignore[union-attr]
            worker.stdin.write("go\n")  # type: ignore[union-attr]
            worker.stdin.close()  # type: ignore[union-attr]

    try:
        result = attach(worker.pid, tmp_path / "x.run", RecordOptions(collectors=("strace",)),
                        10.0, go)
    finally:
        worker.kill()
        worker.wait()
    status = result.run.manifest()["collectors"]["strace"]["status"]
    if status != "ok":
        pytest.skip(f"strace {status}")
    ev = result.run.table("events").to_pydict()
    calls = sorted((ts, n, a) for ts, n, k, a in zip(ev["ts"], ev["name"], ev["kind"],
                                                      ev["args"], strict=True) if k == "syscall")
    looked = [ts for ts, _, a in calls if "/perfswarm-before-its-exec" in a]
    execs = [ts for ts, n, a in calls if n == "execve" and "/bin/true" in a]
    assert len(looked) == 1 and len(execs) == 1 and looked[0] < execs[0]


def test_perf_script_events_become_counters() -> None:
    text = ("5/5   10.000000000:          1      page-faults/period=1,call-graph=no/: \n"
            "\t7f00 memset (/libc.so)\n\n"
            "5/6   10.000000100:     250000 cpu-clock: \n\tffff0001 f ([kernel.kallsyms])\n\n"
            "5/5   10.040000000:          3      page-faults/period=3,call-graph=no/:  "
            "7f01 mmap_ass_subscript (/lib/python3.11.so)\n"
            "5/5   10.070000000:          1      page-faults/period=1,call-graph=no/: \n\n"
            "5/5   10.150000000:          2      context-switches: \n\n")
    samples = parse_script(text, Path("perf.data"))
    assert samples[2].frames == [("mmap_ass_subscript", "/lib/python3.11.so", 0x7f01)]
    assert [(s.event, s.period, len(s.frames)) for s in samples] == [
        ("page-faults", 1, 1), ("cpu-clock", 250000, 1), ("page-faults", 3, 1),
        ("page-faults", 1, 0), ("context-switches", 2, 0)]
    # 50 ms intervals: 10.00 and 10.04 share one (its last point), 10.07 and 10.15 their own
    assert event_counters(samples, 1000, 50_000_000) == [
        (10_040_001_000, "perf.page-faults", -1, 4.0),
        (10_070_001_000, "perf.page-faults", -1, 5.0),
        (10_150_001_000, "perf.context-switches", -1, 2.0)]
    old = parse_script(Path(__file__).with_name("data").joinpath(
        "perf_script.txt").read_text(), Path("p"))
    assert old and {s.event for s in old} == {"cpu-clock"}


def test_parse_events() -> None:
    assert perf.parse_events("page-faults, cycles,cs@10,") == (
        ("page-faults", 1), ("cycles", perf.HARDWARE_PERIOD), ("cs", 10))


@pytest.mark.parametrize(("argv", "why"), [
    (["--pid", "999999999"], "--pid 999999999: no such process"),
    (["--pid", "1", "--", "true"], "give either a command after -- or --pid PID"),
    ([], "no command to record: give it after --"),
    (["--duration", "2", "--", "true"], "--duration goes with --pid"),
    (["--perf-events", "cycles;rm", "--", "true"], "--perf-events cycles;rm: not a perf event"),
    (["--perf-events", "cs@0", "--", "true"], "--perf-events cs@0: PERIOD must be a positive"),
    (["--pid", "1", "--duration", "-1"], "--duration -1.0: must be a positive"),
])
def test_attach_bad_input(argv: list[str], why: str, tmp_path: Path,
                          capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bad.run"
    assert main(["record", "-q", "-o", str(out), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert why in err and len(err.splitlines()) == 1, err
    assert not out.exists() and not list(tmp_path.iterdir())


def test_manifest_json_is_plain(tmp_path: Path) -> None:
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        attach(sleeper.pid, tmp_path / "p.run", RecordOptions(collectors=("system",)), 0.1)
    finally:
        sleeper.kill()
        sleeper.wait()
    data = orjson.loads((tmp_path / "p.run" / "manifest.json").read_bytes())
    assert data["extra"]["record"]["attached"]["duration_s"] == 0.1
