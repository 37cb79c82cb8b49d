"""The loop of func_grad_cpu.pt.trace.json.gz: training through torch.func, grad of the loss
over a dict of parameters (functional_call), a hand-written SGD update, no .backward() and no
torch.optim; batches of 16. Recorded with `perfswarm record --steps 2:3 -c torch -- python
func_grad.py` (torch 2.13 CPU)."""

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad

torch.manual_seed(0)
torch.set_num_threads(1)
net = nn.Sequential(nn.Linear(24, 32), nn.Tanh(), nn.Linear(32, 4))
params = {k: v.detach() for k, v in net.named_parameters()}


def loss_fn(ps: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(functional_call(net, ps, (x,)), y)


for _ in range(8):
    x, y = torch.randn(16, 24), torch.randint(0, 4, (16,))
    g = grad(loss_fn)(params, x, y)
    params = {k: v - 0.1 * g[k] for k, v in params.items()}
