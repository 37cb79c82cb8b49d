"""The loop recorded into loader_workers_main.pt.trace.json.gz (its main process) and
loader_workers_worker.pt.trace.json.gz (its DataLoader worker), run by hand, no test runs it:

    perfswarm record -q -o w.run --steps 3:4 -c torch --no-et -- python loader_workers.py
    gzip -9c w.run/raw/torch-rank0-pid<main>.pt.trace.json > loader_workers_main.pt.trace.json.gz
    gzip -9c w.run/raw/torch-rank0-pid<worker>.pt.trace.json \
        > loader_workers_worker.pt.trace.json.gz

(torch 2.13, CPU, the real torch.profiler: the recorder profiles the worker from the first
batch it fetches while the main process's window is open, each fetch a `DataLoader worker
fetch` span.) One worker is slower than the step: each sample sleeps 1 ms (a file read,
decoding off the GIL) and is made by a few torch ops, so the main thread waits in
next(loader) for the worker every step."""

import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Sleepy(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __len__(self) -> int:
        return 16 * 12

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(0.001)
        x = torch.full((32,), float(i)).sin()
        return x, x.sum().reshape(1)


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    for x, y in DataLoader(Sleepy(), batch_size=16, num_workers=1):
        opt.zero_grad()
        nn.functional.mse_loss(net(x), y).backward()
        opt.step()


if __name__ == "__main__":
    main()
