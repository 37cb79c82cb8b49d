"""Writes annotated_wait_rank{0,1}.pt.trace.json.gz: two CPU ranks on gloo (spawned here),
five profiled steps. Each step issues an asynchronous all-gather of 2-6 M floats a rank (more
in some steps than others) and waits for it inside a record_function range that holds nothing
but the wait (as FSDP2's all-gather does): the loop's thread sits there until gloo's thread
has copied the shards in."""
import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from trace_gz import gzip_trace


def run(rank: int, store: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    torch.manual_seed(rank)
    torch.set_num_threads(1)
    x, w = torch.randn(64, 128), torch.randn(128, 128)
    shards = [torch.randn(n << 20) for n in (2, 4, 6)]
    gathered = [torch.empty(2 * len(s)) for s in shards]

    def step(i: int) -> None:
        work = dist.all_gather_into_tensor(gathered[i % 3], shards[i % 3], async_op=True)
        y = torch.relu(x @ w)
        with torch.profiler.record_function("wait_for_gather"):
            work.wait()
        y.sum().item()

    for i in range(3):
        step(i)
    out = f"annotated_wait_rank{rank}.pt.trace.json"
    with torch.profiler.profile(
            schedule=torch.profiler.schedule(wait=0, warmup=1, active=5, repeat=1),
            on_trace_ready=lambda p: p.export_chrome_trace(out)) as prof:
        for i in range(6):
            step(i)
            prof.step()
    gzip_trace(out)
    dist.destroy_process_group()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(run, args=(os.path.join(tmp, "store"),), nprocs=2)
