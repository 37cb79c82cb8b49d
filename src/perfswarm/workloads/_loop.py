"""The training loop every bundled workload shares: arguments, data loading, timing.

Each workload supplies a model, a dataset and a loss; this module runs
`--steps` optimizer steps and prints one line per step (`step N TIME ms`), so a
recorded run can be checked against what the script itself measured.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


@dataclass(frozen=True)
class LoopArgs:
    steps: int
    batch_size: int
    lr: float
    num_workers: int
    loader_delay_ms: float
    seed: int
    threads: int


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--steps", type=int, default=30, help="optimizer steps to run")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--num-workers", type=int, default=0, help="DataLoader worker processes")
    p.add_argument("--loader-delay-ms", type=float, default=0.0,
                   help="extra time the DataLoader spends on each batch (a slow input pipeline)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0,
                   help="torch intra-op threads (0: torch's default)")
    return p


def loop_args(ns: argparse.Namespace) -> LoopArgs:
    if ns.steps < 1 or ns.batch_size < 1 or ns.num_workers < 0 or ns.loader_delay_ms < 0:
        raise SystemExit("--steps and --batch-size must be >= 1;"
                         " --num-workers and --loader-delay-ms >= 0")
    return LoopArgs(ns.steps, ns.batch_size, ns.lr, ns.num_workers, ns.loader_delay_ms,
                    ns.seed, ns.threads)


class SlowCollate:
    """Stacks a batch, then sleeps: the delay lands in whichever process loads (main or worker)."""

    def __init__(self, delay_ms: float) -> None:
        self.delay_s = delay_ms / 1000.0

    def __call__(self, items: Sequence[tuple[torch.Tensor, ...]]) -> tuple[torch.Tensor, ...]:
        batch = tuple(torch.stack(parts) for parts in zip(*items, strict=True))
        if self.delay_s:
            time.sleep(self.delay_s)
        return batch


def _batches(loader: DataLoader[Any]) -> Iterator[tuple[torch.Tensor, ...]]:
    while True:  # as many epochs as the step count needs
        yield from loader


def train(args: LoopArgs, model: nn.Module, dataset: Dataset[Any],
          loss_fn: Callable[[nn.Module, tuple[torch.Tensor, ...]], torch.Tensor]) -> list[float]:
    """Run `args.steps` steps; print and return each step's wall time in ms."""
    if args.threads:
        torch.set_num_threads(args.threads)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    loader: DataLoader[Any] = DataLoader(
        dataset, batch_size=args.batch_size, shuffle=True, drop_last=True,
        num_workers=args.num_workers, collate_fn=SlowCollate(args.loader_delay_ms),
        generator=torch.Generator().manual_seed(args.seed),
        persistent_workers=args.num_workers > 0,
    )
    times: list[float] = []
    batches = _batches(loader)
    model.train()
    for step in range(args.steps):
        start = time.perf_counter()
        batch = next(batches)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model, batch)
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        ms = (time.perf_counter() - start) * 1000.0
        times.append(ms)
        print(f"step {step} {ms:.3f} ms loss {loss.item():.4f}", flush=True)
    return times
