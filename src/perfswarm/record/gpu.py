"""GPU sampler (NVML): utilization, memory, power, clocks, PCIe and NVLink throughput per GPU.

`nvidia-smi topo -m` is saved beside the samples. Without an NVIDIA GPU (or
NVML) the collector is `unavailable: no NVIDIA GPU`.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from perfswarm.record.base import Clock, Sampler

NO_GPU = "no NVIDIA GPU"


class GpuSampler(Sampler):
    name = "gpu"

    def __init__(self, raw: Path, hz: float, clock: Clock | None = None) -> None:
        super().__init__(raw, hz, clock or time.time_ns)
        self.nvml: Any = None
        self.handles: list[Any] = []
        try:
            import pynvml

            pynvml.nvmlInit()
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i)
                            for i in range(pynvml.nvmlDeviceGetCount())]
            self.nvml = pynvml
        except Exception:  # NVML missing, no driver, or no device: all mean no GPU to sample
            self.handles = []
        if not self.handles:
            self.unavailable(NO_GPU)
            return
        self._topology()

    def _topology(self) -> None:
        smi = shutil.which("nvidia-smi")
        if smi is None:
            return
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run([smi, "topo", "-m"], capture_output=True, text=True,
                                 timeout=20, check=False)
            (self.raw / "nvidia-smi-topo.txt").write_text(out.stdout)

    def start(self, pid: int) -> None:
        if self.handles:
            super().start(pid)

    def read(self) -> dict[str, float]:
        nv = self.nvml
        values: dict[str, float] = {}
        for i, h in enumerate(self.handles):
            reads = {
                "sm_util": lambda h=h: nv.nvmlDeviceGetUtilizationRates(h).gpu,
                "mem_util": lambda h=h: nv.nvmlDeviceGetUtilizationRates(h).memory,
                "mem_used_bytes": lambda h=h: nv.nvmlDeviceGetMemoryInfo(h).used,
                "power_w": lambda h=h: nv.nvmlDeviceGetPowerUsage(h) / 1000.0,
                "sm_clock_mhz": lambda h=h: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
                "mem_clock_mhz": lambda h=h: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM),
                "pcie_tx_kbps": lambda h=h: nv.nvmlDeviceGetPcieThroughput(
                    h, nv.NVML_PCIE_UTIL_TX_BYTES),
                "pcie_rx_kbps": lambda h=h: nv.nvmlDeviceGetPcieThroughput(
                    h, nv.NVML_PCIE_UTIL_RX_BYTES),
            }
            for key, fn in reads.items():
                with contextlib.suppress(Exception):  # a field this GPU does not support
                    values[f"gpu{i}.{key}"] = float(fn())  # type: ignore[no-untyped-call]
            values.update(self._nvlink(i, h))
        return values

    def _nvlink(self, i: int, h: Any) -> dict[str, float]:
        nv = self.nvml
        tx = rx = 0.0
        links = 0
        for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)):
            try:
                if not nv.nvmlDeviceGetNvLinkState(h, link):
                    continue
                counts = nv.nvmlDeviceGetNvLinkUtilizationCounter(h, link, 0)
            except Exception:  # no such link, or counters not supported
                continue
            rx += float(counts[0])
            tx += float(counts[1])
            links += 1
        if not links:
            return {}
        return {f"gpu{i}.nvlink_rx": rx, f"gpu{i}.nvlink_tx": tx}

    def stop(self) -> None:
        super().stop()
        if self.nvml is not None:
            with contextlib.suppress(Exception):
                self.nvml.nvmlShutdown()
