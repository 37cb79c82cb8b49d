"""Accelerator hardware specs from the bundled devices.yaml (sources cited per device)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cache
from typing import Any

from perfswarm.errors import PerfswarmError
from perfswarm.yamlfile import bundled_mapping


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

    def peak_for(self, dtype: str) -> float:
        """Peak FLOP/s for a dtype key (fp32, fp16, ...); fp32 when the device has no such rate."""
        return self.peak_flops.get(dtype, self.peak_flops["fp32"])

    def ridge_point(self, dtype: str) -> float:
        """FLOP/byte where the roofline turns from memory-bound to compute-bound."""
        return self.peak_for(dtype) / self.memory_bandwidth

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "peak_tflops": {k: v / 1e12 for k, v in self.peak_flops.items()},
                "memory_bandwidth_gbps": self.memory_bandwidth / 1e9,
                "memory_gb": self.memory_bytes / 1e9, "l2_mb": self.l2_bytes / 1e6,
                "compute_units": self.compute_units, "boost_clock_mhz": self.boost_clock_mhz,
                "pcie_gen": self.pcie_gen, "nvlink_gbps": self.nvlink_gbps, "source": self.source}


def _spec(name: str, raw: object) -> DeviceSpec:
    if not isinstance(raw, dict) or not isinstance(raw.get("peak_tflops"), dict):
        raise PerfswarmError(f"devices.yaml: {name}: expected a mapping with peak_tflops")
    try:
        peaks = {str(k): float(v) * 1e12 for k, v in raw["peak_tflops"].items()}
        spec = DeviceSpec(
            name, peaks, float(raw["memory_bandwidth_gbps"]) * 1e9, float(raw["memory_gb"]) * 1e9,
            float(raw["l2_mb"]) * 1e6, int(raw["compute_units"]), float(raw["boost_clock_mhz"]),
            int(raw["pcie_gen"]), float(raw["nvlink_gbps"]), str(raw["source"]))
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


def load_spec(name: str) -> DeviceSpec:
    """The spec of a device by name, case-insensitive (e.g. ``h100-sxm``)."""
    by_lower = {key.lower(): spec for key, spec in device_specs().items()}
    spec = by_lower.get(name.lower())
    if spec is None:
        raise PerfswarmError(f"--device {name}: unknown device; known: {', '.join(device_specs())}")
    return spec


def match_device(name: str, memory_bytes: float = 0.0) -> DeviceSpec | None:
    """The spec of a device as a trace names it (deviceProperties' name and totalGlobalMem):
    e.g. 'NVIDIA A100-SXM4-80GB' -> A100-80GB; AMD parts by their memory (a trace's
    'AMD Radeon Graphics' with 64 GB is one die of an MI250)."""
    specs = device_specs()
    upper = name.upper()
    gb = memory_bytes / 1e9
    if "H200" in upper:
        return specs["H200"]
    if "H100" in upper or "H800" in upper:
        return specs["H100-PCIe" if "PCIE" in upper else "H100-SXM"]
    if "A100" in upper or "A800" in upper:
        return specs["A100-80GB" if "80GB" in upper or gb > 60 else "A100-40GB"]
    for key in ("V100", "L4", "MI300X", "MI250"):
        if key in upper:
            return specs[key]
    if "AMD" in upper and gb:
        return specs["MI300X" if gb > 150 else "MI250"]
    return None


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
        spec = match_device(str(device.get("name", "")), float(device.get("totalGlobalMem", 0)))
        if spec is not None:
            units = device.get("numSms")
            return per_device(spec, int(units) if isinstance(units, int) else None)
    return None
