"""Whole models as Runs: NeuSight's labels written as Kineto traces and forecast by `predict`.

    PYTHONPATH=src .venv/bin/python benchmarks/gpu_label_runs.py [--bundled] [--cases N]
                                                                 [--decompose]

Each label of ../shared/gpu-kernels (an fx graph of the embeddings, one transformer layer and
the head, with every node's input shapes and measured latencies; num_layer and the measured
e2e in its .json) becomes the trace torch.profiler would write of one iteration
(perfswarm/trace/opgraph.py): the forward ops of the embeddings, num_layer times the layer's
and the head's, then (training cases) every node's backward ops in reverse order inside their
autograd node, each op with its input shapes; two iterations. Two Runs per case:
- recorded on a CPU (the op graph alone): `predict RUN --device GPU` turns every op, forward
  and backward, into the GPU kernels it launches (model/gpu/aten.py), priced by the learned
  model, launched at the corpus's per-op host time;
- recorded on another GPU (the source: V100, or the A100 for the V100), its kernels the
  source's measured node latencies (split over a node's kernels as the model shares them):
  `predict RUN --device GPU` scales every kernel by the model's ratio between the target and
  the source; the forecast is the source's measured e2e times the predicted over the Run's
  measured iteration (the Run stands for the source's e2e run).
Each is compared with the target GPU's measured e2e ("idle": the share of the forecast
iteration the device waits on the host, its launches and gaps). With each GPU left out of the
model's training (leave-one-GPU-out, as benchmarks/gpu_forecast.py), or with the bundled model
(`--bundled`: trained on all five GPUs, in sample; quicker). That a Run's forecast prices
exactly its ops (as gpu_forecast.py's "op graph" prices the label directly) is tested in
tests/test_gpu_runs.py.

Then where the error is (`decompose`; `--decompose` prints only that): per held-out GPU, the
labels' e2e over the sum of their measured node latencies, and per op family its share of the
measured node time and the error of the model's price against it, absolute (left out, and the
points of the nodes' sum it makes; in sample) and as the ratio to the source GPU's measured node;
and the from-run error that exact node ratios would leave (the labels' own inconsistency).
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import orjson

from gpu_forecast import DATA, LAYER, _node_seconds, label_nodes, source_dir
from perfswarm.model.gpu.aten import op_kernels
from perfswarm.model.gpu.dataset import load_dataset
from perfswarm.model.gpu.hardware import Hardware
from perfswarm.model.gpu.labels import node_ops
from perfswarm.model.gpu.learned import FamilyModel, KernelModel, bundled, train
from perfswarm.model.kernels import GPU_FLOOR_NS
from perfswarm.model.opcost import Shapes
from perfswarm.model.predict import Change, Prediction, predict
from perfswarm.model.specs import DeviceSpec, load_spec
from perfswarm.trace import opgraph
from perfswarm.trace.ingest import ImportOptions, import_traces
from perfswarm.trace.store import Run

STEPS = 2
KERNEL_NAMES = {"gemm": "sgemm_128x64_nn", "conv": "implicit_convolve_sgemm",
                "elementwise": "void at::native::vectorized_elementwise_kernel<4, float>",
                "norm": "void at::native::vectorized_layer_norm_kernel<float, float>",
                "softmax": "void at::native::cunn_SoftMaxForward<4, float, float, float>"}


def _grad_fn(name: str) -> str:
    """The autograd node of a forward op: aten::native_layer_norm -> NativeLayerNormBackward0."""
    return name.removeprefix("aten::").title().replace("_", "") + "Backward0"


def label_ops(path: Path, train_case: bool, layers: int, source: tuple[Hardware, KernelModel]
              | None = None) -> list[opgraph.TraceOp]:
    """One iteration of a label's graph as trace ops: forward, then (training) backward in
    reverse. With `source`, every op carries its kernels at the label's measured node latency
    (ms), shared over the node's kernels as the model prices them on the source."""
    rows = list(csv.DictReader(io.StringIO(gzip.decompress(path.read_bytes()).decode())))
    nodes: list[tuple[bool, list[opgraph.TraceOp], list[opgraph.TraceOp]]] = []
    for row in rows:
        found = node_ops(row, train_case)
        if found is None:
            continue
        forward, backward = found
        grad = _grad_fn(forward[0][0]) if forward else ""
        fw = _traced(forward, "", float(row["fw_latency"]), source)
        bw = _traced(backward if train_case else [], grad, float(row["bw_latency"]), source)
        nodes.append((bool(LAYER.search(row["meta"])), fw, bw))
    first = next((i for i, n in enumerate(nodes) if n[0]), len(nodes))
    last = max((i for i, n in enumerate(nodes) if n[0]), default=first - 1)
    order = nodes[:first] + nodes[first:last + 1] * layers + nodes[last + 1:]
    return [op for n in order for op in n[1]] + [op for n in reversed(order) for op in n[2]]


def _traced(ops: Sequence[tuple[str, Shapes]], grad_fn: str, latency_ms: float,
            source: tuple[Hardware, KernelModel] | None) -> list[opgraph.TraceOp]:
    out = []
    works = [op_kernels(name, shapes) or [] for name, shapes in ops]
    share: np.ndarray = np.zeros(0)
    if source is not None and any(works):
        hw, model = source
        priced = model.seconds([w for ws in works for w in ws], hw) + GPU_FLOOR_NS * 1e-9
        share = priced / priced.sum() * latency_ms * 1e6
    i = 0
    for (name, shapes), ws in zip(ops, works, strict=True):
        kernels = tuple((KERNEL_NAMES[w.family], max(1, round(float(share[i + j]))))
                        for j, w in enumerate(ws)) if len(share) else ()
        i += len(ws)
        out.append(opgraph.TraceOp(name, shapes.dims, shapes.types, grad_fn, kernels))
    return out


def decompose(model_for: Callable[[str], KernelModel], full: KernelModel) -> None:
    """Where the whole-model error comes from, per held-out GPU: the labels' own gap (e2e over
    the sum of their measured node latencies), and per op family of the nodes that launch
    kernels, their share of the measured node time and the error of the model's price of them
    against it: absolute (the GPU left out, and the points of the nodes' sum it makes; and in
    sample, trained on it too) and as the ratio applied to the source GPU's measured node (the
    GPU left out); then the from-run error were every node's ratio exact (the measured target
    over source node), which the labels alone leave."""
    print("\nwhere the error is, against the measured node latencies (mean over cases, each GPU "
          "left out)")
    for gpu_dir in sorted((DATA / "labels").iterdir()):
        gpu = gpu_dir.name.replace("_", " ")
        hw, loo = Hardware.of_spec(load_spec(gpu)), model_for(gpu)
        # family -> [measured, abs, abs in sample; where a source ran the case: measured, abs,
        # ratio]
        parts: dict[str, np.ndarray] = {}
        gaps, exact = [], []
        for path in sorted(gpu_dir.glob("*.csv.gz")):
            case, train_case = path.name.removesuffix(".csv.gz"), "-train-" in path.name
            meta = orjson.loads((gpu_dir / f"{case}.json").read_bytes())
            layers, e2e = int(meta["num_layer"]), float(meta["e2e_latency"])
            nodes = label_nodes(path, train_case)
            times = [n.forward_ms + n.backward_ms for n in nodes]
            gaps.append(e2e / sum(t * (layers if n.in_layer else 1)
                                  for n, t in zip(nodes, times, strict=True)))
            src_dir = source_dir(gpu, case)
            src = label_nodes(src_dir / f"{case}.csv.gz", train_case) if src_dir else nodes
            src_hw = Hardware.of_spec(load_spec(src_dir.name.replace("_", " "))) if src_dir else hw
            measured = source = 0.0
            for phase in ("forward", "backward"):
                works = [getattr(n, phase) for n in nodes]
                priced = [np.array(_node_seconds(m, works, h)) * 1e3
                          for m, h in ((loo, hw), (full, hw), (loo, src_hw))]
                for i, (node, other) in enumerate(zip(nodes, src, strict=True)):
                    if not works[i]:
                        continue
                    times_ms = (getattr(node, f"{phase}_ms"), getattr(other, f"{phase}_ms"))
                    weight = layers if node.in_layer else 1
                    row = parts.setdefault(works[i][0].family, np.zeros(6))
                    sourced = np.array([times_ms[0], priced[0][i],
                                        times_ms[1] * priced[0][i] / priced[2][i]])
                    row += weight * np.array([times_ms[0], priced[0][i], priced[1][i],
                                              *(sourced if src_dir else np.zeros(3))])
                    measured += weight * times_ms[0]
                    source += weight * times_ms[1]
            if src_dir is not None:
                src_e2e = float(orjson.loads((src_dir / f"{case}.json").read_bytes())
                                ["e2e_latency"])
                exact.append(abs(src_e2e * measured / source / e2e - 1))
        total = sum(p[0] for p in parts.values())
        exact_text = f"{100 * statistics.mean(exact):.1f}%" if exact else "-"
        print(f"{gpu}: e2e / sum of node latencies {statistics.mean(gaps):.3f} "
              f"({min(gaps):.3f}-{max(gaps):.3f}); from run with exact node ratios {exact_text}")
        for family, (mt, absolute, in_sample, sourced, sourced_abs, ratio) in sorted(
                parts.items(), key=lambda kv: -kv[1][0]):
            print(f"  {family:12s} {100 * mt / total:5.1f}% of node time: absolute "
                  f"{100 * (absolute / mt - 1):+6.1f}%, {100 * (absolute - mt) / total:+5.1f} "
                  f"points of the nodes' sum (in sample "
                  f"{100 * (in_sample / mt - 1):+6.1f}%); where a source ran it: absolute "
                  f"{100 * (sourced_abs / sourced - 1):+6.1f}%, ratio from the source "
                  f"{100 * (ratio / sourced - 1):+6.1f}%")


def _idle(p: Prediction) -> str:
    """The share of the forecast iteration the device is idle: what host time, launches and
    gaps add to the kernels."""
    return f"{100 * (1 - p.median_active('predicted') / p.median('predicted')):5.1f}%"


def _device(spec: DeviceSpec) -> dict[str, object]:
    return {"name": (spec.names or (spec.name,))[0], "totalGlobalMem": int(spec.memory_bytes),
            "numSms": spec.compute_units}


def _run(tmp: Path, name: str, ops: list[opgraph.TraceOp], device: DeviceSpec | None) -> Run:
    trace = opgraph.write(tmp / f"{name}.json", [ops] * STEPS,
                          _device(device) if device else None)
    return import_traces([trace], tmp / f"{name}.run", ImportOptions(), [name])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundled", action="store_true",
                        help="the bundled model (all five GPUs, in sample), not leave-one-out")
    parser.add_argument("--cases", type=int, default=0, help="the first N cases only")
    parser.add_argument("--decompose", action="store_true",
                        help="only where the error is (printed after the table otherwise): per "
                        "GPU and op family, against the labels' measured node latencies")
    args = parser.parse_args(argv)
    started = time.process_time()
    full = bundled()
    holdout: dict[tuple[str, str], FamilyModel] = {}
    if not args.bundled:
        full, fits = train(load_dataset(DATA), lambda what: print(f"  fitting {what}",
                                                                  file=sys.stderr))
        holdout = {(h.family, h.gpu): h.model for h in fits}

    def model_for(gpu: str) -> KernelModel:
        return KernelModel({f: holdout.get((f, gpu), m) for f, m in full.families.items()}, ())

    if args.decompose:
        decompose(model_for, full)
        print(f"\nCPU time {time.process_time() - started:.0f} s")
        return 0

    print(f"{'GPU':22s} {'case':26s} {'measured ms':>11s} {'op graph':>9s} {'idle':>6s}"
          f" {'from run':>9s} {'idle':>6s} {'source':>10s}")
    errors: dict[str, dict[str, list[float]]] = {}
    cases = sorted({p.name.removesuffix(".csv.gz") for p in DATA.glob("labels/*/*.csv.gz")})
    with tempfile.TemporaryDirectory(prefix="perfswarm-labels-") as scratch:
        tmp = Path(scratch)
        for case in cases[:args.cases or None]:
            train_case = "-train-" in case
            gpus = [d for d in sorted((DATA / "labels").iterdir())
                    if (d / f"{case}.csv.gz").exists()]
            layers = int(orjson.loads((gpus[0] / f"{case}.json").read_bytes())["num_layer"])
            cpu_run = _run(tmp, f"{case}-cpu", label_ops(gpus[0] / f"{case}.csv.gz",
                                                         train_case, layers), None)
            for gpu_dir in gpus:
                gpu = gpu_dir.name.replace("_", " ")
                model = model_for(gpu)
                measured = float(orjson.loads((gpu_dir / f"{case}.json").read_bytes())
                                 ["e2e_latency"])
                graph = predict(cpu_run, Change(device=gpu), gpu_model=model)
                graph_ms = graph.median("predicted") / 1e6
                idle = [_idle(graph), "-"]
                errors.setdefault(gpu, {}).setdefault("op graph", []).append(
                    abs(graph_ms / measured - 1))
                src_dir = source_dir(gpu, case)
                shown = "-"
                if src_dir is not None:
                    src_spec = load_spec(src_dir.name.replace("_", " "))
                    ops = label_ops(src_dir / f"{case}.csv.gz", train_case, layers,
                                    (Hardware.of_spec(src_spec), model))
                    src_run = _run(tmp, f"{case}-{gpu_dir.name}-src", ops, src_spec)
                    p = predict(src_run, Change(device=gpu), gpu_model=model)
                    src_e2e = float(orjson.loads((src_dir / f"{case}.json").read_bytes())
                                    ["e2e_latency"])
                    scaled = src_e2e * p.median("predicted") / p.median("measured")
                    errors[gpu].setdefault("from run", []).append(abs(scaled / measured - 1))
                    shown = f"{100 * abs(scaled / measured - 1):8.1f}%"
                    idle[1] = _idle(p)
                print(f"{gpu:22s} {case:26s} {measured:11.1f} "
                      f"{100 * abs(graph_ms / measured - 1):8.1f}% {idle[0]:>6s} {shown:>9s} "
                      f"{idle[1]:>6s} "
                      f"{src_dir.name[-10:] if src_dir else '-':>10s}", flush=True)
    print("\nmean |error| per GPU")
    for gpu, row in errors.items():
        print(f"{gpu:22s} " + " ".join(
            f"{c} {100 * statistics.mean(v):5.1f}%" for c, v in row.items()))
    every = {c: [e for row in errors.values() for e in row.get(c, [])]
             for c in ("op graph", "from run")}
    print(f"{'all':22s} " + " ".join(f"{c} {100 * statistics.mean(v):5.1f}%"
                                      for c, v in every.items() if v))
    decompose(model_for, full)
    print(f"\nCPU time {time.process_time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
