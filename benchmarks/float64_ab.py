"""float64_ops on a CPU against an A/B: the same MLP in float64 and in float32.

    PYTHONPATH=src python benchmarks/float64_ab.py [--blocks 20] [--only tiny,large]

Each case (`tiny`: 30 layers of 8, batch 4, whose calls are their fixed cost; `large`: 4
layers of 512, batch 256) builds both dtypes in one process and runs them in blocks of steps,
interleaved (float64 first in odd blocks), one intra-op thread: load from elsewhere falls on
both alike. Printed: each dtype's median of the blocks' median steps with its quartiles, and
float32's saving (of float64's step). Then the float64 form is recorded (`perfswarm record`,
torch collector) and advised: `float64_ops`' claimed gain as a share of the time it is of.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import tempfile
import time
from pathlib import Path

from realworld import found, record

CASES = {"tiny": (8, 30, 4, 60), "large": (512, 4, 256, 6)}  # width, layers, batch, block


def _model(width: int, layers: int, batch: int, dtype: object) -> tuple[object, ...]:
    import torch
    from torch import nn

    torch.manual_seed(0)
    assert isinstance(dtype, torch.dtype)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.Tanh())
                            for _ in range(layers)]).to(dtype)
    return (model, torch.optim.SGD(model.parameters(), 0.001),
            torch.randn(batch, width, dtype=dtype), torch.randn(batch, width, dtype=dtype))


def _steps(parts: tuple[object, ...], n: int) -> float:
    """The median of `n` training steps' times (the first two aside), in ms."""
    model, opt, x, y = parts
    ts = [time.perf_counter()]
    for _ in range(n):
        opt.zero_grad()  # type: ignore[attr-defined]
        ((model(x) - y) ** 2).mean().backward()  # type: ignore[operator]
        opt.step()  # type: ignore[attr-defined]
        ts.append(time.perf_counter())
    return statistics.median(1000 * (b - a) for a, b in itertools.pairwise(ts[2:]))


def ab(case: str, blocks: int) -> tuple[list[float], list[float]]:
    import torch

    torch.set_num_threads(1)
    width, layers, batch, block = CASES[case]
    runs = {d: _model(width, layers, batch, d) for d in (torch.float64, torch.float32)}
    times: dict[object, list[float]] = {d: [] for d in runs}
    for b in range(blocks):
        for d in (list(runs) if b % 2 else list(runs)[::-1]):
            times[d].append(_steps(runs[d], block))
    return times[torch.float64], times[torch.float32]


SCRIPT = """
import sys, torch
sys.path.insert(0, {here!r})
from float64_ab import _model, _steps
torch.set_num_threads(1)
_steps(_model({w}, {l}, {b}, torch.float64), 12)
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--blocks", type=int, default=20)
    p.add_argument("--only", default="", help="cases, comma-separated (default: all)")
    a = p.parse_args()
    cases = [c for c in CASES if not a.only or c in a.only.split(",")]
    for case in cases:
        f64, f32 = ab(case, a.blocks)
        m64, m32 = statistics.median(f64), statistics.median(f32)
        q64, q32 = statistics.quantiles(f64, n=4), statistics.quantiles(f32, n=4)
        print(f"{case}: float64 {m64:.3f} ms ({q64[0]:.3f}-{q64[2]:.3f}), float32 {m32:.3f} ms "
              f"({q32[0]:.3f}-{q32[2]:.3f}): {100 * (1 - m32 / m64):.1f}% less; pairs "
              f"{min(100 * (1 - b / a) for a, b in zip(f64, f32, strict=True)):.1f}% to "
              f"{max(100 * (1 - b / a) for a, b in zip(f64, f32, strict=True)):.1f}%")
        with tempfile.TemporaryDirectory() as tmp:
            script = Path(tmp) / "f64.py"
            w, l_, b, _ = CASES[case]
            script.write_text(SCRIPT.format(here=str(Path(__file__).resolve().parent), w=w,
                                            l=l_, b=b))
            run, _ = record(Path(tmp) / "f64.run", [sys.executable, str(script)], steps="4:6")
            advice = found(run).get("float64_ops")
            said = "nothing" if advice is None else f"{advice.gain_pct}% of {advice.gain_of}"
            print(f"  advised: {said}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
