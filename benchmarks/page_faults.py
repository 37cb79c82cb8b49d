"""Minor page faults a training step takes bare, inside a torch.profiler window, and after it:
how far a step's fresh pages are the program's and how far the profiler's.

    PYTHONPATH=src .venv/bin/python benchmarks/page_faults.py [--steps 10] [--memory]

Two small models in the styles of the fifteenth pass (a transformer encoder on 4x4 patches
with AdamW; a conv + linear autoencoder with Adam), one intra-op thread, at two batch sizes
and two widths, each case in a fresh process (a heap's past decides: run one after another in
one process, the later cases took no faults at all). Each step's faults are the process's
`ru_minflt` across it; the table gives the median over the steps of each phase (the first
bare step, the warm-up, left out) and the range. A profiled step runs as the recorder's
window does (record_shapes; `--memory` adds profile_memory). glibc trims its heap's top once
the free space there passes its trim threshold, and the next step faults those pages back
in: whether it does depends on what else lies on the heap, the profiler's own allocations
included (docs/benchmarks.md, the seventeenth pass).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


class Encoder(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, width, 4, stride=4)
        layer = nn.TransformerEncoderLayer(width, 4, 4 * width, dropout=0.0, batch_first=True)
        self.body = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.patch(x).flatten(2).transpose(1, 2)
        return self.head(self.body(tokens).mean(1))


def _autoencoder(width: int) -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, width, 3, stride=2, padding=1), nn.ReLU(), nn.Flatten(),
                         nn.Linear(width * 196, 64), nn.ReLU(), nn.Linear(64, width * 196),
                         nn.Unflatten(1, (width, 14, 14)),
                         nn.ConvTranspose2d(width, 1, 4, stride=2, padding=1))


def _step(style: str, batch: int, width: int) -> Callable[[], None]:
    torch.manual_seed(0)
    if style == "encoder":
        net: nn.Module = Encoder(width)
        opt: torch.optim.Optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)
    else:
        net = _autoencoder(width)
        opt = torch.optim.Adam(net.parameters(), lr=1e-3)

    def step() -> None:
        if style == "encoder":
            loss = F.cross_entropy(net(torch.randn(batch, 3, 32, 32)),
                                   torch.randint(0, 10, (batch,)))
        else:
            x = torch.rand(batch, 1, 28, 28)
            loss = F.mse_loss(net(x), x)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return step


def _phase(step: Callable[[], None], steps: int) -> list[int]:
    out = []
    for _ in range(steps):
        before = _faults()
        step()
        out.append(_faults() - before)
    return out


def measure(style: str, batch: int, width: int, steps: int, memory: bool
            ) -> dict[str, list[int]]:
    step = _step(style, batch, width)
    bare = _phase(step, steps + 1)[1:]
    with torch.profiler.profile(record_shapes=True, profile_memory=memory):
        profiled = _phase(step, steps)
    return {"bare": bare, "profiled": profiled, "after": _phase(step, steps)}


CASES = (("encoder", 16, 32), ("encoder", 32, 32), ("encoder", 16, 64),
         ("autoencoder", 16, 32), ("autoencoder", 32, 32), ("autoencoder", 16, 64))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--memory", action="store_true", help="profile_memory=True in the window")
    ap.add_argument("--case", help=argparse.SUPPRESS)  # STYLE:BATCH:WIDTH, in this process
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.case:
        style, batch, width = args.case.split(":")
        print(json.dumps(measure(style, int(batch), int(width), args.steps, args.memory)))
        return
    print(f"{'model':12} {'batch':>5} {'width':>5}   faults a step, median [min-max]: "
          "bare | profiled | after the window")
    for style, batch, width in CASES:
        argv = [sys.executable, __file__, "--case", f"{style}:{batch}:{width}",
                "--steps", str(args.steps), *(["--memory"] if args.memory else [])]
        out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
        found = json.loads(out.strip().splitlines()[-1])
        cells = [f"{statistics.median(v):6.0f} [{min(v)}-{max(v)}]" for v in found.values()]
        print(f"{style:12} {batch:5d} {width:5d}   " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
