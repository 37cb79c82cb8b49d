"""A tiny command to tune whose printed step times are exact, so a search over it is
deterministic (used by the tuner, report and browser tests)."""

from __future__ import annotations

import sys
from pathlib import Path

from perfswarm.optimize.space import load_space
from perfswarm.optimize.tune import TuneOptions, TuneResult, tune

# Step time 10 ms / (1 + WORKERS), halved by --fast; WORKERS=2 crashes (a bad configuration).
SCRIPT = """\
import os, sys
w = int(os.environ.get("WORKERS", "0"))
if w == 2:
    sys.exit("bad config")
for i in range(8):
    print(f"step {i} {10 / (1 + w) * (0.5 if '--fast' in sys.argv else 1):.3f} ms loss 0.1")
"""
COMMAND = [sys.executable, "-c", SCRIPT]
SPACE = """\
params:
  - {name: workers, type: categorical, choices: [0, 1, 2, 3], env: WORKERS}
  - {name: fast, type: bool, flag: --fast}
"""


def write_space(directory: Path) -> Path:
    path = directory / "space.yaml"
    path.write_text(SPACE)
    return path


def printed_search(out: Path, trials: int = 8, seed: int = 1) -> TuneResult:
    """The search the tests share: 8 trials, seed 1 (pruned, failed and complete trials)."""
    out.mkdir(parents=True, exist_ok=True)
    return tune(COMMAND, load_space(write_space(out)),
                TuneOptions(out=out, trials=trials, seed=seed, measure="stdout"))
