"""Recording overhead: bare vs recorded runs of a bundled workload, interleaved, in one process.

Prints the ratio of median step time (recorded / bare) outside the profiling
window (goal <= 1.02), also apart before and after it, and inside it, and the
samplers' CPU use as a share of one core (goal <= 1% at 20 Hz), and the external tools'
(py-spy, perf) CPU against the job's own. Step times are what the workload itself prints;
`--loop` records a loop of benchmarks/realworld_loop.py instead of the bundled trainer.

    python benchmarks/overhead.py [--repeats 20] [--steps 50] [--collectors torch,system]
        [--loop sgd|infer|callbacks|workers|loader]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from perfswarm.defaults import DEFAULT_COLLECTORS
from perfswarm.recorder.session import RecordOptions, RecordResult, record

STEP = re.compile(rb"^step (\d+) ([\d.]+) ms", re.MULTILINE)


def step_times(stdout: bytes) -> dict[int, float]:
    """Step index -> ms, as the bundled workloads print them, or from the `truth` line of
    benchmarks/realworld_loop.py."""
    for line in stdout.splitlines():
        if line.startswith(b"truth "):
            return {i: ns / 1e6 for i, ns in enumerate(json.loads(line[6:])["step_ns"])}
    return {int(m.group(1)): float(m.group(2)) for m in STEP.finditer(stdout)}


def _recorded(cmd: list[str], out: Path, options: RecordOptions, fd: int) -> RecordResult:
    """record() with the child's stdout (inherited from ours) sent to `fd`."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(fd, 1)
    try:
        return record(cmd, out, options)
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # 20 repeats: at 8, the ratio before the window swung from 0.97 to 1.14 between runs (the
    # step time of a CPU workload moves with where its allocator's heap happens to lie)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--skip", type=int, default=25)
    p.add_argument("--window", type=int, default=10)
    p.add_argument("--collectors", default=",".join(DEFAULT_COLLECTORS))
    p.add_argument("--hz", type=float, default=RecordOptions.hz)
    p.add_argument("--perf-hz", type=int, default=RecordOptions.perf_hz)
    p.add_argument("--pystacks-hz", type=int, default=RecordOptions.pystacks_hz)
    p.add_argument("--threads", type=int, default=1,
                   help="the workload's intra-op threads (0: torch's default, every core). One "
                        "leaves a core to the collectors' own processes: a workload on every "
                        "core of a small machine pays for any profiler's CPU, which is core "
                        "contention rather than recording overhead")
    p.add_argument("--loop", choices=("sgd", "infer", "callbacks", "workers", "loader"),
                   help="record benchmarks/realworld_loop.py STYLE (a loop written as people "
                        "do, one thread) instead of the bundled trainer")
    ns = p.parse_args()
    cmd = ([sys.executable, str(Path(__file__).parent / "realworld_loop.py"), ns.loop,
            "--steps", str(ns.steps)] if ns.loop else
           [sys.executable, "-m", "perfswarm.workloads.trainer", "--steps", str(ns.steps),
            "--batch-size", "32", "--threads", str(ns.threads)])
    window = range(ns.skip, ns.skip + ns.window)
    before = range(2, ns.skip)
    after = range(ns.skip + ns.window + 1, ns.steps)  # the step that exports is left out
    bare: dict[int, list[float]] = {}
    rec: dict[int, list[float]] = {}
    cpu_share: list[float] = []
    tools: list[float] = []  # the external tools' CPU (py-spy, perf) over the job's own
    options = RecordOptions(collectors=tuple(ns.collectors.split(",")), hz=ns.hz,
                            perf_hz=ns.perf_hz, pystacks_hz=ns.pystacks_hz,
                            skip=ns.skip, steps=ns.window, execution_trace=False)
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(ns.repeats):  # interleaved, so drift in machine load hits both alike
            out = subprocess.run(cmd, capture_output=True, check=True).stdout
            for s, t in step_times(out).items():
                bare.setdefault(s, []).append(t)
            log = Path(tmp) / f"child-{i}.txt"
            with log.open("wb") as f:
                result = _recorded(cmd, Path(tmp) / f"r{i}.run", options, f.fileno())
            for s, t in step_times(log.read_bytes()).items():
                rec.setdefault(s, []).append(t)
            extra = result.run.manifest()["extra"]["record"]
            span = extra["end_ns"] - extra["start_ns"]
            cpu_share.append(sum(extra["sampler_cpu_ns"].values()) / span)
            if extra.get("job_cpu_ns"):
                tools.append(sum(extra["tool_cpu_ns"].values()) / extra["job_cpu_ns"])

    def median_of(times: dict[int, list[float]], steps: list[int] | range) -> float:
        return statistics.median(t for s in steps for t in times.get(s, []))

    def ratio(steps: list[int] | range) -> float:
        return median_of(rec, steps) / median_of(bare, steps)

    print(f"collectors: {ns.collectors}; {ns.repeats} interleaved repeats of {ns.steps} steps, "
          f"workload threads {ns.threads or 'default'}")
    print(f"median step, outside the window: recorded/bare = {ratio([*before, *after]):.3f} "
          f"(goal <= 1.02); before it {ratio(before):.3f}, after it {ratio(after):.3f}")
    print(f"median step, inside the window:  recorded/bare = {ratio(window):.3f}")
    print(f"samplers' CPU: {100 * statistics.median(cpu_share):.2f}% of one core at {ns.hz:g} Hz"
          " (goal <= 1%)")
    if tools:
        print(f"external tools' CPU (py-spy at {ns.pystacks_hz} Hz, perf at {ns.perf_hz} Hz): "
              f"{100 * statistics.median(tools):.1f}% of the job's own CPU (goal < 100%: the "
              "recorder costs less than the job)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
