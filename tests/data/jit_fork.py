"""Writes jit_fork_cpu.pt.trace.json.gz: TorchScript's inter-op parallelism, a scripted model
whose `forward` forks a wide branch (torch.jit.fork) onto an inter-op thread, runs a narrow one
itself and waits for the wide one (torch.jit.wait) before a linear head; trained by SGD, batch
64, one intra-op and two inter-op threads, 3 profiled steps after a warm-up. The main thread
waits at the wait: torch records its scripted `forward` as one op, the fork's work inside
`<forked function>` on an inter-op thread, and the interpreter, suspended at the wait,
continues the function (the head) on an inter-op thread; the wait itself is not traced.
Written with `python jit_fork.py OUT.json` (torch 2.13 CPU)."""

import sys

import torch
from torch import nn
from trace_gz import profile_steps

torch.manual_seed(0)
torch.set_num_threads(1)
torch.set_num_interop_threads(2)


class TwoBranch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wide = nn.Sequential(nn.Linear(128, 2048), nn.ReLU(), nn.Linear(2048, 128))
        self.narrow = nn.Sequential(nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 128))
        self.head = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fut = torch.jit.fork(self.wide, x)
        y = self.narrow(x)
        return self.head(torch.jit.wait(fut) + y)


model = torch.jit.script(TwoBranch())
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x, y = torch.randn(64, 128), torch.randint(0, 10, (64,))


def step() -> None:
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()


for _ in range(3):  # the profiling executor optimizes the graph at its second call
    step()
profile_steps(step, sys.argv[1])
