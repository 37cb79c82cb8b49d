"""The loop of pointwise_conv_b{8,16}_cpu.pt.trace.json.gz: a 3x3 convolution, a 1x1 one and a
1-D 1x1 one (nn.Conv1d over the image's 256 pixels) stepped by SGD on one intra-op thread, at
batch 8 (ATen runs both 1x1 ones in its own code, _slow_conv2d_forward and _backward) and 16
(oneDNN: mkldnn_convolution and convolution_backward). Written by torch.profiler
(record_shapes, three active steps) with `python pointwise_conv.py BATCH OUT.json` (torch 2.13
CPU)."""

import sys

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
batch = int(sys.argv[1])
image = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 1), nn.ReLU(),
                      nn.Flatten(2))
pixels = nn.Conv1d(32, 8, 1)
params = [*image.parameters(), *pixels.parameters()]
opt = torch.optim.SGD(params, lr=0.01)
x = torch.randn(batch, 3, 16, 16)
schedule = torch.profiler.schedule(wait=1, warmup=1, active=3, repeat=1)
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                            record_shapes=True, schedule=schedule) as prof:
    for _ in range(5):
        loss = pixels(image(x)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        prof.step()
prof.export_chrome_trace(sys.argv[2])
