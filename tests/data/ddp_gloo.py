"""Writes ddp_gloo_rank{0,1}.pt.trace.json.gz: DDP on gloo, two CPU ranks (torchrun
--nproc_per_node 2 ddp_gloo.py), three profiled steps. Rank 1 computes about 6 ms more
before its backward in every step, so rank 0 waits for it in each all-reduce."""
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
    t0 = time.perf_counter()
    loss = nn.functional.cross_entropy(model(x), y)
    if rank == 1:
        a = torch.randn(256, 256)
        while time.perf_counter() - t0 < 0.006:
            a = torch.tanh(a @ a)
    opt.zero_grad()
    loss.backward()
    opt.step()


for _ in range(3):
    step()
out = f"ddp_gloo_rank{rank}.pt.trace.json"
profile_steps(step, out)
dist.destroy_process_group()
