"""record against signals (issue 23): a child that ignores Ctrl-C is killed after a grace
period and recorded incomplete; a SIGKILLed recorder takes its child with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from perfswarm.cli.main import main
from perfswarm.recorder.recover import STATE, leftovers, recover
from perfswarm.recorder.session import STOP_GRACE_S, Child, RecordOptions, record
from perfswarm.trace.store import Run, new_manifest

PY = sys.executable
CLI = [PY, "-m", "perfswarm.cli.main", "record", "--quiet", "--collectors", "system"]
STUBBORN = ("import os, signal, time\n"
            "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "print(os.getpid(), flush=True)\n"
            "time.sleep(60)")


def _gone(pid: int, within: float) -> bool:
    """Whether `pid` has exited (or is a zombie nobody reaped yet) within `within` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.05)
    return False


def _recording(out: Path) -> tuple[subprocess.Popen[bytes], int]:
    """`perfswarm record` of the stubborn child, once it runs; the recorder and the child's pid."""
    proc = subprocess.Popen([*CLI, "--out", str(out), "--", PY, "-c", STUBBORN],
                            stdout=subprocess.PIPE)
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def test_a_child_ignoring_ctrl_c_is_killed_and_recorded_incomplete(tmp_path: Path) -> None:
    out = tmp_path / "s.run"
    proc, child = _recording(out)
    os.kill(proc.pid, signal.SIGINT)
    assert proc.wait(timeout=60) == 128 + signal.SIGKILL
    assert _gone(child, 1)
    m = Run.open(out).manifest()
    assert m["complete"] is False and m["signal"] == "SIGKILL"
    assert {"source": "record", "count": 1, "what": (
        f"interrupted by SIGINT; the child did not stop within {STOP_GRACE_S:g} s (or it was "
        "asked twice) and was killed")} in m["warnings"]


def test_a_killed_recorder_takes_its_child_along(tmp_path: Path) -> None:
    proc, child = _recording(tmp_path / "k.run")
    assert not _gone(child, 0.2)
    proc.kill()
    proc.wait(timeout=10)
    assert _gone(child, 5)


def test_what_a_killed_recorder_left_becomes_an_incomplete_run(tmp_path: Path) -> None:
    out = tmp_path / "k.run"
    proc, child = _recording(out)
    time.sleep(0.5)  # a few sampler readings
    assert leftovers(tmp_path) == []  # held by the live recorder
    proc.kill()
    proc.wait(timeout=10)
    assert _gone(child, 5)
    [raw] = leftovers(tmp_path)
    assert main(["recover", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.run"]  # the recording is gone
    run = Run.open(out)
    m = run.manifest()
    assert m["complete"] is False and m["exit_status"] is None and m["signal"] is None
    assert m["command"] == [PY, "-c", STUBBORN]
    assert m["warnings"][-1]["what"].startswith("recovered: the recorder was killed")
    assert run.table("counters").num_rows > 0
    assert raw.name.startswith(".k.run.")


def test_recover_names_a_missing_or_plain_directory(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """A mistyped directory is one line and exit 2 (it had exited 0 saying nothing, as if
    nothing were left to recover); a directory with nothing left says so."""
    plain = tmp_path / "k.out"
    plain.write_text("x")
    for path, why in ((tmp_path / "nope", "no such directory"), (plain, "not a directory")):
        assert main(["recover", str(path)]) == 2
        assert capsys.readouterr().err == f"perfswarm: error: {path}: {why}\n"
    assert main(["recover", str(tmp_path)]) == 0
    assert capsys.readouterr().out == f"no recording left to recover in {tmp_path}\n"


def test_a_recovered_recording_says_which_samplers_never_wrote(tmp_path: Path) -> None:
    """perf and py-spy write their samples as they stop: a killed recorder's perf.data is
    unfinished and py-spy's file never written, which had read as ok with no samples."""
    raw = tmp_path / ".k.run.abcd1234.recording"
    raw.mkdir()
    manifest = new_manifest(["python", "train.py"])
    manifest["collectors"] = {"perf": {"status": "ok", "files": ["perf.data"]},
                              "pystacks": {"status": "ok", "files": ["pystacks.log"]},
                              "system": {"status": "ok", "files": ["system.jsonl"]}}
    (raw / "system.jsonl").write_bytes(b'{"ts": 5, "values": {"mem.used_bytes": 1.0}}\n')
    (raw / "pystacks.log").write_text("")
    (raw / STATE).write_bytes(orjson.dumps({"manifest": manifest, "start_ns": 1,
                                            "perf_exe": None}))
    run = recover(raw)
    status = {k: v["status"] for k, v in run.manifest()["collectors"].items()}
    assert status == {
        "perf": "failed: recovered: the recorder was killed before perf wrote its samples "
                "(raw/perf.data)",
        "pystacks": "failed: recovered: the recorder was killed before py-spy wrote its "
                    "samples (raw/pystacks.txt)",
        "system": "ok"}
    assert run.table("counters").num_rows == 1 and not raw.exists()


def test_the_recorded_command_starts_as_it_would_bare(tmp_path: Path) -> None:
    """What a process inherits across exec (ignored and blocked signals, CPU affinity,
    niceness) is the same recorded as bare. The launcher that holds the command before its
    exec is a Python, which ignores SIGPIPE and SIGXFSZ as it starts, and exec keeps an ignored
    signal: `yes | head -n 1` then ended by EPIPE, saying so, not silently by SIGPIPE
    (`subprocess` restores both to their default before its exec, as the bare run has them)."""
    probe = ["sh", "-c", "grep -E '^(SigBlk|SigIgn|Cpus_allowed_list):' /proc/self/status; "
             "nice; yes | head -n 1"]
    bare = subprocess.run(probe, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          check=True).stdout
    log = tmp_path / "child.txt"
    with log.open("wb") as out:
        result = record(probe, tmp_path / "p.run", RecordOptions(collectors=("system",)),
                        child=Child(output=out))
    assert result.exit_code == 0
    assert bare.splitlines()[-1] == b"y"  # yes killed by SIGPIPE, silently
    assert log.read_bytes() == bare
