"""How much the GPU kernel model's leave-one-GPU-out figures move with the fits' random seed.

    PYTHONPATH=src .venv/bin/python benchmarks/gpu_seeds.py [--seeds 3]

The model (model/gpu/learned.py) fitted leave-one-GPU-out on ../shared/gpu-kernels once per
seed 0..N-1 (`train`'s seed, every fit's), each scored as benchmarks/gpu_forecast.py scores it:
whole models (mean |error| of the e2e per GPU left out, from the op graph and from another
GPU's run, direct pricing) and the kernel tables (GMAE per family, of the kernel time and of
the whole latency, mean over the GPUs). Per row: each seed's figure, their mean and their
spread (max - min); for the kernel tables also the largest spread of one GPU. A forecast for an
unmeasured GPU should not move with the seed.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import sys
import time

from gpu_forecast import DATA, left_out, models_table
from perfswarm.model.gpu.dataset import load_dataset
from perfswarm.model.gpu.learned import train

COLUMNS = ("op graph", "from run")
KERNEL = (("kernel time", "gmae_kernel"), ("whole latency", "gmae"))


def _row(name: str, values: list[float], extra: str = "") -> str:
    cells = " ".join(f"{100 * v:6.1f}%" for v in values)
    return (f"{name:28s} {cells} {100 * statistics.mean(values):6.1f}% "
            f"{100 * (max(values) - min(values)):6.1f}{extra}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3, help="fit with seeds 0..N-1")
    args = parser.parse_args(argv)
    started = time.process_time()
    data = load_dataset(DATA)
    whole: dict[tuple[str, str], list[float]] = {}
    kernel: dict[tuple[str, str], dict[str, list[float]]] = {}
    for seed in range(args.seeds):
        print(f"  seed {seed}", file=sys.stderr)
        model, holdouts = train(data, seed=seed)
        model_for = left_out(model, holdouts)
        with contextlib.redirect_stdout(io.StringIO()):
            errors = models_table(lambda gpu, _, of=model_for: of(gpu), "", detail=False)
        for column in COLUMNS:
            for gpu, row in [*errors.items(), ("all cases", {
                    column: [e for r in errors.values() for e in r.get(column, [])]})]:
                whole.setdefault((gpu, column), []).append(statistics.mean(row[column]))
        for title, value in KERNEL:
            for h in holdouts:
                kernel.setdefault((title, h.family), {}).setdefault(h.gpu, []).append(
                    getattr(h, value))
    seeds = " ".join(f"{f'seed {s}':>7s}" for s in range(args.seeds))
    for column in COLUMNS:
        print(f"\nwhole models, {column}: mean |error| per GPU left out")
        print(f"{'GPU':28s} {seeds} {'mean':>7s} {'spread':>6s}")
        for (gpu, c), values in whole.items():
            if c == column:
                print(_row(gpu, values))
    for title, _ in KERNEL:
        print(f"\nkernel level, {title}: GMAE per family, mean over the GPUs left out")
        print(f"{'family':28s} {seeds} {'mean':>7s} {'spread':>6s} "
              f"{'largest spread of a GPU':>24s}")
        for (t, family), per_gpu in kernel.items():
            if t == title:
                means = [statistics.mean(v[s] for v in per_gpu.values())
                         for s in range(args.seeds)]
                gpu, widest = max(per_gpu.items(), key=lambda kv: max(kv[1]) - min(kv[1]))
                print(_row(family, means, f" {100 * (max(widest) - min(widest)):6.1f} "
                                          f"({gpu[-14:]})"))
    print(f"\nCPU time {time.process_time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
