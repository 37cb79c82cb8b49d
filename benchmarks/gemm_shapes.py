"""How close calibrated GEMM models come on the GEMMs real scripts run, not on their own sweep.

    PYTHONPATH=src .venv/bin/python benchmarks/gemm_shapes.py RUNS_DIR PROFILE.json [PROFILE ...]

Every distinct single-matrix GEMM (aten::mm, aten::addmm: m, k, n and operand layout) of the
Runs in RUNS_DIR (e.g. `realworld.py --only predict --keep DIR`) is timed here, on this CPU at
one thread, the way `calibrate` times a sweep point (kernels.py's runner: inputs from a
rotation of copies, the fastest of five timings). Each profile's GEMM model is scored on those
times: GMAE over every shape, over those above 20 us, and the mean |log error| weighted by the
time each shape took in the recordings (count x time). A profile's held-out error is on points
of its own design; this is the error where predictions land.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import numpy as np

from perfswarm.errors import PerfswarmError
from perfswarm.model.accuracy import gmae
from perfswarm.model.opcost import Shapes, data_cost, gemm_dims
from perfswarm.model.predict import load_model
from perfswarm.model.profile import read_profile
from perfswarm.recorder.bench.kernels import _runner, time_op
from perfswarm.trace.store import Run

GEMMS = ("aten::mm", "aten::addmm")
BIG_S = 20e-6

Shape = tuple[int, int, int, bool, bool]  # m, k, n, A column-major, B column-major


def real_shapes(folder: Path) -> Counter[Shape]:
    """Each distinct GEMM of the Runs in `folder`, and how often the recordings ran it."""
    found: Counter[Shape] = Counter()
    runs = sorted(folder.glob("*.run"))
    if not runs:
        raise PerfswarmError(f"{folder}: no Runs (*.run) in it")
    for path in runs:
        m = load_model(Run(path))
        ev = m.ev
        ids = [i for i, name in enumerate(ev.names) if name in GEMMS]
        gemm = np.isin(ev.name, ids) & ev.of_kind("cpu_op")
        rows = np.flatnonzero(gemm).tolist()
        for row, shapes in zip(rows, m.shapes(rows), strict=True):
            cost = data_cost(ev.names[ev.name[row]], shapes) if shapes is not None else None
            dims = gemm_dims(cost.op, shapes.dims) if cost is not None and shapes else None
            if cost is not None and dims is not None and dims[0] == 1:
                found[(*dims[1:], cost.a_transposed, cost.b_transposed)] += 1
    return found


def timed(shape: Shape) -> tuple[Shapes, float]:
    """The shape as a sweep point (`aten::mm` in its layout) and its time here."""
    m, k, n, a_t, b_t = shape
    strides = ((1, m), (n, 1)) if a_t else ((k, 1), (1, k)) if b_t else ()
    dims = [[m, k], [k, n]]
    return (Shapes((tuple(dims[0]), tuple(dims[1])), ("float", "float"), strides),
            time_op(_runner("aten::mm", dims, "cpu", strides)))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", type=Path)
    p.add_argument("profiles", type=Path, nargs="+")
    args = p.parse_args()
    import torch

    torch.set_num_threads(1)
    try:
        profiles = {path: read_profile(path) for path in args.profiles}
        counts = real_shapes(args.runs)
    except PerfswarmError as exc:
        print(f"gemm_shapes: {exc}", file=sys.stderr)
        return 2
    if missing := [str(path) for path, found in profiles.items() if "gemm" not in found.models]:
        print(f"gemm_shapes: {', '.join(missing)}: no GEMM model in the profile", file=sys.stderr)
        return 2
    models = {path: found.models["gemm"] for path, found in profiles.items()}
    shapes = sorted(counts)
    points = [timed(s) for s in shapes]
    seconds = np.array([t for _, t in points])
    weight = np.array([counts[s] for s in shapes]) * seconds
    big = seconds > BIG_S
    print(f"{len(shapes)} distinct GEMMs of {sum(counts.values())} in {args.runs}, "
          f"{int(big.sum())} above {BIG_S * 1e6:.0f} us here")
    print(f"{'profile':40s} {'all':>7s} {'>20us':>7s} {'time-weighted':>14s}")
    for path, model in models.items():
        predicted = []
        for shapes_, _ in points:
            cost = data_cost("aten::mm", shapes_)
            assert cost is not None
            predicted.append(model.predict(cost, shapes_.dims))
        pred = np.array(predicted)
        weighted = float(np.sum(weight * np.abs(np.log(pred / seconds))) / weight.sum())
        print(f"{str(path)[-40:]:40s} {100 * gmae(pred, seconds):6.1f}% "
              f"{100 * gmae(pred[big], seconds[big]):6.1f}% {100 * weighted:13.1f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
