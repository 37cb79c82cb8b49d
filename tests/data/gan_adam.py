"""The loop of gan_adam_cpu.pt.trace.json.gz: a GAN stepped 10 times, its discriminator's Adam
then its generator's, each after a backward of its own; the two models differ in size (the
generator 16 -> 64 -> 32, the discriminator 32 -> 48 -> 1). Profiled with record_shapes and no
schedule (no ProfilerStep markers). Written with `python gan_adam.py OUT.json` (torch 2.13 CPU),
or `python gan_adam.py OUT.json twins` for twin_gan_cpu.pt.trace.json.gz: both models
32 -> 32 -> 32 (the discriminator's score the mean of its output), so both optimizers update
parameters of the same shapes. Each step's end (time.perf_counter_ns, after the generator's
optimizer call) goes to stdout. `twins d2` has the twins' discriminator step twice a generator
step, each on fakes of its own (twin_gan_d2_cpu.pt.trace.json.gz), and `twins d2 sgd` both
models stepped by plain SGD (twin_gan_d2_sgd_cpu.pt.trace.json.gz): three calls of one kind a
step, the ops between them alike but one stretch, as one optimizer's with extra work every
third step; the backward passes before them, in a cycle of three, tell the models apart.
`twins d2 wide` (twin_gan_d2_wide_cpu.pt.trace.json.gz, 4 steps): twins 32 -> 48 -> 32 on
batches of 16, a first layer that is not square (what the weight gradients' samples read)."""

import sys
import time

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
flags = set(sys.argv[2:])
twins = "twins" in flags
hidden, batch = (48, 16) if "wide" in flags else (32, 64)
if twins:
    gen = nn.Sequential(nn.Linear(32, hidden), nn.ReLU(), nn.Linear(hidden, 32))
    disc = nn.Sequential(nn.Linear(32, hidden), nn.LeakyReLU(0.2), nn.Linear(hidden, 32))
    noise = 32
else:
    gen = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 32))
    disc = nn.Sequential(nn.Linear(32, 48), nn.LeakyReLU(0.2), nn.Linear(48, 1))
    noise = 16


def optimizer(model: nn.Module) -> torch.optim.Optimizer:
    if "sgd" in flags:
        return torch.optim.SGD(model.parameters(), lr=0.01)
    return torch.optim.Adam(model.parameters(), lr=2e-4, betas=(0.5, 0.999))


opt_g, opt_d = optimizer(gen), optimizer(disc)
real = torch.randn(batch, 32)


def score(x: torch.Tensor) -> torch.Tensor:
    return disc(x).mean(dim=1)


def step() -> None:
    for _ in range(2 if "d2" in flags else 1):  # each discriminator step on fakes of its own
        fake = gen(torch.randn(batch, noise))
        opt_d.zero_grad()
        d_loss = (nn.functional.softplus(-score(real))
                  + nn.functional.softplus(score(fake.detach()))).mean()
        d_loss.backward()
        opt_d.step()
    opt_g.zero_grad()
    g_loss = nn.functional.softplus(-score(fake)).mean()
    g_loss.backward()
    opt_g.step()


step()  # warm-up, outside the window
ends = []
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                            record_shapes=True) as prof:
    for _ in range(4 if "wide" in flags else 10):
        step()
        ends.append(time.perf_counter_ns())
prof.export_chrome_trace(sys.argv[1])
print(*ends)
