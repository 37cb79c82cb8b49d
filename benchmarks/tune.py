"""Tuner benchmark: on the bundled data-loading-bound trainer, find >= 1.3x within 20 trials.

    .venv/bin/python benchmarks/tune.py [--trials 20] [--steps 10] [--out DIR]

The baseline is the workload as shipped for this demo (a 20 ms-per-batch loader, no
workers); the search space is DataLoader workers and torch threads, passed as flags.
Prints the measured baseline and best throughput, their ratio, and the first trial
that reached the target. Exits 1 when the target is not reached.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from perfswarm.optimize.tune import TuneOptions, load_space, tune

TARGET = 1.3
SPACE = """\
params:
  - {name: num_workers, type: int, low: 0, high: 4, flag: --num-workers}
  - {name: threads, type: int, low: 0, high: 2, flag: --threads}
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--out", type=Path, default=None)
    ns = p.parse_args()
    out = ns.out or Path(tempfile.mkdtemp(prefix="perfswarm-tune-bench-"))
    space = out / "space.yaml"
    out.mkdir(parents=True, exist_ok=True)
    space.write_text(SPACE)
    command = [sys.executable, "-W", "ignore", "-m", "perfswarm.workloads.trainer",
               "--steps", str(ns.steps), "--loader-delay-ms", "20", "--num-workers", "0"]
    start = time.perf_counter()
    result = tune(command, load_space(space), TuneOptions(out=out, trials=ns.trials, warmup=2),
                  lambda msg: print(f"  {msg}", flush=True))
    elapsed = time.perf_counter() - start
    base = result.baseline.throughput
    reached = next((t["number"] for t in result.trials
                    if t["throughput"] and t["throughput"] >= TARGET * base), None)
    best = result.best
    states = result.to_dict()
    print(f"baseline     {base:.3f} steps/s")
    if best is not None:
        print(f"best         {best['throughput']:.3f} steps/s  {best['params']}")
    print(f"speedup      {result.speedup}x (target {TARGET}x within {ns.trials} trials)")
    print(f"first >= {TARGET}x at trial {reached}; pruned {states['pruned']}, "
          f"failed {states['failed']}; {elapsed:.1f} s; results in {out}")
    return 0 if result.speedup is not None and result.speedup >= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
