"""Makes mlp_adam_cpu_snapshot.pickle.gz and mlp_adam_cpu_snapshot_memory.raw.json.gz (run by
hand with torch installed; no test runs it): one CPU recording of an MLP trained with Adam for 3
steps, written as torch.profiler's memory timeline and as a snapshot by torch's own
torch.cuda._memory_viz._profile_to_snapshot. torch's converter gives its entries no time_us;
each gets the time of the profiler action it came from, in the converter's order."""

import gzip
import pickle

import torch
from torch.cuda import _memory_viz
from torch.profiler import ProfilerActivity, profile
from torch.profiler._memory_profiler import Action, TensorKey

ENTRIES = {Action.CREATE: 1, Action.DESTROY: 2, Action.INCREMENT_VERSION: 3,
           Action.PREEXISTING: 0}  # trace entries _profile_to_snapshot writes per action

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
opt = torch.optim.Adam(model.parameters())
x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
             with_stack=True) as prof:
    for _ in range(3):
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
prof.export_memory_timeline("mlp_adam_cpu_snapshot_memory.raw.json.gz", device="cpu")
snapshot = _memory_viz._profile_to_snapshot(prof)
times = [t for t, action, (key, _), _ in prof._memory_profile().timeline
         if isinstance(key, TensorKey) for _ in range(ENTRIES[action])]
trace = snapshot["device_traces"][-1]
assert len(trace) == len(times)
first = min(t for t in times if t >= 0)
for entry, t in zip(trace, times, strict=True):
    entry["time_us"] = max(t, first) // 1000
with gzip.open("mlp_adam_cpu_snapshot.pickle.gz", "wb") as f:
    pickle.dump(snapshot, f)
