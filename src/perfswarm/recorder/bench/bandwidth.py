"""Time host<->device and device<->device copies with torch.cuda for the bandwidth matrix
(model/bandwidth_matrix.py). Needs at least 2 GPUs.

UNVERIFIED: written and tested without a GPU (the tests drive the matrix's assembly with a fake
copier); this torch.cuda path has not yet run on GPUs.
"""

from __future__ import annotations

from typing import Any

from perfswarm.errors import PerfswarmError
from perfswarm.model.bandwidth_matrix import (
    COPY_BYTES,
    HOST,
    REPEATS,
    BandwidthMatrix,
    measure_matrix,
)


def gpu_count() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


class _TorchCopy:
    """One pinned host buffer and one buffer per GPU; a copy is timed by CUDA events on the
    stream of the GPU that takes part (the destination's, or the source's from a GPU to the
    host), peer access enabled where the driver allows it."""

    def __init__(self, devices: int, nbytes: int) -> None:
        import torch

        self.torch = torch
        elements = nbytes // 4
        self.host = torch.empty(elements, dtype=torch.float32).pin_memory()
        self.gpu = [torch.empty(elements, dtype=torch.float32, device=f"cuda:{i}")
                    for i in range(devices)]

    def _buffer(self, node: str) -> Any:
        return self.host if node == HOST else self.gpu[int(node.split(":")[1])]

    def __call__(self, src: str, dst: str, nbytes: int) -> float:
        torch = self.torch
        device = dst if dst != HOST else src
        with torch.cuda.device(device):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            source, target = self._buffer(src), self._buffer(dst)
            torch.cuda.synchronize()
            start.record()
            target.copy_(source, non_blocking=True)
            end.record()
            torch.cuda.synchronize()
            return float(start.elapsed_time(end)) * 1e-3


def gpu_matrix(nbytes: int = COPY_BYTES, repeats: int = REPEATS) -> BandwidthMatrix:
    """The bandwidth matrix of this machine's GPUs (PerfswarmError with fewer than 2)."""
    devices = gpu_count()
    if devices < 2:
        raise PerfswarmError(f"bandwidth matrix: needs at least 2 GPUs, found {devices}")
    return measure_matrix(_TorchCopy(devices, nbytes), devices, nbytes, repeats)
