"""The loop of jit_block_cpu.pt.trace.json.gz: a torch.jit.script'ed block (linear 64 -> 64,
GELU, linear 64 -> 64) and a linear head trained by SGD, batch 16, 3 profiled steps after 5
warm-up steps, the profiler's own warm-up the fifth. TorchScript's profiling executor runs the
block as a differentiable graph from its third call: its ops inside `<forward op>`, one
DifferentiableGraphBackward node for them, which no fwdbwd flow links to an op of theirs.
Written with `python jit_block.py OUT.json`
(torch 2.13 CPU)."""

import sys

import torch
import torch.nn.functional as F
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(64, 64), nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(F.gelu(self.a(x)))


block, head = torch.jit.script(Block()), nn.Linear(64, 10)
opt = torch.optim.SGD([*block.parameters(), *head.parameters()], lr=0.01)
x, y = torch.randn(16, 64), torch.randint(0, 10, (16,))


def step() -> None:
    opt.zero_grad()
    F.cross_entropy(head(block(x)), y).backward()
    opt.step()


for _ in range(4):  # warm-up, outside the window
    step()
with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True,
        schedule=torch.profiler.schedule(wait=0, warmup=1, active=3),
        on_trace_ready=lambda p: p.export_chrome_trace(sys.argv[1])) as prof:
    for _ in range(4):
        step()
        prof.step()
