"""Six more training loops in styles people write, each timing its own parts.

    python benchmarks/realworld_styles.py STYLE [--steps N] [--batch-size N]

STYLE: `accum` (gradient accumulation: AdamW steps once every 4 micro-batches, the loss
divided by 4), `bf16` (the forward under torch.autocast("cpu", dtype=torch.bfloat16), no
GradScaler, AdamW), `ckpt` (six residual MLP blocks under torch.utils.checkpoint with
use_reentrant=False: their forwards run again inside backward, Adam), `func` (torch.func:
functional_call and grad of the loss over a dict of parameters, a hand-written SGD update, no
.backward(), no torch.optim), `buckets` (a transformer encoder layer fed sequences of 16, 32 or
64 tokens, a different shape each step, clip_grad_norm_, AdamW under a OneCycleLR schedule),
`valstop` (an MLP fed by a DataLoader, AdamW, a validation pass under model.eval() and
torch.inference_mode() every 5 steps, early stopping with patience 2). One intra-op thread.
No perfswarm import: each is recorded unmodified, and compared with the ground truth it
prints last, one JSON line after `truth ` (realworld_loop.py's): per step (an optimizer step,
or the hand-written update of `func`), from one step's end to the next, the wall time
(`step_ns`) and the process's CPU time (`cpu_ns`), the time waiting for the batch (`wait_ns`),
in the forward (`forward_ns`, under `func` the whole grad call), the backward (`backward_ns`,
with `ckpt`'s recomputed forwards), clipping (`clip_ns`), the optimizer or update
(`optimizer_ns`) and the validation (`eval_ns`, 0 where none ran); `micro` (micro-batches a
step), `tokens` (`buckets`' sequence length per step), `eval_steps`, `stopped_at` (the step
early stopping ended after, or null).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader, TensorDataset

from realworld_loop import say_truth

STYLES = ("accum", "bf16", "ckpt", "func", "buckets", "valstop")
WIDTH = 1024


def mlp(width: int = WIDTH) -> nn.Module:
    return nn.Sequential(nn.Linear(64, width), nn.GELU(), nn.Linear(width, width), nn.GELU(),
                         nn.Linear(width, 10))


class Residual(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(width)
        self.ff = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.ff(self.ln(x))


class Checkpointed(nn.Module):
    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        self.inp, self.out = nn.Linear(64, width), nn.Linear(width, 10)
        self.blocks = nn.ModuleList(Residual(width) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for b in self.blocks:
            h = checkpoint(b, h, use_reentrant=False)
        return self.out(h)


class Timer:
    """Per-step sums of the parts' wall times."""

    def __init__(self) -> None:
        self.parts: dict[str, list[int]] = {k: [] for k in (
            "wait_ns", "forward_ns", "backward_ns", "clip_ns", "optimizer_ns", "eval_ns")}

    def new_step(self) -> None:
        for v in self.parts.values():
            v.append(0)

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        t = time.perf_counter_ns()
        yield
        self.parts[name][-1] += time.perf_counter_ns() - t


def batches(batch: int, classes: bool = True) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    while True:
        x = torch.randn(batch, 64)
        yield x, (torch.randint(0, 10, (batch,)) if classes else x[:, :10].sum(1, keepdim=True))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("style", choices=STYLES)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=64)
    ns = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    tm = Timer()
    wall: list[int] = []
    cpu: list[int] = []
    extra: dict[str, Any] = {"micro": 4 if ns.style == "accum" else 1, "tokens": [],
                             "eval_steps": [], "stopped_at": None}
    last = time.perf_counter_ns(), time.process_time_ns()

    def end_step() -> None:
        nonlocal last
        now = time.perf_counter_ns(), time.process_time_ns()
        wall.append(now[0] - last[0])
        cpu.append(now[1] - last[1])
        last = now

    if ns.style == "func":
        net = mlp()
        params = {k: v.detach() for k, v in net.named_parameters()}

        def loss_fn(ps: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor
                    ) -> torch.Tensor:
            return F.cross_entropy(functional_call(net, ps, (x,)), y)

        grads_of = grad(loss_fn)
        data = batches(ns.batch_size)
        for _ in range(ns.steps):
            tm.new_step()
            with tm.part("wait_ns"):
                x, y = next(data)
            with tm.part("forward_ns"):
                g = grads_of(params, x, y)
            with tm.part("optimizer_ns"):
                params = {k: v - 0.05 * g[k] for k, v in params.items()}
            end_step()
    elif ns.style == "buckets":
        enc = nn.TransformerEncoderLayer(128, 4, 512, dropout=0.0, batch_first=True)
        head = nn.Linear(128, 10)
        params = [*enc.parameters(), *head.parameters()]
        opt = torch.optim.AdamW(params, lr=1e-3)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-3, total_steps=ns.steps)
        lengths = torch.tensor([16, 32, 64])
        for _ in range(ns.steps):
            tm.new_step()
            t = int(lengths[torch.randint(0, 3, ())])
            extra["tokens"].append(t)
            with tm.part("wait_ns"):
                x = torch.randn(ns.batch_size, t, 128)
                y = torch.randint(0, 10, (ns.batch_size,))
            with tm.part("forward_ns"):
                loss = F.cross_entropy(head(enc(x).mean(1)), y)
            opt.zero_grad(set_to_none=True)
            with tm.part("backward_ns"):
                loss.backward()
            with tm.part("clip_ns"):
                nn.utils.clip_grad_norm_(params, 1.0)
            with tm.part("optimizer_ns"):
                opt.step()
            sched.step()
            end_step()
    else:
        model: nn.Module = Checkpointed(256, 6) if ns.style == "ckpt" else mlp()
        opt = (torch.optim.Adam if ns.style == "ckpt" else torch.optim.AdamW)(
            model.parameters(), lr=1e-3)
        micro = extra["micro"]
        if ns.style == "valstop":
            gen = torch.Generator().manual_seed(1)
            xs = torch.randn(64 * 64, 64, generator=gen)
            ys = (xs[:, :10] @ torch.randn(10, 10, generator=gen)).argmax(1)
            ys[:-512][torch.rand(len(ys) - 512, generator=gen) < 0.5] = 0  # noisy: it overfits
            train = DataLoader(TensorDataset(xs[:-512], ys[:-512]), batch_size=ns.batch_size,
                               shuffle=True, generator=gen)
            val = DataLoader(TensorDataset(xs[-512:], ys[-512:]), batch_size=128)
            data: Iterator[tuple[torch.Tensor, torch.Tensor]] = (
                b for _ in iter(int, 1) for b in train)  # epoch after epoch
        else:
            data = batches(ns.batch_size)
        best, bad = float("inf"), 0
        for i in range(ns.steps):
            tm.new_step()
            for _ in range(micro):
                with tm.part("wait_ns"):
                    x, y = next(data)
                with tm.part("forward_ns"), torch.autocast(
                        "cpu", dtype=torch.bfloat16, enabled=ns.style == "bf16"):
                    loss = F.cross_entropy(model(x), y) / micro
                with tm.part("backward_ns"):
                    loss.backward()
            with tm.part("optimizer_ns"):
                opt.step()
            opt.zero_grad(set_to_none=True)
            if ns.style == "valstop" and i % 5 == 4:
                extra["eval_steps"].append(i)

                def validate() -> float:
                    model.eval()
                    with torch.inference_mode():
                        total = sum(float(F.cross_entropy(model(vx), vy, reduction="sum"))
                                    for vx, vy in val)
                    model.train()
                    return total / 512

                with tm.part("eval_ns"):
                    v = validate()
                best, bad = (v, 0) if v < best - 1e-3 else (best, bad + 1)
                if bad == 2:
                    extra["stopped_at"] = i
                    end_step()
                    break
            end_step()
    say_truth(step_ns=wall, cpu_ns=cpu, **tm.parts, **extra)


if __name__ == "__main__":
    main()
