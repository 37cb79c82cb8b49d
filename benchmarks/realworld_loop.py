"""Training and inference loops in the styles people write, each timing itself.

    python benchmarks/realworld_loop.py STYLE [--steps N] [--fused]

STYLE: `sgd` (manual SGD, no torch.optim, as pytorch/examples' word_language_model),
`infer` (a no_grad inference loop), `callbacks` (an AdamW trainer whose callback runs a long
evaluation every few steps), `workers` (a DataLoader with 2 worker processes and a slow
dataset), `loader` (the same dataset loaded in the training process). No perfswarm import:
benchmarks/realworld.py records this script unmodified and compares what perfswarm says with
the ground truth it prints last, one JSON line after `truth `: per step, the wall time from
one step's end to the next (`step_ns`, as the optimizer hook times it) and the time spent
waiting for the next batch (`wait_ns`), the optimizer's own time (`optimizer_ns`) and its
thread's CPU time (`optimizer_cpu_ns`: what other processes' load barely moves), and the
steps that ran the callback.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Slow(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Each sample costs `delay_s` of busy Python work, as per-sample decoding does."""

    def __init__(self, n: int, delay_s: float) -> None:
        self.x, self.y = torch.randn(n, 64), torch.randn(n, 1)
        self.delay_s = delay_s

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        end = time.perf_counter() + self.delay_s
        while time.perf_counter() < end:
            pass
        return self.x[i], self.y[i]


def say_truth(**parts: object) -> None:
    """The ground truth, last on stdout: one JSON line after `truth ` (realworld.py's `truth`)."""
    print("truth " + json.dumps(parts), flush=True)


def model() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                         nn.Linear(512, 1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("style", choices=("sgd", "infer", "callbacks", "workers", "loader"))
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--fused", action="store_true", help="AdamW(fused=True) (callbacks style)")
    ns = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    net = model()
    steps, waits, opt_ns, opt_cpu_ns, called = [], [], [], [], []
    workers = 2 if ns.style == "workers" else 0
    loader = DataLoader(Slow(64 * (ns.steps + 1), 0.0002 if ns.style in ("workers", "loader")
                             else 0.0), batch_size=64, num_workers=workers)
    batches = iter(loader)
    opt = (torch.optim.AdamW(net.parameters(), lr=1e-3, fused=ns.fused)
           if ns.style in ("callbacks", "workers", "loader") else None)
    last = time.perf_counter_ns()
    for i in range(ns.steps):
        t = time.perf_counter_ns()
        x, y = next(batches)
        waits.append(time.perf_counter_ns() - t)
        if ns.style == "infer":
            with torch.no_grad():
                net(x)
        else:
            loss = ((net(x) - y) ** 2).mean()
            net.zero_grad(set_to_none=True)
            loss.backward()
            if opt is None:
                with torch.no_grad():
                    for w in net.parameters():
                        w.sub_(1e-3 * w.grad)  # type: ignore[operator]
            else:
                if ns.style == "callbacks" and i % 10 == 9:
                    called.append(i)
                    with torch.no_grad():  # the callback: a long evaluation
                        for _ in range(300):
                            net(x)
                t, cpu = time.perf_counter_ns(), time.thread_time_ns()
                opt.step()
                opt_cpu_ns.append(time.thread_time_ns() - cpu)
                opt_ns.append(time.perf_counter_ns() - t)
        now = time.perf_counter_ns()
        steps.append(now - last)
        last = now
    say_truth(step_ns=steps, wait_ns=waits, optimizer_ns=opt_ns, optimizer_cpu_ns=opt_cpu_ns,
              callback_steps=called)


if __name__ == "__main__":
    main()
