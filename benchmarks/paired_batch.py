"""A script's step at two batch sizes (or widths), measured in pairs: contention falls on both
alike.

    python benchmarks/paired_batch.py {lstm,resnet,gpt,mixer,conv1d,nanogpt} B0 B1 [--width 40]
        [--width1 W1] [--pairs 30] [--window N] [--apart] [--reserve MIB] [--json OUT]
        [--nanogpt DIR]

One process builds the model of benchmarks/realworld_models.py STYLE (with its optimizer, as the
script trains it: `train_step`; one intra-op thread) twice from the same seed, the second at
`--width1` where given (realworld.py's width x2: B1 = B0, --width1 twice --width). `nanogpt`:
nanoGPT's model.py, unmodified, from `--nanogpt DIR` (realworld.py's `nanogpt_dir`), each step
one iteration of its train.py's loop (benchmarks/nanogpt_step.py; `--width`: n_embd). It alternates
steps at batch B0 and B1 (each pair's order swapped from one pair to the next), each step under
torch.profiler with record_shapes. It prints the median over pairs of (B1 step's process CPU
time / B0 step's). `--window N` keeps one profiler on over N steps at a time, as `perfswarm
record` keeps it on over its window of steps (0, the default: a profiler of its own for each
step). `--reserve MIB` writes a heap reserve first (the recorder's `reserve_heap`, as
`record --heap-reserve` does): both models share one heap, and without it the profiler's
allocations inside a window leave the larger configuration's results on fresh pages that fault
on first write, so an op whose result is the step's largest reads x5-11 for twice the batch
where it does twice the work (docs/benchmarks.md, thirtieth pass), while the smaller one's fit
the holes the larger one's leave and take none (nanoGPT at 12 and 24: 2 and 5,378 a step, where
its recordings took 2,690 and 6,147). `--apart` gives each configuration a process of its own
(started fresh, as a recorded script is) and alternates the steps between the two, one at a time,
each heap then as a recording's (`--window N`: N of each process's own steps under one
profiler, as the recorder's window of N steps). Each configuration's minor page faults per step
are printed beside the ratio.
On a machine whose other load comes and goes, and on hyperthreads whose sibling's work stretches
CPU time too, two recordings made a minute apart can differ by 2x. Two steps a few milliseconds
apart cannot, so this ratio is what `predict`'s ratio of a changed configuration to its base
should match.
`--json` writes, per op occurrence (`aten::NAME#k`: the k-th of its name in a step, in start
order, inclusive time) and for the whole step (`STEP cpu`), the median paired ratio and the
median B0 time (us); without it the profiler's events are not read (that takes longer than the
steps). The figures printed come last as one JSON line after `truth ` too (`ratio`, `base_ms`,
`faults`: each configuration's, `pairs`), for realworld.py.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import resource
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from functools import partial
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from nanogpt_step import NanoGPT
from perfswarm.recorder.inject._perfswarm_heap import reserve_heap
from realworld_models import STYLES, build, optimizer, train_step

STEP = "paired_batch step"
FAULTS = "STEP faults"  # a step's minor page faults (not a time: kept out of the ratios)
Config = tuple[int, int]  # (batch, width)


def make_step(style: str, config: Config, nanogpt: Path | None) -> Callable[[], None]:
    """One training step of `style` at `config`, its model built from the same seed each time."""
    batch, width = config
    if style == "nanogpt":
        assert nanogpt is not None
        return NanoGPT(nanogpt, batch, width).step
    torch.manual_seed(0)
    net, shape, classes = build(style, width)
    return partial(train_step, style, net, optimizer(style, net), shape, classes, batch,
                   torch.device("cpu"))


def ops(events: list[Any], start: float, end: float) -> dict[str, float]:
    """Each aten op's inclusive time (us) among `events` from start to end, by occurrence."""
    seen: dict[str, int] = defaultdict(int)
    out = {}
    for e in sorted((e for e in events if e.name.startswith("aten::")
                     and start <= e.time_range.start < end), key=lambda e: e.time_range.start):
        out[f"{e.name}#{seen[e.name]}"] = e.cpu_time_total
        seen[e.name] += 1
    return out


class Profiled:
    """Steps timed under torch.profiler (record_shapes), one profiler kept on over `per` of
    them at a time: each step's process CPU time (us, `STEP cpu`), its minor page faults
    (FAULTS) and, where `read_ops`, its aten ops (`ops`)."""

    def __init__(self, per: int, read_ops: bool) -> None:
        self.per, self.read_ops = per, read_ops
        self.prof: Any = None
        self.steps: list[dict[str, float]] = []
        self.opened = 0  # the first step of the open profiler's

    def run(self, step: Callable[[], None]) -> None:
        if self.prof is None:
            self.prof = torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True)
            self.prof.start()
            self.opened = len(self.steps)
        with torch.profiler.record_function(STEP):
            start = time.process_time_ns()
            touched = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            step()
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - touched
            self.steps.append({"STEP cpu": (time.process_time_ns() - start) / 1e3,
                               FAULTS: faults})
        if len(self.steps) - self.opened == self.per:
            self._stop()

    def _stop(self) -> None:
        self.prof.stop()
        if self.read_ops:
            events = list(self.prof.events())
            spans = sorted((e.time_range.start, e.time_range.end) for e in events
                           if e.name == STEP)
            for measured, span in zip(self.steps[self.opened:], spans, strict=True):
                measured.update(ops(events, *span))
        self.prof = None

    def close(self) -> list[dict[str, float]]:
        """Every step's figures, in the order they ran."""
        if self.prof is not None:
            self._stop()
        return self.steps


def serve(conn: Connection, style: str, config: Config, nanogpt: Path | None, reserve: int,
          per: int, read_ops: bool) -> None:
    """`--apart`: one configuration in a process of its own, a step each time `conn` says so,
    its steps' figures sent back at the end."""
    reserve_heap(reserve)
    torch.set_num_threads(1)
    step = make_step(style, config, nanogpt)
    for _ in range(3):  # first calls create oneDNN primitives, grow the heap
        step()
    conn.send(True)
    timed = Profiled(per, read_ops)
    while conn.recv():
        timed.run(step)
        conn.send(True)
    conn.send(timed.close())


def apart(ns: argparse.Namespace, order: list[Config]) -> dict[Config, list[dict[str, float]]]:
    """Each configuration's steps, in a process of its own, run one at a time in `order`."""
    spawn = multiprocessing.get_context("spawn")  # a fresh interpreter, as a recorded script's
    conns, workers = {}, []
    for config in dict.fromkeys(order):
        conns[config], theirs = spawn.Pipe()
        workers.append(spawn.Process(target=serve, args=(
            theirs, ns.style, config, ns.nanogpt, ns.reserve, ns.window or 1, bool(ns.json))))
        workers[-1].start()
    for conn in conns.values():
        conn.recv()  # built and warm
    for config in order:
        conns[config].send(True)
        conns[config].recv()
    steps = {}
    for config, conn in conns.items():
        conn.send(False)
        steps[config] = conn.recv()
    for worker in workers:
        worker.join()
    return steps


def together(ns: argparse.Namespace, order: list[Config]) -> dict[Config, list[dict[str, float]]]:
    """Each configuration's steps, both models in this process, run in `order`."""
    reserve_heap(ns.reserve)
    torch.set_num_threads(1)
    steps_of = {config: make_step(ns.style, config, ns.nanogpt) for config in dict.fromkeys(order)}
    for _ in range(3):  # warm both: first calls create oneDNN primitives, grow the heap
        for step in steps_of.values():
            step()
    timed = Profiled(2 * max(1, ns.window // 2) if ns.window else 1, bool(ns.json))
    for config in order:
        timed.run(steps_of[config])
    got = timed.close()
    return {config: [s for c, s in zip(order, got, strict=True) if c == config]
            for config in steps_of}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("style", choices=(*STYLES, "nanogpt"))
    p.add_argument("b0", type=int)
    p.add_argument("b1", type=int)
    p.add_argument("--width", type=int, default=40)
    p.add_argument("--width1", type=int, help="the second model's width (default --width)")
    p.add_argument("--pairs", type=int, default=30)
    p.add_argument("--window", type=int, default=0,
                   help="steps one profiler stays on for (0: a profiler per step)")
    p.add_argument("--apart", action="store_true",
                   help="each configuration in a process of its own, steps alternating")
    p.add_argument("--reserve", type=int, default=0, metavar="MIB",
                   help="write a heap reserve of MIB first (0, the default: none)")
    p.add_argument("--json", type=Path, help="per-op paired ratios to this file")
    p.add_argument("--nanogpt", type=Path, metavar="DIR",
                   help="nanogpt: the folder of its model.py and data (realworld.py's nanogpt_dir)")
    ns = p.parse_args()
    if ns.style == "nanogpt" and not (ns.nanogpt and (ns.nanogpt / "model.py").is_file()):
        p.error("nanogpt needs --nanogpt DIR, a folder with nanoGPT's model.py and its data")
    # the two configurations, (batch, width): the first B0 at --width, the second B1 at --width1
    first, second = (ns.b0, ns.width), (ns.b1, ns.width1 or ns.width)
    if first == second:
        p.error("the two configurations are the same: give another B1 or --width1")
    # each pair's order swapped from one pair to the next
    order = [c for i in range(ns.pairs) for c in ((first, second) if i % 2 == 0 else
                                                   (second, first))]
    steps = (apart if ns.apart else together)(ns, order)
    ratios: dict[str, list[float]] = defaultdict(list)
    base: dict[str, list[float]] = defaultdict(list)
    faulted = {config: [s.pop(FAULTS) for s in got] for config, got in steps.items()}
    for one, other in zip(steps[first], steps[second], strict=True):  # pair by pair
        for k, v in one.items():
            if k in other and v > 0:
                ratios[k].append(other[k] / v)
                base[k].append(v)
    truth = {"ratio": statistics.median(ratios["STEP cpu"]),
             "base_ms": statistics.median(base["STEP cpu"]) / 1e3,
             "faults": [statistics.median(faulted[c]) for c in (first, second)],
             "pairs": ns.pairs}
    print(f"{ns.style} batch {ns.b0} -> {ns.b1}, width {first[1]} -> {second[1]}"
          f"{', apart' if ns.apart else ''}: step CPU time x{truth['ratio']:.3f} (median of "
          f"{ns.pairs} pairs; the first step {truth['base_ms']:.2f} ms); minor page faults a step "
          f"{truth['faults'][0]:.0f} and {truth['faults'][1]:.0f}")
    if ns.json:
        ns.json.write_text(json.dumps({k: [statistics.median(v), statistics.median(base[k])]
                                       for k, v in ratios.items()}))
    print("truth " + json.dumps(truth))
    return 0


if __name__ == "__main__":
    sys.exit(main())
