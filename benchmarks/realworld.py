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
- the fused-optimizer advice's gain per step against an A/B of the loop as written and with
  AdamW(fused=True), both unrecorded, in turns (two rounds), by the CPU time of the loop's
  thread in optimizer.step() (its wall time at load 5-6 read 0.8 to 11.2 ms saved), printed
  side by side, and each as a share of the single-tensor call: the advice's of the call it
  priced (its `calls_ns` over the profiler's slowdown: wall time, at the recording's load),
  the A/B's of the unfused loop's; the shares are what compares (the A/B's unfused side had
  been the recorded run's calls, slowed by the profiler and the collectors: 7.7-9.9 ms
  saved a step by a fused step where the loop's unfused call takes 1.4-2.0 ms of CPU);
- nanoGPT: its printed iteration times against the recorder's steps, and the advice it gets;
- predict (`--only predict`): nanoGPT (one intra-op thread, 2 layers, n_embd 128) and the five
  scripts of benchmarks/realworld_models.py (LSTM LM, ResNet with BatchNorm, GPT decoder with
  SDPA, MLP-Mixer, 1-D conv audio) recorded at a base configuration and at batch x0.5, x2, x4
  and width x2; each predicted from its base with a calibrated profile (`--profile`, else a
  `--budget`-minute calibration first), the steady steps' predicted median against its
  measured median steady step (goal: geomean <= 5%, max <= 15%), and each base at its recorded
  configuration (goal within 2%; each step is predicted from its own ops, so there it is the
  replay), beside the spread of its own steady steps. Each script prints its own CPU and wall
  time per step: a recording whose process had under 90% of a core in its profiled steps (other
  processes held it, stretching every op the prediction reads) is shown but its wall-time error
  not judged; the ratio of each prediction to the base's prediction is also judged against the
  ratio of the scripts' own CPU time per step (CPU seconds: what other load barely moves). The width
  change gives --dim W=2W and, for the GPT-style decoders, the head size W/4 (the parameters'
  multiples of W follow by themselves). Each script runs `--after` steps more after the window
  and its export step: the program's own step (no profiler), which `predict` gives at the target
  configuration too (`predicted_unprofiled_ns`); its error is printed beside the wall time's,
  against the compared Run's own step and against the script's own clock over those steps,
  judged as the wall time is (never at the recorded configuration, where it is the measured own
  step by construction). Where the step's largest results change at the new shapes, the last
  column ends with the time of writing fresh pages `predict` leaves unpriced
  (`first_touch_unpriced_ns`).
  One recording a configuration is a draw (one process against one read x1.34-1.76 for the
  same change, docs/benchmarks.md's twenty-third pass; the host's speed drifts over minutes):
  `--rounds N` records each script's five configurations N times, round by round, in an order
  that changes between rounds (round_orders: each configuration in each
  place once in five rounds, none after the same one in every round), predicts each round's
  changed configurations from that round's base (the base is as much a draw as the rest;
  same-round pairs share the host's speed of those minutes), prints each recording's row (its
  configuration suffixed ` rR`) and summary lines as one round does, then each row's medians
  over rounds (the error: of the medians; the spread: the measured step's largest round over
  its smallest, less 1), judged where most of its rounds and most of its base's were, and the
  same summary lines of them.
  Beside them, a truth the host's speed does not move: right after a script's recordings of a
  round, each changed configuration's step against its base's measured in pairs
  (benchmarks/paired_batch.py --apart, `--pairs` pairs: each configuration in a fresh process
  of its own, its heap as its recording's, no reserve, as `record` writes none unless asked;
  one step of each in turn, under a profiler kept over the recording's window of steps; nanoGPT
  by benchmarks/nanogpt_step.py, train.py's loop body on its unmodified model.py): the median
  over pairs of their CPU time's ratio (`paired`), beside `predict`'s ratio to the base (its
  predicted step over the base's measured one, both off the base's Run: `pred x`) and the error
  of that against it (`pair err`), judged on every changed row, quiet or not, each round and on
  the medians over rounds (the paired ratio's median over rounds); each row's tail starts with
  the minor page faults a step of the paired base and changed processes and of the two Runs.

    python benchmarks/realworld.py [--only sgd,infer,callbacks,workers,loader,nanogpt,predict]
        [--steps 30] [--nanogpt-iters 30] [--profile cpu-profile.json] [--budget 1]
        [--predict-steps 16] [--after 12] [--scripts mixer,conv1d] [--rounds 1] [--pairs 20]
        [--keep DIR]   (record into DIR and keep the Runs, to compare them op by op; with
                        --only predict each script's output beside its Run, RUN.stdout; over
                        rounds, SCRIPT-CONFIG-rR.run; the profile it calibrated,
                        cpu-profile.json)

On a busy machine every figure moves with the load; cpu_contention says when it does.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfswarm.analyze.iterations import step_faults
from perfswarm.model.accuracy import gmae
from perfswarm.model.predict import Change, Prediction, predict
from perfswarm.model.profile import Profile
from perfswarm.optimize.advise import advise
from perfswarm.recorder.bench.kernels import calibrate
from perfswarm.trace.store import Run
from perfswarm.userfiles import read_json, write_json

HERE = Path(__file__).resolve().parent
LOOP = HERE / "realworld_loop.py"
SHARED = HERE.parent.parent / "shared" / "realworld"
EXPECTED = {"sgd": "backward", "infer": "forward", "callbacks": "optimizer",
            "workers": "optimizer", "loader": "optimizer"}


def record(out: Path, cmd: list[str], cwd: Path | None = None, steps: str = "5:10",
           collectors: str = "torch,system", env: dict[str, str] | None = None
           ) -> tuple[Run, str]:
    done = subprocess.run([sys.executable, "-m", "perfswarm.cli.main", "record", "-q", "-o",
                           str(out), "--steps", steps, "-c", collectors, "--", *cmd],
                          capture_output=True, text=True, cwd=cwd, check=False,
                          env=None if env is None else {**os.environ, **env})
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
            own: dict[bool, list[float]] = {False: [], True: []}
            for _ in range(2):  # in turns: the host's load falls on both alike
                for fused in (False, True):
                    done = subprocess.run([sys.executable, str(LOOP), style, "--steps",
                                           str(steps), *(["--fused"] if fused else [])],
                                          capture_output=True, text=True, check=True)
                    own[fused].append(statistics.median(
                        truth(done.stdout)["optimizer_cpu_ns"]))
            single = statistics.median(own[False])
            ab = single - statistics.median(own[True])
            ev = optimizer.evidence
            call = ev["calls_ns"] / (ev["optimizer_slowdown"] or ev["profiler_slowdown"])
            print(f"   fused=True gain per step: advice {optimizer.gain_ns / len(marked) / 1e6:.3f}"
                  f" ms vs A/B {ab / 1e6:.3f} ms of CPU; of the call "
                  f"{optimizer.gain_ns / call:.2f} vs {ab / single:.2f} ({optimizer.change})")
    for rule, a in sorted(advice.items()):
        print(f"   advice {rule}: {a.severity}, {a.gain_pct}% of {a.gain_of_ns / 1e6:,.0f} ms")


def nanogpt_dir(tmp: Path) -> Path:
    """A working folder for nanoGPT: its data made offline, its files linked unmodified."""
    work = tmp / "nanogpt"
    if work.is_dir():
        return work
    work.mkdir()
    subprocess.run([sys.executable, str(SHARED / "make_char_data.py"), str(work)], check=True,
                   capture_output=True)
    for f in ("train.py", "model.py", "configurator.py"):
        (work / f).symlink_to(SHARED / "nanoGPT" / f)
    (work / "config").symlink_to(SHARED / "nanoGPT" / "config")
    return work


def nanogpt_cmd(iters: int, batch: int = 12, width: int = 128, layers: int = 4) -> list[str]:
    return [sys.executable, "train.py", "config/train_shakespeare_char.py", "--device=cpu",
            "--compile=False", "--eval_iters=5", "--eval_interval=1000", "--log_interval=1",
            "--block_size=64", f"--batch_size={batch}", f"--n_layer={layers}", "--n_head=4",
            f"--n_embd={width}", f"--max_iters={iters}", "--dropout=0.0"]


def check_nanogpt(iters: int, tmp: Path) -> None:
    work = nanogpt_dir(tmp)
    cmd = nanogpt_cmd(iters)
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


MODELS = HERE / "realworld_models.py"
PAIRED = HERE / "paired_batch.py"
BASE_BATCH, BASE_WIDTH = 8, 40
# per script: the widths it derives from its base W, each doubled with it
# (the parameters' whole multiples follow by themselves: predict's derived_dims; a head's
# W / heads does not)
DERIVED = {"lstm": (), "resnet": (), "gpt": (0.25,), "mixer": (), "conv1d": ()}
NANOGPT_WIDTH, NANOGPT_BATCH = 128, 12


def configurations(base_batch: int, base_width: int, derived: tuple[float, ...]
                   ) -> list[tuple[str, int, int, Change]]:
    """(label, batch, width, change from the base) of the base and its four variations."""
    widths = tuple((round(k * base_width), round(2 * k * base_width)) for k in (1, *derived))
    return [("base", base_batch, base_width, Change()),
            *((f"batch x{k:g}", round(k * base_batch), base_width,
               Change(batch_size=round(k * base_batch))) for k in (0.5, 2, 4)),
            ("width x2", base_batch, 2 * base_width, Change(dims=widths))]


UNCONTENDED = 0.9  # a recording judged on wall time when its process had this share of a core
# ... and other processes used at most this many cores meanwhile: on a machine whose two vCPUs
# are one core's two hyperthreads, a process keeps its whole vCPU while its sibling's load slows
# it (op by op 1.5-2.5x, framework ops alike, in a recording made while tests ran beside it)
QUIET_OTHERS = 0.1


def _busy_s() -> float:
    """CPU seconds the whole machine has been busy (/proc/stat: every state but idle and
    iowait)."""
    with open("/proc/stat") as f:
        user, nice, system, _idle, _wait, irq, softirq, steal = map(int, f.readline().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _ours_s() -> float:
    """CPU seconds of this process and its finished children (a recording and its script)."""
    return sum(getattr(resource.getrusage(who), f) for who in (resource.RUSAGE_SELF,
               resource.RUSAGE_CHILDREN) for f in ("ru_utime", "ru_stime"))


def record_alone(out: Path, cmd: list[str], **kwargs: Any) -> tuple[Run, str, float]:
    """`record`, and the cores other processes kept busy meanwhile (on average); the script's
    output kept beside the Run (RUN.stdout: its `truth` line, for --keep)."""
    busy, ours, start = _busy_s(), _ours_s(), time.perf_counter()
    run, stdout = record(out, cmd, **kwargs)
    wall = time.perf_counter() - start
    out.with_name(out.name + ".stdout").write_text(stdout)
    return run, stdout, max(0.0, (_busy_s() - busy) - (_ours_s() - ours)) / wall


def own_clock(run: Run, out: str) -> tuple[float, float] | None:
    """The script's median CPU time per profiled step and its CPU share of their wall time
    (its own clock; None for a script that prints no truth: nanoGPT). Under UNCONTENDED, other
    processes held its core for part of the steps, stretching every op of the trace."""
    if not out or "truth " not in out:
        return None
    t = truth(out)
    marked = [i for i in steps_of(run, "marker") if i < len(t["cpu_ns"])]
    return (statistics.median(t["cpu_ns"][i] for i in marked),
            sum(t["cpu_ns"][i] for i in marked) / sum(t["step_ns"][i] for i in marked))


def own_after(run: Run, out: str) -> float | None:
    """The script's median wall time per step (its own clock) over the steps the recorder timed
    after its window (those `unprofiled_ns` is of; None for a script that prints no truth)."""
    if not out or "truth " not in out:
        return None
    step_ns = truth(out)["step_ns"]
    rows = run.table("steps").to_pylist()
    closed = max(r["end"] for r in rows if r["source"] == "marker")
    after = [step_ns[r["step"]] for r in rows if r["source"] == "detected"
             and r["start"] >= closed and r["step"] < len(step_ns)]
    return statistics.median(after) if after else None


def round_orders(configurations: int, rounds: int) -> list[tuple[int, ...]]:
    """The order to measure `configurations` in, round by round, each once a round: the rows of
    a cyclic Latin square on Williams' sequence (0, 1, n - 1, 2, n - 2, ...; Williams 1949),
    renamed so that round 0 is 0, 1, 2, ... Each configuration takes each place once in n
    rounds, so none keeps its place from one round to the next (the first follows whatever ran
    before the round; a drift within rounds falls on every place), and none follows the same
    one in every round of two or more (but three configurations over two rounds: no order of
    them can do both), as a rotation (r, r + 1, ...) would put each after the one before it in
    every round it is not first. Of an even number, each follows each other once in n rounds.
    A machine's state left by the one before (its caches, allocator, clock speed) then falls on
    each configuration from several sides."""
    n = configurations
    sequence = [0, *((k + 1) // 2 if k % 2 else n - k // 2 for k in range(1, n))]
    renamed = {c: k for k, c in enumerate(sequence)}
    return [tuple(renamed[(c + r) % n] for c in sequence) for r in range(rounds)]


def over_rounds(values: Iterable[float | None]) -> float | None:
    """The median over the rounds that took a figure (None where none did): a round a burst of
    other load or a cold cache moved is outvoted, where a single measurement is a draw."""
    taken = [v for v in values if v is not None]
    return statistics.median(taken) if taken else None


def round_spread(values: Sequence[float]) -> float:
    """How far a figure moved over rounds: its largest over its smallest, less 1."""
    return max(values) / min(values) - 1


@dataclass(frozen=True)
class Paired:
    """A changed configuration's step over its base's, measured in pairs in the same minutes
    (`paired`): the truth a predicted ratio is judged against beside the recordings, which the
    host's speed from one minute to the next does not move. `faults`: the minor page faults a
    step of the base's process and of the changed one's there."""
    ratio: float
    faults: tuple[float, float]

    @staticmethod
    def median(found: Sequence[Paired]) -> Paired | None:
        """Each figure's median over the rounds that measured one (None where none did)."""
        if not found:
            return None
        return Paired(statistics.median(p.ratio for p in found),
                      (statistics.median(p.faults[0] for p in found),
                       statistics.median(p.faults[1] for p in found)))


@dataclass(frozen=True)
class Row:
    """A configuration's figures: one recording's, beside its prediction from the base recorded
    in the same round, or the medians over rounds of each (`quiet` then: in most rounds)."""
    measured: float  # the median steady step: the base's own, a changed configuration's Run's
    # the steady steps' predicted median, the statistic `predict` judges against `measured` (the
    # median of every profiled step's prediction, the window's first and last among them, had
    # read the GPT's base r1 13% above it once each step kept its own time)
    predicted: float
    others: float  # cores other processes kept busy meanwhile, on average
    quiet: bool  # others at most QUIET_OTHERS, and the script had UNCONTENDED of a core
    clock: tuple[float, float] | None  # own_clock: the script's CPU per step and CPU share
    own_measured: float | None  # the program's own step after the window (unprofiled_ns)
    own_predicted: float | None  # predicted_unprofiled_ns
    own_after: float | None  # the script's clock over the same steps
    # a changed configuration's step over its base's measured in pairs (paired_batch.py
    # --apart), the minor page faults a step of its base and of it there, and the Run's own
    # a profiled step (step_faults)
    paired: Paired | None = None
    faults: float | None = None


def recorded_row(p: Prediction, label: str, run: Run, out: str, others: float,
                 paired: Paired | None = None) -> Row:
    clock = own_clock(run, out)
    faults = step_faults(run)
    return Row(measured=p.measured_steady_ns if label == "base" else (p.compare or ("", 0))[1],
               predicted=p.predicted_steady_ns, others=others,
               quiet=(clock is None or clock[1] >= UNCONTENDED) and others <= QUIET_OTHERS,
               clock=clock,
               own_measured=p.unprofiled_ns if label == "base" else p.compare_unprofiled_ns,
               own_predicted=p.predicted_unprofiled_ns, own_after=own_after(run, out),
               paired=paired, faults=None if faults is None else faults.profiled)


def median_row(rows: Sequence[Row]) -> Row:
    """Each figure's median over the rounds (the errors printed of it are the errors of the
    medians); quiet where more than half the rounds were."""
    clocks = [r.clock for r in rows if r.clock is not None]
    return Row(measured=statistics.median(r.measured for r in rows),
               predicted=statistics.median(r.predicted for r in rows),
               others=statistics.median(r.others for r in rows),
               quiet=2 * sum(r.quiet for r in rows) > len(rows),
               clock=(statistics.median(c[0] for c in clocks),
                      statistics.median(c[1] for c in clocks)) if clocks else None,
               own_measured=over_rounds(r.own_measured for r in rows),
               own_predicted=over_rounds(r.own_predicted for r in rows),
               own_after=over_rounds(r.own_after for r in rows),
               paired=Paired.median([r.paired for r in rows if r.paired is not None]),
               faults=over_rounds(r.faults for r in rows))


@dataclass
class Tally:
    """The errors of the rows judged, and how many were not."""
    wall: list[float] = field(default_factory=list)  # changed configurations
    recorded: list[float] = field(default_factory=list)  # the base at its own configuration
    # predicted / the base's predicted against own CPU / the base's own CPU (every changed row:
    # CPU seconds are what other load barely moves)
    ratio: list[float] = field(default_factory=list)
    # the program's own step predicted (predicted_unprofiled_ns), changed configurations judged
    # as the wall time is: against the compared Run's own step, and the script's clock
    own: list[float] = field(default_factory=list)
    clock: list[float] = field(default_factory=list)
    # the ratio to the base predicted against the paired ratio: every changed row, quiet or
    # not (other load falls on both steps of a pair alike)
    paired: list[float] = field(default_factory=list)
    contended: int = 0

    def add(self, script: str, label: str, row: Row, base: Row, spread: str, tail: str,
            shown: str = "") -> None:
        """Judge `row` against its base's figures and print it (its configuration as `shown`,
        else `label`)."""
        error = row.predicted / row.measured - 1
        judged = row.quiet and base.quiet
        if judged:
            (self.recorded if label == "base" else self.wall).append(error)
        else:
            self.contended += 1
        own = ""
        if row.clock is not None and base.clock is not None:
            ratio = row.predicted / base.predicted / (row.clock[0] / base.clock[0]) - 1
            own = f"{100 * row.clock[1]:8.0f}%  {row.clock[0] / 1e6:7.2f}ms"
            if label != "base":
                self.ratio.append(ratio)
                own += f" {100 * ratio:+8.1f}%"
        cells = [f"{v / 1e6:.2f}ms" if v else "-" for v in (row.own_measured, row.own_predicted)]
        # at the recorded configuration the own step predicted is the measured one times the
        # prediction's error (predicted_unprofiled_ns): shown, never judged there
        for against, own_judged in ((row.own_measured, self.own), (row.own_after, self.clock)):
            if label == "base" or not (row.own_predicted and against):
                cells.append("-")
                continue
            cells.append(f"{100 * (row.own_predicted / against - 1):+.1f}%")
            if judged:
                own_judged.append(row.own_predicted / against - 1)
        if row.paired is None:
            cells += ["-", "-", "-"]
        else:
            # predict's ratio to the base: the predicted step over the base's measured one,
            # both read off the base's Run (its process's speed falls on both)
            ratio = row.predicted / base.measured
            self.paired.append(ratio / row.paired.ratio - 1)
            cells += [f"x{row.paired.ratio:.3f}", f"x{ratio:.3f}",
                      f"{100 * self.paired[-1]:+.1f}%"]
            runs = "/".join(f"{f:.0f}" if f is not None else "-" for f in (base.faults,
                                                                           row.faults))
            tail = (f"faults paired {row.paired.faults[0]:.0f}/{row.paired.faults[1]:.0f}, "
                    f"Runs {runs}; {tail}")
        print(f"{script:8s} {shown or label:14s} {row.measured / 1e6:8.2f}ms "
              f"{row.predicted / 1e6:8.2f}ms {100 * error:+7.1f}% {spread:>7s} "
              f"{row.others:6.2f}{' ' if judged else '*'}{own:<30s} {cells[0]:>9s} "
              f"{cells[1]:>9s} {cells[2]:>8s} {cells[3]:>9s} {cells[4]:>7s} {cells[5]:>7s} "
              f"{cells[6]:>8s}  {tail}")

    def summary(self, over: str = "", most: str = "") -> None:
        """The footnote and the summary lines (`over`: what the figures are, after the rows'
        kind; `most`: how many of its recordings a row's judgment asks)."""
        print(f"* wall-time error not judged: {most}the script or its base had under "
              f"{100 * UNCONTENDED:.0f}% of a core, or other processes kept more than "
              f"{QUIET_OTHERS:g} cores busy meanwhile ('others', on average) "
              f"({self.contended} rows)")
        for what, changed in (("wall time", self.wall), ("ratio to the base, against own CPU "
                                                         "time", self.ratio),
                              ("own step, against the compared Run's own", self.own),
                              ("own step, against the script's clock after the window",
                               self.clock),
                              ("ratio to the base, against the paired ratio (one step of each "
                               "in turn, in the same minutes; every row)", self.paired)):
            if changed:
                ratios = [1 + e for e in changed]
                print(f"changed configurations{over}, {what} ({len(changed)}): geomean |error| "
                      f"{100 * gmae(ratios, [1.0] * len(ratios)):.1f}% (goal <= 5%), max "
                      f"{100 * max(abs(e) for e in changed):.1f}% (goal <= 15%)")
        if self.recorded:
            print(f"recorded configurations{over} ({len(self.recorded)}): max |error| "
                  f"{100 * max(abs(e) for e in self.recorded):.1f}% (goal <= 2%)")


def paired(script: str, base: tuple[int, int], changed: tuple[int, int], window: int, pairs: int,
           tmp: Path) -> Paired:
    """`changed` (batch, width) against `base` in pairs: paired_batch.py --apart, each in a
    process of its own started fresh (its heap as a recording's: no reserve, as `record` writes
    none unless asked), one step of each in turn, under a profiler kept over `window` of its
    steps as the recorder keeps it; the median over `pairs` pairs of their CPU time's ratio."""
    cmd = [sys.executable, str(PAIRED), script, str(base[0]), str(changed[0]), "--width",
           str(base[1]), "--width1", str(changed[1]), "--window", str(window), "--pairs",
           str(pairs), "--apart"]
    if script == "nanogpt":
        cmd += ["--nanogpt", str(nanogpt_dir(tmp))]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-2000:])
        raise SystemExit(f"{' '.join(cmd[1:])} failed ({done.returncode})")
    t = truth(done.stdout)
    return Paired(t["ratio"], (t["faults"][0], t["faults"][1]))


def _header(last: str) -> None:
    print(f"{'script':8s} {'configuration':14s} {'measured':>10s} {'predicted':>10s} "
          f"{'error':>8s} {'spread':>7s} {'others':>6s} {'CPU share':>9s} {'CPU/step':>9s} "
          f"{'ratio err':>9s} {'own':>9s} {'own pred':>9s} {'own err':>8s} {'clock err':>9s}"
          f" {'paired':>7s} {'pred x':>7s} {'pair err':>8s}  {last}")


def check_predict(profile: Profile, steps: int, after: int, tmp: Path, only: str,
                  rounds: int = 1, pairs: int = 0) -> None:
    """Record each script at every configuration, `rounds` times interleaved (round_orders),
    predict each from the same round's base; over several rounds, the medians too. With
    `pairs`, each round measures each changed configuration against its base in pairs too
    (`paired`), right after its recordings."""
    print(f"-- predict: profile {profile.device}, {profile.threads} thread(s); unusable "
          f"families: {profile.unusable() or 'none'}")
    _header("kernels")
    each = Tally()  # every recording judged by itself
    medians: list[tuple[str, str, Row, Row, str, str]] = []
    one_thread = {"OMP_NUM_THREADS": "1"}
    scripts = [(s, DERIVED[s]) for s in DERIVED] + [("nanogpt", (0.25,))]
    for script, derived in scripts:
        if only and script not in only.split(","):
            continue
        nano = script == "nanogpt"
        base = configurations(NANOGPT_BATCH if nano else BASE_BATCH,
                              NANOGPT_WIDTH if nano else BASE_WIDTH, derived)
        # the window's steps, then its export step, then `after` steps of the program's own
        window = steps - 6
        steps_run = 4 + window + 1 + after
        per_round: list[dict[str, Row]] = []
        for r, order in enumerate(round_orders(len(base), rounds)):
            suffix = f" r{r}" if rounds > 1 else ""
            runs: dict[str, tuple[Run, str, float]] = {}
            for i in order:
                label, batch, width, _change = base[i]
                cmd = (nanogpt_cmd(steps_run, batch, width, layers=2) if nano else
                       [sys.executable, str(MODELS), script, "--batch-size", str(batch),
                        "--width", str(width), "--steps", str(steps_run)])
                runs[label] = record_alone(
                    tmp / f"{script}-{label.replace(' ', '')}{suffix.replace(' ', '-')}.run",
                    cmd, cwd=nanogpt_dir(tmp) if nano else None, steps=f"4:{window}",
                    collectors="torch", env=one_thread)
            truths = {base[i][0]: paired(script, base[0][1:3], base[i][1:3], window, pairs, tmp)
                      for i in order if pairs and i}
            rows: dict[str, Row] = {}
            for label, _batch, _width, change in base:
                run, out, others = runs[label]
                p = predict(runs["base"][0], change, profile=profile,
                            compare=None if label == "base" else run)
                rows[label] = recorded_row(p, label, run, out, others, truths.get(label))
                kernels = ", ".join(f"{k} {v}" for k, v in sorted(p.kernels.items()) if v)
                if p.first_touch_unpriced_ns:  # the step's largest results changed: see its note
                    kernels += f"; fresh pages unpriced {p.first_touch_unpriced_ns / 1e6:.2f}ms"
                spread = f"{100 * p.steady_spread:6.1f}%" if label == "base" else ""
                each.add(script, label, rows[label], rows["base"], spread, kernels,
                         shown=label + suffix)
            per_round.append(rows)
        base_row = median_row([rows["base"] for rows in per_round])
        medians += [(script, label, median_row([rows[label] for rows in per_round]), base_row,
                     f"{100 * round_spread([rows[label].measured for rows in per_round]):6.1f}%",
                     f"{sum(rows[label].quiet for rows in per_round)} of {rounds} quiet")
                    for label, *_ in base]
    each.summary()
    if rounds > 1:
        print(f"-- predict, medians over {rounds} rounds: each figure's median over the rounds, "
              "the errors those of the medians; spread: the measured step's largest round over "
              "its smallest, less 1")
        _header("rounds")
        over = Tally()
        for script, label, row, base_row, spread, tail in medians:
            over.add(script, label, row, base_row, spread, tail)
        over.summary(f", medians over {rounds} rounds",
                     "in half its rounds or more, ")


def _at_least(least: int) -> Callable[[str], int]:
    """An argparse type: a whole number of `least` or more."""
    def whole(text: str) -> int:
        if not text.isdigit() or int(text) < least:
            raise argparse.ArgumentTypeError(f"not a whole number of {least} or more: {text!r}")
        return int(text)
    return whole


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default="sgd,infer,callbacks,workers,loader,nanogpt")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--nanogpt-iters", type=int, default=30)
    p.add_argument("--profile", type=Path, help="a calibrated profile (predict)")
    p.add_argument("--budget", type=float, default=1.0,
                   help="minutes of calibration when no --profile is given (predict)")
    p.add_argument("--predict-steps", type=int, default=16,
                   help="predict: the profiler's window holds N - 6 steps, after 4 "
                   "unprofiled ones")
    p.add_argument("--after", type=int, default=12,
                   help="predict: the script's steps after the window's export step (its own "
                   "step, no profiler: predicted_unprofiled_ns is judged against them)")
    p.add_argument("--scripts", default="", help="predict: only these (lstm,resnet,gpt,mixer,"
                   "conv1d,nanogpt)")
    p.add_argument("--rounds", type=_at_least(1), default=1,
                   help="predict: record each script's configurations ROUNDS times, interleaved "
                   "(round_orders), and judge the medians over rounds too")
    p.add_argument("--pairs", type=_at_least(0), default=20,
                   help="predict: each round, each changed configuration's step against its "
                   "base's in N pairs (paired_batch.py --apart; 0: none)")
    p.add_argument("--keep", type=Path, help="record into this folder and keep the Runs")
    ns = p.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        tmp = str(ns.keep or scratch)
        Path(tmp).mkdir(parents=True, exist_ok=True)
        for what in ns.only.split(","):
            if what == "nanogpt":
                check_nanogpt(ns.nanogpt_iters, Path(tmp))
            elif what == "predict":
                data = read_json(ns.profile) if ns.profile else calibrate(60 * ns.budget)
                if ns.keep and not ns.profile:  # what its predictions can be taken again with
                    write_json(ns.keep / "cpu-profile.json", data)
                check_predict(Profile.from_dict(data), ns.predict_steps, ns.after, Path(tmp),
                              ns.scripts, ns.rounds, ns.pairs)
            elif what in EXPECTED:
                check_loop(what, ns.steps, Path(tmp))
            else:
                raise SystemExit(f"--only: unknown {what!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
