"""What the measured GPUs' FP32 GEMMs reach, and what a GPU left out could be told of it.

    PYTHONPATH=src .venv/bin/python benchmarks/gpu_gemm_rates.py

Reads ../shared/gpu-kernels (NeuSight's measurements, MIT) and prints, per GPU:
1. the GEMM kernels its linear and bmm sweeps and test sets ran, and how many are FP32 SIMT
   sgemm kernels (no tensor-core or TF32 kernel: the FP32 peak is the roofline they can use);
2. the FLOP rate of its large GEMMs (2e10 FLOPs or more) as a fraction of its FP32 peak
   (devices.yaml, boost clock), median and 90th percentile, per split (sweep, test shapes,
   whole models' nodes);
3. the rate of each test-set GEMM over that of the nearest sweep shape (b, m, n, k within a
   factor 2 over all four) of the same GPU: the same work measured twice;
4. the same sweep kernel on several GPUs: its large linears' median fraction of the peak;
5. a power bound: board power (TDP) over the energy per FLOP of the other GPUs of the same
   process node (TDP over their 90th-percentile rate, the least), as a fraction of the peak,
   beside what the GPU reached.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import math
import re
import time
from collections import Counter
from pathlib import Path

import numpy as np

from perfswarm.model.gpu.dataset import Measurement, load_dataset

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "gpu-kernels"
LARGE = 2e10  # FLOPs
TENSOR_CORE = re.compile(r"tensorop|1688|16816|884|tf32|hmma|xmma", re.IGNORECASE)
# board power (W) and the die's process node (nm), NVIDIA's datasheets and whitepapers
POWER = {"Tesla P4": (75, 16), "Tesla P100-PCIE-16GB": (250, 16), "Tesla T4": (70, 12),
         "Tesla V100-PCIE-32GB": (250, 12), "NVIDIA A100-PCIE-40GB": (250, 7)}


def same_kernel(peaks: dict[str, float]) -> None:
    print("\n4. one sweep kernel on several GPUs: large linears' median fraction of the peak")
    by: dict[str, dict[str, list[float]]] = {}
    for gpu, peak in peaks.items():
        with gzip.open(DATA / "train" / "linear" / f"{gpu.replace(' ', '_')}.csv.gz", "rt",
                       newline="") as f:
            for r in csv.DictReader(f):
                flops = 2.0 * math.prod(int(float(r[c])) for c in "BMNK")
                if flops >= LARGE:
                    by.setdefault(r["Kernel Name"].split("(")[0], {}).setdefault(gpu, []).append(
                        flops / (float(r["Latency"]) * 1e-3) / peak)
    for kernel, per_gpu in sorted(by.items()):
        if len(per_gpu) > 1:
            print(f"  {kernel:34s} " + "  ".join(f"{g} {np.median(v):.2f} ({len(v)})"
                                                for g, v in per_gpu.items()))


def kernels() -> None:
    print("1. GEMM kernels run (FP32 SIMT sgemm / all) and the commonest two, per op and split")
    for gpu in POWER:
        cells, simt, every = [], 0, 0
        for op in ("linear", "bmm"):
            for split, path in (("sweep", DATA / "train" / op / f"{gpu.replace(' ', '_')}.csv.gz"),
                                ("test", DATA / "test" / f"{op}.csv.gz")):
                with gzip.open(path, "rt", newline="") as f:
                    names = Counter(r["Kernel Name"].split("(")[0] for r in csv.DictReader(f)
                                    if r.get("Device", gpu) == gpu)
                simt += sum(n for k, n in names.items()
                            if "sgemm" in k and not TENSOR_CORE.search(k))
                every += sum(names.values())
                cells.append(f"{op} {split}: " + ", ".join(f"{k} {n}"
                                                          for k, n in names.most_common(2)))
        print(f"  {gpu:22s} {simt}/{every}\n    " + "\n    ".join(cells))


def rate(r: Measurement) -> float:
    return r.work.flops / r.seconds


def main() -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    started = time.process_time()
    data = load_dataset(DATA)
    kernels()
    gemms = [r for r in data.rows if r.work.family == "gemm"]
    large = {(g, s): np.array([rate(r) for r in gemms if r.gpu == g and r.split == s
                               and r.work.flops >= LARGE])
             for g in POWER for s in ("train", "test", "label")}
    print("\n2. large GEMMs, fraction of the FP32 peak: median / 90th percentile (rows)")
    for gpu in POWER:
        peak = data.hardware[gpu].fp32
        cells = [f"{s} {np.median(v) / peak:.2f} / {np.percentile(v, 90) / peak:.2f} ({len(v)})"
                 for s in ("train", "test", "label") if len(v := large[gpu, s])]
        print(f"  {gpu:22s} peak {peak / 1e12:5.1f} TFLOP/s  " + "  ".join(cells))
    print("\n3. the same shapes twice: test-set rate over the nearest sweep shape's, median")
    for gpu in POWER:
        cells = []
        for kind in ("linear", "bmm"):
            sweep = [r for r in gemms if r.gpu == gpu and r.work.kind == kind
                     and r.split == "train" and r.work.flops >= LARGE / 10]
            dims = np.log2([[r.work.b, r.work.m, r.work.n, r.work.k] for r in sweep])
            ratios = []
            for r in gemms:
                if ((r.gpu, r.work.kind, r.split) == (gpu, kind, "test")
                        and r.work.flops >= LARGE / 10):
                    far = np.abs(dims - np.log2([r.work.b, r.work.m, r.work.n, r.work.k])).sum(1)
                    if far.min() < 1:
                        ratios.append(rate(r) / rate(sweep[int(far.argmin())]))
            cells.append(f"{kind} {np.median(ratios):.2f} ({len(ratios)})")
        print(f"  {gpu:22s} " + "  ".join(cells))
    same_kernel({g: data.hardware[g].fp32 for g in POWER})
    print("\n5. power bound from the other GPUs of the same node, fraction of the peak")
    energy = {g: watts / np.percentile(np.concatenate([large[g, "train"], large[g, "label"]]), 90)
              for g, (watts, _) in POWER.items()}
    for gpu, (watts, node) in POWER.items():
        peak = data.hardware[gpu].fp32
        others = [energy[g] for g, (_, n) in POWER.items() if n == node and g != gpu]
        bound = f"{min(1.0, watts / min(others) / peak):.2f}" if others else "none"
        print(f"  {gpu:22s} {watts:3d} W {node:2d} nm  {energy[gpu] * 1e12:5.1f} pJ/FLOP  bound "
              f"{bound:4s}  reached: sweep {np.percentile(large[gpu, 'train'], 90) / peak:.2f}, "
              f"whole models {np.percentile(large[gpu, 'label'], 90) / peak:.2f} (90th pct)")
    print(f"\nCPU time {time.process_time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
