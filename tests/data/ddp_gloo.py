"""Writes ddp_gloo_rank{0,1}.pt.trace.json.gz: DDP on gloo, two CPU ranks (torchrun
--nproc_per_node 2 ddp_gloo.py), three profiled steps. Rank 1 computes about 6 ms more
before its backward in every step, so rank 0 waits for it in each all-reduce."""
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from trace_gz import gzip_trace

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
with torch.profiler.profile(schedule=torch.profiler.schedule(wait=0, warmup=1, active=3, repeat=1),
                            on_trace_ready=lambda p: p.export_chrome_trace(out)) as prof:
    for _ in range(4):
        step()
        prof.step()
gzip_trace(out)
dist.destroy_process_group()
