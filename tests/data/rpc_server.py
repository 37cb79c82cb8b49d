"""torch.distributed.rpc on the CPU: a trainer (the first process) calls a remote forward on a
server (the second) holding the first layer, through an RRef, distributed autograd and a
DistributedOptimizer, 10 steps. The server runs each request on a thread of its RPC pool, the
threads taking them in turn, each idle between its own. Recorded with
`perfswarm record -c torch --no-et --steps 2:5 -- python rpc_server.py`."""
import os

import torch
import torch.distributed.autograd as dist_autograd
import torch.multiprocessing as mp
from torch.distributed import rpc
from torch.distributed.optim import DistributedOptimizer


class Remote(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l = torch.nn.Linear(256, 512)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.l(x))


def parameters(rref: rpc.RRef) -> list[rpc.RRef]:
    return [rpc.RRef(p) for p in rref.local_value().parameters()]


def run(rank: int) -> None:
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ.setdefault("MASTER_PORT", "29531")
    rpc.init_rpc(f"w{rank}", rank=rank, world_size=2)
    if rank == 0:
        remote = rpc.remote("w1", Remote)
        head = torch.nn.Linear(512, 10)
        params = [rpc.RRef(p) for p in head.parameters()] + rpc.rpc_sync(
            "w1", parameters, args=(remote,))
        opt = DistributedOptimizer(torch.optim.SGD, params, lr=0.01)
        for _ in range(10):
            x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
            with dist_autograd.context() as ctx:
                h = remote.rpc_sync().forward(x)
                loss = torch.nn.functional.cross_entropy(head(h), y)
                dist_autograd.backward(ctx, [loss])
                opt.step(ctx)
    rpc.shutdown()


if __name__ == "__main__":
    mp.spawn(run, nprocs=2)
