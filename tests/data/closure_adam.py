"""The loop of closure_adam_cpu.pt.trace.json.gz: Adam stepped with a closure that runs the
forward and the backward inside optimizer.step() (as LBFGS and Lightning's loop do). Recorded
with `perfswarm record --steps 2:3 -- python closure_adam.py` (torch 2.13 CPU)."""

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                    nn.Flatten(), nn.Linear(8, 10))
opt = torch.optim.Adam(net.parameters(), lr=1e-3)
x, y = torch.randn(16, 3, 16, 16), torch.randint(0, 10, (16,))


def closure() -> torch.Tensor:
    opt.zero_grad()
    loss = nn.functional.cross_entropy(net(x), y)
    loss.backward()
    return loss


for _ in range(8):
    opt.step(closure)
