"""A kernel sweep on a lent GPU, written as shared/gpu-kernels lays one out (NeuSight's format),
so `perfswarm calibrate --dataset` can learn from a GPU that folder does not hold.

Here, `shapes OUT.json [--rows N]`: N rows per op, evenly spaced over each sweep of
../shared/gpu-kernels (its shapes only: linear, bmm and the elementwise, layer norm and softmax
ops from the A100's sweep, conv from the V100's, the only GPU with conv and the most rows).

On the GPU machine, `device SHAPES OUT [--budget S]`: each shape's op run under
torch.profiler (CUDA activities) REPS times after WARMUP calls, in torch's defaults (FP32
GEMMs on CUDA cores, cuDNN free to use TF32 for convolutions, as NeuSight's own sweeps ran);
a row's `Latency` is the median over the calls of the sum of the call's kernels' CUPTI
durations, in ms: the kernel time alone, no host part (NeuSight's latencies hold 25-60 us of the
measuring host's). Also `linear_tf32` (the same GEMMs with TF32 allowed), a folder the dataset
reader skips. Writes OUT/train/<op>/<GPU>.csv.gz and OUT/device_configs/<GPU>.json.

    python benchmarks/gpu_sweep.py shapes OUT.json [--kernels ../shared/gpu-kernels] [--rows N]
    python benchmarks/gpu_sweep.py device SHAPES.json OUT [--budget S] [--reps 5]
"""

from __future__ import annotations

import argparse
import bisect
import csv
import gzip
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

KERNELS = Path(__file__).resolve().parents[2] / "shared" / "gpu-kernels"
ELEMENTWISE = ("add", "addu", "mul", "mulu", "div", "divu", "pow", "powu", "relu", "gelu",
               "tanh")
SOURCES = {"linear": ("NVIDIA_A100-PCIE-40GB", ("B", "M", "N", "K")),
           "bmm": ("NVIDIA_A100-PCIE-40GB", ("B", "M", "N", "K")),
           "conv": ("Tesla_V100-PCIE-32GB", ("B", "Input_Channel", "Output_Channel",
                                             "Kernel_Szie", "Input_Size", "Stride", "Padding")),
           "ln": ("NVIDIA_A100-PCIE-40GB", ("B", "H")),
           "softmax": ("NVIDIA_A100-PCIE-40GB", ("B", "H")),
           **dict.fromkeys(ELEMENTWISE, ("NVIDIA_A100-PCIE-40GB", ("B", "H")))}
ROWS = {"linear": 1200, "bmm": 1200, "conv": 900, "ln": 600, "softmax": 600,
        **dict.fromkeys(ELEMENTWISE, 250)}
ORDER = ("bmm", "conv", "linear", "linear_tf32")  # after the vector ops: the slow sweeps last
TF32_ROWS = 500  # linear_tf32: every other of the first linear rows, TF32 allowed


def shapes_half(ns: argparse.Namespace) -> None:
    out: dict[str, Any] = {}
    for op, (gpu, columns) in SOURCES.items():
        with gzip.open(ns.kernels / "train" / op / f"{gpu}.csv.gz", "rt", newline="") as f:
            rows = [[int(float(r[c])) for c in columns] for r in csv.DictReader(f)]
        want = min(len(rows), ns.rows or ROWS[op])
        step = len(rows) / want
        picked = [rows[int(i * step)] for i in range(want)]
        random.Random(0).shuffle(picked)  # a sweep cut short by its budget keeps a fair sample
        out[op] = {"columns": columns, "shapes": picked}
    out["linear_tf32"] = {"columns": out["linear"]["columns"],
                          "shapes": out["linear"]["shapes"][: 2 * TF32_ROWS : 2]}
    ns.out.write_text(json.dumps(out))
    print({op: len(v["shapes"]) for op, v in out.items()})


def op_call(op: str, shape: list[int], torch: Any, dev: str = "cuda") -> Callable[[], Any]:
    """The call NeuSight's sweep times for a row of `op` (its inputs made once, on the GPU)."""
    import torch.nn.functional as F


    def rand(*size: int) -> Any:
        return torch.randn(*size, device=dev)

    if op in ("linear", "linear_tf32"):
        _, m, n, k = shape  # x [M, N] through a weight [K, N]: output [M, K]
        x, w, bias = rand(m, n), rand(k, n), rand(k)
        return lambda: F.linear(x, w, bias)
    if op == "bmm":
        b, m, n, k = shape
        x, y = rand(b, m, n), rand(b, n, k)
        return lambda: torch.bmm(x, y)
    if op == "conv":
        b, c_in, c_out, kernel, size, stride, pad = shape
        x, w = rand(b, c_in, size, size), rand(c_out, c_in, kernel, kernel)
        return lambda: F.conv2d(x, w, stride=stride, padding=pad)
    b, h = shape
    x = rand(b, h)
    if op == "ln":
        gamma, beta = rand(h), rand(h)
        return lambda: F.layer_norm(x, (h,), gamma, beta)
    if op == "softmax":
        return lambda: torch.softmax(x, dim=-1)
    y = rand(b, h).abs() + 0.5
    calls: dict[str, Callable[[], Any]] = {
        "add": lambda: x + y, "addu": lambda: x + 1.5, "mul": lambda: x * y,
        "mulu": lambda: x * 1.5, "div": lambda: x / y, "divu": lambda: x / 1.5,
        "pow": lambda: torch.pow(y, x), "powu": lambda: torch.pow(y, 2.5),
        "relu": lambda: torch.relu(x), "gelu": lambda: F.gelu(x), "tanh": lambda: torch.tanh(x)}
    return calls[op]


def kernel_times(trace: Path) -> dict[str, list[tuple[int, str, list[Any]]]]:
    """Per annotation name, the (duration ns, kernel name, [grid, block]) of each kernel whose
    launch ran inside it (through the runtime call's correlation id)."""
    events = json.loads(trace.read_text())["traceEvents"]
    spans = sorted((int(e["ts"] * 1000), int((e["ts"] + e["dur"]) * 1000), e["name"])
                   for e in events if e.get("cat") == "user_annotation" and "dur" in e)
    starts = [s for s, _, _ in spans]
    owner: dict[int, str] = {}
    for e in events:
        if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {}):
            ts = int(e["ts"] * 1000)
            i = bisect.bisect_right(starts, ts) - 1
            if i >= 0 and ts <= spans[i][1]:
                owner[e["args"]["correlation"]] = spans[i][2]
    out: dict[str, list[tuple[int, str, list[Any]]]] = {}
    for e in events:
        if e.get("cat") == "kernel":
            name = owner.get(e.get("args", {}).get("correlation", -1))
            if name is not None:
                args = e["args"]
                out.setdefault(name, []).append((round(e["dur"] * 1000), e["name"],
                                                 [args.get("grid"), args.get("block")]))
    return out


def measure(op: str, shapes: list[list[int]], reps: int, warmup: int, deadline: float,
            torch: Any) -> list[tuple[list[int], float, list[tuple[int, str, list[Any]]]]]:
    """Each shape's median kernel time per call (ms) and one call's kernels."""
    from torch.profiler import ProfilerActivity, profile, record_function

    torch.backends.cuda.matmul.allow_tf32 = op == "linear_tf32"
    done: list[int] = []  # the shapes timed, by index (one out of memory is skipped)
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.json"
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for i, shape in enumerate(shapes):
                if time.monotonic() > deadline:
                    break
                try:
                    call = op_call(op, shape, torch)
                    for _ in range(warmup):
                        call()
                    for j in range(reps):
                        with record_function(f"{i}.{j}"):
                            call()
                except torch.OutOfMemoryError:
                    torch.cuda.empty_cache()
                    continue
                done.append(i)
                if i % 50 == 49:
                    torch.cuda.synchronize()
            torch.cuda.synchronize()
        prof.export_chrome_trace(str(trace))
        kernels = kernel_times(trace)
    torch.backends.cuda.matmul.allow_tf32 = False
    out = []
    for i in done:
        shape = shapes[i]
        calls = [kernels.get(f"{i}.{j}", []) for j in range(reps)]
        if all(calls):
            ms = statistics.median(sum(d for d, _, _ in c) for c in calls) / 1e6
            out.append((shape, ms, calls[0]))
    return out


def device_half(ns: argparse.Namespace) -> None:
    import torch

    spec = json.loads(ns.shapes.read_text())
    gpu = torch.cuda.get_device_name(0)
    props = torch.cuda.get_device_properties(0)
    stem = gpu.replace(" ", "_")
    (ns.out / "device_configs").mkdir(parents=True, exist_ok=True)
    # L2Cache in MB of 2^20 bytes and the compute capability, as Hardware.of_config reads them
    (ns.out / "device_configs" / f"{stem}.json").write_text(json.dumps({
        "Device": gpu, "Dev_Mem": round(props.total_memory / 1e9), "Num_Sm":
        props.multi_processor_count, "L2Cache": props.L2_cache_size / 2**20,
        "Compute_Capability": f"{props.major}.{props.minor}",
        "torch": torch.__version__, "cudnn": torch.backends.cudnn.version()}))
    # the quick sweeps first; one the budget cuts short keeps a fair sample (shapes shuffled)
    ops = sorted(spec, key=lambda op: ORDER.index(op) if op in ORDER else -1)
    deadline = time.monotonic() + ns.budget
    for op in ops:
        begun = time.monotonic()
        rows = measure(op, spec[op]["shapes"], ns.reps, ns.warmup, deadline, torch)
        folder = ns.out / "train" / op
        folder.mkdir(parents=True, exist_ok=True)
        with gzip.open(folder / f"{stem}.csv.gz", "wt", newline="") as f:
            w = csv.writer(f)
            w.writerow(["OPName", "Latency", "Device", "Torch Version", "CUDNN Version",
                        "Kernel Name", "Grid", "Block", "Kernels", *spec[op]["columns"]])
            for shape, ms, kernels in rows:
                main = max(kernels)
                w.writerow([op, f"{ms:.6g}", gpu, torch.__version__,
                            torch.backends.cudnn.version(), main[1], main[2][0], main[2][1],
                            ";".join(k[1] for k in kernels), *shape])
        print(f"{op}: {len(rows)} of {len(spec[op]['shapes'])} shapes in "
              f"{time.monotonic() - begun:.1f} s", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="half", required=True)
    s = sub.add_parser("shapes")
    s.add_argument("out", type=Path)
    s.add_argument("--kernels", type=Path, default=KERNELS)
    s.add_argument("--rows", type=int, default=0)
    d = sub.add_parser("device")
    d.add_argument("shapes", type=Path)
    d.add_argument("out", type=Path)
    d.add_argument("--budget", type=float, default=120.0)
    d.add_argument("--reps", type=int, default=5)
    d.add_argument("--warmup", type=int, default=2)
    ns = p.parse_args()
    try:
        if ns.half == "shapes":
            shapes_half(ns)
        else:
            device_half(ns)
    except (OSError, ValueError, KeyError) as exc:  # a missing or malformed input file
        print(f"gpu_sweep.py: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
