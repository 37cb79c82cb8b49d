"""GPU forecasts against real GPU measurements (../shared/gpu-kernels, NeuSight's data, MIT).

    PYTHONPATH=src .venv/bin/python benchmarks/gpu_forecast.py [--only kernels|models]

1. Kernels: the GPU kernel model (model/gpu/learned.py) fitted leave-one-GPU-out over the 5
   GPUs, per family: GMAE on the held-out GPU's measurements (up to 1,500 per family: its
   sweeps and NeuSight's test shapes), beside a plain roofline (max of FLOPs at the FP32 peak
   and bytes at the bandwidth), twice: of the kernel time (the latency less the held-out GPU's
   own floor, its host and launch part, on its rows of at least two floors) and of the whole
   latency (the other GPUs' median floor plus the kernel). Goal: <= 10% for every family.
2. Whole models: each label (BERT-large, GPT-2 large, GPT-3 XL / 2.7B, OPT-1.3B; inference and
   training) is an fx graph of the embeddings, one transformer layer and the head, each node
   with its input shapes and measured forward/backward latency. Every node becomes the aten ops
   it runs, forward and (training) backward: Linear -> linear; its backward two GEMMs and the
   bias-gradient reduction; LayerNorm -> native_layer_norm(_backward); softmax and its
   backward; elementwise ops; Embedding -> embedding and embedding_dense_backward; a
   non-contiguous `contiguous` -> a copy. The iteration is the head plus num_layer times the
   layer (as the label's e2e is measured). Forecast for each GPU with that GPU left out of
   training:
   - op graph: every op's kernels priced by the model on the target (absolute times);
   - from another GPU's run: the source GPU's measured e2e of the same case times the model's
     ratio between the op graph on the target and on the source (the source's per-node
     latencies are not summed: on the A100 they add up to 1.5x its measured e2e);
   against the measured e2e, beside NeuSight's, Habitat's and the roofline's published
   forecasts of the same cases (published/<GPU>/<method>/<case>.json).
   Goals: mean |error| <= 5% (from another GPU) and never worse than NeuSight on a GPU;
   from the op graph alone mean <= 10%.
"""

from __future__ import annotations

import argparse
import ast
import csv
import gzip
import io
import math
import re
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson

from perfswarm.model.gpu.aten import op_kernels
from perfswarm.model.gpu.dataset import load_dataset
from perfswarm.model.gpu.hardware import Hardware
from perfswarm.model.gpu.learned import KernelModel, train
from perfswarm.model.gpu.work import Work
from perfswarm.model.kernels import GPU_FLOOR_NS
from perfswarm.model.opcost import Shapes
from perfswarm.model.specs import load_spec

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "gpu-kernels"
LAYER = re.compile(r"\.(?:layer|h|layers)\.0'")  # the one transformer layer of a label graph
SOURCES = ("Tesla V100-PCIE-32GB", "NVIDIA A100-PCIE-40GB", "Tesla T4", "Tesla P100-PCIE-16GB",
           "Tesla P4")  # the source run: the first of these, other than the target, with the case
METHODS = ("neusight", "habitat", "roofline")


@dataclass
class Node:
    in_layer: bool
    forward: list[Work]
    backward: list[Work]
    forward_ms: float = 0.0  # the label's measured latencies of the node
    backward_ms: float = 0.0


def _shape(text: str) -> list[list[int]]:
    try:
        value = ast.literal_eval(text) if text else []
    except (ValueError, SyntaxError):
        return []
    if isinstance(value, tuple):
        value = [list(value)]
    return [list(v) if isinstance(v, list | tuple) else [] for v in value]


def _ops(row: dict[str, str], train_case: bool) -> tuple[list[tuple[str, Shapes]],
                                                        list[tuple[str, Shapes]]] | None:
    """The aten ops (forward, backward) of one fx node; None when it runs no kernel."""
    op, target, meta = row["op"], row["target"], row["meta"]
    ins = [d for d in _shape(row["input_shapes"]) if d]
    out = _shape(row["output_shape"])
    out_shape = out[0] if out else []
    module = meta.split("<class '")[-1].split("'")[0] if op == "call_module" else ""

    def s(*dims: Sequence[int]) -> Shapes:
        return Shapes(tuple(tuple(d) for d in dims), ("float",) * len(dims))

    if not ins or not out_shape:
        return None
    x = ins[0]
    if module.endswith("Linear"):
        n, k = out_shape[-1], x[-1]
        m = math.prod(x[:-1])
        return ([("aten::linear", s(x, [n, k], [n]))],
                [("aten::mm", s([m, n], [n, k])), ("aten::mm", s([n, m], [m, k])),
                 ("aten::sum", s([m, n])), ("aten::add_", s([n, k], [n, k]))])
    if "addmm" in target and len(ins) == 3:
        (n,), (m, k) = ins[0], ins[1]
        return ([("aten::addmm", s(ins[0], ins[1], ins[2]))],
                [("aten::mm", s([m, n], [n, k])), ("aten::mm", s([k, m], [m, n])),
                 ("aten::sum", s([m, n])), ("aten::add_", s([k, n], [k, n]))])
    if ("matmul" in target or "bmm" in target) and len(ins) == 2:
        a, b = ins
        return ([("aten::matmul", s(a, b))],
                [("aten::matmul", s(out_shape, [*b[:-2], b[-1], b[-2]])),
                 ("aten::matmul", s([*a[:-2], a[-1], a[-2]], out_shape))])
    if module.endswith("LayerNorm"):
        return ([("aten::native_layer_norm", s(x))],
                [("aten::native_layer_norm_backward", s(x, x))])
    if "softmax" in target:
        return [("aten::_softmax", s(x))], [("aten::_softmax_backward_data", s(x, x))]
    if module.endswith("Embedding") or (not module and "embedding" in target):
        table = [1, out_shape[-1]]
        return ([("aten::embedding", s(table, x))],
                [("aten::embedding_dense_backward", s(out_shape, out_shape))])
    if module.endswith("Dropout") or "dropout" in target:
        return ([("aten::mul", s(x, x))], [("aten::mul", s(x, x))]) if train_case else None
    unary = {"gelu": "aten::gelu", "tanh": "aten::tanh", "Tanh": "aten::tanh",
             "ReLU": "aten::relu", "pow": "aten::pow"}
    for key, name in unary.items():
        if key in target or module.endswith(key):
            return [(name, s(x))], [(name + "_backward" if key != "pow" else "aten::mul",
                                     s(out_shape, x))]
    binary = {"add": "aten::add", "sub": "aten::sub", "mul": "aten::mul",
              "truediv": "aten::div", "where": "aten::where", "masked_fill": "aten::masked_fill",
              "max": "aten::maximum"}  # OPT's torch.max(scores, finfo.min): elementwise
    for key, name in binary.items():
        if key in target and math.prod(out_shape) > 1:
            shapes = s(*[d for d in ins if d] + ([out_shape] if len(ins) == 1 else []))
            grads = ([("aten::mul", s(out_shape, out_shape))]
                     if key in ("mul", "truediv", "max") else [])
            return [(name, shapes)], grads
    if target in ("contiguous", "reshape") and row["input_contiguous"].startswith("[False"):
        return [("aten::copy_", s(x, x))], []
    return None


def label_nodes(path: Path, train_case: bool) -> list[Node]:
    rows = csv.DictReader(io.StringIO(gzip.decompress(path.read_bytes()).decode()))
    nodes = []
    for row in rows:
        ops = _ops(row, train_case)
        forward = [w for name, sh in (ops[0] if ops else []) for w in op_kernels(name, sh) or []]
        backward = [w for name, sh in (ops[1] if ops and train_case else [])
                    for w in op_kernels(name, sh) or []]
        nodes.append(Node(bool(LAYER.search(row["meta"])), forward, backward,
                          float(row["fw_latency"] or 0), float(row["bw_latency"] or 0)))
    return nodes


def _node_seconds(model: KernelModel, works: list[list[Work]], hw: Hardware) -> list[float]:
    flat = [w for ws in works for w in ws]
    times = model.seconds(flat, hw) if flat else np.zeros(0)
    out, i = [], 0
    for ws in works:
        out.append(float(times[i:i + len(ws)].sum()) + len(ws) * GPU_FLOOR_NS * 1e-9)
        i += len(ws)
    return out


def source_dir(gpu: str, case: str) -> Path | None:
    """The labels of the run a forecast for `gpu` starts from: the first of SOURCES, other
    than `gpu`, that measured `case`."""
    return next((d for s in SOURCES if s != gpu
                 and ((d := DATA / "labels" / s.replace(" ", "_")) / f"{case}.csv.gz").exists()),
                None)


def _total(nodes: list[Node], per_node: list[float], layers: int) -> float:
    return sum(t * (layers if n.in_layer else 1) for n, t in zip(nodes, per_node, strict=True))


def kernels_table(holdouts: list) -> None:  # type: ignore[type-arg]
    gpus = sorted({h.gpu for h in holdouts})
    for title, value, roof in (
            ("kernel time (latency less the GPU's own floor, rows of >= 2 floors)",
             "gmae_kernel", "gmae_kernel_roofline"),
            ("whole latency (the others' median floor + the kernel)", "gmae", "gmae_roofline")):
        print(f"\n1. kernel level, leave-one-GPU-out GMAE per family (model | plain roofline): "
              f"{title}")
        print(f"{'family':12s} " + " ".join(f"{g[-14:]:>24s}" for g in gpus) + f" {'mean':>18s}")
        for family in dict.fromkeys(h.family for h in holdouts):
            mine = {h.gpu: h for h in holdouts if h.family == family}
            cells = [f"{100 * getattr(mine[g], value):6.1f}% | "
                     f"{100 * getattr(mine[g], roof):7.1f}%" if g in mine else f"{'-':>18s}"
                     for g in gpus]
            mean = statistics.mean(getattr(h, value) for h in mine.values())
            mean_roof = statistics.mean(getattr(h, roof) for h in mine.values())
            print(f"{family:12s} " + " ".join(f"{c:>24s}" for c in cells)
                  + f" {100 * mean:6.1f}% | {100 * mean_roof:6.1f}%")


def models_table(holdouts: list, full: KernelModel) -> None:  # type: ignore[type-arg]
    print("\n2. whole models, each GPU left out of training: |error| of e2e vs measured")
    print(f"{'GPU':22s} {'case':28s} {'measured ms':>11s} {'op graph':>9s} {'from run':>9s}"
          f" {'(source)':>10s} " + " ".join(f"{m:>9s}" for m in METHODS))
    errors: dict[str, dict[str, list[float]]] = {}
    for gpu_dir in sorted((DATA / "labels").iterdir()):
        gpu = gpu_dir.name.replace("_", " ")
        loo = KernelModel({f: next((h.model for h in holdouts
                                    if h.family == f and h.gpu == gpu), m)
                           for f, m in full.families.items()}, ())
        hw = Hardware.of_spec(load_spec(gpu))
        for case_json in sorted(gpu_dir.glob("*.json")):
            case = case_json.stem
            if case.endswith("-fusion") or not (gpu_dir / f"{case}.csv.gz").exists():
                continue
            meta = orjson.loads(case_json.read_bytes())
            measured, layers = float(meta["e2e_latency"]), int(meta["num_layer"])
            train_case = "-train-" in case
            nodes = label_nodes(gpu_dir / f"{case}.csv.gz", train_case)
            fw = _node_seconds(loo, [n.forward for n in nodes], hw)
            bw = _node_seconds(loo, [n.backward for n in nodes], hw)
            graph = 1e3 * _total(nodes, [a + b for a, b in zip(fw, bw, strict=True)], layers)
            row = errors.setdefault(gpu, {})
            row.setdefault("op graph", []).append(abs(graph / measured - 1))
            src_dir = source_dir(gpu, case)
            source = src_dir.name.replace("_", " ") if src_dir else None
            from_run = "-"
            if src_dir is not None and source is not None:
                src_nodes = label_nodes(src_dir / f"{case}.csv.gz", train_case)
                src_hw = Hardware.of_spec(load_spec(source))
                s_fw = _node_seconds(loo, [n.forward for n in src_nodes], src_hw)
                s_bw = _node_seconds(loo, [n.backward for n in src_nodes], src_hw)
                src_graph = 1e3 * _total(src_nodes, [a + b for a, b in zip(s_fw, s_bw,
                                                                           strict=True)], layers)
                src_e2e = float(orjson.loads((src_dir / f"{case}.json").read_bytes())
                                ["e2e_latency"])
                scaled = src_e2e * graph / src_graph
                row.setdefault("from run", []).append(abs(scaled / measured - 1))
                from_run = f"{100 * abs(scaled / measured - 1):8.1f}%"
            published = []
            for method in METHODS:
                path = DATA / "published" / gpu_dir.name / method / f"{case}.json"
                if path.exists():
                    value = float(orjson.loads(path.read_bytes())["e2e_latency"])
                    row.setdefault(method, []).append(abs(value / measured - 1))
                    published.append(f"{100 * abs(value / measured - 1):8.1f}%")
                else:
                    published.append(f"{'-':>9s}")
            print(f"{gpu:22s} {case:28s} {measured:11.1f} {100 * abs(graph / measured - 1):8.1f}%"
                  f" {from_run:>9s} {(source or '-')[-10:]:>10s} " + " ".join(published))
    print("\nmean |error| per GPU (left out of training)")
    cols = ("op graph", "from run", *METHODS)
    print(f"{'GPU':22s} " + " ".join(f"{c:>9s}" for c in cols))
    for gpu, row in errors.items():
        print(f"{gpu:22s} " + " ".join(f"{100 * statistics.mean(row[c]):8.1f}%" if row.get(c)
                                       else f"{'-':>9s}" for c in cols))
    every = {c: [e for row in errors.values() for e in row.get(c, [])] for c in cols}
    print(f"{'all cases':22s} " + " ".join(f"{100 * statistics.mean(every[c]):8.1f}%"
                                           if every[c] else f"{'-':>9s}" for c in cols))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("kernels", "models"))
    args = parser.parse_args(argv)
    started = time.process_time()
    data = load_dataset(DATA)
    model, holdouts = train(data, lambda what: print(f"  fitting {what}", file=sys.stderr))
    if args.only != "models":
        kernels_table(holdouts)
    if args.only != "kernels":
        models_table(holdouts, model)
    print(f"\nCPU time {time.process_time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
