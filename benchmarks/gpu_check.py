"""The whole loop checked on a real GPU, in two halves, on nanoGPT, unmodified.

On the GPU machine, `device OUT`: nanoGPT's data made offline (../shared/realworld); for each case
nanoGPT run bare (its own printed iteration times are the truth) and recorded with every
collector (torch with CUDA, system, gpu (NVML), perf, pystacks). Cases: `small` (the README's CPU
run: launch-bound on a GPU), `medium` (6 layers of 384, block 256, batch 32), `medium-b64` (its
batch doubled: what `predict --batch-size 64` of `medium` is judged on), `medium-bf16` (nanoGPT's
own default precision there), `small-cupti0` (`small` recorded with TEARDOWN_CUPTI=0: the
recorder's default of 1 A/B'd); all float32 otherwise (the CPU recording's precision; nanoGPT
itself allows TF32 matmuls). `--models STYLE,...` runs benchmarks/realworld_models.py's styles
on the GPU, bare at two sizes (batch 8 width 40, batch 64 width 128) and recorded at the
second. `--calibrate` adds `calibrate --device cuda:0`, `--memory` the
allocator's snapshot and the profiler's memory timeline of a CUDA training loop
(benchmarks/cuda_memory.py). Each run's directory is packed into one tar under OUT, so a
machine that sends back only a few files sends back everything.

Here, `compare OUT...` (several device rounds; a later round's case replaces an earlier one's):
per case the collectors' status, NVML's SM utilization in the profiled window beside the
trace's kernel-busy share of it, the bundled kernel model against the run's own kernels (GMAE
per family, on a GPU it was never trained on), the recorder's overhead (its unprofiled steps
before and after the window against the bare run), `predict` at the recorded configuration,
`predict --batch-size 64` of `medium` against `medium-b64`, and, for `small` and `medium`, the
same command recorded on this CPU and forecast by `predict --device GPU` against the GPU's
step; the same for each model style and size (its GPU recording checked as nanoGPT's); then
the calibration and the memory case against what the allocator said.

    python benchmarks/gpu_check.py device OUT [--realworld ../shared/realworld] [--device cuda]
        [--iters 40] [--window 10:5] [--cases small,medium,...] [--models lstm,resnet,...]
        [--calibrate] [--memory]
    python benchmarks/gpu_check.py compare OUT... [--keep DIR] [--cpu-steps 5]

`--device cpu` runs the device half on this machine (to try the script before a GPU run).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "realworld"
ITER = re.compile(r"^iter (\d+): loss [\d.]+, time ([\d.]+)ms")

# nanoGPT flags (float32: the CPU recording's precision; nanoGPT itself allows TF32 matmuls)
COMMON = ["--compile=False", "--eval_iters=5", "--eval_interval=1000", "--log_interval=1",
          "--dropout=0.0", "--dtype=float32"]
SMALL = ["--block_size=64", "--batch_size=12", "--n_layer=4", "--n_head=4", "--n_embd=128"]
MEDIUM = ["--block_size=256", "--batch_size=32", "--n_layer=6", "--n_head=6", "--n_embd=384"]
CASES = {  # later flags win (nanoGPT's configurator applies them in order)
    "small": SMALL,
    "medium": MEDIUM,
    "medium-b64": [*MEDIUM, "--batch_size=64"],
    "medium-bf16": [*MEDIUM, "--dtype=bfloat16"],
}
# cases that record another case's command with the recorder's environment changed (its bare
# run is that case's): Kineto's CUPTI left subscribed after the window (the default is 1)
RECORDER_CASES = {"small-cupti0": ("small", {"TEARDOWN_CUPTI": "0"})}
CASES.update({case: CASES[same] for case, (same, _) in RECORDER_CASES.items()})
MODELS = REPO / "benchmarks" / "realworld_models.py"
# realworld_models.py's configurations run on the GPU: bare both, recorded the second
MODEL_SIZES = {"b8w40": ("8", "40"), "b64w128": ("64", "128")}
MODEL_STEPS = 30
CPU_CASES = ("small", "medium")  # recorded here too: predict --device from a CPU recording
ITERS = 40  # iterations of a GPU run (41 optimizer steps: nanoGPT counts from 0)
WINDOW = "10:5"  # the recorded window on the GPU: skip 10 steps, profile 5


def perfswarm(*args: str, cwd: Path | None = None, timeout: float = 600,
              out: Path | None = None,
              env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`perfswarm ARGS` with this interpreter (the GPU machine has no installed entry point)."""
    proc = subprocess.run([sys.executable, "-m", "perfswarm.cli.main", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout, check=False,
                          env={**os.environ, **(env or {})})
    if args[0] != "sql" or proc.returncode:
        print(f"$ perfswarm {' '.join(args)}  -> {proc.returncode}", flush=True)
    if out is not None:
        out.write_text(proc.stdout)
    if proc.returncode != 0:
        print(proc.stdout[-3000:] + proc.stderr[-3000:], flush=True)
    return proc


def work_dir(realworld: Path, where: Path) -> Path:
    """nanoGPT's files linked unmodified into a folder that holds its offline data."""
    where.mkdir(parents=True, exist_ok=True)
    realworld = realworld.resolve()
    subprocess.run([sys.executable, str(realworld / "make_char_data.py"), str(where)], check=True)
    for f in ("train.py", "model.py", "configurator.py"):
        if not (where / f).exists():
            (where / f).symlink_to(realworld / "nanoGPT" / f)
    if not (where / "config").exists():
        (where / "config").symlink_to(realworld / "nanoGPT" / "config")
    return where


def nanogpt(case: str, device: str, iters: int) -> list[str]:
    return [sys.executable, "train.py", "config/train_shakespeare_char.py", f"--device={device}",
            f"--max_iters={iters}", *COMMON, *CASES[case]]


def iter_ms(stdout: str) -> list[float]:
    """nanoGPT's printed iteration times (iteration 0 holds the first evaluation: left out)."""
    return [float(m.group(2)) for m in map(ITER.match, stdout.splitlines())
            if m and int(m.group(1)) > 0]


def median_after(times: list[float], skip: int = 5) -> float | None:
    return statistics.median(times[skip:]) if len(times) > skip else None


def pack(folder: Path, out: Path) -> None:
    """FOLDER as OUT/NAME.tgz (a machine that sends back few files sends one per folder)."""
    with tarfile.open(out / f"{folder.name}.tgz", "w:gz") as tar:
        tar.add(folder, arcname=folder.name)
    shutil.rmtree(folder)


def record(out: Path, name: str, cmd: list[str], window: str, work: Path,
           env: dict[str, str] | None) -> None:
    """`perfswarm record` of CMD into OUT/NAME.run, packed (a failed build's folder too)."""
    run = out / f"{name}.run"
    rec = perfswarm("record", "--out", str(run), "--steps", window, "--quiet", "--", *cmd,
                    cwd=work, timeout=200, env=env)
    print(f"recorded {name}:\n{rec.stdout[-2500:]}{rec.stderr[-2500:]}", flush=True)
    if run.exists():
        pack(run, out)
    for hidden in out.glob(f".{name}.run.*"):  # a build that failed
        pack(hidden, out)


def device_half(ns: argparse.Namespace) -> None:
    out: Path = ns.out
    out.mkdir(parents=True, exist_ok=True)
    env: dict[str, Any] = {"python": sys.version}
    import torch

    env["torch"] = torch.__version__
    if ns.device == "cuda":
        env["gpu"] = torch.cuda.get_device_name(0)
        env["capability"] = list(torch.cuda.get_device_capability(0))
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,power.limit,"
                              "clocks.max.sm,clocks.max.mem,memory.total", "--format=csv"],
                             capture_output=True, text=True, check=False)
        env["nvidia_smi"] = smi.stdout
    print(json.dumps(env, indent=1), flush=True)
    work = work_dir(ns.realworld, Path(tempfile.mkdtemp(prefix="nanogpt-")))
    env["bare_iter_ms"] = {}
    for case in filter(None, ns.cases.split(",")):
        cmd = nanogpt(case, ns.device, ns.iters)
        if case not in RECORDER_CASES:
            proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=120,
                                  check=False)
            env["bare_iter_ms"][case] = iter_ms(proc.stdout)
            print(f"bare {case}: rc {proc.returncode}, median "
                  f"{median_after(env['bare_iter_ms'][case])} ms", flush=True)
            if proc.returncode:
                print(proc.stderr[-3000:], flush=True)
        record(out, f"nano-{case}-{ns.device}", cmd, ns.window, work,
               RECORDER_CASES.get(case, (case, None))[1])
        (out / "env.json").write_text(json.dumps(env, indent=1))  # kept if a later case hangs
    env["model_step_ns"] = {}
    for style in filter(None, ns.models.split(",")):
        for size, (batch, width) in MODEL_SIZES.items():
            cmd = [sys.executable, str(MODELS), style, "--batch-size", batch, "--width", width,
                   "--steps", str(MODEL_STEPS), "--device", ns.device]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
            truth = [json.loads(line.removeprefix("truth ")) for line in proc.stdout.splitlines()
                     if line.startswith("truth ")]
            env["model_step_ns"][f"{style}-{size}"] = truth[0]["step_ns"] if truth else []
            steps = env["model_step_ns"][f"{style}-{size}"]
            print(f"bare {style}-{size}: rc {proc.returncode}, median "
                  f"{median_after([t / 1e6 for t in steps], 10)} ms", flush=True)
            if proc.returncode:
                print(proc.stderr[-3000:], flush=True)
            if size == "b64w128":
                record(out, f"model-{style}-{size}-{ns.device}", cmd, ns.window, work, None)
            (out / "env.json").write_text(json.dumps(env, indent=1))
    (out / "env.json").write_text(json.dumps(env, indent=1))
    if ns.calibrate:
        perfswarm("calibrate", "--device", "cuda:0", "--budget", "1", "-o",
                  str(out / "calibrate.json"), timeout=150)
    if ns.memory:
        mem = out / "memory"
        proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "cuda_memory.py"),
                               str(mem)], capture_output=True, text=True, timeout=120,
                              check=False)
        print(f"memory case: rc {proc.returncode}\n{proc.stdout[-1500:]}{proc.stderr[-1500:]}")
        if mem.exists():
            pack(mem, out)


def sql(run: Path, query: str) -> list[dict[str, Any]]:
    proc = perfswarm("sql", str(run), query, "--json")
    rows: list[dict[str, Any]] = json.loads(proc.stdout) if proc.returncode == 0 else []
    return rows


def window_check(run: Path) -> None:
    """NVML's SM utilization in the profiled steps beside the kernels' busy share of them."""
    steps = sql(run, "SELECT min(start) s, max(\"end\") e FROM steps WHERE source = 'marker'")
    if not steps or steps[0]["s"] is None:
        print("  no marker steps")
        return
    s, e = int(steps[0]["s"]), int(steps[0]["e"])
    busy = sql(run, f"""WITH k AS (SELECT greatest(ts, {s}) a, least(ts + dur, {e}) b FROM events
        WHERE kind IN ('kernel', 'memcpy', 'memset') AND ts < {e} AND ts + dur > {s}),
        o AS (SELECT a, b, max(b) OVER (ORDER BY a ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
        prev FROM k) SELECT sum(b - greatest(a, coalesce(prev, a))) FILTER (WHERE b > coalesce(prev,
        a)) busy, count(*) n FROM o""")
    nvml = sql(run, f"""SELECT name, count(*) n, avg(value) mean, max(value) max FROM counters
        WHERE name LIKE 'gpu0.%' AND ts BETWEEN {s} AND {e} GROUP BY name ORDER BY name""")
    share = float(busy[0]["busy"] or 0) / (e - s)
    print(f"  window {(e - s) / 1e6:.1f} ms; device ops {busy[0]['n']}; kernel-busy share "
          f"{share:.1%}; NVML in it: " + ", ".join(
              f"{r['name'].removeprefix('gpu0.')} {r['mean']:.4g} ({r['n']})" for r in nvml))
    allnvml = sql(run, "SELECT name, count(*) n FROM counters WHERE name LIKE 'gpu%' GROUP BY name")
    print(f"  NVML counters in the whole run: {sorted((r['name'], r['n']) for r in allnvml)}")


def overhead(run: Path, bare_of: dict[int, float]) -> None:
    """The recorded run's unprofiled steps (the recorder's hook times) before and after the
    window, against the bare run's same steps (BARE_OF: the recorder's step number -> ms; the
    GPU warms up over the first ones): what recording costs outside the window."""
    rows = sql(run, "SELECT step, (\"end\" - start) / 1e6 ms, source FROM steps ORDER BY step")
    marked = [r["step"] for r in rows if r["source"] == "marker"]
    if not marked or not bare_of:
        return
    detected = {r["step"]: r["ms"] for r in rows if r["source"] == "detected"}
    parts = []
    for name, keep in (("before", lambda i: 5 <= i < marked[0]),
                       ("after", lambda i: i > marked[-1] + 1)):
        both = [i for i in detected if keep(i) and i in bare_of]
        if both:
            rec = statistics.median(detected[i] for i in both)
            ref = statistics.median(bare_of[i] for i in both)
            parts.append(f"{name} the window {rec:.2f} ms against {ref:.2f} ms bare "
                         f"({rec / ref:.2f}x, iterations {both[0]}-{both[-1]})")
    inside = [r["ms"] for r in rows if r["source"] == "marker"]
    parts.append(f"inside {statistics.median(inside):.2f} ms")
    print("  recorder's steps: " + "; ".join(parts))


def kernel_check(path: Path, gpu: str) -> None:
    """The bundled GPU kernel model (trained on NeuSight's 5 GPUs, never this one) against the
    run's own kernels: per launching op with shapes, its kernels' measured time beside the
    model's (TF32 where the kernels ran on tensor cores), GMAE per family."""
    import math

    import numpy as np

    from perfswarm.analyze.dependencies import launching_op_rows
    from perfswarm.analyze.frame import Events, args_of
    from perfswarm.analyze.ops import is_tensor_core
    from perfswarm.model.gpu.aten import kernels
    from perfswarm.model.gpu.hardware import Hardware
    from perfswarm.model.gpu.learned import bundled
    from perfswarm.model.kernels import GPU_FLOOR_NS
    from perfswarm.model.opcost import data_cost, shapes_from_args, tf32_if_fp32
    from perfswarm.model.specs import load_spec
    from perfswarm.trace.store import Run

    run = Run(path)
    ev = Events.load(run)
    ext = np.asarray(run.table("events", ["external_id"]).column("external_id").to_numpy())
    device = np.flatnonzero(ev.of_kind("kernel"))
    by_op: dict[int, list[int]] = {}
    for k, op in zip(device.tolist(), launching_op_rows(ev, ext, device).tolist(), strict=True):
        if op >= 0:
            by_op.setdefault(op, []).append(k)
    ops = sorted(by_op)
    model, hw = bundled(), Hardware.of_spec(load_spec(gpu))
    errors: dict[str, list[float]] = {}
    for op, text in zip(ops, args_of(run, np.asarray(ops, np.int64)), strict=True):
        shapes = shapes_from_args(text)
        cost = data_cost(ev.name_of(op), shapes) if shapes else None
        if cost is None or shapes is None:
            continue
        if any(is_tensor_core(ev.name_of(k)) for k in by_op[op]):
            cost = tf32_if_fp32(cost)
        works = kernels(cost, shapes.dims)
        if not works or any(w.family not in model.families for w in works):
            continue
        predicted = float(model.seconds(works, hw).sum()) * 1e9 + GPU_FLOOR_NS * len(works)
        measured = float(sum(int(ev.dur[k]) for k in by_op[op]))
        errors.setdefault(works[0].family, []).append(math.log(predicted / measured))
    print("  the kernel model on this GPU (never trained on it), per launching op: " + "; ".join(
        f"{family} {len(e)} ops, GMAE {math.exp(float(np.mean(np.abs(e)))) - 1:.0%}, "
        f"predicted / measured {math.exp(float(np.mean(e))):.2f}x"
        for family, e in sorted(errors.items())))


def predict(run: Path, *args: str) -> dict[str, Any] | None:
    proc = perfswarm("predict", str(run), *args, "--json")
    out: dict[str, Any] | None = json.loads(proc.stdout) if proc.returncode == 0 else None
    return out


def unpack(outs: list[Path], keep: Path) -> tuple[dict[str, Any], dict[str, Path]]:
    """Every round's env (bare times merged by case) and runs (a later round's win)."""
    env: dict[str, Any] = {"bare_iter_ms": {}}
    runs: dict[str, Path] = {}
    for i, out in enumerate(outs):
        here = json.loads((out / "env.json").read_text())
        env.update({k: v for k, v in here.items() if k != "bare_iter_ms"})
        env["bare_iter_ms"].update(here["bare_iter_ms"])
        for tgz in sorted(out.glob("*.tgz")):
            where = keep / f"round{i}"
            with tarfile.open(tgz) as tar:
                tar.extractall(where, filter="data")
            runs[tgz.name.removesuffix(".tgz").removesuffix(".run")] = (
                where / tgz.name.removesuffix(".tgz"))
    return env, runs


def compare_half(outs: list[Path], keep: Path, cpu_steps: int) -> None:
    keep.mkdir(parents=True, exist_ok=True)
    env, runs = unpack(outs, keep)
    target = str(env.get("gpu", "H200"))
    print(f"GPU: {target}, torch {env['torch']}")
    work = work_dir(SHARED, keep / "nanogpt")
    measured: dict[str, float] = {}
    for case in CASES:
        gpu = runs.get(f"nano-{case}-cuda")
        bare = env["bare_iter_ms"].get(RECORDER_CASES.get(case, (case, None))[0]) or []
        truth = median_after(bare)
        print(f"== {case}: bare GPU median iteration {truth} ms ({len(bare)} printed)")
        if gpu is None:
            print("  no GPU run")
            continue
        at = gpu_run_check(gpu, dict(enumerate(bare, start=1)), target)  # nanoGPT counts from 0
        if at:
            measured[case] = at["steady"]["measured_ns"] / 1e6
        if case == "medium-b64" and "nano-medium-cuda" in runs:
            scaled = predict(runs["nano-medium-cuda"], "--batch-size", "64")
            if scaled and at:
                pred = scaled["steady"]["predicted_ns"] / 1e6  # as `measured`: the steady steps
                print(f"  predict --batch-size 64 of medium: {pred:.2f} ms against "
                      f"{measured[case]:.2f} ms recorded ({pred / measured[case] - 1:+.1%}); "
                      f"bare {truth} ms")
        if case not in CPU_CASES:
            continue
        cpu = keep / f"nano-{case}-cpu.run"
        if not cpu.exists():
            perfswarm("record", "--out", str(cpu), "--steps", f"2:{cpu_steps}", "--quiet", "--",
                      *nanogpt(case, "cpu", 2 + cpu_steps + 1), cwd=work, timeout=1800)
        forecast(cpu, target, truth, measured.get(case))
    for name, steps in env.get("model_step_ns", {}).items():
        style, size = name.split("-")
        bare_of = {i: ns / 1e6 for i, ns in enumerate(steps)}  # step i ends at hook i
        truth = median_after(list(bare_of.values()), 10)
        print(f"== model {name}: bare GPU median step {truth} ms ({len(steps)} steps)")
        gpu = runs.get(f"model-{name}-cuda")
        at = gpu_run_check(gpu, bare_of, target) if gpu else None
        cpu = keep / f"model-{name}-cpu.run"
        if not cpu.exists():
            batch, width = MODEL_SIZES[size]
            perfswarm("record", "--out", str(cpu), "--steps", f"3:{cpu_steps}", "--quiet", "--",
                      sys.executable, str(MODELS), style, "--batch-size", batch, "--width",
                      width, "--steps", str(3 + cpu_steps + 2), timeout=1800)
        forecast(cpu, target, truth, at["steady"]["measured_ns"] / 1e6 if at else None)
    for out in outs:
        calibrated(out / "calibrate.json")
    if "memory" in runs:
        memory_case(runs["memory"], keep)


def gpu_run_check(gpu: Path, bare_of: dict[int, float], target: str) -> dict[str, Any] | None:
    """A GPU recording's collectors, NVML against its trace, the recorder's overhead, the
    kernel model on its kernels and `predict` at its own configuration (returned)."""
    manifest = json.loads((gpu / "manifest.json").read_text())
    print("  collectors: " + ", ".join(f"{k} {v.get('status')}"
                                       for k, v in manifest["collectors"].items()))
    window_check(gpu)
    overhead(gpu, bare_of)
    kernel_check(gpu, target)
    at = predict(gpu)
    if at:
        print(f"  predict at the recorded configuration: measured {at['measured_ns']} "
              f"replayed {at['replayed_ns']} predicted {at['predicted_ns']} (error "
              f"{at['predicted_error']:+.2%}); steady {at['steady']}; kernels {at['kernels']}")
    return at


def forecast(cpu: Path, target: str, truth: float | None, recorded: float | None) -> None:
    """`predict --device TARGET` of a CPU recording against the GPU's bare step (TRUTH, ms)
    and its profiled one (RECORDED)."""
    fc = predict(cpu, "--device", target)
    if not fc or not truth:
        return
    pred = fc["predicted_ns"] / 1e6
    window = (f", {pred / recorded - 1:+.1%} of the recorded window's {recorded:.2f} ms"
              if recorded else "")
    print(f"  CPU recording, predict --device {target}: {pred:.2f} ms "
          f"({pred / truth - 1:+.1%} of the bare {truth:.2f} ms{window})"
          f"; device {fc['device_active_ns']['predicted'] / 1e6:.2f} ms, breakdown "
          f"{fc['breakdown_ns']}; kernels {fc['kernels']}")
    for note in fc.get("notes", []):
        print(f"    note: {note}")


def calibrated(path: Path) -> None:
    if not path.exists() or not path.read_text().strip():
        return
    prof = json.loads(path.read_text())
    print(f"calibrate cuda:0 ({prof.get('device_name')}): " + "; ".join(
        f"{op} {f['chosen']} held-out {f['gmae_held_out']:.1%} ({f['points']} points)"
        for op, f in prof["families"].items()) + f"; unusable {prof.get('unusable')}")


def memory_case(mem: Path, keep: Path) -> None:
    """The CUDA memory case imported both ways: the peak against the allocator's own."""
    truth = json.loads((mem / "truth.json").read_text())
    print(f"== memory: the allocator's own figures {truth}")
    for source in ("snapshot.pickle", "memory.raw.json.gz"):
        run = keep / f"memory-{source.split('.')[0]}.run"
        perfswarm("import", str(mem / "trace.json"), "--memory-timeline", str(mem / source),
                  "-o", str(run), "-q")
        proc = perfswarm("analyze", str(run), "--json")
        if proc.returncode == 0:
            for rank in json.loads(proc.stdout).get("memory") or []:
                peak = rank["peak"]
                print(f"  {source}: peak {peak['total_bytes']:,} B at {peak['ts']} "
                      f"({peak['total_bytes'] / truth['max_memory_allocated']:.4f} of "
                      f"max_memory_allocated) by category {peak['by_category']}; reserved "
                      f"{rank.get('reserved') and rank['reserved']['peak_bytes']}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("half", choices=("device", "compare"))
    p.add_argument("out", type=Path, nargs="+")
    p.add_argument("--realworld", type=Path, default=SHARED)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--iters", type=int, default=ITERS)
    p.add_argument("--window", default=WINDOW)
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--models", default="", help="realworld_models.py styles, comma-separated")
    p.add_argument("--calibrate", action="store_true")
    p.add_argument("--memory", action="store_true")
    p.add_argument("--keep", type=Path, default=None)
    p.add_argument("--cpu-steps", type=int, default=5)
    ns = p.parse_args()
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    if ns.half == "device":
        ns.out = ns.out[0]
        device_half(ns)
    else:
        compare_half(ns.out, ns.keep or Path(tempfile.mkdtemp(prefix="gpu-check-")),
                     ns.cpu_steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
