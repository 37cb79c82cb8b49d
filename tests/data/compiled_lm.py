"""A token model trained under torch.compile (inductor, CPU), batch 8 of 16 tokens, 5 steps,
the last two profiled with shapes: tests/data/compiled_lm.json.gz was written by
`python tests/data/compiled_lm.py tests/data/compiled_lm.json` (then gzip -9). Inside the
compiled graph the embedding leaves no op and the products run on [8 x 16, 32]."""
import sys

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Embedding(64, 32), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 64))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
compiled = torch.compile(model)
x, y = torch.randint(0, 64, (8, 16)), torch.randint(0, 64, (8, 16))
with torch.profiler.profile(
        record_shapes=True, schedule=torch.profiler.schedule(wait=0, warmup=3, active=2, repeat=1),
        on_trace_ready=lambda p: p.export_chrome_trace(sys.argv[1])) as prof:
    for _ in range(5):
        loss = nn.functional.cross_entropy(compiled(x).reshape(-1, 64), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        prof.step()
