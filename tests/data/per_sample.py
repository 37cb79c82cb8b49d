"""The loop of per_sample_cpu.pt.trace.json.gz: a contrastive step whose two augmented views
are made on the main thread one sample at a time (crop, flip, jitter, blur, noise), as SimCLR
scripts often do, before a small CNN. Written by torch.profiler (record_shapes, three active
steps) with `python per_sample.py OUT.json` (torch 2.13 CPU)."""

import sys

import torch
import torch.nn.functional as F
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
BATCH = 16
data = torch.rand(256, 3, 20, 20)


def augment(x: torch.Tensor) -> torch.Tensor:
    out = []
    for img in x:
        i, j = torch.randint(0, 5, (2,)).tolist()
        v = img[:, i:i + 16, j:j + 16]
        if torch.rand(()) < 0.5:
            v = v.flip(-1)
        v = v * (0.6 + 0.8 * torch.rand(3, 1, 1)) + 0.1 * torch.randn(3, 1, 1)
        v = F.avg_pool2d(F.pad(v[None], (1, 1, 1, 1), mode="reflect"), 3, 1)[0]
        out.append((v + 0.05 * torch.randn_like(v)).clamp(0, 1))
    return torch.stack(out)


net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                    nn.Flatten(), nn.Linear(8, 16))
opt = torch.optim.SGD(net.parameters(), lr=0.1)
schedule = torch.profiler.schedule(wait=1, warmup=1, active=3, repeat=1)
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                            record_shapes=True, schedule=schedule) as prof:
    for _ in range(5):
        x = data[torch.randint(0, len(data), (BATCH,))]
        z1, z2 = net(augment(x)), net(augment(x))
        loss = -F.cosine_similarity(z1, z2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        prof.step()
prof.export_chrome_trace(sys.argv[1])
