"""A loop that steps several optimizers at different rates, recorded, against its own clock.

WGAN-GP (the eighteenth pass's audit script): the critic stepped N_CRITIC times (each on a
fresh batch, a gradient penalty from autograd.grad(create_graph=True)), then the generator,
Adam for both; one thread. Records it with `perfswarm record` (the perfswarm on PYTHONPATH:
point it at another checkout for a before/after), then prints the iterations the script timed
against the Run's steps: counts, the median step after the window against the script's own
median over the same iterations, where each step ends against where the script's iteration
ended (wall clock, as a share of the script's median iteration), the marked steps' optimizer
calls, and the steps `analyze` detects from the trace with its markers and with them stripped.
`--generator-first` steps the generator first in each iteration, then the critic; `--spare`
builds a third optimizer the loop never steps.

    PYTHONPATH=src python benchmarks/optimizer_cycles.py [--n-critic 5] [--iterations 30]
        [--generator-first] [--spare]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent("""
    import sys, time, torch, torch.nn as nn
    torch.manual_seed(0)
    n_critic, iterations, order = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    G = nn.Sequential(nn.Linear(16, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),
                      nn.Linear(128, 32))
    D = nn.Sequential(nn.Linear(32, 128), nn.LeakyReLU(0.2), nn.Linear(128, 128),
                      nn.LeakyReLU(0.2), nn.Linear(128, 1))
    og = torch.optim.Adam(G.parameters(), 1e-4, betas=(0.5, 0.9))
    od = torch.optim.Adam(D.parameters(), 1e-4, betas=(0.5, 0.9))
    if "spare" in sys.argv[4:]:
        spare = torch.optim.SGD(nn.Linear(4, 4).parameters(), lr=0.1)  # never stepped
    real_data = torch.randn(8192, 32) * 0.5 + 1
    def generator_step():
        loss_g = -D(G(torch.randn(64, 16))).mean()
        og.zero_grad(); loss_g.backward(); og.step()
    for it in range(iterations):
        t0 = time.perf_counter()
        if order == "generator":
            generator_step()
        for _ in range(n_critic):
            real = real_data[torch.randint(0, 8192, (64,))]; fake = G(torch.randn(64, 16)).detach()
            eps = torch.rand(64, 1); mix = (eps * real + (1 - eps) * fake).requires_grad_(True)
            g, = torch.autograd.grad(D(mix).sum(), mix, create_graph=True)
            loss_d = D(fake).mean() - D(real).mean() + 10 * ((g.norm(2, dim=1) - 1) ** 2).mean()
            od.zero_grad(); loss_d.backward(); od.step()
        if order == "critic":
            generator_step()
        end = time.time_ns()
        print(f"STEP {it} {(time.perf_counter() - t0) * 1e3:.3f} ms {end}", flush=True)
""")


def stripped_steps(run: Path, work: Path) -> int:
    """The steps `analyze` detects in the Run's trace with its ProfilerStep markers removed."""
    from perfswarm.analyze.frame import Events
    from perfswarm.analyze.iterations import iterations
    from perfswarm.trace.ingest import ImportOptions, import_traces

    (trace,) = (run / "raw").glob("torch-*.pt.trace.json")
    raw = json.loads(trace.read_text())
    raw["traceEvents"] = [e for e in raw["traceEvents"]
                          if not str(e.get("name", "")).startswith("ProfilerStep#")]
    path = work / "stripped.json"
    path.write_text(json.dumps(raw))
    imported = import_traces([path], work / "stripped.run", ImportOptions(), ["t"])
    return len(iterations(imported, Events.load(imported)).steps[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-critic", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--generator-first", action="store_true")
    parser.add_argument("--spare", action="store_true")
    args = parser.parse_args()
    import duckdb

    from perfswarm.analyze.frame import Events
    from perfswarm.analyze.iterations import iterations
    from perfswarm.trace.store import Run

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        script = work / "wgan.py"
        script.write_text(SCRIPT)
        run_dir = work / "wgan.run"
        env = dict(os.environ, OMP_NUM_THREADS="1")
        log = work / "own.log"
        with log.open("w") as f:  # (a file: a pipe's reader lagging held the prints)
            subprocess.run([sys.executable, "-m", "perfswarm.cli.main", "record", "-q", "-o",
                            str(run_dir), "--", sys.executable, str(script), str(args.n_critic),
                            str(args.iterations),
                            "generator" if args.generator_first else "critic",
                            *(["spare"] if args.spare else [])], env=env, stdout=f, check=True)
        out = log.read_text()
        own = [float(m[1]) for m in re.finditer(r"STEP \d+ ([\d.]+) ms", out)]
        ends = [int(m[1]) for m in re.finditer(r"STEP \d+ [\d.]+ ms (\d+)", out)]
        steps = duckdb.connect().execute(
            f"SELECT step, start, \"end\", source FROM read_parquet('{run_dir}/tables/"
            "steps.parquet') ORDER BY step").fetchall()
        marked = [(lo, hi) for _, lo, hi, source in steps if source == "marker"]
        last = max((step for step, _, _, source in steps if source == "marker"), default=-1)
        after = {step: (hi - lo) / 1e6 for step, lo, hi, source in steps
                 if source == "detected" and step > last + 1}
        run = Run(run_dir)
        calls = [e for e in run.table("events", ["name", "ts"]).to_pylist()
                 if e["name"].startswith("Optimizer.step#")]
        per_step = sorted({sum(lo <= e["ts"] < hi for e in calls) for lo, hi in marked})
        (agreement,) = iterations(run, Events.load(run)).agreement
        print(f"n_critic {args.n_critic}: {len(own)} iterations, "
              f"{args.iterations * (args.n_critic + 1)} optimizer calls; the Run: "
              f"{len(steps)} steps ({len(marked)} marked, each holding {per_step} calls)")
        if after:  # (the script's from iteration 16: after the default window, 5:10)
            print(f"  after the window: Run step median {statistics.median(after.values()):.2f}"
                  f" ms ({len(after)} steps), the script's own median "
                  f"{statistics.median(own[16:]):.2f} ms (its iterations from 16 on)")
            if len(steps) == len(own) - 1:  # step k ends with iteration k: each against its own
                off = [abs(ms - own[k]) / own[k] * 100 for k, ms in after.items()]
                print(f"  each of those steps against its iteration's own time: median "
                      f"{statistics.median(off):.2f}% off, at most {max(off):.2f}%")
        # each step's end against the nearest iteration's end (the window's last marked step
        # ends at the profiler's stop, inside the next iteration: left out)
        off = [min(abs(hi - e) for e in ends) / 1e6 / statistics.median(own) * 100
               for step, _, hi, source in steps if source != "marker" or step != last]
        print(f"  step ends against the iterations' ends: median {statistics.median(off):.2f}%"
              f" of the median iteration, {sum(o < 1 for o in off)} of {len(off)} within 1%; "
              f"the window's first step {last - len(marked) + 1}")
        print(f"  analyze: {agreement.marker_count} marked, {agreement.detected_count} "
              f"detected (max boundary error {agreement.max_error_pct:.2f}% of a step); with "
              f"the markers stripped: {stripped_steps(run_dir, work)} steps")


if __name__ == "__main__":
    main()
