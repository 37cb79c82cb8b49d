"""The loop of stacked_blocks_cpu.pt.trace.json.gz: three residual MLP blocks of width 16, each
expanding to 48 and back, so that the first layer's weight shape [48, 16] is each block's:
batches of 8, Adam. Recorded with `perfswarm record --steps 2:3 -c torch -- python
stacked_blocks.py` (torch 2.13 CPU)."""

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(16, 48), nn.Linear(48, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


net = nn.Sequential(Block(), Block(), Block(), nn.Linear(16, 4))
opt = torch.optim.Adam(net.parameters(), lr=1e-3)
for _ in range(8):
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    opt.zero_grad()
    nn.functional.cross_entropy(net(x), y).backward()
    opt.step()
