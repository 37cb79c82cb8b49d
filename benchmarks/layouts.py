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
   The model's compute rate is calibrated on the first row (1.7B, pure data parallel: no
   tensor or pipeline traffic, no bubble) and held for the others, so each later row tests the
   layout's terms (bubble, tensor and pipeline traffic, the gradients' exposed all-reduce).
   Micro-batch 1 (the table does not give it).

    .venv/bin/python benchmarks/layouts.py [--json OUT]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import orjson

from perfswarm.model.collectives import collective_time
from perfswarm.model.parallelism import Layout, best_layout, estimate, transformer
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


def megatron() -> dict[str, Any]:
    spec = load_spec("A100-80GB")
    peak = spec.peak_for("fp16")
    intra, inter = interconnect("nvswitch-a100"), interconnect("ib-hdr")
    rows: list[dict[str, Any]] = []
    rate = 0.0
    for billions, heads, h, layers, tp, pp, gpus, batch, tflops in MEGATRON:
        model = transformer(billions * 1e9, layers, h, heads, SEQ, batch)
        measured = megatron_flops(batch, layers, h) / (gpus * tflops * 1e12)
        paper = Layout(gpus // (tp * pp), tp, pp, 0, True)  # the paper recomputes
        if not rate:  # calibrated on the first row: the share of peak this model reaches
            e1 = estimate(model, paper, per_node=8, intra=intra, inter=inter,
                          work_s=model.training_flops() / peak)
            rate = peak * e1.compute_s / (measured - e1.exposed_comm_s)
        work = model.training_flops() / rate
        e = estimate(model, paper, per_node=8, intra=intra, inter=inter, work_s=work)
        best, _ = best_layout(model, gpus, per_node=8, intra=intra, inter=inter, work_s=work,
                              memory_bytes=spec.memory_bytes)
        rows.append({"params_b": billions, "gpus": gpus, "tp": tp, "pp": pp,
                     "measured_s": measured, "predicted_s": e.step_s,
                     "ratio": e.step_s / measured, "bubble": e.bubble,
                     "exposed_comm_s": e.exposed_comm_s, "memory_gb": e.memory_bytes / 1e9,
                     "best": best.layout.describe() if best else None,
                     "best_s": best.step_s if best else None})
    later = [r["ratio"] for r in rows[1:]]
    return {"efficiency": rate / peak, "rows": rows,
            "geomean_abs_log_error": math.exp(statistics.fmean(abs(math.log(x))
                                                                for x in later)) - 1}


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
    m = megatron()
    print(f"\nMegatron-LM Table 1 (A100-80GB, DGX A100 + HDR IB), compute rate calibrated on "
          f"row 1: {m['efficiency']:.1%} of the fp16 peak")
    print("  params   GPUs  tp  pp  measured s  predicted s  ratio  bubble  memory GB  "
          "best that fits")
    for r in m["rows"]:
        print(f"  {r['params_b']:6.1f}B {r['gpus']:5d} {r['tp']:3d} {r['pp']:3d} "
              f"{r['measured_s']:11.2f} {r['predicted_s']:12.2f} {r['ratio']:6.2f} "
              f"{r['bubble']:7.3f} {r['memory_gb']:10.1f}  {r['best']}")
    print(f"  geomean |error| over rows 2-10: {m['geomean_abs_log_error']:.1%}")
    if ns.json:
        ns.json.write_bytes(orjson.dumps({"corpus": c, "megatron": m},
                                         option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
