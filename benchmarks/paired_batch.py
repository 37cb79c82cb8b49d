"""A script's step at two batch sizes (or widths), measured in pairs: contention falls on both
alike.

    python benchmarks/paired_batch.py {lstm,resnet,gpt,mixer,conv1d} B0 B1 [--width 40]
        [--width1 W1] [--pairs 30] [--window N] [--reserve MIB] [--json OUT]

One process builds the model of benchmarks/realworld_models.py STYLE (with its optimizer, as the
script trains it: `train_step`; one intra-op thread) twice from the same seed, the second at
`--width1` where given (realworld.py's width x2: B1 = B0, --width1 twice --width). It alternates
steps at batch B0 and B1 (each pair's order swapped from one pair to the next), each step under
torch.profiler with record_shapes. It prints the median over pairs of (B1 step's process CPU
time / B0 step's). `--window N` keeps one profiler on over N steps at a time, as `perfswarm
record` keeps it on over its window of steps (0, the default: a profiler of its own for each
step). `--reserve MIB` writes a heap reserve first (the recorder's `reserve_heap`, as
`record --heap-reserve` does): both models share one heap, and without it the profiler's
allocations inside a window leave the larger configuration's results on fresh pages that fault
on first write, so an op whose result is the step's largest reads x5-11 for twice the batch
where it does twice the work (docs/benchmarks.md, thirtieth pass). Each configuration's minor
page faults per step are printed beside the ratio.
On a machine whose other load comes and goes, and on hyperthreads whose sibling's work stretches
CPU time too, two recordings made a minute apart can differ by 2x. Two steps a few milliseconds
apart cannot, so this ratio is what `predict`'s ratio of a changed configuration to its base
should match.
`--json` writes, per op occurrence (`aten::NAME#k`: the k-th of its name in a step, in start
order, inclusive time) and for the whole step (`STEP cpu`), the median paired ratio and the
median B0 time (us).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from perfswarm.recorder.inject._perfswarm_heap import reserve_heap
from realworld_models import STYLES, build, optimizer, train_step

STEP = "paired_batch step"
FAULTS = "STEP faults"  # a step's minor page faults (not a time: kept out of the ratios)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("style", choices=STYLES)
    p.add_argument("b0", type=int)
    p.add_argument("b1", type=int)
    p.add_argument("--width", type=int, default=40)
    p.add_argument("--width1", type=int, help="the second model's width (default --width)")
    p.add_argument("--pairs", type=int, default=30)
    p.add_argument("--window", type=int, default=0,
                   help="steps one profiler stays on for (0: a profiler per step)")
    p.add_argument("--reserve", type=int, default=0, metavar="MIB",
                   help="write a heap reserve of MIB first (0, the default: none)")
    p.add_argument("--json", type=Path, help="per-op paired ratios to this file")
    ns = p.parse_args()
    reserve_heap(ns.reserve)
    torch.set_num_threads(1)
    # the two configurations, (batch, width): the first B0 at --width, the second B1 at --width1
    first, second = (ns.b0, ns.width), (ns.b1, ns.width1 or ns.width)
    if first == second:
        p.error("the two configurations are the same: give another B1 or --width1")
    nets = {}
    for b, w in (first, second):
        torch.manual_seed(0)
        net, shape, classes = build(ns.style, w)
        nets[b, w] = net, optimizer(ns.style, net)

    def step(config: tuple[int, int]) -> None:
        train_step(ns.style, *nets[config], shape, classes, config[0], torch.device("cpu"))

    def ops(events: list[Any], start: float, end: float) -> dict[str, float]:
        """Each aten op's inclusive time (us) among `events` from start to end, by occurrence."""
        seen: dict[str, int] = defaultdict(int)
        out = {}
        for e in sorted((e for e in events if e.name.startswith("aten::")
                         and start <= e.time_range.start < end),
                        key=lambda e: e.time_range.start):
            out[f"{e.name}#{seen[e.name]}"] = e.cpu_time_total
            seen[e.name] += 1
        return out

    def session(configs: list[tuple[int, int]]) -> list[dict[str, float]]:
        """The steps at `configs` under one profiler: each
        step's CPU time (us, `STEP cpu`) and its ops."""
        cpu: list[float] = []
        faults: list[float] = []
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                    record_shapes=True) as prof:
            for config in configs:
                with torch.profiler.record_function(STEP):
                    start = time.process_time_ns()
                    touched = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                    step(config)
                    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - touched)
                    cpu.append((time.process_time_ns() - start) / 1e3)
        events = list(prof.events())
        spans = sorted((e.time_range.start, e.time_range.end) for e in events if e.name == STEP)
        return [{"STEP cpu": c, FAULTS: f, **ops(events, *span)}
                for c, f, span in zip(cpu, faults, spans, strict=True)]

    for _ in range(3):  # warm both: first calls create oneDNN primitives, grow the heap
        step(first)
        step(second)
    ratios: dict[str, list[float]] = defaultdict(list)
    base: dict[str, list[float]] = defaultdict(list)
    faulted: dict[tuple[int, int], list[float]] = defaultdict(list)
    # each pair's order swapped from one pair to the next
    order = [c for i in range(ns.pairs) for c in ((first, second) if i % 2 == 0 else
                                                   (second, first))]
    per = 2 * max(1, ns.window // 2) if ns.window else 1  # steps a profiler is on for
    steps = [got for i in range(0, len(order), per) for got in session(order[i:i + per])]
    for i in range(ns.pairs):
        got = dict(zip(order[2 * i:2 * i + 2], steps[2 * i:2 * i + 2], strict=True))
        for config, measured in got.items():
            faulted[config].append(measured.pop(FAULTS))
        for k, v in got[first].items():
            if k in got[second] and v > 0:
                ratios[k].append(got[second][k] / v)
                base[k].append(v)
    print(f"{ns.style} batch {ns.b0} -> {ns.b1}, width {first[1]} -> {second[1]}: step CPU time "
          f"x{statistics.median(ratios['STEP cpu']):.3f} (median of {ns.pairs} pairs; the first "
          f"step {statistics.median(base['STEP cpu']) / 1e3:.2f} ms); minor page faults a step "
          f"{statistics.median(faulted[first]):.0f} and {statistics.median(faulted[second]):.0f}")
    if ns.json:
        ns.json.write_text(json.dumps({k: [statistics.median(v), statistics.median(base[k])]
                                       for k, v in ratios.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
