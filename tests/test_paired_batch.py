"""benchmarks/paired_batch.py's page faults and heap reserve: both configurations' models share
one heap, where the profiler's allocations inside a window leave the larger one's results on
fresh pages; a reserve written first keeps them on resident ones."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "paired_batch.py"


def _faults(reserve: int) -> tuple[int, int]:
    """Each configuration's median minor page faults a step, the LSTM LM at batch 8 and 32."""
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(SCRIPT.parents[1] / "src")}
    out = subprocess.run([sys.executable, str(SCRIPT), "lstm", "8", "32", "--pairs", "4",
                          "--window", "4", "--reserve", str(reserve)],
                         capture_output=True, text=True, env=env, check=True, timeout=300).stdout
    found = re.search(r"minor page faults a step (\d+) and (\d+)", out)
    assert found, out
    return int(found[1]), int(found[2])


def test_the_larger_batch_faults_in_a_shared_heap_and_not_over_a_reserve() -> None:
    # measured: 29 and 2,162 a step as the heap comes, 0 and 0 over a 256 MiB reserve
    _, larger = _faults(0)
    assert larger > 500
    assert max(_faults(256)) < 50
