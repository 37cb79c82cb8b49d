"""benchmarks/paired_batch.py's page faults and heap reserve: both configurations' models share
one heap, where the profiler's allocations inside a window leave the larger one's results on
fresh pages; a reserve written first keeps them on resident ones; `--apart` gives each a process
and a heap of its own, as its recording has. Its nanoGPT step (benchmarks/nanogpt_step.py) runs
the ops train.py's recorded step runs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("torch")

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "paired_batch.py"


def _faults(reserve: int, *apart: str) -> tuple[int, int]:
    """Each configuration's median minor page faults a step, the LSTM LM at batch 8 and 32."""
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(SCRIPT.parents[1] / "src")}
    out = subprocess.run([sys.executable, str(SCRIPT), "lstm", "8", "32", "--pairs", "4",
                          "--window", "4", "--reserve", str(reserve), *apart],
                         capture_output=True, text=True, env=env, check=True, timeout=300).stdout
    found = re.search(r"minor page faults a step (\d+) and (\d+)", out)
    assert found, out
    return int(found[1]), int(found[2])


def test_the_larger_batch_faults_in_a_shared_heap_and_not_over_a_reserve() -> None:
    # measured: 29 and 2,162 a step as the heap comes, 0 and 0 over a 256 MiB reserve
    _, larger = _faults(0)
    assert larger > 500
    assert max(_faults(256)) < 50


def test_apart_the_base_faults_as_in_a_process_of_its_own() -> None:
    # measured: 0 and 1,774 a step in one heap, 458 and 2,414 apart (the LM's base recorded
    # by realworld.py took 319 a step in its window)
    base, larger = _faults(0, "--apart")
    assert base > 100
    assert larger > 500


# one step of benchmarks/nanogpt_step.py under torch.profiler, its aten ops' names and input
# dims as Kineto writes them (a Run's `detail`), printed as JSON
HARNESS = """
import json, sys, tempfile
from pathlib import Path
import torch
sys.path.insert(0, sys.argv[1])
from nanogpt_step import NanoGPT
torch.set_num_threads(1)
model = NanoGPT(Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
for _ in range(3):
    model.step()
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                            record_shapes=True) as prof:
    model.step()
trace = Path(tempfile.mkdtemp()) / "step.json"
prof.export_chrome_trace(str(trace))
print(json.dumps([[e["name"], e["args"]["Input Dims"]] for e in json.loads(trace.read_text())[
    "traceEvents"] if e.get("cat") == "cpu_op" and e["name"].startswith("aten::")]))
"""


@pytest.mark.slow
def test_the_nanogpt_step_runs_the_ops_of_trains_recorded_step(tmp_path: Path) -> None:
    """train.py recorded unmodified (realworld.py's command, small) against the harness at the
    same configuration: the same aten ops with the same input dims in a step (realworld.py's
    predict configurations: the same, in the same order, docs/benchmarks.md)."""
    sys.path.insert(0, str(SCRIPT.parent))
    from realworld import nanogpt_cmd, nanogpt_dir, record

    work = nanogpt_dir(tmp_path)
    run, _ = record(tmp_path / "nanogpt.run", nanogpt_cmd(10, batch=3, width=32, layers=2),
                    cwd=work, steps="3:4", collectors="torch", env={"OMP_NUM_THREADS": "1"})
    events = run.table("events").to_pylist()
    middle = sorted({e["step"] for e in events if e["kind"] == "cpu_op"})[1]
    recorded = Counter((e["name"], json.dumps(json.loads(e["detail"])["Input Dims"]))
                       for e in events if e["kind"] == "cpu_op" and e["step"] == middle
                       and e["name"].startswith("aten::"))
    out = subprocess.run([sys.executable, "-c", HARNESS, str(SCRIPT.parent), str(work), "3",
                          "32"], capture_output=True, text=True, check=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "1"}).stdout
    harness = Counter((name, json.dumps(dims)) for name, dims in json.loads(out.splitlines()[-1]))
    assert sum(recorded.values()) > 300
    assert harness == recorded
