"""The loop recorded into busy_inproc.pt.trace.json.gz and busy_inproc_host.json, run by hand on
the 2-core VM (torch 2.13, CPU), no test runs it (/tmp/p32/epochlabel/busy.sh recorded it,
`perfswarm record -q -c torch -- python busy_inproc.py 60`, beside two busy-looping Python
processes, each in a session of its own; fixture.py made the files: the main process's trace,
its steps outside the window and the recorder's hook run delay readings).

busy_inproc.py [STEPS] [workers]: a loop loading its batches in the training process (or with W
workers): a Dataset whose __getitem__ costs 0.5 ms of busy Python a sample, batches of 8, a
small MLP; one intra-op thread. Own clock: median step (ms) printed at exit."""
import itertools
import statistics
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 40
W = int(sys.argv[2]) if len(sys.argv) > 2 else 0


class Busy(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __len__(self) -> int:
        return 8 * STEPS

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        end = time.perf_counter() + 0.0005
        while time.perf_counter() < end:
            pass
        x = torch.full((64,), float(i))
        return x, x.sum().reshape(1)


torch.manual_seed(0)
torch.set_num_threads(1)
net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1))
opt = torch.optim.SGD(net.parameters(), lr=0.01)
ends = [time.perf_counter()]
for x, y in DataLoader(Busy(), batch_size=8, num_workers=W, persistent_workers=W > 0):
    for _ in range(4):
        opt.zero_grad()
        nn.functional.mse_loss(net(x), y).backward()
    opt.step()
    ends.append(time.perf_counter())
steps = [b - a for a, b in itertools.pairwise(ends)][5:]
print(f"median step {1e3 * statistics.median(steps):.2f} ms (workers {W})")
