"""Parallel layouts (model.parallelism, `project`'s layouts) against measured step and collective
times: the corpus's multi-rank DDP trace and the measured throughputs Megatron-LM published.

1. The corpus's DDP trace (ResNet-50 on 2 of 8 A100s on NVSwitch, rank 0 of 2, 3 steps): the
   layouts `project` reads off it at 2 devices (dp2, the Run's own layout), each gradient
   bucket's all-reduce as the model times it on the Run's topology beside the kernel the trace
   measured (which includes waiting for the other rank), and the step (the Run's device compute
   and its time with no device work, both measured, plus the modelled exposed communication).
2. Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
   Megatron-LM", SC'21 (arXiv:2104.04473), Table 1: GPT models of 1.7B to 1T parameters on 32 to
   3072 A100-80GB GPUs of Selene (DGX A100 nodes: NVSwitch inside, 8 HDR InfiniBand NICs each),
   sequence 2048, vocabulary 51,200, the (tp, pp) the authors chose, and the teraFLOP/s per GPU
   they measured end to end. Measured step time = the paper's FLOPs per iteration (its eq. 3,
   96 B s l h^2 (1 + s/6h + V/16lh), activation recomputation counted) / (GPUs x teraFLOP/s).
   Each row at the paper's layout: its (tp, pp), plain data parallel, recomputation, and the
   interleaved schedule with the scatter/gather optimization (section 5.1), in the number of
   chunks the model finds fastest (the paper does not give it). The GEMM rate is calibrated on
   the first row (1.7B, pure data parallel: no tensor or pipeline traffic, no bubble) and held
   for the others; the memory-bound ops run at the A100's memory bandwidth (model.parallelism's
   memory_bound_s), so each later row tests the layout's terms (bubble, tensor and pipeline
   traffic, the gradients' exposed all-reduce, the memory-bound share tensor parallelism does
   not split). Micro-batch 1 (the table does not give it).
3. The same paper's Table 2 (section 5.2, Figure 10): the 175B and 530B models on 384 to 2240
   GPUs under DeepSpeed's ZeRO-3 without model parallelism (micro-batch 4, 2 or 1 at a fixed
   global batch) and under PTD-P (model-parallel size 96 = tp8 x pp12, and 280 = tp8 x pp35),
   both measured and predicted with the same calibration, and the layout the model picks (the
   530B ZeRO-3 row on 640 GPUs, at another batch than PTD-P's 560, is left out).
4. Section 5.4's sweeps (Figures 13-15, 64 GPUs): the orderings the paper's text states,
   checked on the predicted throughput of each configuration.
5. Korthikanti et al. (MLSys 2023): sequence parallelism with selective recomputation against
   full recomputation on the 530B model, the speedup their abstract gives.
Beside each case, the layout the model picks, with every option and with only the paper's
(2021) techniques.

    .venv/bin/python benchmarks/layouts.py [--json OUT]
"""

from __future__ import annotations

import argparse
import itertools
import math
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import orjson
from scipy.optimize import brentq

from perfswarm.model.collectives import collective_time
from perfswarm.model.parallelism import (
    Estimate,
    Layout,
    Model,
    best_layout,
    estimate,
    layouts,
    memory_bound_s,
    transformer,
)
from perfswarm.model.specs import load_spec
from perfswarm.model.topology import Topology, interconnect
from perfswarm.optimize.project import project
from perfswarm.trace.ingest import ImportOptions, import_traces

ROOT = Path(__file__).resolve().parents[1]
NCCL = ROOT.parent / "shared" / "corpus" / "hta" / "nccl_parser_config" / "nccl_data.json.gz"
SEQ, VOCAB = 2048, 51200
# Table 1: billions of parameters, heads, hidden, layers, tp, pp, GPUs, batch, teraFLOP/s per GPU
MEGATRON = [(1.7, 24, 2304, 24, 1, 1, 32, 512, 137), (3.6, 32, 3072, 30, 2, 1, 64, 512, 138),
            (7.5, 32, 4096, 36, 4, 1, 128, 512, 142), (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
            (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138),
            (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140),
            (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148),
            (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155),
            (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163),
            (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163)]
# Table 2: (billions, heads, hidden, layers, PTD-P's tp, pp) and per GPU count: ZeRO-3's batch,
# micro-batch and teraFLOP/s per GPU, PTD-P's batch and teraFLOP/s (micro-batch 1); 530B under
# ZeRO-3 did not fit 560 GPUs, so the paper ran it on 640 at batch 2560
TABLE2 = [((174.6, 96, 12288, 96, 8, 12), [(384, 1536, 4, 144, 1536, 153),
                                           (768, 1536, 2, 88, 1536, 149),
                                           (1536, 1536, 1, 44, 1536, 141)]),
          ((529.6, 128, 20480, 105, 8, 35), [(1120, 2240, 2, 98, 2240, 167),
                                             (2240, 2240, 1, 48, 2240, 159)])]


def corpus_trace() -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        run = import_traces([NCCL], Path(tmp) / "nccl.run", ImportOptions(), ["bench"])
        result = project(run, [1, 2])
        prof, lay = result.profile, result.layouts
        assert lay is not None and lay.best is not None
        steps = run.table("steps", ["start", "end"])
        spans = [(e - s) * 1e-9 for s, e in zip(steps.column("start").to_pylist(),
                                                   steps.column("end").to_pylist(), strict=True)]
    top = Topology(2, 8, result.intra, result.inter)
    buckets = []
    for k, call in enumerate(prof.steps[0].calls):
        if call.op != "all_reduce":
            continue
        measured = [st.calls[k].dur_ns * 1e-9 for st in prof.steps]
        buckets.append({"bytes": call.nbytes, "measured_min_s": min(measured),
                        "measured_median_s": statistics.median(measured),
                        "predicted_s": collective_time("all_reduce", call.nbytes, top)})
    dp2 = next(e for e in lay.every if (e.layout.dp, e.layout.zero) == (2, 0))
    compute = statistics.median(st.compute_ns for st in prof.steps) * 1e-9
    return {"params": lay.source.params, "params_source": lay.source.params_source,
            "intra": result.intra.name, "buckets": buckets,
            "allreduce_measured_median_s": statistics.median(
                sum(c.dur_ns for c in st.calls if c.op == "all_reduce") * 1e-9
                for st in prof.steps),
            "allreduce_predicted_s": sum(b["predicted_s"] for b in buckets),
            "device_compute_s": compute, "step_measured_s": statistics.median(spans),
            "step_predicted_s": dp2.step_s, "exposed_predicted_s": dp2.exposed_comm_s,
            "host_s": dp2.host_s,
            "best": lay.best.layout.describe()}


def megatron_flops(b: int, layers: int, h: int) -> float:
    """Narayanan et al. eq. 3: FLOPs per iteration, activation recomputation included."""
    return 96 * b * SEQ * layers * h * h * (1 + SEQ / (6 * h) + VOCAB / (16 * layers * h))


class Megatron:
    """Selene's layouts priced at one GEMM rate, calibrated on Table 1's first row."""

    def __init__(self) -> None:
        self.spec = load_spec("A100-80GB")
        self.intra, self.inter = interconnect("nvswitch-a100"), interconnect("ib-hdr")
        peak = self.spec.peak_for("fp16")
        billions, heads, h, layers, tp, pp, gpus, batch, tflops = MEGATRON[0]
        model = transformer(billions * 1e9, layers, h, heads, SEQ, batch)
        measured = megatron_flops(batch, layers, h) / (gpus * tflops * 1e12)
        paper = Layout(gpus // (tp * pp), tp, pp, 0, True)
        self.rate = brentq(lambda r: self.estimate(model, paper, r).step_s - measured,
                           0.05 * peak, 2 * peak)

    def work(self, model: Model, rate: float) -> tuple[float, float]:
        """The step's compute on one device (GEMMs at `rate`, memory-bound ops at the HBM's
        bandwidth) and its memory-bound part."""
        memory = memory_bound_s(model, self.spec.memory_bandwidth)
        return model.training_flops() / rate + memory, memory

    def estimate(self, model: Model, layout: Layout, rate: float = 0.0) -> Estimate:
        work, memory = self.work(model, rate or self.rate)
        return estimate(model, layout, per_node=8, intra=self.intra, inter=self.inter,
                        work_s=work, memory_s=memory)

    def paper(self, model: Model, gpus: int, tp: int, pp: int) -> Estimate:
        """The paper's layout: its (tp, pp), plain data parallel, recomputation, and the
        interleaved schedule (section 5.1) in the number of chunks the model finds fastest
        (the paper does not give it)."""
        return self.fastest(model, gpus, tp, pp, recompute=True)

    def fastest(self, model: Model, gpus: int, tp: int, pp: int, *, recompute: bool = False,
                sequence_parallel: bool = False, selective: bool = False) -> Estimate:
        """The fastest layout at this (tp, pp), plain data parallel, with these options, over
        the interleaving degrees."""
        return min((self.estimate(model, lay) for lay in layouts(model, gpus, 8)
                    if (lay.tp, lay.pp, lay.zero, lay.recompute, lay.sequence_parallel,
                        lay.selective) == (tp, pp, 0, recompute, sequence_parallel, selective)),
                   key=lambda e: e.step_s)

    def best(self, model: Model, gpus: int, since_2022: bool = True) -> Estimate | None:
        """The fastest layout that fits; without `since_2022`, of the techniques of the
        paper's time (no sequence parallelism or selective recomputation: Korthikanti et al.
        came a year later)."""
        work, memory = self.work(model, self.rate)
        _, every = best_layout(model, gpus, per_node=8, intra=self.intra, inter=self.inter,
                               work_s=work, memory_s=memory, memory_bytes=self.spec.memory_bytes)
        return next((e for e in every if e.memory_bytes <= self.spec.memory_bytes and (
            since_2022 or not (e.layout.sequence_parallel or e.layout.selective))), None)


def megatron(meg: Megatron) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for billions, heads, h, layers, tp, pp, gpus, batch, tflops in MEGATRON:
        model = transformer(billions * 1e9, layers, h, heads, SEQ, batch)
        measured = megatron_flops(batch, layers, h) / (gpus * tflops * 1e12)
        e = meg.paper(model, gpus, tp, pp)
        best, then = meg.best(model, gpus), meg.best(model, gpus, since_2022=False)
        rows.append({"params_b": billions, "gpus": gpus, "tp": tp, "pp": pp,
                     "chunks": e.layout.chunks, "measured_s": measured, "predicted_s": e.step_s,
                     "ratio": e.step_s / measured, "bubble": e.bubble,
                     "compute_s": e.compute_s, "exposed_comm_s": e.exposed_comm_s,
                     "memory_gb": e.memory_bytes / 1e9,
                     "best": best.layout.describe() if best else None,
                     "best_s": best.step_s if best else None,
                     "best_2021": then.layout.describe() if then else None})
    later = [r["ratio"] for r in rows[1:]]
    return {"gemm_efficiency": meg.rate / meg.spec.peak_for("fp16"), "rows": rows,
            "geomean_abs_log_error": math.exp(statistics.fmean(abs(math.log(x))
                                                                for x in later)) - 1}


def zero3_vs_ptdp(meg: Megatron) -> list[dict[str, Any]]:
    """Table 2: the same model, batch and GPUs under DeepSpeed's ZeRO-3 (no model
    parallelism, activation checkpointing) and under PTD-P, both measured and predicted."""
    rows: list[dict[str, Any]] = []
    for (billions, heads, h, layers, tp, pp), runs in TABLE2:
        for gpus, batch, micro, zero_tflops, ptdp_batch, ptdp_tflops in runs:
            zero = transformer(billions * 1e9, layers, h, heads, SEQ, batch, micro)
            ptdp = transformer(billions * 1e9, layers, h, heads, SEQ, ptdp_batch)
            z = meg.estimate(zero, Layout(gpus, 1, 1, 3, True))
            p = meg.paper(ptdp, gpus, tp, pp)
            best, then = meg.best(ptdp, gpus), meg.best(ptdp, gpus, since_2022=False)
            # per-GPU rates: the paper's FLOPs over each step, the way Table 2 counts them
            rows.append({
                "params_b": billions, "gpus": gpus, "zero_micro_batch": micro,
                "zero_measured_tflops": zero_tflops, "ptdp_measured_tflops": ptdp_tflops,
                "zero_predicted_tflops": megatron_flops(batch, layers, h) / gpus / z.step_s
                / 1e12,
                "ptdp_predicted_tflops": megatron_flops(ptdp_batch, layers, h) / gpus
                / p.step_s / 1e12,
                "zero_exposed_comm_s": z.exposed_comm_s, "zero_compute_s": z.compute_s,
                "zero_memory_gb": z.memory_bytes / 1e9,
                "best": best.layout.describe() if best else None,
                "best_2021": then.layout.describe() if then else None})
    return rows


def korthikanti(meg: Megatron) -> dict[str, Any]:
    """Korthikanti et al. (MLSys 2023, arXiv:2205.05198), abstract: the 530B model (105 layers,
    128 heads, hidden 20480) on 2240 A100s at tp 8 x pp 35, model FLOPs utilization 42.1% with
    full recomputation and 54.2% with sequence parallelism and selective recomputation (29%
    faster); batch 2240, micro-batch 1 as in Narayanan et al.'s Table 2 run on the same GPUs."""
    model = transformer(529.6e9, 105, 20480, 128, SEQ, 2240)
    full = meg.fastest(model, 2240, 8, 35, recompute=True)
    new = meg.fastest(model, 2240, 8, 35, sequence_parallel=True, selective=True)
    return {"measured_speedup": 54.2 / 42.1, "predicted_speedup": full.step_s / new.step_s,
            "full_s": full.step_s, "selective_s": new.step_s,
            "full_memory_gb": full.memory_bytes / 1e9,
            "selective_memory_gb": new.memory_bytes / 1e9,
            "full_layout": full.layout.describe(), "selective_layout": new.layout.describe()}


def configurations(meg: Megatron) -> list[dict[str, Any]]:
    """Section 5.4's sweeps on 64 GPUs, micro-batch 1, the default (non-interleaved) schedule,
    with recomputation, and the ordering the paper states for each: Figure 13 (162.2B: 32
    layers, 128 heads, hidden 20480; batch 32 and 128), (pipeline, tensor) from (2, 32) to
    (32, 2), "peak performance when the tensor-parallel size is equal to the number of GPUs in
    a single node"; Figures 14 and 15 (5.9B: 32 layers, 32 heads, hidden 3840; batches 32, 128
    and 512), pipeline or tensor parallel 2 to 32 with the rest data parallel: throughput
    decreases as either grows."""
    sweeps = [("fig13", (162.2, 128, 20480, 32), (32, 128),
               [(64 // t, t) for t in (32, 16, 8, 4, 2)]),
              ("fig14", (5.9, 32, 3840, 32), (32, 128, 512), [(p, 1) for p in (2, 4, 8, 16, 32)]),
              ("fig15", (5.9, 32, 3840, 32), (32, 128, 512), [(1, t) for t in (2, 4, 8, 16, 32)])]
    rows: list[dict[str, Any]] = []
    for figure, (billions, heads, h, layers), batches, splits in sweeps:
        for batch in batches:
            model = transformer(billions * 1e9, layers, h, heads, SEQ, batch)
            rates = [megatron_flops(batch, layers, h) / 64 / meg.estimate(
                model, Layout(64 // (pp * tp), tp, pp, 0, True)).step_s / 1e12
                for pp, tp in splits]
            if figure == "fig13":
                agrees = splits[rates.index(max(rates))] == (8, 8)
            else:
                agrees = all(a > b for a, b in itertools.pairwise(rates))
            rows.append({"figure": figure, "batch": batch, "splits": splits,
                         "predicted_tflops": rates, "agrees": agrees})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path)
    ns = ap.parse_args(argv)
    c = corpus_trace()
    print(f"corpus DDP trace: {c['params']:,} parameters ({c['params_source']}), "
          f"intra {c['intra']}, layouts' best at 2: {c['best']}")
    print("  all-reduce bucket    measured min / median ms   predicted ms   predicted/min")
    for b in c["buckets"]:
        print(f"  {b['bytes'] / 1e6:12.1f} MB   {b['measured_min_s'] * 1e3:8.3f} / "
              f"{b['measured_median_s'] * 1e3:8.3f}   {b['predicted_s'] * 1e3:12.3f}   "
              f"{b['predicted_s'] / b['measured_min_s']:8.2f}")
    print(f"  all-reduce per step: measured {c['allreduce_measured_median_s'] * 1e3:.2f} ms, "
          f"predicted {c['allreduce_predicted_s'] * 1e3:.2f} ms")
    print(f"  step: measured {c['step_measured_s'] * 1e3:.1f} ms (ProfilerStep), device compute "
          f"{c['device_compute_s'] * 1e3:.1f} ms, no device work {c['host_s'] * 1e3:.1f} ms; "
          f"predicted dp2 {c['step_predicted_s'] * 1e3:.1f} ms (exposed comm "
          f"{c['exposed_predicted_s'] * 1e3:.2f} ms): "
          f"{c['step_predicted_s'] / c['step_measured_s']:.2f}x")
    meg = Megatron()
    m = megatron(meg)
    print(f"\nMegatron-LM Table 1 (A100-80GB, DGX A100 + HDR IB), GEMM rate calibrated on "
          f"row 1: {m['gemm_efficiency']:.1%} of the fp16 peak, memory-bound ops at the HBM "
          "bandwidth")
    print("  params   GPUs  tp  pp  v  measured s  predicted s  ratio  bubble  memory GB  "
          "best that fits")
    for r in m["rows"]:
        print(f"  {r['params_b']:6.1f}B {r['gpus']:5d} {r['tp']:3d} {r['pp']:3d} {r['chunks']:2d} "
              f"{r['measured_s']:11.2f} {r['predicted_s']:12.2f} {r['ratio']:6.2f} "
              f"{r['bubble']:7.3f} {r['memory_gb']:10.1f}  {r['best']}"
              + ("" if r["best_2021"] == r["best"] else f" (2021: {r['best_2021']})"))
    print(f"  geomean |error| over rows 2-10: {m['geomean_abs_log_error']:.1%}")
    z = zero3_vs_ptdp(meg)
    print("\nTable 2, ZeRO-3 (DeepSpeed, no model parallelism) against PTD-P, teraFLOP/s per GPU")
    print("  params   GPUs  ZeRO-3 mb  ZeRO-3 meas/pred   PTD-P meas/pred   PTD-P/ZeRO-3 "
          "meas/pred  best that fits")
    for r in z:
        print(f"  {r['params_b']:6.1f}B {r['gpus']:5d} {r['zero_micro_batch']:10d} "
              f"{r['zero_measured_tflops']:8.0f} /{r['zero_predicted_tflops']:5.0f} "
              f"{r['ptdp_measured_tflops']:9.0f} /{r['ptdp_predicted_tflops']:5.0f} "
              f"{r['ptdp_measured_tflops'] / r['zero_measured_tflops']:11.2f} /"
              f"{r['ptdp_predicted_tflops'] / r['zero_predicted_tflops']:5.2f}  {r['best']}"
              + ("" if r["best_2021"] == r["best"] else f" (2021: {r['best_2021']})"))
    k = korthikanti(meg)
    print(f"\nKorthikanti et al., 530B on 2240 GPUs: sequence parallel + selective recompute "
          f"over full recompute, measured {k['measured_speedup']:.2f}x, predicted "
          f"{k['predicted_speedup']:.2f}x ({k['full_s']:.1f} s -> {k['selective_s']:.1f} s; "
          f"{k['full_memory_gb']:.0f} -> {k['selective_memory_gb']:.0f} GB a device)")
    print("\nSection 5.4's sweeps on 64 GPUs, predicted teraFLOP/s per GPU and whether the "
          "paper's stated ordering holds")
    sweeps = configurations(meg)
    for r in sweeps:
        cells = "  ".join(f"(p{pp},t{tp}) {x:.0f}"
                          for (pp, tp), x in zip(r["splits"], r["predicted_tflops"], strict=True))
        print(f"  {r['figure']} batch {r['batch']:4d}: {cells}  "
              f"{'agrees' if r['agrees'] else 'DISAGREES'}")
    if ns.json:
        ns.json.write_bytes(orjson.dumps({"corpus": c, "megatron": m, "table2": z,
                                          "korthikanti": k, "configurations": sweeps},
                                         option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
