"""Writes p2p_gloo_rank{0,1}.pt.trace.json.gz: a two-stage pipeline's hand-off on gloo, two CPU
ranks (torchrun --nproc_per_node 2 p2p_gloo.py), three profiled steps. Rank 0 computes about
6 ms, then sends its activation [16, 256] to rank 1 (dist.send), which posted its receive at
the start of its step and so waits for it, then computes about 2 ms on it. p2p_gloo_variants.py
derives two variants of these traces (a receiver busy at a completion, a rank profiled late)."""
import time

import torch
import torch.distributed as dist
from trace_gz import profile_steps

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
torch.set_num_threads(1)
w = torch.randn(256, 256) / 16


def compute(x: torch.Tensor, seconds: float) -> torch.Tensor:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        x = torch.tanh(x @ w)
    return x


def step() -> None:
    x = torch.empty(16, 256)
    if rank == 0:
        dist.send(compute(torch.randn(16, 256), 0.006), 1)
    else:
        dist.recv(x, 0)
        compute(x, 0.002)


for _ in range(3):
    step()
out = f"p2p_gloo_rank{rank}.pt.trace.json"
profile_steps(step, out, record_shapes=True)
dist.destroy_process_group()
