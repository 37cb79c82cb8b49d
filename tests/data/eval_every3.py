"""The loop of eval_every3_cpu.pt.trace.json.gz: an MLP stepped by SGD 12 times, an evaluation
forward under no_grad after every third step, profiled with no schedule (no ProfilerStep
markers: the steps are to be detected). Its op sequence repeats every three steps; the steps
are one optimizer call each. Written with `python eval_every3.py OUT.json` (torch 2.13 CPU)."""

import sys

import torch
import torch.nn.functional as F
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
net = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
opt = torch.optim.SGD(net.parameters(), lr=0.01)
x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))


def step() -> None:
    opt.zero_grad()
    F.cross_entropy(net(x), y).backward()
    opt.step()


step()  # warm-up, outside the window
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
    for i in range(12):
        step()
        if i % 3 == 2:
            with torch.no_grad():
                net(x).argmax(1)
prof.export_chrome_trace(sys.argv[1])
