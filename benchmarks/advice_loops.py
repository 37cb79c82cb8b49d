"""Loops for checking advice against the change it suggests, each in its slow and its mended
form, timing itself.

    python benchmarks/advice_loops.py CASE [--mended] [--steps N] [--file PATH]

CASE: `augment` (two views of a batch of 64 augmented on the main thread one sample at a
time: crop, flip, jitter, pad and blur, noise, as SimCLR scripts do; mended: the same math on
the whole batch, gathers for the crops), `reads` (each step reads its batch with 96 random
16 KiB O_DIRECT reads of `--file`, no page cache between it and the disk, then trains an MLP;
mended: a thread reads the next batch while the step computes), `threads` (two DDP ranks on
gloo started by torch.multiprocessing.spawn, no RANK, each with torch's default of one
intra-op thread per core; mended: one thread each). No perfswarm import: benchmarks/
advice_ab.py records the slow form unmodified. Prints one JSON line, `truth ` first: the
median step after a warm-up of 5 (rank 0's for `threads`).
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import statistics
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

BLOCK = 16 << 10
READS = 96


def _median(steps: list[float]) -> float:
    return statistics.median(steps[5:]) if len(steps) > 5 else statistics.median(steps)


def _augment(x: torch.Tensor) -> torch.Tensor:
    out = []
    for img in x:
        i, j = torch.randint(0, 9, (2,)).tolist()
        v = img[:, i:i + 32, j:j + 32]
        if torch.rand(()) < 0.5:
            v = v.flip(-1)
        v = v * (0.6 + 0.8 * torch.rand(3, 1, 1)) + 0.1 * torch.randn(3, 1, 1)
        v = F.avg_pool2d(F.pad(v[None], (1, 1, 1, 1), mode="reflect"), 3, 1)[0]
        out.append((v + 0.05 * torch.randn_like(v)).clamp(0, 1))
    return torch.stack(out)


def _augment_batched(x: torch.Tensor) -> torch.Tensor:
    n = x.shape[0]
    ij = torch.randint(0, 9, (n, 2))
    rows = (ij[:, 0, None] + torch.arange(32))[:, None, :, None].expand(n, 3, 32, 40)
    cols = (ij[:, 1, None] + torch.arange(32))[:, None, None, :].expand(n, 3, 32, 32)
    v = x.gather(2, rows).gather(3, cols)
    v = torch.where((torch.rand(n) < 0.5)[:, None, None, None], v.flip(-1), v)
    v = v * (0.6 + 0.8 * torch.rand(n, 3, 1, 1)) + 0.1 * torch.randn(n, 3, 1, 1)
    v = F.avg_pool2d(F.pad(v, (1, 1, 1, 1), mode="reflect"), 3, 1)
    return (v + 0.05 * torch.randn_like(v)).clamp(0, 1)


def augment(steps: int, mended: bool) -> float:
    torch.manual_seed(0)
    data = torch.rand(1024, 3, 40, 40)
    aug = _augment_batched if mended else _augment
    net = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                        nn.MaxPool2d(2), nn.Conv2d(16, 64, 3, padding=1), nn.BatchNorm2d(64),
                        nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 128),
                        nn.ReLU(), nn.Linear(128, 64))
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        x = data[torch.randint(0, len(data), (64,))]
        z = F.normalize(torch.cat([net(aug(x)), net(aug(x))]), dim=1)
        s = (z @ z.t() / 0.2).fill_diagonal_(float("-inf"))
        loss = F.cross_entropy(s, torch.cat([torch.arange(64, 128), torch.arange(0, 64)]))
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t)
    return _median(times)


def reads(steps: int, mended: bool, path: str) -> float:
    torch.manual_seed(0)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    blocks = os.path.getsize(path) // BLOCK
    rng = np.random.default_rng(0)

    def load() -> torch.Tensor:
        buf = mmap.mmap(-1, BLOCK * READS)  # page-aligned, as O_DIRECT needs
        for i, block in enumerate(rng.integers(0, blocks, READS).tolist()):
            os.preadv(fd, [memoryview(buf)[i * BLOCK:(i + 1) * BLOCK]], block * BLOCK)
        return torch.frombuffer(bytearray(buf), dtype=torch.uint8).view(READS, BLOCK)[
            :, :1024].float() / 255

    net = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                        nn.Linear(1024, 10))
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    pool = ThreadPoolExecutor(1) if mended else None
    ahead: Future[torch.Tensor] | None = pool.submit(load) if pool else None
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        if pool is not None and ahead is not None:
            x, ahead = ahead.result(), pool.submit(load)
        else:
            x = load()
        loss = net(x).logsumexp(1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t)
    return _median(times)


def _rank(rank: int, steps: int, mended: bool, port: int, out: str) -> None:
    import torch.distributed as dist

    if mended:
        torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    torch.manual_seed(0)
    net = nn.parallel.DistributedDataParallel(nn.Sequential(
        nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)))
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    x, y = torch.randn(128, 512), torch.randint(0, 10, (128,))
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        loss = F.cross_entropy(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(_median(times), f)
    dist.destroy_process_group()


def threads(steps: int, mended: bool, port: int) -> float:
    import tempfile

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "median.json")
        mp.spawn(_rank, args=(steps, mended, port, out), nprocs=2)
        with open(out) as f:
            return float(json.load(f))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("case", choices=("augment", "reads", "threads"))
    p.add_argument("--mended", action="store_true")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--file", default="", help="reads: the data file (1 GiB or so)")
    p.add_argument("--port", type=int, default=29611, help="threads: the rendezvous port")
    a = p.parse_args()
    if a.case == "reads" and not a.file:
        p.error("reads needs --file")
    run: dict[str, Callable[[], float]] = {
        "augment": lambda: augment(a.steps, a.mended),
        "reads": lambda: reads(a.steps, a.mended, a.file),
        "threads": lambda: threads(a.steps, a.mended, a.port)}
    print("truth " + json.dumps({"case": a.case, "mended": a.mended,
                                 "median_step_s": run[a.case]()}), flush=True)


if __name__ == "__main__":
    main()
