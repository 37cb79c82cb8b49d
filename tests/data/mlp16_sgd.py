"""The loop of mlp16_sgd_cpu.pt.trace.json.gz: 16 Linear(64, 64) layers at batch 16 stepped by
SGD with momentum, whose single-tensor updates run one op a parameter (16 biases of 64: as many
calls a step as the batch has samples, none of them a sample's). Written by torch.profiler
(record_shapes, three active steps) with `python mlp16_sgd.py OUT.json` (torch 2.13 CPU)."""

import sys

import torch
import torch.nn.functional as F
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
net = nn.Sequential(*[m for _ in range(16) for m in (nn.Linear(64, 64), nn.ReLU())])
opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
x, y = torch.randn(16, 64), torch.randn(16, 64)
schedule = torch.profiler.schedule(wait=1, warmup=1, active=3, repeat=1)
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                            record_shapes=True, schedule=schedule) as prof:
    for _ in range(5):
        loss = F.mse_loss(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        prof.step()
prof.export_chrome_trace(sys.argv[1])
