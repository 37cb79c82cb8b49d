"""The system sampler's own CPU cost: goal <= 1% of one core at 20 Hz (<= 0.5 ms per reading).

Samples a live process tree shaped like a training job (a parent with several
threads and a few worker processes, all idle) two ways: back-to-back readings
(read and write one line; CPU time per reading, thread CPU clock, caches warm)
and the real sampler thread at --hz for --seconds (its whole CPU time over the
wall time: wake-ups and cold caches included, the figure the goal is about).

    python benchmarks/sampler.py [--hz 20] [--seconds 5] [--reads 500] [--threads 8] [--workers 3]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from perfswarm.recorder.system import SystemSampler

TREE = """
import subprocess, sys, threading, time
threads = int(sys.argv[1])
workers = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
           for _ in range(int(sys.argv[2]))]
for _ in range(threads):
    threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
print("ready", flush=True)
time.sleep(600)
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hz", type=float, default=20.0)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--reads", type=int, default=500)
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--workers", type=int, default=3)
    ns = p.parse_args()
    # its own session: the workers go with it at the end (they had outlived it, holding the
    # pipe of whoever read this script's output)
    tree = subprocess.Popen([sys.executable, "-c", TREE, str(ns.threads), str(ns.workers)],
                            stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert tree.stdout is not None and tree.stdout.readline() == b"ready\n"
        with tempfile.TemporaryDirectory() as tmp:
            sampler = SystemSampler(Path(tmp), ns.hz)
            sampler.pid = tree.pid
            values = sampler.read()
            with open(os.devnull, "wb") as sink:
                t0 = time.thread_time_ns()
                for _ in range(ns.reads):
                    sampler.sample_once(sink)
                per_read = (time.thread_time_ns() - t0) / ns.reads

            threaded = SystemSampler(Path(tmp), ns.hz)
            wall0 = time.monotonic_ns()
            threaded.start(tree.pid)
            time.sleep(ns.seconds)
            threaded.stop()
            share = threaded.cpu_ns / (time.monotonic_ns() - wall0)
    finally:
        os.killpg(tree.pid, signal.SIGKILL)
        tree.wait()
    print(f"tree: {values.get('proc.count', 0):.0f} processes, {ns.threads} extra threads;"
          f" {os.cpu_count()} cores")
    print(f"one reading (read + write): {per_read / 1e3:.1f} us CPU"
          f" = {100 * per_read * ns.hz / 1e9:.2f}% of one core at {ns.hz:g} Hz")
    print(f"sampler thread: {100 * share:.2f}% of one core at {ns.hz:g} Hz over {ns.seconds:g} s"
          f" ({threaded.samples} readings; goal <= 1%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
