"""What a fused optimizer step costs on this CPU (model/fusedstep.py): torch.optim's Adam,
AdamW and SGD (momentum 0.9) with fused=True, each step() timed over parameter lists of a few
counts and sizes (GRID) and fitted as a cost a call, a cost a tensor and a cost a byte of
parameters (non-negative least squares). Each call is timed alone after a write of a buffer
past the cache (`evict_bytes`), as a training step finds the optimizer: its forward and
backward since the last step moved other data and code through the caches. Timed back to
back, as kernels.time_op times an op, the step took half as long as in a training loop (a
60-tensor Adam: 0.45 ms warm, 0.92 ms after the write, 0.87-1.10 ms in the loop; /tmp/p33/
fusedgain/evict.py). About three seconds on the 2-core VM.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Final

import numpy as np

from perfswarm.model.fusedstep import OPTIMIZERS
from perfswarm.model.nnls import nnls

# (tensors, elements each): few and many tensors, small and large, so the three costs part
GRID: Final = ((1, 256), (16, 256), (64, 256), (16, 1 << 14), (4, 1 << 18), (1, 1 << 20))
CALLS, ROUNDS = 9, 3  # a point's time: the least of ROUNDS medians of CALLS calls
_FLOAT = 4  # bytes: the parameters are float32


def _step_s(name: str, tensors: int, elements: int, evict: Any) -> float:
    """Seconds of one fused step over `tensors` parameters of `elements` each, `evict`
    written before each call."""
    import torch

    params = [torch.nn.Parameter(torch.randn(elements)) for _ in range(tensors)]
    for p in params:
        p.grad = torch.randn(elements)
    extra = {"momentum": 0.9} if name == "SGD" else {}
    optimizer = getattr(torch.optim, name)(params, lr=1e-3, fused=True, **extra)
    optimizer.step()  # its state made
    medians = []
    for _ in range(ROUNDS):
        calls = []
        for _ in range(CALLS):
            evict.fill_(1.0)
            start = time.perf_counter()
            optimizer.step()
            calls.append(time.perf_counter() - start)
        medians.append(statistics.median(calls))
    return min(medians)  # other load only ever adds time


def fused_step_cost(evict_bytes: int) -> dict[str, Any]:
    """The profile's `fused_optimizer_step`: per optimizer, model/fusedstep.StepCostDict's
    figures and the points they are fitted to."""
    import torch

    evict = torch.empty(evict_bytes // _FLOAT)
    out: dict[str, Any] = {}
    for name in OPTIMIZERS:
        points = [{"tensors": t, "elements": n, "ns": round(1e9 * _step_s(name, t, n, evict))}
                  for t, n in GRID]
        terms = np.array([[1.0, p["tensors"], _FLOAT * p["tensors"] * p["elements"]]
                          for p in points])
        (call, tensor, byte), _ = nnls(terms, np.array([p["ns"] for p in points], np.float64))
        out[name] = {"call_ns": round(float(call)), "tensor_ns": round(float(tensor)),
                     "byte_ns": round(float(byte), 4), "points": points}
    return out
