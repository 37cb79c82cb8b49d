"""nanoGPT's training iteration as its train.py runs it on a CPU, on its unmodified model.py: for
paired_batch.py, which alternates two configurations' iterations.

    python benchmarks/nanogpt_step.py DIR [--batch-size 12] [--width 128] [--steps 14]

No figures of its own. `NanoGPT(folder, batch, width)` imports model.py from `folder`
(realworld.py's `nanogpt_dir`: nanoGPT's files linked unmodified, its offline data made beside
them), builds the model as train.py does at realworld.py's predict configuration
(config/train_shakespeare_char.py with `--device=cpu --compile=False --block_size=64 --n_layer=2
--n_head=4 --dropout=0.0`, the batch and `--n_embd` given) and `step()` runs one pass of
train.py's loop body: the learning rate set on each group, the forward with its loss, the loss
over gradient_accumulation_steps (1), the next batch fetched (`get_batch`: np.memmap, randint,
stack), backward, clip_grad_norm_ at grad_clip 1.0, the AdamW step as `configure_optimizers`
makes it (weight decay 0.1 on 2-D parameters, betas (0.9, 0.99), not fused on a CPU),
zero_grad(set_to_none=True) and the log line's `loss.item()` and MFU estimate.
train.py's GradScaler (float16 is its default dtype without CUDA) disables itself without CUDA, so
its calls are the optimizer's own; the evaluation (iteration 0 alone at eval_interval 1000) is left
out, as are the printing and the checkpoints. Run as a script, it steps one configuration
(one intra-op thread) and prints, as benchmarks/realworld_models.py does, one JSON line after
`truth `: each step's wall time (`step_ns`) and process CPU time (`cpu_ns`).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import pickle
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

# config/train_shakespeare_char.py over train.py's defaults, and realworld.py's flags
BLOCK, LAYERS, HEADS = 64, 2, 4
LEARNING_RATE, MIN_LR, WARMUP, DECAY_ITERS = 1e-3, 1e-4, 100, 5000
WEIGHT_DECAY, BETAS, GRAD_CLIP = 0.1, (0.9, 0.99), 1.0


class NanoGPT:
    """One configuration's model, optimizer and batches, stepped as train.py's loop steps them."""

    def __init__(self, folder: Path, batch: int, width: int) -> None:
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
        from model import GPT, GPTConfig  # nanoGPT's model.py, unmodified

        self.data = folder / "data" / "shakespeare_char"
        with open(self.data / "meta.pkl", "rb") as f:
            vocab = pickle.load(f)["vocab_size"]
        self.batch = batch
        torch.manual_seed(1337)
        with contextlib.redirect_stdout(io.StringIO()):  # its parameter counts
            self.model: Any = GPT(GPTConfig(n_layer=LAYERS, n_head=HEADS, n_embd=width,
                                            block_size=BLOCK, bias=False, vocab_size=vocab,
                                            dropout=0.0))
            self.optimizer = self.model.configure_optimizers(WEIGHT_DECAY, LEARNING_RATE, BETAS,
                                                             "cpu")
        self.iteration = 0
        self.x, self.y = self.get_batch()  # train.py fetches the first batch before its loop

    def get_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """train.py's `get_batch('train')` on a CPU."""
        data = np.memmap(self.data / "train.bin", dtype=np.uint16, mode="r")
        ix = torch.randint(len(data) - BLOCK, (self.batch,))
        x = torch.stack([torch.from_numpy((data[i:i + BLOCK]).astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy((data[i + 1:i + 1 + BLOCK]).astype(np.int64))
                         for i in ix])
        return x.to("cpu"), y.to("cpu")

    def learning_rate(self) -> float:
        """train.py's `get_lr`: linear warm-up, then cosine decay."""
        it = self.iteration
        if it < WARMUP:
            return LEARNING_RATE * (it + 1) / (WARMUP + 1)
        if it > DECAY_ITERS:
            return MIN_LR
        ratio = (it - WARMUP) / (DECAY_ITERS - WARMUP)
        return MIN_LR + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (LEARNING_RATE - MIN_LR)

    def step(self) -> None:
        """One iteration of train.py's loop."""
        lr = self.learning_rate()
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        _logits, loss = self.model(self.x, self.y)
        loss = loss / 1  # over gradient_accumulation_steps
        self.x, self.y = self.get_batch()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), GRAD_CLIP)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        loss.item()  # the log line's loss, every iteration at log_interval 1
        if self.iteration >= 5:
            self.model.estimate_mfu(self.batch, 0.01)
        self.iteration += 1


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path, help="nanoGPT's model.py and its data (realworld.py's "
                   "nanogpt_dir)")
    p.add_argument("--batch-size", type=int, default=12)
    p.add_argument("--width", type=int, default=128, help="n_embd")
    p.add_argument("--steps", type=int, default=14)
    ns = p.parse_args()
    if not (ns.folder / "model.py").is_file():
        p.error(f"{ns.folder}: no nanoGPT model.py there")
    torch.set_num_threads(1)
    model = NanoGPT(ns.folder, ns.batch_size, ns.width)
    wall, cpu = [], []
    for _ in range(ns.steps):
        start = time.perf_counter_ns(), time.process_time_ns()
        model.step()
        wall.append(time.perf_counter_ns() - start[0])
        cpu.append(time.process_time_ns() - start[1])
    print("truth " + json.dumps({"step_ns": wall, "cpu_ns": cpu}))


if __name__ == "__main__":
    main()
