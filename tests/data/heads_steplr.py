"""Three loops of one optimizer each, profiled with record_shapes and no step markers, 12 steps:
`heads` (one Adam over a shared trunk and two task heads of other shapes, used in turn: each
call updates the trunk and one head), `steplr` (SGD whose StepLR halves its rate every 3
steps: its ops' scalars come in runs of 3) and `frozen` (SGD over the trunk and head A, the
trunk's layer frozen every other step: those calls update head A alone, after a backward of
fewer nodes). Read as told-apart optimizers, the first had been a cycle of two optimizers (6
steps), the second of three twins (4); the third, its backward passes alternating as twin
models' do, 6. `unshaped` records without record_shapes (`frozen unshaped`:
frozen_unshaped_cpu.pt.trace.json.gz, where a call is its class alone: 6 of 12 had been found).

    python tests/data/heads_steplr.py heads|steplr|frozen OUT.pt.trace.json [unshaped]
"""

import sys

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

torch.manual_seed(0)
case, out = sys.argv[1], sys.argv[2]
x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))
lossf = nn.CrossEntropyLoss()
trunk = nn.Sequential(nn.Linear(32, 64), nn.ReLU())
head_a, head_b = nn.Linear(64, 10), nn.Linear(64, 3)
y_b = torch.randint(0, 3, (16,))
params = [*trunk.parameters(), *head_a.parameters(), *head_b.parameters()]
opt = torch.optim.Adam(params) if case == "heads" else torch.optim.SGD(params, 0.1)
schedule = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
shaped = "unshaped" not in sys.argv[3:]
with profile(activities=[ProfilerActivity.CPU], record_shapes=shaped) as prof:
    for step in range(12):
        if case == "frozen":
            trunk.requires_grad_(step % 2 == 0)
        opt.zero_grad()
        if case == "heads" and step % 2:
            lossf(head_b(trunk(x)), y_b).backward()
        else:
            lossf(head_a(trunk(x)), y).backward()
        opt.step()
        if case == "steplr":
            schedule.step()
prof.export_chrome_trace(out)
