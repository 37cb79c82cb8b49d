"""Faults: the workload SIGKILLed while it is recorded, perfswarm itself SIGKILLed while it
imports, and a full disk. Whatever happens, a Run is whole or absent, nothing half-written is
left where a reader looks, and nothing already recorded is lost.

Kill points come from a seeded random list: which phase of the workload, and how far into it
(a fraction of the measured length of the thing killed), so runs are repeatable in kind.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import os
import random
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import psutil
import pytest

from perfswarm.cli.main import main
from perfswarm.errors import PerfswarmError
from perfswarm.recorder import session, tools
from perfswarm.recorder.build import Recording, build_run
from perfswarm.recorder.session import RecordOptions, record
from perfswarm.recorder.tools import ToolCollector
from perfswarm.trace import synthetic
from perfswarm.trace.ingest import ImportOptions, import_traces
from perfswarm.trace.store import Run, new_manifest, sweep_partials

PY = sys.executable
CLI = [PY, "-m", "perfswarm.cli.main"]


def _wait_for(found: Callable[[], bool], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not found():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(0.005)


def _digest(run: Path) -> dict[str, str]:
    """Every file of a Run directory and its hash."""
    return {str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run.rglob("*")) if p.is_file()}


def _leftovers(parent: Path, name: str) -> list[Path]:
    return sorted(parent.glob(f".{name}.*"))


# -- the workload killed while recording -----------------------------------------------------
TRAINER = ["-m", "perfswarm.workloads.trainer", "--steps", "14", "--batch-size", "8",
           "--loader-delay-ms", "40"]
SKIP, COUNT = 2, 3


def _trainer_pid() -> int | None:
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if "perfswarm.workloads.trainer" in " ".join(child.cmdline()):
                return child.pid
    return None


def _recording_files(out: Path, prefix: str) -> bool:
    return any(True for d in out.parent.glob(f".{out.name}.*.recording")
               for _ in d.glob(f"{prefix}-rank0-pid*.json"))


PHASES: dict[str, Callable[[Path], bool]] = {
    # the child is running python, torch not imported yet (that takes a second or more)
    "before torch": lambda out: True,
    # the profiler is on: the execution trace of the first profiled step is being written
    "profiling window": lambda out: _recording_files(out, "et"),
    # the Kineto trace has been exported, the loop goes on
    "after the window": lambda out: _recording_files(out, "torch"),
}
# after the phase begins, the kill waits this long (s): seeded, so the list is the same each run
KILLS = [(phase, round(random.Random(f"{phase}-{i}").uniform(0.0, 0.15), 3))
         for i in range(3) for phase in PHASES]


def _kill_workload(out: Path, phase: str, delay: float) -> threading.Thread:
    def killer() -> None:
        pids: list[int] = []

        def found() -> bool:
            pid = _trainer_pid()
            if pid is not None:
                pids.append(pid)
            return bool(pids)

        _wait_for(found)
        _wait_for(lambda: PHASES[phase](out))
        time.sleep(delay)
        # The pid found first: it stays the trainer's across the launcher's exec, while the
        # cmdline, read again during that exec, can be briefly empty (the kill then went nowhere).
        with contextlib.suppress(ProcessLookupError):
            os.kill(pids[0], signal.SIGKILL)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    return thread


def _check_killed_recording(out: Path, capsys: pytest.CaptureFixture[str]) -> Run:
    """The Run opens, says how the child ended, and info/analyze work on it."""
    run = Run.open(out)
    m = run.manifest()
    assert (m["complete"], m["signal"], m["exit_status"]) == (False, "SIGKILL", None)
    assert all(c["status"] == "ok" or c["status"].startswith(("unavailable: ", "failed: "))
               for c in m["collectors"].values())
    assert all((run.raw_dir / f).is_file() for c in m["collectors"].values() for f in c["files"])
    assert _leftovers(out.parent, out.name) == []
    capsys.readouterr()
    assert main(["info", str(out), "--json"]) == 0
    info = orjson.loads(capsys.readouterr().out)
    assert info["complete"] is False
    code = main(["analyze", str(out), "--json"])
    captured = capsys.readouterr()
    if info["events"]:
        assert code == 0 and orjson.loads(captured.out)["events"] == info["events"]
    elif info["counters"] or info["samples"]:  # killed before the profiler wrote its trace:
        assert code == 0 and orjson.loads(captured.out)["events"] == 0  # what the samplers saw
    else:  # nothing to analyze, said in one line
        assert code == 2 and captured.err.strip().endswith(
            "the Run has no events, samples or counters to analyze")
    return run


def _record_killed(tmp_path: Path, phase: str, delay: float) -> tuple[Path, int]:
    out = tmp_path / "killed.run"
    killer = _kill_workload(out, phase, delay)
    result = record([PY, *TRAINER], out, RecordOptions(skip=SKIP, steps=COUNT))
    killer.join(timeout=10)
    return out, result.exit_code


@pytest.mark.parametrize(("phase", "delay"), KILLS[:3])
def test_workload_killed_while_recording(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         phase: str, delay: float) -> None:
    out, code = _record_killed(tmp_path, phase, delay)
    assert code == 128 + signal.SIGKILL
    run = _check_killed_recording(out, capsys)
    torch = run.manifest()["collectors"]["torch"]["status"]
    if phase == "before torch":
        assert torch.startswith("unavailable: no step seen")
        assert run.table("events").num_rows == 0
    if phase == "after the window":  # the exported window is whole: its three marked steps
        steps = run.table("steps").to_pylist()
        assert [s["step"] for s in steps if s["source"] == "marker"] == [2, 3, 4]
        # the steps timed by the optimizer hook (kept live, so the kill loses none) lie outside
        hooked = [s["step"] for s in steps if s["source"] == "detected"]
        assert hooked and not set(hooked) & {2, 3, 4}


@pytest.mark.slow
@pytest.mark.parametrize(("phase", "delay"), KILLS[3:])
def test_workload_killed_more_points(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                     phase: str, delay: float) -> None:
    out, code = _record_killed(tmp_path, phase, delay)
    assert code == 128 + signal.SIGKILL
    _check_killed_recording(out, capsys)


HOLD = """
import ctypes, pathlib, signal, sys, time
libc = ctypes.CDLL(None, use_errno=True)
# PTRACE_SEIZE with PTRACE_O_TRACEEXIT: the tracee stops at its exit until the tracer lets go
if libc.ptrace(0x4206, int(sys.argv[1]), None, ctypes.c_void_p(0x40)) != 0:
    sys.exit(f"cannot trace: errno {ctypes.get_errno()}")
signal.signal(signal.SIGINT, lambda *_: (pathlib.Path(sys.argv[2]).write_text("x"), sys.exit(0)))
while True:
    time.sleep(1)
"""


class _HoldingTracer(ToolCollector):
    """A ptrace collector that never lets the child finish exiting (as py-spy can, when the
    SIGKILL lands while it has the child paused for a sample)."""

    name = "holder"
    tool = "python3"
    output = "holder.txt"
    ptrace = True

    def argv(self, pid: int) -> list[str]:
        return [PY, "-c", HOLD, str(pid), str(self.raw / self.output)]


def test_killed_child_held_by_a_tracer_is_freed(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    holders: list[_HoldingTracer] = []
    monkeypatch.setattr(session, "make_collectors", lambda names, raw, options: holders.append(
        _HoldingTracer(raw, 0)) or holders)
    child = "import os, signal, time\ntime.sleep(1.0)\nos.kill(os.getpid(), signal.SIGKILL)"
    done = threading.Event()

    def watchdog() -> None:  # without the fix record would wait forever: fail instead
        if not done.wait(60) and holders[0].proc is not None:
            holders[0].proc.kill()

    threading.Thread(target=watchdog, daemon=True).start()
    start = time.monotonic()
    result = record([PY, "-c", child], tmp_path / "h.run", RecordOptions(collectors=()))
    done.set()
    status = result.run.manifest()["collectors"]["holder"]["status"]
    if status.startswith("unavailable"):
        pytest.skip(f"no ptrace here: {status}")
    assert result.exit_code == 128 + signal.SIGKILL
    assert status == "ok"  # stopped with SIGINT: it wrote its output
    assert time.monotonic() - start < 30


def test_torn_collector_files_fail_only_their_collector(tmp_path: Path) -> None:
    """What a killed child or tool leaves (a sampler line cut short, strace garbage) fails
    that collector in the manifest, naming the file where the Run keeps it (raw/, not the
    recording's hidden folder, gone once the Run is built); the Run is built. An execution
    trace cut mid-write is a warning: the torch collector's traces and steps stand."""
    raw = tmp_path / "rec"
    raw.mkdir()
    (raw / "et-rank0-pid7.json").write_text('{"schema": "1.0.1", "nodes": [{"name": "[pyt')
    (raw / "system.jsonl").write_bytes(b'{"ts": 5, "values": {"mem.used_bytes": 1.0}}\n'
                                       b'{"ts": 6, "values": {"mem.u')
    (raw / "gpu.jsonl").write_bytes(b'{"ts": 5, "values": {"gpu0.util": "high"}}\n{}\n')
    (raw / "strace.txt").write_text("7 99999999999999999999.000001 read(3) = 1 <0.000001>\n")
    manifest = new_manifest(["x"])
    manifest["collectors"] = {n: {"status": "ok", "files": []}
                              for n in ("torch", "system", "gpu", "strace")}
    run = build_run(Recording(raw, manifest, None, 0), tmp_path / "t.run", force=False)
    status = {k: v["status"] for k, v in run.manifest()["collectors"].items()}
    assert status["system"] == "ok"  # only its last line was torn
    assert status["torch"] == "ok"
    [warning] = [w for w in run.manifest()["warnings"] if w["source"] == "torch"]
    assert warning["what"].startswith("execution trace unreadable, no op graph: "
                                      "raw/et-rank0-pid7.json (json): ")
    assert status["gpu"].startswith("failed: raw/gpu.jsonl (line 1): not a sampler")
    assert status["strace"] == ("failed: raw/strace.txt (line 1): time out of range: "
                                "99999999999999999999")
    assert run.table("counters").to_pylist() == [
        {"rank": -1, "ts": 5, "name": "mem.used_bytes", "device": -1, "value": 1.0}]
    assert sorted(p.name for p in run.raw_dir.iterdir()) == sorted(p.name for p in raw.iterdir())


@pytest.mark.parametrize(("name", "text", "why"), [
    ("steps-rank0-pid7.json", '{"rank": 0, "hook_ns": [1, 2', "JSONDecodeError"),
    ("steps-rank0-pid7.json", '{"rank": 0, "hook_ns": ["soon"]}', "ValueError"),
    ("steps-rank0-pid7.json", '[1, 2]', "TypeError"),
    ("steps-rank0-pid7.json", '{"rank": 0, "hook_ns": [1], "optimizer_ns": [5]}',
     "AttributeError"),
    ("steps-rank0-pid7.json", '{"rank": 0, "hook_ns": [1], "hook_loaded": [[1, 2]]}',
     "ValueError"),
    ("steps-rank0-pid7.live", "12\nlater\n", "ValueError"),
])
def test_bad_steps_file_fails_torch_only(tmp_path: Path, name: str, text: str,
                                         why: str) -> None:
    """A steps file that is not one (edited by hand, or not ours) fails the torch collector
    with the file named, next to a good one whose steps are kept; the Run is built."""
    raw = tmp_path / "rec"
    raw.mkdir()
    (raw / name).write_text(text)
    (raw / "steps-rank1-pid8.json").write_text('{"rank": 1, "hook_ns": [10, 20, 30]}')
    manifest = new_manifest(["x"])
    manifest["collectors"] = {"torch": {"status": "ok", "files": []}}
    run = build_run(Recording(raw, manifest, None, 0), tmp_path / "t.run", force=False)
    status = run.manifest()["collectors"]["torch"]["status"]
    assert status.startswith(f"failed: raw/{name} (steps): not a steps file: {why}(")
    assert [(s["rank"], s["step"], s["end"]) for s in run.table("steps").to_pylist()] == [
        (1, 1, 20), (1, 2, 30)]


# -- perfswarm killed while importing ---------------------------------------------------------
@pytest.fixture(scope="module")
def big_trace(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float, int]:
    """A synthetic trace, how long its import takes in this process, and its event count."""
    path = synthetic.write(tmp_path_factory.mktemp("big") / "big.json", 120_000)
    start = time.perf_counter()
    run = import_traces([path], path.with_suffix(".run"), ImportOptions(), ["t"])
    return path, time.perf_counter() - start, run.table("events", ["ts"]).num_rows


def _import_killed(trace: Path, out: Path, fraction: float, seconds: float,
                   *extra: str) -> int | None:
    """Start `perfswarm import`, SIGKILL it `fraction` of an import's length after its
    partial directory appears; its return code (-9 when the kill landed)."""
    proc = subprocess.Popen([*CLI, "import", str(trace), "-o", str(out), "-q", *extra])
    try:
        _wait_for(lambda: proc.poll() is not None
                  or any(out.parent.glob(f".{out.name}.*.partial")))
        time.sleep(fraction * seconds)
        proc.send_signal(signal.SIGKILL)
        return proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()


# the kill lands this far into the import (fractions of its in-process length), per case
FRACTIONS = [round(random.Random(i).uniform(0.02, 0.9), 3) for i in range(4)]


@pytest.mark.parametrize("streaming", ["never", "always"])
def test_import_killed_leaves_no_run(tmp_path: Path, big_trace: tuple[Path, float, int],
                                     streaming: str) -> None:
    trace, seconds, events = big_trace
    out = tmp_path / "k.run"
    outcomes = []
    for fraction in FRACTIONS[:2]:
        _import_killed(trace, out, fraction, seconds, "--streaming", streaming)
        if out.exists():  # it finished first: then the Run is whole
            assert Run.open(out).table("events", ["ts"]).num_rows == events
            out.rename(tmp_path / f"finished{len(outcomes)}.run")
            outcomes.append("whole")
        else:  # only the hidden partial directory and the claim's lock file, which no
            # reader lists and the next import of the path removes
            assert sorted(p.suffix for p in _leftovers(tmp_path, out.name)) == [".lock", ".partial"]
            outcomes.append("none")
    assert "none" in outcomes
    # the next import removes what the killed one left, and builds the Run
    run = import_traces([trace], out, ImportOptions(streaming=streaming),  # type: ignore[arg-type]
                        ["t"])
    assert run.table("events", ["ts"]).num_rows == events
    assert _leftovers(tmp_path, out.name) == []


def test_forced_reimport_killed_keeps_a_whole_run(tmp_path: Path,
                                                  big_trace: tuple[Path, float, int]) -> None:
    """--force over an existing Run, killed anywhere: the path holds the old Run, byte for
    byte, or the new one whole; never a mix, never nothing."""
    trace, seconds, events = big_trace
    out = tmp_path / "old.run"
    small = synthetic.write(tmp_path / "small.json", 2_000, seed=3)
    import_traces([small], out, ImportOptions(), ["t"])
    old = _digest(out)
    outcomes = set()
    for fraction in [*FRACTIONS, 1.2]:
        _import_killed(trace, out, fraction, seconds, "--force")
        now = _digest(out)
        if now == old:
            outcomes.add("old")
        else:
            assert Run.open(out).table("events", ["ts"]).num_rows == events
            outcomes.add("new")
            import_traces([small], out, ImportOptions(force=True), ["t"])
            assert _digest(out) == old  # the same input, the same bytes
    assert "old" in outcomes
    sweep_partials(out)
    assert _leftovers(tmp_path, out.name) == []


def test_sweep_spares_a_live_import(tmp_path: Path) -> None:
    partial = tmp_path / ".r.run.abc.partial"
    partial.mkdir()
    fd = os.open(partial, os.O_RDONLY)
    import fcntl

    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        assert sweep_partials(tmp_path / "r.run") == [] and partial.is_dir()
    finally:
        os.close(fd)
    assert sweep_partials(tmp_path / "r.run") == [partial] and not partial.exists()


# -- a full disk -------------------------------------------------------------------------------
def _fsize_limit(limit: int) -> Callable[[], None]:
    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of death
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


@pytest.mark.parametrize("streaming", ["never", "always"])
def test_file_size_limit_is_one_error(tmp_path: Path, big_trace: tuple[Path, float, int],
                                      streaming: str) -> None:
    """Writes past RLIMIT_FSIZE fail with EFBIG (portable: no mount, no root), a stand-in
    for a full disk on every write path: one line, exit 2, the old Run untouched."""
    trace, _, _ = big_trace
    out = tmp_path / "old.run"
    import_traces([synthetic.write(tmp_path / "small.json", 2_000)], out, ImportOptions(), ["t"])
    old = _digest(out)
    for target, force in ((tmp_path / "new.run", []), (out, ["--force"])):
        proc = subprocess.run([*CLI, "import", str(trace), "-o", str(target), "-q",
                               "--streaming", streaming, *force], capture_output=True, text=True,
                              preexec_fn=_fsize_limit(1 << 20), check=False)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1, proc.stderr
        assert lines[0].startswith(f"perfswarm: error: {target}")
        assert lines[0].endswith("(File too large)")
    assert not (tmp_path / "new.run").exists()
    assert _digest(out) == old
    assert _leftovers(tmp_path, "new.run") == _leftovers(tmp_path, "old.run") == []


@contextlib.contextmanager
def _tmpfs(size: str) -> Iterator[Path]:
    """A small tmpfs (needs root and a mount namespace that allows it; else skip)."""
    with tempfile.TemporaryDirectory() as mount_point:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                               mount_point], capture_output=True, check=False)
        if done.returncode:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
        try:
            yield Path(mount_point)
        finally:
            subprocess.run(["umount", mount_point], check=True)


def test_full_disk_import(tmp_path: Path, big_trace: tuple[Path, float, int]) -> None:
    trace, _, _ = big_trace
    with _tmpfs("4m") as disk:
        out = disk / "full.run"
        code = subprocess.run([*CLI, "import", str(trace), "-o", str(out), "-q"],
                              capture_output=True, text=True, check=False)
        lines = code.stderr.strip().splitlines()
        assert code.returncode == 2 and len(lines) == 1, code.stderr
        assert lines[0].startswith(f"perfswarm: error: {out}")
        assert lines[0].endswith("(No space left on device)")
        assert list(disk.iterdir()) == []


def test_full_disk_out_of_core_merge(tmp_path: Path, big_trace: tuple[Path, float, int]) -> None:
    """DuckDB's own writes (its sort spills, its COPY) hitting a full disk: the same one line."""
    from perfswarm.trace import merge, stream
    from perfswarm.trace.build import write_tables
    from perfswarm.trace.kineto import ReadOptions
    from perfswarm.trace.store import creating

    trace, _, _ = big_trace
    _, spill, _, _ = stream.spill_trace(trace, 0, ReadOptions(), tmp_path / "spill")
    with _tmpfs("1m") as disk:
        out = disk / "m.run"
        with pytest.raises(PerfswarmError) as err, creating(out) as run:
            (run.path / ".scratch").mkdir()
            write_tables(run, merge.merge(run, [spill], [0], [0], run.path / ".scratch", "512MB"))
        assert str(err.value) == f"{out}: cannot write (No space left on device)"
        assert list(disk.iterdir()) == []


FILL = """
import sys, time
time.sleep(0.5)  # a few sampler readings first
with open(sys.argv[1], "wb") as f:  # then the disk fills up
    try:
        while True:
            f.write(b"x" * (1 << 16))
            f.flush()
    except OSError:
        pass
"""


def test_full_disk_record_keeps_raw_files(tmp_path: Path) -> None:
    """The disk fills while recording: the Run cannot be built, the error says so in one
    line, and the recording's raw files stay where the collectors wrote them."""
    with _tmpfs("2m") as disk:
        out = disk / "r.run"
        with pytest.raises(PerfswarmError) as err:
            record([PY, "-c", FILL, str(disk / "filler")], out,
                   RecordOptions(collectors=("system",)))
        message = str(err.value)
        assert "\n" not in message and "No space left on device" in message
        (kept,) = disk.glob(".r.run.*.recording")
        assert message.endswith(f"the recording's raw files are kept in {kept}")
        assert not out.exists() and not list(disk.glob("*.partial"))
        assert (kept / "system.jsonl").stat().st_size > 0


class _Quitter(ToolCollector):
    """A tool that writes py-spy's closing lines and exits at once, without output."""

    name = "quitter"
    tool = "python3"
    output = "quitter.txt"

    def argv(self, pid: int) -> list[str]:
        return [PY, "-c", "print(\"py-spy> Wrote raw flamegraph data to 'x'. Samples: 0 Errors: "
                "191\"); print('py-spy> You can use the flamegraph.pl script to generate a "
                "SVG'); raise SystemExit(1)"]


def test_a_failed_tool_says_its_error_not_its_last_hint(tmp_path: Path) -> None:
    """py-spy's count of errors comes a line before its closing flamegraph hint: the failure
    names the count (it had quoted the hint)."""
    tool = _Quitter(tmp_path, 20)
    tool.start(os.getpid())
    _wait_for(lambda: tool.proc is None or tool.proc.poll() is not None)
    tool.stop()
    state = tool.status()["status"]
    assert "Samples: 0 Errors: 191" in state and "flamegraph.pl" not in state


def test_spawned_ranks_keep_their_traces_rank(tmp_path: Path) -> None:
    """torch.multiprocessing.spawn's ranks have no RANK: the recorder names each stepping
    process its next free rank (1 and 2 here), while their traces say 0 and 1
    (distributedInfo, the real gloo pair of tests/data). Every table takes the trace's rank:
    the steps files' had made a phantom rank 2 and a rank 1 of two processes' steps."""
    raw = tmp_path / "rec"
    raw.mkdir()
    data = Path(__file__).parent / "data"
    hooks = {}
    for trace_rank, (file_rank, pid) in enumerate(((2, 8), (1, 7))):
        text = gzip.decompress((data / f"ddp_gloo_rank{trace_rank}.pt.trace.json.gz")
                               .read_bytes())
        trace = orjson.loads(text)
        (raw / f"torch-rank{file_rank}-pid{pid}.pt.trace.json").write_bytes(text)
        base = trace["baseTimeNanoseconds"]
        ends = sorted(base + round((e["ts"] + e["dur"]) * 1000) for e in trace["traceEvents"]
                      if e.get("name", "").startswith("ProfilerStep#"))
        hooks[trace_rank] = ends + [ends[-1] + 10_000_000 * i for i in range(1, 4)]
        (raw / f"steps-rank{file_rank}-pid{pid}.json").write_bytes(orjson.dumps(
            {"rank": file_rank, "pid": pid, "hook_ns": hooks[trace_rank]}))
    manifest = new_manifest(["python", "spawn.py"])
    manifest["collectors"] = {"torch": {"status": "ok", "files": []}}
    run = build_run(Recording(raw, manifest, None, 0), tmp_path / "s.run", force=False)
    assert run.manifest()["ranks"] == [0, 1]
    steps = run.table("steps").to_pylist()
    assert {s["rank"] for s in steps} == {0, 1}
    for rank, ends in hooks.items():  # each rank's steps end at its own process's hooks
        mine = [s["end"] for s in steps if s["rank"] == rank and s["source"] == "detected"]
        assert mine and set(mine) <= set(ends)
    events = run.table("events", ["rank"]).column("rank").to_pylist()
    assert set(events) == {0, 1}


SPIN = ("import signal, sys\nopen(sys.argv[1], 'w').write('x')\n"
        "signal.signal(signal.SIGINT, lambda *_: sys.exit(0))\nwhile True: pass\n")


class _Spinner(ToolCollector):
    """A tool that spins from its start, as perf 6.1 -p does once a thread it follows exits:
    it writes its output, then burns a core until SIGINT."""

    name = "spinner"
    tool = Path(sys.executable).name
    output = "spin.out"
    spins = True

    def argv(self, pid: int) -> list[str]:
        assert self.exe is not None
        return [self.exe, "-c", SPIN, str(self.raw / self.output)]


def test_a_spinning_tool_is_started_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    """Watched every second, a tool using half a core or more is stopped and started again,
    writing a new file each time (perf had burnt a core for the rest of a recording, which the
    program shared its cores with); one that spins again at once stops for good after
    MAX_RESTARTS; every file it wrote is its. (The bar is lowered to a tenth of a core: at a
    load of 9 on 2 cores the spinner had got under half of one, and was left alone.)"""
    monkeypatch.setattr(tools, "SPIN_CORES", 0.1)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    spinner = _Spinner(tmp_path, 99)
    try:
        spinner.start(child.pid)
        start = time.monotonic()
        while time.monotonic() - start < 2.6:
            spinner.watch(child.pid, time.monotonic() - start)
            time.sleep(0.05)
        spinner.stop()
    finally:
        child.kill()
        child.wait()
    assert len(spinner.restarts) >= 1 and spinner.restarts == sorted(spinner.restarts)
    assert spinner.outputs[:2] == ["spin.out", "spin-2.out"]
    assert spinner.files() == [*spinner.outputs, "spinner.log"]
    assert spinner.status()["status"] == "ok"
    # a tool that does not spin is left alone
    quiet = _Spinner(tmp_path / "q", 99)
    (tmp_path / "q").mkdir()
    quiet.spins = False
    quiet.start(os.getpid())
    quiet.watch(os.getpid(), 0.0)
    time.sleep(1.1)
    quiet.watch(os.getpid(), 1.1)
    quiet.stop()
    assert quiet.restarts == [] and quiet.outputs == ["spin.out"]
