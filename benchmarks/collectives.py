"""Predicted vs measured collective times over 1 KB..64 MB (goal: GMAE <= 15%, per op and overall).

Several independent sweeps, one after another, with real torch.distributed among local processes
(gloo on CPU, NCCL when there are enough GPUs). The models are fitted on sweep i and judged on
sweep i+1, so every figure is held out and includes run-to-run noise, as a prediction for a new
run would; the spread over the pairs shows how reproducible that is on this machine. Beside it:
the noise floor (sweep i's own times taken as the prediction of sweep i+1), and the sizes left out
(fitted on every other size of a sweep, judged on the other sizes of the same sweep: interpolation
at twice the spacing, which cannot place a knee that falls between two fitted sizes).

    .venv/bin/python benchmarks/collectives.py [--sweeps 3] [--world 2] [--passes 12] [--json OUT]
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import orjson

from perfswarm.defaults import SWEEP_PASSES
from perfswarm.model.accuracy import gmae
from perfswarm.model.collective_fit import Sweep, evaluate, fit, split_sizes
from perfswarm.recorder.bench.collectives import default_sizes, sweep

GOAL = 0.15


def _judge(train: Sweep, test: Sweep) -> dict[str, float]:
    """Per op and "overall" (every op and size together): the GMAE on `test` of the models
    fitted on `train`."""
    models = fit(train)
    errors: dict[str, float] = dict(evaluate(models, test))
    pairs = [(model.time(m.nbytes), m.seconds) for op, model in models.items()
             for m in test.of(op)]
    errors["overall"] = gmae([p for p, _ in pairs], [m for _, m in pairs])
    return errors


def _floor(train: Sweep, test: Sweep) -> dict[str, float]:
    """The noise floor: train's measured times as the prediction of test's."""
    before = {(m.op, m.nbytes): m.seconds for m in train.measurements}
    out: dict[str, float] = {}
    for op in dict.fromkeys(m.op for m in test.measurements):
        ms = test.of(op)
        out[op] = gmae([before[op, m.nbytes] for m in ms], [m.seconds for m in ms])
    ms = test.measurements
    out["overall"] = gmae([before[m.op, m.nbytes] for m in ms], [m.seconds for m in ms])
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweeps", type=int, default=3,
                        help="at least 2: fit on one, judge on the next")
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--passes", type=int, default=SWEEP_PASSES)
    parser.add_argument("--backend", default="auto", choices=["auto", "gloo", "nccl"])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.sweeps < 2:
        parser.error("--sweeps: needs at least 2")
    sizes = default_sizes(1 << 10, 64 << 20)
    sweeps = [sweep(sizes=sizes, world_size=args.world, backend=args.backend, passes=args.passes)
              for _ in range(args.sweeps)]
    later = [_judge(a, b) for a, b in itertools.pairwise(sweeps)]
    floor = [_floor(a, b) for a, b in itertools.pairwise(sweeps)]
    form = [_judge(*split_sizes(s)) for s in sweeps]
    keys = list(later[0])
    print(f"backend {sweeps[0].backend}, world {args.world}, {len(sizes)} sizes "
          f"{sizes[0]} B..{sizes[-1] >> 20} MB, {args.passes} passes a sweep")
    print(f"held out: fit on sweep i, judged on sweep i+1 (goal <= {GOAL:.0%}); noise floor: "
          "sweep i's times as the prediction; sizes left out: every other size of one sweep")
    header = "".join(f"{f'{i + 1}->{i + 2}':>9}" for i in range(len(later)))
    print(f"{'op':<16}{header}{'worst':>9}{'':3}{'noise floor':>12}{'sizes left out':>16}")
    worst = {}
    for key in keys:
        errs = [p[key] for p in later]
        worst[key] = max(errs)
        print(f"{key:<16}" + "".join(f"{e:>9.1%}" for e in errs) + f"{worst[key]:>9.1%}"
              f"{'' if worst[key] <= GOAL else ' !':3}{max(f[key] for f in floor):>12.1%}"
              f"{max(f[key] for f in form):>16.1%}")
    last = fit(sweeps[-2])
    print("\nthe last fit: latency, then bandwidth per size regime (up to bytes: GB/s); "
          "measured / predicted on the last sweep")
    for op, model in last.items():
        d = model.to_dict()
        regimes = "; ".join(f"{r['up_to_bytes'] or 'above'}: "
                            + ("flat" if r["bandwidth_gbps"] is None
                               else f"{r['bandwidth_gbps']:.2f}") for r in d["regimes"])
        print(f"  {op:<16}{d['latency_us']:7.1f} us   {regimes}")
    print(f"{'size':>10}" + "".join(f"{op[:12]:>14}" for op in last))
    for n in sizes:
        cells = [f"{next(x for x in sweeps[-1].of(op) if x.nbytes == n).seconds / m.time(n):>14.2f}"
                 for op, m in last.items()]
        print(f"{n:>10}" + "".join(cells))
    if args.json:
        args.json.write_bytes(orjson.dumps(
            {"sweeps": [s.to_dict() for s in sweeps], "held_out": later, "noise_floor": floor,
             "model_form": form}, option=orjson.OPT_INDENT_2))
    return 0 if all(e <= GOAL for e in worst.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
