"""Hogwild (tests/data/hogwild_cpu_rank{1,2}.pt.trace.json.gz): 2 torch.multiprocessing processes
(fork) train one shared-memory MLP, each its own SGD, 8 steps; the second runs batches of 192, the
first of 64, so it computes about 3x as long. No process group: neither waits for the other.
Recorded with `perfswarm record -c torch --no-et --steps 2:3 -- python hogwild_cpu.py`."""
import torch
import torch.multiprocessing as mp


def train(proc: int, model: torch.nn.Module) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(proc)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batch = 64 * (1 + 2 * proc)
    for _ in range(8):
        x, y = torch.randn(batch, 256), torch.randint(0, 10, (batch,))
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()


if __name__ == "__main__":
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 10))
    model.share_memory()
    procs = [mp.Process(target=train, args=(p, model)) for p in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
