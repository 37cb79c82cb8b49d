"""Per-sample gradients with torch.func (vmap over grad) of a small MLP, 4 steps of a batch of
128, the last two profiled with shapes: tests/data/vmap_grads.json.gz was written by
`python tests/data/vmap_grads.py tests/data/vmap_grads.json` (then gzip -9)."""
import sys

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
params = {k: v.detach() for k, v in model.named_parameters()}


def loss(p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = functional_call(model, p, (x.unsqueeze(0),))
    return nn.functional.cross_entropy(out, y.unsqueeze(0))


per_sample = vmap(grad(loss), in_dims=(None, 0, 0))
x, y = torch.randn(128, 64), torch.randint(0, 10, (128,))
with torch.profiler.profile(
        record_shapes=True, schedule=torch.profiler.schedule(wait=0, warmup=2, active=2, repeat=1),
        on_trace_ready=lambda p: p.export_chrome_trace(sys.argv[1])) as prof:
    for _ in range(4):
        grads = per_sample(params, x, y)
        with torch.no_grad():
            params = {k: v - 0.01 * grads[k].mean(0) for k, v in params.items()}
        prof.step()
