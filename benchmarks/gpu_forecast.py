"""GPU forecasts against real GPU measurements (../shared/gpu-kernels, NeuSight's data, MIT).

    PYTHONPATH=src .venv/bin/python benchmarks/gpu_forecast.py [--only kernels|models]

1. Kernels: the GPU kernel model (model/gpu/learned.py) fitted leave-one-GPU-out over the 5
   GPUs, per family: GMAE on the held-out GPU's measurements (up to 1,500 per family, evenly
   spaced over its sweeps and NeuSight's test shapes), beside a plain roofline (max of FLOPs
   at the FP32 peak and bytes at the bandwidth), twice: of the kernel time (the latency less
   the held-out GPU's own floor, its host and launch part, on its rows of at least two floors)
   and of the whole latency (the other GPUs' median floor plus the kernel). Goal: <= 10% for
   every family.
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
   forecasts of the same cases (published/<GPU>/<method>/<case>.json). The model learns from
   the labels too (the other GPUs', which hold the same models' shapes), so a second table
   forecasts each case with folds that saw no GPU's labels of its model (GROUPS): the figure
   for a model none of the labels holds.
   Goals: mean |error| <= 5% (from another GPU) and never worse than NeuSight on a GPU;
   from the op graph alone mean <= 10%.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import orjson

from perfswarm.model.gpu.aten import op_kernels
from perfswarm.model.gpu.dataset import Dataset, load_dataset
from perfswarm.model.gpu.hardware import Hardware
from perfswarm.model.gpu.labels import LAYER, node_ops
from perfswarm.model.gpu.learned import Holdout, KernelModel, train
from perfswarm.model.gpu.work import Work
from perfswarm.model.kernels import GPU_FLOOR_NS
from perfswarm.model.specs import load_spec

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "gpu-kernels"
SOURCES = ("Tesla V100-PCIE-32GB", "NVIDIA A100-PCIE-40GB", "Tesla T4", "Tesla P100-PCIE-16GB",
           "Tesla P4")  # the source run: the first of these, other than the target, with the case
METHODS = ("neusight", "habitat", "roofline")
# the labels' models by their layers' widths (hidden, FFN): GPT-3 XL's and OPT-1.3B's are the
# same, 2048 and 8192, so neither counts as unseen while the other is trained on
GROUPS = {"bert_large": "bert_large", "gpt2_large": "gpt2_large", "gpt3_27": "gpt3_27",
          "gpt3_xl": "gpt3_xl+opt_13", "opt_13": "gpt3_xl+opt_13"}


@dataclass
class Node:
    in_layer: bool
    forward: list[Work]
    backward: list[Work]
    forward_ms: float = 0.0  # the label's measured latencies of the node
    backward_ms: float = 0.0


def label_nodes(path: Path, train_case: bool) -> list[Node]:
    rows = csv.DictReader(io.StringIO(gzip.decompress(path.read_bytes()).decode()))
    nodes = []
    for row in rows:
        ops = node_ops(row, train_case)
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


def left_out(full: KernelModel, *holdouts: list[Holdout]) -> Callable[[str], KernelModel]:
    """The model for a GPU: each family's fitted without it, from the first of `holdouts` that
    has one (the full model's for a family no fit left it out of: conv on the A100)."""
    def model_for(gpu: str) -> KernelModel:
        return KernelModel({f: next((h.model for hs in holdouts for h in hs
                                     if h.family == f and h.gpu == gpu), m)
                            for f, m in full.families.items()}, ())
    return model_for


def unseen_models(data: Dataset, full: KernelModel, holdouts: list[Holdout]
                  ) -> Callable[[str, str], KernelModel]:
    """The models for a GPU and case that never saw the case's model on any GPU: per group of
    GROUPS, fitted leave-one-GPU-out without any GPU's labels of that group."""
    models = {}
    for group in sorted(set(GROUPS.values())):
        rows = tuple(r for r in data.rows if r.split != "label" or group_of(r.case) != group)
        print(f"  fitting without any GPU's labels of {group}", file=sys.stderr)
        models[group] = left_out(full, train(replace(data, rows=rows))[1], holdouts)
    return lambda gpu, case: models[group_of(case)](gpu)


def group_of(case: str) -> str:
    return GROUPS[case.split("-", maxsplit=1)[0]]


def models_table(model_for: Callable[[str, str], KernelModel], title: str,
                 detail: bool = True) -> dict[str, dict[str, list[float]]]:
    """Prints the whole-model table and returns its |errors|: per GPU, per column (op graph,
    from run, the published methods), one per case."""
    print(f"\n2. whole models, {title}: |error| of e2e vs measured")
    if detail:
        print(f"{'GPU':22s} {'case':28s} {'measured ms':>11s} {'op graph':>9s} {'from run':>9s}"
              f" {'(source)':>10s} " + " ".join(f"{m:>9s}" for m in METHODS))
    errors: dict[str, dict[str, list[float]]] = {}
    for gpu_dir in sorted((DATA / "labels").iterdir()):
        gpu = gpu_dir.name.replace("_", " ")
        hw = Hardware.of_spec(load_spec(gpu))
        for case_json in sorted(gpu_dir.glob("*.json")):
            case = case_json.stem
            if case.endswith("-fusion") or not (gpu_dir / f"{case}.csv.gz").exists():
                continue
            loo = model_for(gpu, case)
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
            if detail:
                print(f"{gpu:22s} {case:28s} {measured:11.1f} "
                      f"{100 * abs(graph / measured - 1):8.1f}% {from_run:>9s} "
                      f"{(source or '-')[-10:]:>10s} " + " ".join(published))
    print("\nmean |error| per GPU (left out of training)")
    cols = ("op graph", "from run", *METHODS)
    print(f"{'GPU':22s} " + " ".join(f"{c:>9s}" for c in cols))
    for gpu, row in errors.items():
        print(f"{gpu:22s} " + " ".join(f"{100 * statistics.mean(row[c]):8.1f}%" if row.get(c)
                                       else f"{'-':>9s}" for c in cols))
    every = {c: [e for row in errors.values() for e in row.get(c, [])] for c in cols}
    print(f"{'all cases':22s} " + " ".join(f"{100 * statistics.mean(every[c]):8.1f}%"
                                           if every[c] else f"{'-':>9s}" for c in cols))
    return errors


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
        model_for = left_out(model, holdouts)
        models_table(lambda gpu, _: model_for(gpu), "each GPU left out of training")
        if any(r.split == "label" for r in data.rows):
            models_table(unseen_models(data, model, holdouts), "each GPU left out of training, "
                         "and every GPU's labels of the case's model", detail=False)
    print(f"\nCPU time {time.process_time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
