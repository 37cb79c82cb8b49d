"""The host's time between two ops (Python, the next call's dispatch) against the size of the
tensors the ops before it touched, with those tensors freed between the ops or kept, and the
minor page faults of each iteration.

    PYTHONPATH=src .venv/bin/python benchmarks/host_gaps.py [--threads 1] [--rounds 20]

A chain of five ops (matmul, relu, mul, add, sum) on [n, 512] float32 tensors under
torch.profiler; a gap is one op's end to the next one's start, the median over the rounds.
Freed: each result is dropped once the next op has used it (as `y = f(y)` drops it: the free
and any pages glibc hands back fall in the gap); kept: every result stays alive, so no free
falls in a gap and every result lands on fresh pages. What `predict` holds fixed at a new
batch size (docs/benchmarks.md, the seventeenth pass).
"""

from __future__ import annotations

import argparse
import itertools
import resource
import statistics

import torch
from torch.profiler import profile

OPS = ("aten::matmul", "aten::relu", "aten::mul", "aten::add", "aten::sum")
WIDTH = 512


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _chain(x: torch.Tensor, w: torch.Tensor, held: list[torch.Tensor] | None) -> torch.Tensor:
    y = x @ w
    y2 = torch.relu(y)
    z = y2 * 2.0
    z2 = z + 1.0
    if held is not None:
        held += [y, y2, z, z2]
    return z2.sum()


def measure(rows: int, keep: bool, rounds: int) -> tuple[float, float]:
    """(median gap in us, minor faults per round)."""
    x, w = torch.randn(rows, WIDTH), torch.randn(WIDTH, WIDTH)
    held: list[torch.Tensor] | None = [] if keep else None
    for _ in range(5):
        _chain(x, w, held)
    if held is not None:
        held.clear()
    before = _faults()
    with profile() as prof:
        for _ in range(rounds):
            _chain(x, w, held)
    faults = (_faults() - before) / rounds
    events = sorted((e for e in prof.events() if e.name in OPS), key=lambda e: e.time_range.start)
    gaps = [b.time_range.start - a.time_range.end for a, b in itertools.pairwise(events)
            if b.name != OPS[0]]  # within a chain: the loop's own turn is not a gap between ops
    return statistics.median(gaps), faults


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--rows", default="64,256,1024,2048")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"{'rows':>6} {'MB a tensor':>11} {'freed: gap us':>14} {'faults':>7} "
          f"{'kept: gap us':>13} {'faults':>7}")
    for rows in (int(r) for r in args.rows.split(",")):
        freed, kept = measure(rows, False, args.rounds), measure(rows, True, args.rounds)
        print(f"{rows:6d} {rows * WIDTH * 4 / 1e6:11.2f} {freed[0]:14.1f} {freed[1]:7.0f} "
              f"{kept[0]:13.1f} {kept[1]:7.0f}")


if __name__ == "__main__":
    main()
