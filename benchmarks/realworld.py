"""perfswarm on real scripts: what it says against what the scripts measure of themselves.

Records, unmodified, nanoGPT (../shared/realworld, its offline data maker, a CPU
configuration) and the loops of benchmarks/realworld_loop.py (manual SGD, inference, a
trainer with a slow callback, a DataLoader with workers and one without), then checks:

- the profiling window opened on what each loop does (`window_on`: optimizer, backward,
  forward) and the step times the recorder took from its hooks against the script's own
  clock (median ratio, goal within 5%);
- the DataLoader share of the profiled steps (advise's data_loading evidence) against the
  loop's own time.perf_counter around `next(loader)` in the same steps (goal within 5
  points);
- the outlier steps advise names against the steps that ran the callback (goal: the same);
- the fused-optimizer advice's gain per step against an A/B of the loop with AdamW(fused=True),
  unrecorded, by the loop's own clock around optimizer.step() (printed side by side; the
  recorded step is slowed by the profiler, so the estimate errs high);
- nanoGPT: its printed iteration times against the recorder's steps, and the advice it gets.

    python benchmarks/realworld.py [--only sgd,infer,callbacks,workers,loader,nanogpt]
        [--steps 30] [--nanogpt-iters 30]

On a busy machine every figure moves with the load; cpu_contention says when it does.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from perfswarm.optimize.advise import advise
from perfswarm.trace.store import Run

HERE = Path(__file__).resolve().parent
LOOP = HERE / "realworld_loop.py"
SHARED = HERE.parent.parent / "shared" / "realworld"
EXPECTED = {"sgd": "backward", "infer": "forward", "callbacks": "optimizer",
            "workers": "optimizer", "loader": "optimizer"}


def record(out: Path, cmd: list[str], cwd: Path | None = None,
           steps: str = "5:10") -> tuple[Run, str]:
    done = subprocess.run([sys.executable, "-m", "perfswarm.cli.main", "record", "-q", "-o",
                           str(out), "--steps", steps, "-c", "torch,system", "--", *cmd],
                          capture_output=True, text=True, cwd=cwd, check=False)
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-2000:])
        raise SystemExit(f"recording {' '.join(cmd)} failed ({done.returncode})")
    return Run(out), done.stdout


def truth(stdout: str) -> dict[str, Any]:
    line = next(s for s in stdout.splitlines() if s.startswith("truth "))
    data: dict[str, Any] = json.loads(line.removeprefix("truth "))
    return data


def steps_of(run: Run, source: str) -> dict[int, int]:
    return {int(s["step"]): int(s["end"] - s["start"]) for s in run.table("steps").to_pylist()
            if s["source"] == source}


def found(run: Run) -> dict[str, Any]:
    return {a.rule: a for a in advise(run).advice}


def check_loop(style: str, steps: int, tmp: Path) -> None:
    run, out = record(tmp / f"{style}.run", [sys.executable, str(LOOP), style, "--steps",
                                              str(steps)])
    t = truth(out)
    on = run.manifest()["extra"]["record"].get("window_on")
    print(f"-- {style}: window on {on} (expected {EXPECTED[style]})")
    hooked = steps_of(run, "detected")
    ratio = statistics.median(hooked[i] / t["step_ns"][i] for i in hooked if i < len(t["step_ns"]))
    print(f"   hook step / own step time, median over {len(hooked)} steps: {ratio:.3f}")
    advice = found(run)
    marked = sorted(steps_of(run, "marker"))
    if style in ("workers", "loader"):
        # By the loop's clock the last profiled step also holds the trace export (written in
        # its optimizer.step() hook); the recorder puts it in the next step, marked `export`.
        mine = marked[:-1]
        own = 100 * sum(t["wait_ns"][i] for i in mine) / sum(t["step_ns"][i] for i in mine)
        loading = advice.get("data_loading")
        said = loading.evidence["loader_share_pct"] if loading else None
        print(f"   DataLoader share of the profiled steps: perfswarm {said}% vs own {own:.1f}%")
    if style == "callbacks":
        outliers = advice.get("outlier_steps")
        named = [o["step"] for o in outliers.evidence["outliers"]] if outliers else []
        print(f"   outlier steps: perfswarm {named} vs callback steps {t['callback_steps']}")
        optimizer = advice.get("single_tensor_optimizer")
        if optimizer is not None and optimizer.gain_ns is not None:
            fused = subprocess.run([sys.executable, str(LOOP), style, "--steps", str(steps),
                                    "--fused"], capture_output=True, text=True, check=True)
            ab = (statistics.median(t["optimizer_ns"])
                  - statistics.median(truth(fused.stdout)["optimizer_ns"]))
            print(f"   fused=True gain per step: advice {optimizer.gain_ns / len(marked) / 1e6:.3f}"
                  f" ms vs A/B {ab / 1e6:.3f} ms ({optimizer.change})")
    for rule, a in sorted(advice.items()):
        print(f"   advice {rule}: {a.severity}, {a.gain_pct}% of {a.gain_of_ns / 1e6:,.0f} ms")


def check_nanogpt(iters: int, tmp: Path) -> None:
    work = tmp / "nanogpt"
    work.mkdir()
    subprocess.run([sys.executable, str(SHARED / "make_char_data.py"), str(work)], check=True,
                   capture_output=True)
    for f in ("train.py", "model.py", "configurator.py"):
        (work / f).symlink_to(SHARED / "nanoGPT" / f)
    (work / "config").symlink_to(SHARED / "nanoGPT" / "config")
    cmd = [sys.executable, "train.py", "config/train_shakespeare_char.py", "--device=cpu",
           "--compile=False", "--eval_iters=5", "--eval_interval=1000", "--log_interval=1",
           "--block_size=64", "--batch_size=12", "--n_layer=4", "--n_head=4", "--n_embd=128",
           f"--max_iters={iters}", "--dropout=0.0"]
    run, out = record(tmp / "nanogpt.run", cmd, cwd=work)
    own = {int(line.split()[1].rstrip(":")): float(line.rsplit("time ", 1)[1].split("ms")[0])
           for line in out.splitlines() if line.startswith("iter ")}
    hooked = steps_of(run, "detected")
    # nanoGPT times iteration N from just after optimizer step N - 1 to just after step N: the
    # recorder's step N (optimizer hook N - 1 to hook N)
    pairs = [(hooked[i] / 1e6, own[i]) for i in own if i in hooked]
    ratio = statistics.median(h / o for h, o in pairs)
    print(f"-- nanogpt: window on {run.manifest()['extra']['record'].get('window_on')}; "
          f"hook step / printed iteration time, median over {len(pairs)}: {ratio:.3f}")
    for rule, a in sorted(found(run).items()):
        print(f"   advice {rule}: {a.severity}, {a.gain_pct}% of {a.gain_of_ns / 1e6:,.0f} ms: "
              f"{a.change[:80]}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default="sgd,infer,callbacks,workers,loader,nanogpt")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--nanogpt-iters", type=int, default=30)
    ns = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for what in ns.only.split(","):
            if what == "nanogpt":
                check_nanogpt(ns.nanogpt_iters, Path(tmp))
            elif what in EXPECTED:
                check_loop(what, ns.steps, Path(tmp))
            else:
                raise SystemExit(f"--only: unknown {what!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
