"""The loop of short_loop_cpu.pt.trace.json.gz: an MLP stepped by SGD 4 times under a profiler
schedule of 10 active steps, `prof.step()` after each step as usual: the loop ends inside the
active steps, and its last `prof.step()` opens a ProfilerStep#5 that holds nothing. Written
with `python short_loop.py OUT.json` (torch 2.13 CPU)."""

import sys

import torch
import torch.nn.functional as F
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
net = nn.Sequential(nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))
opt = torch.optim.SGD(net.parameters(), lr=0.01)
x, y = torch.randn(32, 128), torch.randint(0, 10, (32,))
schedule = torch.profiler.schedule(wait=0, warmup=1, active=10)
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], schedule=schedule,
                            on_trace_ready=lambda p: p.export_chrome_trace(sys.argv[1])) as prof:
    for _ in range(5):
        opt.zero_grad()
        F.cross_entropy(net(x), y).backward()
        opt.step()
        prof.step()
