"""Predicted vs measured collective times over 1 KB..64 MB (goal: GMAE <= 15% per op).

Two independent sweeps with real torch.distributed among local processes (gloo on CPU, NCCL
when there are enough GPUs): the alpha-beta links are fitted on the first and judged against
the second, so the error includes run-to-run noise, as a prediction for a new run would.

    .venv/bin/python benchmarks/collectives.py [--world 2] [--iters 5] [--json OUT]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import orjson

from perfswarm.model.collective_bench import default_sizes, evaluate, fit, sweep

GOAL = 0.15


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--backend", default="auto", choices=["auto", "gloo", "nccl"])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    sizes = default_sizes(1 << 10, 64 << 20)
    train = sweep(sizes=sizes, world_size=args.world, backend=args.backend, iters=args.iters)
    test = sweep(sizes=sizes, world_size=args.world, backend=args.backend, iters=args.iters)
    models = fit(train)
    errors = evaluate(models, test)
    print(f"backend {test.backend}, world {test.world_size}, {len(sizes)} sizes "
          f"{sizes[0]} B..{sizes[-1] >> 20} MB, fit on sweep 1, judged on sweep 2")
    print(f"{'op':<16}{'GMAE':>8}  goal <= {GOAL:.0%}   regimes: up to bytes: latency us, GB/s")
    for op, model in models.items():
        mark = "ok    " if errors[op] <= GOAL else "MISSED"
        regimes = "; ".join(f"{'all' if bound == float('inf') else int(bound)}: "
                            f"{link.alpha_s * 1e6:.1f} us, {link.bandwidth_gbps:.3f} GB/s"
                            for bound, link in model.regimes)
        print(f"{op:<16}{errors[op]:>8.1%}  {mark}   {regimes}")
    print(f"{'size':>10}" + "".join(f"{op[:12]:>14}" for op in models) + "   (measured/predicted)")
    for n in sizes:
        cells = [f"{next(x for x in test.of(op) if x.nbytes == n).seconds / model.time(n):>14.2f}"
                 for op, model in models.items()]
        print(f"{n:>10}" + "".join(cells))
    if args.json:
        args.json.write_bytes(orjson.dumps({"train": train.to_dict(), "test": test.to_dict(),
                                            "gmae": errors,
                                            "models": {k: v.to_dict() for k, v in models.items()}},
                                           option=orjson.OPT_INDENT_2))
    return 0 if all(e <= GOAL for e in errors.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
