"""Embedding sharding: predicted vs measured per-device EmbeddingBag time (GMAE), side by side.

The cost model is calibrated here first (the probe tables, `shard --calibrate`), then every plan
(size-greedy, lookup-greedy, time-balanced) of several table sets none of which is in the probe
is timed with one local process per device, and each device's predicted time is set beside its
measured one. Also: whether the plan the model picks is the one measured fastest.

    .venv/bin/python benchmarks/shard.py [--iters 10] [--json OUT]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import orjson

from perfswarm.model.accuracy import gmae
from perfswarm.model.embedding import Table
from perfswarm.optimize.shard import Workload, measure_plan, shard
from perfswarm.recorder.bench.embedding import calibrate

GOAL = 0.20
SETS: dict[str, Workload] = {
    "mixed": Workload((Table("users", 200_000, 128, 10), Table("items", 200_000, 64, 20, 1.1),
                       Table("ads", 50_000, 128, 1), Table("country", 250, 16, 1),
                       Table("history", 100_000, 32, 50), Table("tags", 5_000, 64, 10)), 256),
    "criteo-like": Workload(tuple(Table(f"c{i}", rows, 64, 1, 1.05) for i, rows in enumerate(
        (400_000, 300_000, 120_000, 60_000, 20_000, 8_000, 3_000, 1_000, 500, 100))), 512),
    "multi-hot": Workload((Table("clicks", 300_000, 64, 40, 1.2), Table("views", 150_000, 64, 60),
                           Table("search", 80_000, 128, 15, 0.9), Table("geo", 20_000, 32, 5),
                           Table("device", 2_000, 16, 3), Table("follows", 120_000, 96, 25, 1.1),
                           Table("topics", 30_000, 64, 30, 1.3)), 128),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--devices", default="2,4")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    t0 = time.perf_counter()
    cost = calibrate()
    print(f"calibrated on the probe tables in {time.perf_counter() - t0:.1f} s: "
          + ", ".join(f"{k} {v:.4g}" for k, v in cost.to_dict().items()))
    rows, per_set, choices = [], {}, []
    for name, work in SETS.items():
        pred_all, meas_all = [], []
        for devices in (int(d) for d in args.devices.split(",")):
            result = shard(work, devices, cost)
            measured_max = {}
            for p in result.plans:
                measured = measure_plan(work, p, args.iters)
                measured_max[p.strategy] = max(measured)
                for d, (pred, meas) in enumerate(zip(p.device_s, measured, strict=True)):
                    if pred > 0 and meas > 0:   # (a device without tables takes no time)
                        pred_all.append(pred)
                        meas_all.append(meas)
                        rows.append({"set": name, "devices": devices, "strategy": p.strategy,
                                     "device": d, "predicted_ms": pred * 1e3,
                                     "measured_ms": meas * 1e3})
            fastest = min(measured_max, key=lambda s: measured_max[s])
            # the pick is right if its measured time is within 5% of the fastest's
            right = measured_max[result.best.strategy] <= 1.05 * measured_max[fastest]
            choices.append({"set": name, "devices": devices, "picked": result.best.strategy,
                            "measured_fastest": fastest, "right": right,
                            "measured_max_ms": {k: v * 1e3 for k, v in measured_max.items()}})
        per_set[name] = gmae(pred_all, meas_all)
    print(f"\n{'set':<12}{'devices':>8}  {'plan':<14}{'device':>7}{'predicted ms':>14}"
          f"{'measured ms':>13}{'ratio':>7}")
    for r in rows:
        print(f"{r['set']:<12}{r['devices']:>8}  {r['strategy']:<14}{r['device']:>7}"
              f"{r['predicted_ms']:>14.3f}{r['measured_ms']:>13.3f}"
              f"{r['predicted_ms'] / r['measured_ms']:>7.2f}")
    print("\nplan choice (the model's pick vs the plan measured fastest, within 5%)")
    for c in choices:
        times = ", ".join(f"{k} {v:.3f}" for k, v in c["measured_max_ms"].items())
        print(f"  {c['set']:<12} {c['devices']} devices: picked {c['picked']}, measured fastest "
              f"{c['measured_fastest']} ({'right' if c['right'] else 'WRONG'}; max ms: {times})")
    overall = gmae([r["predicted_ms"] for r in rows], [r["measured_ms"] for r in rows])
    print(f"\nper-device GMAE, predicted vs measured (goal <= {GOAL:.0%}):")
    for name, e in per_set.items():
        print(f"  {name:<12}{e:>8.1%}")
    print(f"  {'overall':<12}{overall:>8.1%}   {'ok' if overall <= GOAL else 'MISSED'}")
    if args.json:
        args.json.write_bytes(orjson.dumps({"cost": cost.to_dict(), "devices": rows,
                                            "choices": choices, "gmae": per_set,
                                            "overall": overall}, option=orjson.OPT_INDENT_2))
    return 0 if overall <= GOAL and not any(math.isnan(e) for e in per_set.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
