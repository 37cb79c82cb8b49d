"""The loop recorded into loader_cpu_w{0,2,4}_*.pt.trace.json.gz, run by hand on the 2-core
VM (torch 2.13, CPU), no test runs it:

    perfswarm record -q -o wN.run -c torch -- python loader_cpu.py N     # N = 0, 2, 4
    gzip -9c wN.run/raw/torch-rank0-pid<pid>.pt.trace.json \
        > loader_cpu_wN_<main|worker1..>.pt.trace.json.gz

Each sample's `__getitem__` runs ~2.5 ms of Python (CPU work, no wait); a batch of 16 takes
~40 ms of it, the step's own work ~5 ms. Timed apart (common.py's Timer around the same loop,
3 interleaved rounds, nice -20): 45-52 ms a step with no worker, 43-46 with 1, 24-31 with 2,
25-32 with 4: on 2 cores the workers and the training process share both, the training
process waiting on the workers' queue while they work."""

import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Expensive(Dataset[tuple[torch.Tensor, int]]):
    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        s = 0
        for k in range(50_000):
            s += k * k % 7
        return torch.full((256,), float(s % 3)), i % 10


def main(workers: int) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                          nn.Linear(1024, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = iter(DataLoader(Expensive(), batch_size=16, num_workers=workers, shuffle=True))
    for _ in range(24):
        x, y = next(batches)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main(int(sys.argv[1]))
