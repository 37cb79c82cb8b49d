"""GPU sampler (NVML): utilization, memory, power, clocks, PCIe and NVLink traffic per GPU.

`nvidia-smi topo -m` is saved beside the samples. Without an NVIDIA GPU (or
NVML) the collector is `unavailable: no NVIDIA GPU`.

What each GPU supports is found once, at start, so a reading makes only calls
that work: utilization, memory, two clocks, and one `nvmlDeviceGetFieldValues`
for instant power and the PCIe and NVLink byte counters (per active link).
Byte counters become cumulative bytes since the recording began, like the
system sampler's disk and network bytes. GPUs without the PCIe byte counters
(older drivers) fall back to `nvmlDeviceGetPcieThroughput`, which measures for
20 ms per call, so it is read at most once a second.
"""

from __future__ import annotations

import contextlib
import math
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfswarm.recorder.base import Clock, Sampler

NO_GPU = "no NVIDIA GPU"
# nvmlValueType_t -> (union member, bits of an unsigned counter; 0 for the others)
_VALUE = {0: ("dVal", 0), 1: ("uiVal", 32), 2: ("ulVal", 64), 3: ("ullVal", 64),
          4: ("sllVal", 0), 5: ("siVal", 0), 6: ("usVal", 16)}


@dataclass
class _Counter:
    """A hardware byte counter as bytes since the first reading, across wrap-arounds."""

    name: str
    scale: int  # bytes per counter unit (NVLink counts KiB)
    last: int = -1
    total: int = 0

    def update(self, raw: int, bits: int) -> float:
        if self.last >= 0:
            delta = raw - self.last
            self.total += delta % (1 << bits) if bits else max(0, delta)
        self.last = raw
        return float(self.total * self.scale)


@dataclass
class _Gpu:
    index: int
    handle: Any
    fields: list[tuple[int, int]] = field(default_factory=list)  # (field id, scope) per read
    counters: list[_Counter | None] = field(default_factory=list)  # None: instant power
    power_fallback: bool = False  # nvmlDeviceGetPowerUsage (a 1 s average on newer GPUs)
    pcie_fallback: bool = False


def _field_value(nv: Any, fv: Any) -> tuple[int | float, int] | None:
    """(value, counter bits) of one nvmlFieldValue_t; None when this one failed."""
    if fv.nvmlReturn != nv.NVML_SUCCESS or fv.valueType not in _VALUE:
        return None
    member, bits = _VALUE[fv.valueType]
    return getattr(fv.value, member), bits


class GpuSampler(Sampler):
    name = "gpu"

    def __init__(self, raw: Path, hz: float, clock: Clock | None = None,
                 nvml: Any = None) -> None:
        super().__init__(raw, hz, clock or time.time_ns)
        self.nvml: Any = None
        self.gpus: list[_Gpu] = []
        self._fallback_every = max(1, math.ceil(hz))  # readings between PCIe fallback reads
        try:
            if nvml is None:
                import pynvml

                nvml = pynvml
            nvml.nvmlInit()
            self.gpus = [_Gpu(i, nvml.nvmlDeviceGetHandleByIndex(i))
                         for i in range(nvml.nvmlDeviceGetCount())]
            self.nvml = nvml
        except Exception:  # NVML missing, no driver, or no device: all mean no GPU to sample
            self.gpus = []
        if not self.gpus:
            self.unavailable(NO_GPU)
            return
        for gpu in self.gpus:
            self._probe(gpu)
        self._topology()

    def _probe(self, gpu: _Gpu) -> None:
        """Keep the fields this GPU answers: instant power, PCIe bytes, NVLink bytes per link."""
        nv = self.nvml
        wanted: list[tuple[int, int, _Counter | None]] = [
            (nv.NVML_FI_DEV_POWER_INSTANT, 0, None),
            (nv.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, 0, _Counter(f"gpu{gpu.index}.pcie_tx_bytes", 1)),
            (nv.NVML_FI_DEV_PCIE_COUNT_RX_BYTES, 0, _Counter(f"gpu{gpu.index}.pcie_rx_bytes", 1)),
        ]
        for link in range(nv.NVML_NVLINK_MAX_LINKS):
            try:
                active = nv.nvmlDeviceGetNvLinkState(gpu.handle, link) == nv.NVML_FEATURE_ENABLED
            except Exception:  # no such link, or no NVLink at all
                continue
            if active:
                wanted += [
                    (nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, link,
                     _Counter(f"gpu{gpu.index}.nvlink_tx_bytes", 1024)),
                    (nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, link,
                     _Counter(f"gpu{gpu.index}.nvlink_rx_bytes", 1024)),
                ]
        try:
            answers = nv.nvmlDeviceGetFieldValues(gpu.handle, [(f, s) for f, s, _ in wanted])
        except Exception:  # no field values at all (very old driver)
            answers = [None] * len(wanted)
        for (fid, scope, counter), fv in zip(wanted, answers, strict=True):
            if fv is not None and _field_value(nv, fv) is not None:
                gpu.fields.append((fid, scope))
                gpu.counters.append(counter)
        kept = {f for f, _ in gpu.fields}
        gpu.power_fallback = nv.NVML_FI_DEV_POWER_INSTANT not in kept
        gpu.pcie_fallback = nv.NVML_FI_DEV_PCIE_COUNT_TX_BYTES not in kept

    def _topology(self) -> None:
        smi = shutil.which("nvidia-smi")
        if smi is None:
            return
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run([smi, "topo", "-m"], capture_output=True, text=True,
                                 timeout=20, check=False)
            if out.returncode == 0 and out.stdout:
                (self.raw / "nvidia-smi-topo.txt").write_text(out.stdout)

    def start(self, pid: int) -> None:
        if self.gpus:
            super().start(pid)

    def read(self) -> dict[str, float]:
        values: dict[str, float] = {}
        for gpu in self.gpus:
            values.update(self._read_gpu(gpu))
        return values

    def _read_gpu(self, gpu: _Gpu) -> dict[str, float]:
        nv, h, p = self.nvml, gpu.handle, f"gpu{gpu.index}."
        out: dict[str, float] = {}
        with contextlib.suppress(Exception):  # a call this GPU refuses leaves its values out
            util = nv.nvmlDeviceGetUtilizationRates(h)
            out[p + "sm_util"], out[p + "mem_util"] = float(util.gpu), float(util.memory)
        with contextlib.suppress(Exception):
            out[p + "mem_used_bytes"] = float(nv.nvmlDeviceGetMemoryInfo(h).used)
        with contextlib.suppress(Exception):
            out[p + "sm_clock_mhz"] = float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))
            out[p + "mem_clock_mhz"] = float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM))
        if gpu.fields:
            with contextlib.suppress(Exception):
                sums: dict[str, float] = {}
                answers = nv.nvmlDeviceGetFieldValues(h, gpu.fields)
                for counter, fv in zip(gpu.counters, answers, strict=True):
                    got = _field_value(nv, fv)
                    if got is None:
                        continue
                    value, bits = got
                    if counter is None:
                        out[p + "power_w"] = float(value) / 1000.0  # mW
                    else:  # NVLink links of one direction add up under one name
                        sums[counter.name] = (sums.get(counter.name, 0.0)
                                              + counter.update(int(value), bits))
                out.update(sums)
        if gpu.power_fallback:
            with contextlib.suppress(Exception):
                out[p + "power_w"] = float(nv.nvmlDeviceGetPowerUsage(h)) / 1000.0  # mW
        if gpu.pcie_fallback and self.samples % self._fallback_every == 0:
            with contextlib.suppress(Exception):  # each call measures for 20 ms
                out[p + "pcie_tx_kbps"] = float(nv.nvmlDeviceGetPcieThroughput(
                    h, nv.NVML_PCIE_UTIL_TX_BYTES))
                out[p + "pcie_rx_kbps"] = float(nv.nvmlDeviceGetPcieThroughput(
                    h, nv.NVML_PCIE_UTIL_RX_BYTES))
        return out

    def stop(self) -> None:
        super().stop()
        if self.nvml is not None:
            with contextlib.suppress(Exception):
                self.nvml.nvmlShutdown()
