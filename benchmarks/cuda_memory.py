"""What PyTorch's memory tools write on a GPU, for `import --memory-timeline` to be checked on
(run by benchmarks/gpu_check.py on a GPU machine; no test runs it): an MLP trained with Adam
for 3 steps on cuda:0 under torch.profiler (CUDA, shapes, memory, stacks) with the caching
allocator's history on. Writes into OUT: `trace.json` (the Kineto trace), `memory.raw.json.gz`
(torch.profiler's memory timeline of cuda:0), `snapshot.pickle`
(torch.cuda.memory._dump_snapshot) and `truth.json`: what the allocator itself says
(`torch.cuda.max_memory_allocated` and `max_memory_reserved` since the loop began).

    python benchmarks/cuda_memory.py OUT
"""

import argparse
import json
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("out", type=Path, help="folder to write the four files into")
out = parser.parse_args().out
out.mkdir(parents=True, exist_ok=True)
torch.manual_seed(0)
dev = torch.device("cuda:0")
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(),
                            torch.nn.Linear(4096, 1024)).to(dev)
opt = torch.optim.Adam(model.parameters())
x, y = torch.randn(256, 1024, device=dev), torch.randn(256, 1024, device=dev)
torch.cuda.synchronize()
torch.cuda.reset_peak_memory_stats(dev)
torch.cuda.memory._record_memory_history(max_entries=100_000)
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], profile_memory=True,
             record_shapes=True, with_stack=True) as prof:
    for _ in range(3):
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    torch.cuda.synchronize()
truth = {"max_memory_allocated": torch.cuda.max_memory_allocated(dev),
         "max_memory_reserved": torch.cuda.max_memory_reserved(dev),
         "memory_allocated": torch.cuda.memory_allocated(dev),
         "parameter_bytes": sum(p.numel() * p.element_size() for p in model.parameters())}
torch.cuda.memory._dump_snapshot(str(out / "snapshot.pickle"))
torch.cuda.memory._record_memory_history(enabled=None)
prof.export_chrome_trace(str(out / "trace.json"))
prof.export_memory_timeline(str(out / "memory.raw.json.gz"), device="cuda:0")
(out / "truth.json").write_text(json.dumps(truth))
print(json.dumps(truth))
