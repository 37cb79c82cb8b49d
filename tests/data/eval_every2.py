"""The loop of eval_every2_cpu.pt.trace.json.gz: an MLP stepped by one Adam 12 times, an
evaluation forward under no_grad after every second step, profiled with record_shapes and no
schedule (no ProfilerStep markers: the steps are to be detected). The optimizer calls come in
twos of unequal stretches, as a GAN's two optimizers' do, but each call updates the same
parameters. Written with `python eval_every2.py OUT.json` (torch 2.13 CPU); each step's end
(time.perf_counter_ns, after its optimizer call) goes to stdout."""

import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
net = nn.Sequential(nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))
opt = torch.optim.Adam(net.parameters(), lr=1e-3)
x, y = torch.randn(32, 128), torch.randint(0, 10, (32,))


def step() -> None:
    opt.zero_grad()
    F.cross_entropy(net(x), y).backward()
    opt.step()


step()  # warm-up, outside the window
ends = []
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                            record_shapes=True) as prof:
    for i in range(12):
        step()
        ends.append(time.perf_counter_ns())
        if i % 2 == 1:
            with torch.no_grad():
                net(x).argmax(1)
prof.export_chrome_trace(sys.argv[1])
print(*ends)
