"""perf's samples whose function is known, and what the perf map the recorder has oneDNN write
costs the program.

    python benchmarks/perf_names.py known RUN...   # per Run: the perf samples' leaf function
        known, of all of them and of those the swarms cluster (analyze's steps), and the
        unknown ones by module
    python benchmarks/perf_names.py cost [--repeats 10] [--recorded]   # the bundled trainer
        with ONEDNN_JIT_PROFILE=2 and with oneDNN's default (1: no perf map), interleaved, bare
        or recorded with the perf collector (which sets no variable the environment has): each
        one's median step (steps 2 on)
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa

import perfswarm.analyze.swarms as swarms_module
from perfswarm.analyze.summary import analyze
from perfswarm.analyze.swarms import run_samples
from perfswarm.recorder.session import Child, RecordOptions, record
from perfswarm.trace.store import Run

STEP = re.compile(rb"^step (\d+) ([\d.]+) ms", re.MULTILINE)
TRAINER = [sys.executable, "-m", "perfswarm.workloads.trainer", "--steps", "50",
           "--batch-size", "32", "--threads", "1"]


def leaf_known(run: Run, samples: pa.Table) -> tuple[int, int, collections.Counter[str]]:
    """(perf samples' weight, its part with a known leaf function, unknown weight by module)."""
    st = run.table("stacks", ["stack_id", "depth", "function", "module"]).to_pydict()
    leaf = {sid: (f, m) for sid, d, f, m in zip(st["stack_id"], st["depth"], st["function"],
                                                st["module"], strict=True) if d == 0}
    s = samples.to_pydict()
    total, known, unknown = 0, 0, collections.Counter[str]()
    for sid, source, weight in zip(s["stack_id"], s["source"], s["weight"], strict=True):
        if source != "perf":
            continue
        function, module = leaf.get(sid, ("[unknown]", ""))
        total += weight
        if function in ("[unknown]", "", None):
            unknown[(module or "[no module]").rsplit("/", 1)[-1]] += weight
        else:
            known += weight
    return total, known, unknown


def known(paths: list[str]) -> None:
    clustered: list[pa.Table] = []
    label = swarms_module.label_stacks

    def caught(samples: pa.Table, stacks: pa.Table) -> Any:
        clustered.append(samples)  # the samples the swarms cluster, as analyze selects them
        return label(samples, stacks)

    swarms_module.label_stacks = caught
    for path in paths:
        run = Run.open(Path(path))
        clustered.clear()
        analyze(run)
        for what, samples in (("all", run_samples(run)), ("swarms' steps", clustered[0]
                                                          if clustered else None)):
            if samples is None:
                continue
            total, named, unknown = leaf_known(run, samples)
            print(f"{path} {what}: {total} perf samples, leaf function known {named} "
                  f"({100 * named / max(total, 1):.1f}%); unknown by module {dict(unknown)}")


def _steps(env: dict[str, str], recorded: Path | None) -> tuple[bytes, int]:
    """The trainer's stdout and pid, run bare or recorded (perf alone) into `recorded`."""
    if recorded is None:
        proc = subprocess.Popen(TRAINER, env=env, stdout=subprocess.PIPE)
        return proc.communicate()[0], proc.pid
    log = recorded.with_suffix(".txt")
    with log.open("wb") as f:
        result = record(TRAINER, recorded, RecordOptions(collectors=("perf",)),
                        child=Child(env=env, output=f))
    return log.read_bytes(), int(result.run.manifest()["extra"]["record"]["pid"])


def cost(repeats: int, recorded: bool) -> None:
    times: dict[str, list[float]] = {"1": [], "2": []}
    lines: set[int] = set()
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(repeats):  # interleaved, the order alternating
            for key in ("1", "2") if i % 2 == 0 else ("2", "1"):
                env = {**os.environ, "ONEDNN_JIT_PROFILE": key}
                out, pid = _steps(env, Path(tmp) / f"{key}-{i}.run" if recorded else None)
                times[key] += [float(t) for s, t in STEP.findall(out) if int(s) >= 2]
                for written in (Path(f"/tmp/perf-{pid}.map"),
                                Path(tmp) / f"{key}-{i}.run" / "raw" / f"perf-{pid}.map"):
                    if written.exists():
                        lines.add(len(written.read_text().splitlines()))
                        written.unlink()
    default, mapped = statistics.median(times["1"]), statistics.median(times["2"])
    print(f"{'recorded (perf)' if recorded else 'bare'}: median step ONEDNN_JIT_PROFILE=1 "
          f"{default:.2f} ms, =2 {mapped:.2f} ms, ratio {mapped / default:.3f}; perf map "
          f"lines per run {sorted(lines)}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="what", required=True)
    sub.add_parser("known").add_argument("runs", nargs="+")
    c = sub.add_parser("cost")
    c.add_argument("--repeats", type=int, default=10)
    c.add_argument("--recorded", action="store_true")
    ns = p.parse_args()
    if ns.what == "known":
        known(ns.runs)
    else:
        cost(ns.repeats, ns.recorded)
    return 0


if __name__ == "__main__":
    sys.exit(main())
