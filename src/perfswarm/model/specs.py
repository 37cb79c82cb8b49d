"""Accelerator hardware specs from the bundled devices.yaml (sources cited per device)."""

from __future__ import annotations

import difflib
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cache
from typing import Any, Final

from perfswarm.errors import ParameterError, PerfswarmError
from perfswarm.userfiles import bundled_mapping

KIB: Final = 1024  # a cache's KB and MB are binary (CUDA's cache sizes in bytes say so)
MIB: Final = 1024 * KIB
# by NVIDIA compute capability, the CUDA C++ Programming Guide's tables: the most threads an SM
# keeps resident, and the KB of its L1 that holds global loads by default, at most (Pascal's
# loads go to the L2 only; 7.5: 96 KB shared with up to 64 KB of L1)
SM_CACHES: Final = {"6.0": (2048, 0), "6.1": (2048, 0), "7.0": (2048, 128), "7.5": (1024, 64),
                    "8.0": (2048, 192), "8.6": (1536, 128), "8.7": (2048, 192),
                    "8.9": (1536, 128), "9.0": (2048, 256), "10.0": (2048, 256),
                    "12.0": (1536, 128)}


def sm_caches(compute_capability: str) -> tuple[int, float]:
    """An SM's resident threads and L1 bytes for global loads at an NVIDIA compute capability
    ('8.0'; '' for none known: 2048 and no L1). Raises ValueError on one SM_CACHES lacks."""
    if not compute_capability:
        return 2048, 0.0
    if compute_capability not in SM_CACHES:
        raise ValueError(f"unknown compute capability {compute_capability!r} (known: "
                         f"{', '.join(SM_CACHES)})")
    threads, l1_kb = SM_CACHES[compute_capability]
    return threads, float(l1_kb * KIB)


@dataclass(frozen=True)
class DeviceSpec:
    """Peak rates of one accelerator; the roofline's ceilings."""

    name: str
    peak_flops: dict[str, float]   # dtype -> FLOP/s (dense)
    memory_bandwidth: float        # bytes/s
    memory_bytes: float
    l2_bytes: float
    compute_units: int
    boost_clock_mhz: float
    pcie_gen: int
    nvlink_gbps: float
    source: str
    # bytes/s of data that stays in the last-level cache (l2_bytes); 0 = unknown, priced as memory
    cache_bandwidth: float = 0.0
    names: tuple[str, ...] = ()    # as torch.cuda.get_device_name() returns them
    aliases: tuple[str, ...] = ()  # short names
    architecture: str = ""         # the chip's generation (Pascal, Volta, ..., CDNA3)
    memory: str = ""               # its DRAM type (GDDR6, HBM2, ...)
    sm_threads: int = 2048         # the most threads an SM (CU) keeps resident
    l1_bytes: float = 0.0          # an SM's L1 that holds global loads by default (0: none)

    def peak_for(self, dtype: str) -> float:
        """Peak FLOP/s for a dtype key (fp32, fp16, ...); fp32 when the device has no such rate."""
        return self.peak_flops.get(dtype, self.peak_flops["fp32"])

    def ridge_point(self, dtype: str) -> float:
        """FLOP/byte where the roofline turns from memory-bound to compute-bound."""
        return self.peak_for(dtype) / self.memory_bandwidth

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "peak_tflops": {k: v / 1e12 for k, v in self.peak_flops.items()},
                "memory_bandwidth_gbps": self.memory_bandwidth / 1e9,
                "memory_gb": self.memory_bytes / 1e9, "l2_mb": self.l2_bytes / MIB,
                "compute_units": self.compute_units, "boost_clock_mhz": self.boost_clock_mhz,
                "pcie_gen": self.pcie_gen, "nvlink_gbps": self.nvlink_gbps,
                "architecture": self.architecture, "memory": self.memory, "source": self.source}


def _spec(name: str, raw: object) -> DeviceSpec:
    if not isinstance(raw, dict) or not isinstance(raw.get("peak_tflops"), dict):
        raise PerfswarmError(f"devices.yaml: {name}: expected a mapping with peak_tflops")
    try:
        peaks = {str(k): float(v) * 1e12 for k, v in raw["peak_tflops"].items()}
        threads, l1_bytes = sm_caches(str(raw.get("compute_capability", "")))
        spec = DeviceSpec(
            name, peaks, float(raw["memory_bandwidth_gbps"]) * 1e9, float(raw["memory_gb"]) * 1e9,
            float(raw["l2_mb"]) * MIB, int(raw["compute_units"]), float(raw["boost_clock_mhz"]),
            int(raw["pcie_gen"]), float(raw["nvlink_gbps"]), str(raw["source"]),
            names=tuple(str(n) for n in raw.get("names", ())),
            aliases=tuple(str(a) for a in raw.get("aliases", ())),
            architecture=str(raw.get("architecture", "")), memory=str(raw.get("memory", "")),
            sm_threads=threads, l1_bytes=l1_bytes)
    except (KeyError, TypeError, ValueError) as exc:
        raise PerfswarmError(f"devices.yaml: {name}: bad or missing field {exc}") from None
    if "fp32" not in peaks or spec.memory_bandwidth <= 0 or min(peaks.values()) <= 0:
        raise PerfswarmError(f"devices.yaml: {name}: needs positive fp32 peak and bandwidth")
    return spec


@cache
def device_specs() -> dict[str, DeviceSpec]:
    """Every device of the bundled YAML, by name, in file order."""
    data = bundled_mapping("perfswarm.model", "devices.yaml")
    return {str(name): _spec(str(name), raw) for name, raw in data.items()}


def _by_lower() -> dict[str, DeviceSpec]:
    """Every spec by its key, short names and driver names, lower case (a driver name two
    devices share, ROCm's generic one, is left to spec_for_device)."""
    shared = {n.lower() for n, count in Counter(
        n.lower() for s in device_specs().values() for n in s.names).items() if count > 1}
    out: dict[str, DeviceSpec] = {}
    for key, spec in device_specs().items():
        for name in (key, *spec.aliases, *spec.names):
            if name.lower() not in shared:
                out.setdefault(name.lower(), spec)
    return out


def load_spec(name: str, param: str = "device") -> DeviceSpec:
    """The spec of a device by name, case-insensitive: its key (``h100-sxm``), a short name
    (``h100``) or the exact name the driver gives it (``NVIDIA H100 80GB HBM3``). An unknown
    name raises a one-line error with the closest known names, of the parameter `param`
    that gave it."""
    known = _by_lower()
    query = name.strip().lower()
    spec = known.get(query)
    if spec is None:
        # the variants a name starts (A100: its PCIe and SXM, 40 and 80 GB), then look-alikes
        close = [k for k in known if k.startswith(query)] if query else []
        close += difflib.get_close_matches(query, known, n=4, cutoff=0.4)
        shown = list(dict.fromkeys(known[c].name for c in close))[:6] or list(device_specs())[:6]
        raise ParameterError(param, f"unknown device; closest known: {', '.join(shown)}",
                             value=name)
    return spec


def spec_for_device(name: str, memory_bytes: float | None = None) -> DeviceSpec | None:
    """The bundled spec of a device as a trace or the driver names it (e.g. ``NVIDIA
    A100-SXM4-80GB``, ``NVIDIA H100 PCIe``). A name some spec lists exactly wins (one several
    list, ROCm's generic 'AMD Radeon Graphics', goes to the one whose memory is closest to
    `memory_bytes`, None without it); else the family (A100, H100, L4, ...) in the name, and
    within it a variant named in the name (80GB, PCIe), else the one whose memory is closest,
    else the first listed; None when no family is in the name."""
    upper = name.upper()
    exact = [s for s in device_specs().values() if upper.strip() in (n.upper() for n in s.names)]
    if len(exact) == 1:
        return exact[0]
    if exact:
        if memory_bytes is None:
            return None
        # ROCm names Instinct parts 'AMD Radeon Graphics': tell them by memory (an MI250 die
        # shows 64 of its 128 GB)
        return min(exact, key=lambda s: abs(s.memory_bytes - memory_bytes))
    family = [s for key, s in device_specs().items()
              if re.search(rf"(?<![A-Z0-9]){re.escape(key.split('-')[0])}(?![A-Z0-9])", upper)]
    named = [s for s in family if "-" in s.name and s.name.split("-", 1)[1].upper() in upper]
    if named or not family:
        return named[0] if named else None
    if memory_bytes is None:
        return family[0]
    return min(family, key=lambda s: abs(s.memory_bytes - memory_bytes))


def cpu_spec(name: str, flops: float, memory_bandwidth: float, cache_bandwidth: float,
             cache_bytes: float, threads: int, source: str) -> DeviceSpec:
    """A CPU's measured ceilings as a device spec (fp32 peak, bandwidths from memory and from its
    last-level cache), so one roofline serves CPUs and accelerators."""
    if not (flops > 0 and memory_bandwidth > 0 and cache_bandwidth >= 0 and cache_bytes >= 0):
        raise PerfswarmError(f"{source}: CPU peaks must be positive (FLOP/s {flops:g}, "
                             f"bandwidth {memory_bandwidth:g} B/s)")
    return DeviceSpec(name, {"fp32": flops}, memory_bandwidth, 0.0, cache_bytes, threads, 0.0, 0,
                      0.0, source, cache_bandwidth)


def per_device(spec: DeviceSpec, compute_units: int | None) -> DeviceSpec:
    """The spec of what the trace calls one device: an MI250 shows each of its two dies, a
    MIG slice a share of the SMs; peaks and bandwidth scale with the units it has."""
    if not compute_units or compute_units >= spec.compute_units:
        return spec
    share = compute_units / spec.compute_units
    return replace(spec, name=f"{spec.name} ({compute_units} of {spec.compute_units} units)",
                   peak_flops={k: v * share for k, v in spec.peak_flops.items()},
                   memory_bandwidth=spec.memory_bandwidth * share,
                   memory_bytes=spec.memory_bytes * share, compute_units=compute_units)


def spec_of_devices(devices: Sequence[Mapping[str, Any]]) -> DeviceSpec | None:
    """The spec of the first recognized device of a manifest's `devices`, scaled to the units
    the trace shows of it."""
    for device in devices:
        memory = device.get("totalGlobalMem")
        spec = spec_for_device(str(device.get("name", "")),
                               float(memory) if isinstance(memory, int | float) else None)
        if spec is not None:
            units = device.get("numSms")
            return per_device(spec, int(units) if isinstance(units, int) else None)
    return None
