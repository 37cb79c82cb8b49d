"""The loop of lbfgs_closure_cpu.pt.trace.json.gz: full-batch L-BFGS, whose step evaluates its
closure (forward and backward over the same 256 samples) several times. Recorded with
`perfswarm record --steps 2:3 -c torch -- python lbfgs_closure.py` (torch 2.13 CPU)."""

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
x = torch.randn(256, 24)
y = x[:, :4].sum(1, keepdim=True).sin()
net = nn.Sequential(nn.Linear(24, 32), nn.Tanh(), nn.Linear(32, 1))
opt = torch.optim.LBFGS(net.parameters(), max_iter=3)
evaluations = []


def closure() -> torch.Tensor:
    evaluations[-1] += 1
    opt.zero_grad()
    loss = nn.functional.mse_loss(net(x), y)
    loss.backward()
    return loss


for _ in range(8):
    evaluations.append(0)
    opt.step(closure)
print("closure evaluations a step:", evaluations)
