"""CPU flash attention on q, k and v laid out as nn.MultiheadAttention hands them over (views of
[L, B, E], a head's rows B x E apart) against contiguous ones, per sample, side by side.

    PYTHONPATH=src .venv/bin/python benchmarks/attention_layout.py [--profile PROFILE.json]

One thread, each call timed the way `calibrate` times a sweep point (kernels.py's runner and
time_op: the fastest of five timings), causal, 4 heads. With --profile, the profile's attention
model is printed beside each (the layout reaches it as OpCost.row_spread): how far a forecast
of a batch change on MultiheadAttention can trust the model, where the measured ratio grows
with the rows' distance (docs/benchmarks.md, the sixteenth pass).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from perfswarm.model.opcost import Shapes, data_cost
from perfswarm.model.profile import read_profile
from perfswarm.recorder.bench.kernels import SDPA_CPU, _runner, time_op

HEADS = 4


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", type=Path)
    ap.add_argument("--heads", default="8,32,64", help="head dimensions (comma-separated)")
    ap.add_argument("--batches", default="2,8,16,32,64")
    ap.add_argument("--seq", type=int, default=64)
    ns = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    model = read_profile(ns.profile).models.get("sdpa") if ns.profile else None
    print(f"{'head':>4} {'batch':>5} {'rows apart':>10} {'contiguous':>11} {'[L, B, E]':>10} "
          f"{'ratio':>6}" + ("  model: contiguous, [L, B, E], ratio" if model else ""))
    for head in (int(h) for h in ns.heads.split(",")):
        for batch in (int(b) for b in ns.batches.split(",")):
            dims = [[batch, HEADS, ns.seq, head]] * 3
            layouts = {"contiguous": (HEADS * ns.seq * head, ns.seq * head, head, 1),
                       "views": (HEADS * head, head, batch * HEADS * head, 1)}
            us = {k: 1e6 * time_op(_runner(SDPA_CPU, dims, "cpu", (st,) * 3)) / batch
                  for k, st in layouts.items()}
            line = (f"{head:4d} {batch:5d} {4 * batch * HEADS * head:9d}B "
                    f"{us['contiguous']:9.1f}us {us['views']:8.1f}us "
                    f"{us['views'] / us['contiguous']:6.2f}")
            if model is not None:
                pred = {}
                for k, st in layouts.items():
                    shapes = Shapes(tuple(map(tuple, dims)), ("float",) * 3, (st,) * 3)
                    cost = data_cost(SDPA_CPU, shapes)
                    assert cost is not None
                    pred[k] = 1e6 * model.predict(cost, shapes.dims) / batch
                line += (f"  {pred['contiguous']:8.1f} {pred['views']:8.1f} "
                         f"{pred['views'] / pred['contiguous']:5.2f}")
            print(line, flush=True)


if __name__ == "__main__":
    main()
