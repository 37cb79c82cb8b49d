"""What taking a batch from a DataLoader worker costs the process it feeds, measured here
(model/receive.py): the process's CPU time a `next()` on a real `DataLoader(num_workers=1)`,
with the worker's queue kept full (a pause before each call lets the worker refill it, as a
training step's compute does), over TensorDatasets of 1 and of `_MANY` tensors; the two
medians give the cost a batch and a tensor. Both loaders are read in turns, so the machine's
other load falls on both alike. About a second on the 2-core VM (0.2 s of this process's CPU
and 0.3 s of the workers'; 3-4 s of wall time at load 12).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from perfswarm.model.receive import ReceiveDict

_MANY = 4  # tensors a batch of the second loader
_ROWS, _COLS = 64, 64  # a batch's rows, each tensor's columns (the rows hardly matter)
_PAUSE_S = 0.003  # before each call: the worker's time to refill its queue
_WARM = 4  # calls left out: the worker's start, its queue's first fill


def next_cpu_ns(batches: int = 48) -> dict[int, float]:
    """Tensors a batch -> the median CPU ns of the process a `next()` of a 1-worker loader."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    rows = _ROWS * (batches + _WARM)
    loaders = {n: iter(DataLoader(TensorDataset(*(torch.randn(rows, _COLS) for _ in range(n))),
                                  batch_size=_ROWS, num_workers=1, prefetch_factor=4))
               for n in (1, _MANY)}
    spent: dict[int, list[int]] = {n: [] for n in loaders}
    try:
        for _ in range(batches + _WARM):
            for n, it in loaders.items():
                time.sleep(_PAUSE_S)
                start = time.process_time_ns()
                next(it)
                spent[n].append(time.process_time_ns() - start)
    finally:
        for it in loaders.values():  # the workers end now, not when the GC finds them
            it._shutdown_workers()  # type: ignore[attr-defined]
    return {n: float(statistics.median(times[_WARM:])) for n, times in spent.items()}


def receive_cost(batches: int = 48) -> dict[str, Any]:
    """The profile's `loader_receive`: ReceiveDict's figures, and the medians they come from."""
    medians = next_cpu_ns(batches)
    tensor = max(0.0, (medians[_MANY] - medians[1]) / (_MANY - 1))
    cost = ReceiveDict(batch_ns=round(max(0.0, medians[1] - tensor)), tensor_ns=round(tensor))
    return {**cost, "next_cpu_ns": {str(n): round(v) for n, v in medians.items()},
            "rows": _ROWS}
