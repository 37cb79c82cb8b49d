"""A script's step at two batch sizes, measured in pairs: contention falls on both alike.

    python benchmarks/paired_batch.py {mixer,conv1d,resnet} B0 B1 [--width 40] [--pairs 30]
        [--json OUT]

One process builds the model of benchmarks/realworld_models.py STYLE (with its optimizer, as the
script trains it; one intra-op thread) twice from the same seed. It alternates steps at batch
B0 and B1 (each pair's order swapped from one pair to the next), each step under torch.profiler
with record_shapes. It prints the median over pairs of (B1 step's process CPU time / B0 step's).
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
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from realworld_models import build, optimizer


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("style", choices=("mixer", "conv1d", "resnet"))  # the styles on images
    p.add_argument("b0", type=int)
    p.add_argument("b1", type=int)
    p.add_argument("--width", type=int, default=40)
    p.add_argument("--pairs", type=int, default=30)
    p.add_argument("--json", type=Path, help="per-op paired ratios to this file")
    ns = p.parse_args()
    torch.set_num_threads(1)
    nets = {}
    for b in (ns.b0, ns.b1):
        torch.manual_seed(0)
        net, shape, classes = build(ns.style, ns.width)
        opt = optimizer(ns.style, net)
        assert opt is not None
        nets[b] = net, opt

    def step(b: int) -> None:
        net, opt = nets[b]
        x, target = torch.randn(b, *shape), torch.randint(0, classes, (b,))
        loss = F.cross_entropy(net(x), target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    def profiled(b: int) -> dict[str, float]:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                    record_shapes=True) as prof:
            start = time.process_time_ns()
            step(b)
            cpu = time.process_time_ns() - start
        seen: dict[str, int] = defaultdict(int)
        out = {"STEP cpu": cpu / 1e3}
        for e in sorted((e for e in prof.events() if e.name.startswith("aten::")),
                        key=lambda e: e.time_range.start):
            out[f"{e.name}#{seen[e.name]}"] = e.cpu_time_total
            seen[e.name] += 1
        return out

    for _ in range(3):  # warm both: first calls create oneDNN primitives, grow the heap
        step(ns.b0)
        step(ns.b1)
    ratios: dict[str, list[float]] = defaultdict(list)
    base: dict[str, list[float]] = defaultdict(list)
    for i in range(ns.pairs):
        order = (ns.b0, ns.b1) if i % 2 == 0 else (ns.b1, ns.b0)
        got = {b: profiled(b) for b in order}
        for k, v in got[ns.b0].items():
            if k in got[ns.b1] and v > 0:
                ratios[k].append(got[ns.b1][k] / v)
                base[k].append(v)
    print(f"{ns.style} batch {ns.b0} -> {ns.b1}: step CPU time x"
          f"{statistics.median(ratios['STEP cpu']):.3f} (median of {ns.pairs} pairs; batch "
          f"{ns.b0} step {statistics.median(base['STEP cpu']) / 1e3:.2f} ms)")
    if ns.json:
        ns.json.write_text(json.dumps({k: [statistics.median(v), statistics.median(base[k])]
                                       for k, v in ratios.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
