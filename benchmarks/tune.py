"""Tuner benchmark: on the bundled data-loading-bound trainer, find >= 1.3x within 20 trials.

    .venv/bin/python benchmarks/tune.py [--trials 20] [--steps 10] [--out DIR]

The baseline is the trainer with a slow input pipeline (50 ms per batch, loaded in the
training process) and torch's default threads; the search space is DataLoader workers and
torch threads, passed as flags. 50 ms keeps it input-bound even on a busy machine, where
the CNN step itself slows down.
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
               "--steps", str(ns.steps), "--loader-delay-ms", "50", "--num-workers", "0"]
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
    ranked = sorted((t for t in result.trials if t["throughput"]),
                    key=lambda t: -(t["throughput"] or 0.0))
    for t in ranked[:3]:
        print(f"  trial {t['number']:2d} {t['throughput']:8.3f} steps/s  {t['params']}")
    print(f"speedup      {result.speedup}x (target {TARGET}x within {ns.trials} trials)")
    print(f"first >= {TARGET}x at trial {reached}; pruned {states['pruned']}, "
          f"failed {states['failed']}; {elapsed:.1f} s; results in {out}")
    return 0 if result.speedup is not None and result.speedup >= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
