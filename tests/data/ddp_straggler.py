"""Writes ddp_straggler_rank{0,1}.pt.trace.json.gz: DDP on gloo, two CPU ranks (torchrun
--nproc_per_node 2 ddp_straggler.py), three profiled steps of three micro-batches each, the
first two under no_sync(). Before its last micro-batch rank 1 spins 6 ms in Python (no op: the
trace shows a gap), so rank 0 waits for it in the all-reduce of that micro-batch's backward."""
import contextlib
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from trace_gz import profile_steps

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
torch.set_num_threads(1)
model = DistributedDataParallel(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x, y = torch.randn(16, 64), torch.randint(0, 10, (16,))


def step() -> None:
    for micro in range(3):
        last = micro == 2
        if last and rank == 1:
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < 0.006:
                pass
        with contextlib.nullcontext() if last else model.no_sync():
            nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    opt.zero_grad()


for _ in range(3):
    step()
out = f"ddp_straggler_rank{rank}.pt.trace.json"
profile_steps(step, out)
dist.destroy_process_group()
