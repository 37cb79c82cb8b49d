"""A small CNN trained under torch.compile (inductor, CPU), batch 6 of 3x16x16 images, 5 steps,
the last two profiled with shapes: tests/data/compiled_cnn.json.gz was written by
`python tests/data/compiled_cnn.py tests/data/compiled_cnn.json` (then gzip -9). The compiled
forward's inputs are the convolutions' and the linear's parameters and the image batch."""
import sys

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1),
                      nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
compiled = torch.compile(model)
x, y = torch.randn(6, 3, 16, 16), torch.randint(0, 4, (6,))
with torch.profiler.profile(
        record_shapes=True, schedule=torch.profiler.schedule(wait=0, warmup=3, active=2, repeat=1),
        on_trace_ready=lambda p: p.export_chrome_trace(sys.argv[1])) as prof:
    for _ in range(5):
        loss = nn.functional.cross_entropy(compiled(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        prof.step()
