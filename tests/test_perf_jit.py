"""perf's samples named where perf alone cannot: oneDNN's JIT kernels from the perf map oneDNN
writes (ONEDNN_JIT_PROFILE=2), kept with the recording, and every library the program maps,
perf started before its exec."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from perfswarm.recorder.perf import PerfCollector, controllable, own_file
from perfswarm.recorder.session import Child, RecordOptions, record
from perfswarm.trace.readers.perf import jit_names, parse_script, read_perf_data
from perfswarm.trace.store import Run

PY = sys.executable
# one thread of oneDNN convolutions (forward and backward: JIT kernels), for about a second
CONV = textwrap.dedent("""
    import torch
    torch.set_num_threads(1)
    conv = torch.nn.Conv2d(3, 32, 3, padding=1)
    x = torch.randn(32, 3, 32, 32)
    for _ in range(60):
        conv(x).sum().backward()
""")


def test_jit_frames_named_from_the_kept_perf_map(tmp_path: Path) -> None:
    """A frame perf left unknown in /tmp/perf-PID.map takes the name of the span of the kept
    perf-PID.map that holds its address: [start, start + size); outside every span, or
    without a kept map, it stays unknown."""
    (tmp_path / "perf-7.map").write_text("7f0000001000 1000 jit_conv_fwd.0\n"
                                         "7f0000000000 ff0 jit reorder kernel.1\n"
                                         "not a map line\n")
    text = ("7/7 10.000000000:   10101010 cpu-clock: \n"
            "\t7f0000001000 [unknown] (/tmp/perf-7.map)\n"
            "\t7f0000001fff [unknown] (/tmp/perf-7.map)\n"
            "\t7f0000002000 [unknown] (/tmp/perf-7.map)\n"
            "\t7f0000000010 [unknown] (/tmp/perf-7.map)\n"
            "\t7f0000000ff0 [unknown] (/tmp/perf-7.map)\n"
            "\t7f0000001000 [unknown] (/tmp/perf-8.map)\n"
            "\t7f0000001000 [unknown] ([unknown])\n"
            "\t55 main (/bin/x)\n\n")
    samples = parse_script(text, Path("perf.data"))
    jit_names(samples, tmp_path)
    assert [f for f, _, _ in samples[0].frames] == [
        "jit_conv_fwd.0", "jit_conv_fwd.0", "[unknown]", "jit reorder kernel.1", "[unknown]",
        "[unknown]", "[unknown]", "main"]


@pytest.fixture(scope="module")
def conv_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    torch = pytest.importorskip("torch")
    if not torch.backends.mkldnn.is_available():
        pytest.skip("torch without oneDNN")
    out = tmp_path_factory.mktemp("jit") / "conv.run"
    result = record([PY, "-c", CONV], out, RecordOptions(collectors=("perf",), perf_hz=499),
                    child=Child(env={**os.environ, "ONEDNN_JIT_PROFILE": "2"}))
    Path(f"/tmp/perf-{result.run.manifest()['extra']['record']['pid']}.map").unlink(
        missing_ok=True)  # oneDNN's, left in /tmp for the program's user; the Run has a copy
    status = result.run.manifest()["collectors"]["perf"]["status"]
    if status != "ok":
        pytest.skip(f"perf {status}")
    return result.run


def _script(data: Path, *args: str) -> str:
    return subprocess.run(["perf", "script", "-i", str(data), *args], capture_output=True,
                          text=True, errors="replace", check=True).stdout


def test_onednn_jit_kernels_named(conv_run: Run) -> None:
    """Every sampled frame in oneDNN's JIT code has the name of its kernel, read here off the
    raw perf.data and the perf map the recorder copied out of /tmp into the recording."""
    pid = conv_run.manifest()["extra"]["record"]["pid"]
    kept = conv_run.path / "raw" / f"perf-{pid}.map"
    assert kept.is_file()
    spans = [(int(a, 16), int(a, 16) + int(n, 16), name) for a, n, name in
             (ln.split(" ", 2) for ln in kept.read_text().splitlines())]
    dso = f"/tmp/perf-{pid}.map"
    expected = sorted(
        next(name for lo, hi, name in spans if lo <= int(addr, 16) < hi)
        for addr in re.findall(rf"^\s*([0-9a-f]+) \S.* \({re.escape(dso)}\)$",
                               _script(conv_run.path / "raw" / "perf.data", "-F", "ip,sym,dso"),
                               re.MULTILINE))
    assert expected and all(name.startswith("jit_") for name in expected)
    # read again, /tmp's map gone: the names come from the kept copy
    assert not Path(dso).exists()
    again = read_perf_data("perf", conv_run.path / "raw" / "perf.data")
    assert sorted(f for s in again for f, m, _ in s.frames if m == dso) == expected
    s = conv_run.table("samples").to_pydict()
    st = conv_run.table("stacks").to_pydict()
    frames = [(sid, f) for sid, f, m in zip(st["stack_id"], st["function"], st["module"],
                                            strict=True) if m == dso]
    sampled: dict[int, int] = {}
    for sid in s["stack_id"]:
        sampled[sid] = sampled.get(sid, 0) + 1
    assert sorted(f for sid, f in frames for _ in range(sampled.get(sid, 0))) == expected


def test_perf_sees_the_exec(conv_run: Run) -> None:
    """perf was sampling before the program's exec: the executable and torch's libraries
    come as mappings made while it recorded, none of them read from /proc after the fact
    (where one mapped meanwhile was lost, its samples without module or function)."""
    pid = conv_run.manifest()["extra"]["record"]["pid"]
    mapped: dict[str, float] = {}  # path -> when it was last mapped (0: read from /proc)
    for when, path in re.findall(rf"(\d+\.\d+): PERF_RECORD_MMAP2 {pid}/{pid}: .* r-xp (\S+)$",
                                 _script(conv_run.path / "raw" / "perf.data",
                                         "--show-mmap-events"), re.MULTILINE):
        mapped[path] = max(mapped.get(path, 0.0), float(when))
    executable = os.path.realpath(PY)
    torch_cpu = next(p for p in mapped if p.endswith("/libtorch_cpu.so"))
    assert mapped[executable] > 0 and mapped[torch_cpu] > mapped[executable]


def test_perf_exiting_at_once_leaves_it_unavailable(tmp_path: Path) -> None:
    """perf that exits before it reads its control pipe (no such process) is not waited for
    and fails nothing: the collector is unavailable, with perf's reason."""
    perf = PerfCollector(tmp_path, 99)
    if perf.exe is None:
        pytest.skip("perf not found")
    fds = len(os.listdir("/proc/self/fd"))
    perf.start(999_999_999)
    assert perf.state.startswith("unavailable: ") and perf.proc is None
    assert len(os.listdir("/proc/self/fd")) == fds  # its control pipes closed


def test_only_a_perf_map_of_ours_that_is_no_link_is_copied(tmp_path: Path) -> None:
    """/tmp is everyone's: a perf map is kept only where it is a plain file of this user's (a
    link to one of our files elsewhere is not followed into the Run)."""
    mine = tmp_path / "perf-1.map"
    mine.write_text("7f0000001000 40 jit_kernel\n")
    secret = tmp_path / "secret"
    secret.write_text("not a perf map\n")
    link = tmp_path / "perf-2.map"
    link.symlink_to(secret)
    assert own_file(mine)
    assert not own_file(link) and not own_file(tmp_path / "perf-3.map")
    assert not own_file(tmp_path)


@pytest.mark.parametrize(("said", "held"), [("perf version 6.1.187", True),
                                            ("perf version 5.10.0", True),
                                            ("perf version 5.4.233", False),
                                            ("perf version 4.19.0-fake", False),
                                            ("something else", False)])
def test_a_perf_without_control_is_started_as_before(tmp_path: Path, said: str, held: bool,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A perf older than 5.10 has no --control nor -D -1: it is started sampling from its
    start, as before, and the recorded command is not held for it."""
    fake = tmp_path / "perf"
    fake.write_text(f"#!/bin/sh\necho '{said}'\n")
    fake.chmod(0o755)
    assert controllable(str(fake)) is held
    assert not controllable(str(tmp_path / "none"))
    monkeypatch.setenv("PATH", str(tmp_path))
    assert PerfCollector(tmp_path, 99).before_exec is held
