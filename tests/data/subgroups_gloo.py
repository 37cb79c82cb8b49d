"""Writes subgroups_gloo_rank{0,1,2,3}.pt.trace.json.gz: four CPU ranks on gloo (python
subgroups_gloo.py [OUT_DIR]; spawns them itself), three profiled steps, each an all-reduce in
the world group, one in the rank's subgroup (new_group([0, 1]) or new_group([2, 3])) and one
more in the world group. Every rank runs the same number of all-reduces, so pairing the n-th
gloo:all_reduce of every rank pairs ranks 0 and 1's subgroup all-reduce with ranks 2 and 3's.
Before its subgroup's all-reduce rank 1 sleeps 4 ms and rank 2 sleeps 8 ms: rank 0 waits about
4 ms for rank 1, rank 3 about 8 ms for rank 2. No record_param_comms is recorded for gloo,
and its ranges carry no process group: each group's work runs on its own two
pt_gloo_runloop threads, created with the group (the world's first)."""
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from trace_gz import profile_steps

WORLD = 4
SLEEP = {1: 0.004, 2: 0.008}  # rank -> seconds it sleeps before its subgroup's all-reduce


def run(rank: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    low, high = dist.new_group([0, 1]), dist.new_group([2, 3])
    mine = low if rank < 2 else high
    x = torch.ones(1024)

    def step() -> None:
        dist.all_reduce(x)
        time.sleep(SLEEP.get(rank, 0))
        dist.all_reduce(x, group=mine)
        dist.all_reduce(x)

    for _ in range(2):
        step()
    out = os.path.join(out_dir, f"subgroups_gloo_rank{rank}.pt.trace.json")
    profile_steps(step, out, activities=[torch.profiler.ProfilerActivity.CPU])
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run, args=(sys.argv[1] if len(sys.argv) > 1 else ".",), nprocs=WORLD)
