"""The loop recorded into busy_compiled.pt.trace.json.gz and busy_compiled_host.json, run by hand
on the 2-core VM (torch 2.13, CPU), no test runs it (/tmp/p30/styles/compiled.py, its own clock
left out; /tmp/p31/busyworker/rec.sh and fixture.py made the files):

    perfswarm record -q -o busy.run -- python busy_compiled.py   # defaults: the system sampler too

while two busy-looping Python processes, each in a session of its own, ran beside it: the
sampler saw the host's 2 cores busy, the loop keep its one (its steps hardly held back), the
others the other. A torch.compile'd MLP (inductor), AdamW, a shuffled TensorDataset loaded in
the training process (64-row batches, a last one of 16 that compiles again), 2 epochs. Timed
apart (/tmp/p31/busyworker/ab.py, interleaved, the host's other processes holding ~1 of its 2
cores): 5.5-5.9 ms a step with no worker, 6.9-8.0 with `num_workers=1`."""

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
torch.set_num_threads(1)
n = 20 * 64 + 16  # 20 full batches and a last one of 16 rows
xs = torch.randn(n, 128)
ys = (xs[:, :8] @ torch.randn(8, 10)).argmax(1)
loader = DataLoader(TensorDataset(xs, ys), batch_size=64, shuffle=True)
model = nn.Sequential(nn.Linear(128, 512), nn.GELU(), nn.LayerNorm(512), nn.Linear(512, 512),
                      nn.GELU(), nn.Linear(512, 10))
cmodel = torch.compile(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for _ in range(2):
    for x, y in loader:
        opt.zero_grad()
        F.cross_entropy(cmodel(x), y).backward()
        opt.step()
