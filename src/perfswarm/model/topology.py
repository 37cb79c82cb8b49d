"""Interconnects (from interconnects.yaml) and the cluster topologies the collective models run on.

A topology is two levels: devices inside a node share the intra-node link (NVLink, NVSwitch, PCIe),
nodes talk over the inter-node fabric (InfiniBand, Ethernet fat tree) with one NIC per device, the
rail-optimized layout of DGX-class machines. One node means a flat topology on the intra link.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cache
from typing import Any, Literal

from perfswarm.errors import ParameterError, PerfswarmError
from perfswarm.model.specs import DeviceSpec, spec_of_devices
from perfswarm.userfiles import bundled_mapping

Fabric = Literal["switch", "p2p", "bus"]
_FABRIC_NAMES: dict[str, Fabric] = {"switch": "switch", "p2p": "p2p", "bus": "bus"}


@dataclass(frozen=True)
class Link:
    """One interconnect as a latency-bandwidth (alpha-beta) pair."""

    name: str
    alpha_s: float            # one point-to-point step
    beta_s_per_byte: float    # inverse of the achieved bandwidth
    fabric: Fabric = "switch"
    source: str = ""

    @property
    def bandwidth_gbps(self) -> float:
        return 1e-9 / self.beta_s_per_byte if self.beta_s_per_byte > 0 else math.inf

    def with_bandwidth(self, gbps: float) -> Link:
        """The same link at another achieved bandwidth (`bandwidth_gbps`)."""
        if not gbps > 0:
            raise ParameterError("bandwidth_gbps", f"must be positive, got {gbps}")
        return replace(self, name=f"{self.name}@{gbps:g}GB/s", beta_s_per_byte=1e-9 / gbps,
                       source=f"{self.source}; bandwidth overridden to {gbps:g} GB/s")

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "latency_us": self.alpha_s * 1e6,
                "bandwidth_gbps": self.bandwidth_gbps, "fabric": self.fabric,
                "source": self.source}


def _link(name: str, spec: object) -> Link:
    if not isinstance(spec, dict):
        raise PerfswarmError(f"interconnects.yaml: {name}: expected a mapping")
    try:
        bandwidth = float(spec["bandwidth_gbps"]) * float(spec.get("efficiency", 1.0))
        latency = float(spec["latency_us"])
        fabric = _FABRIC_NAMES.get(str(spec.get("fabric", "switch")))
    except (KeyError, TypeError, ValueError) as exc:
        raise PerfswarmError(f"interconnects.yaml: {name}: bad or missing field {exc}") from None
    if fabric is None or bandwidth <= 0 or latency < 0:
        raise PerfswarmError(f"interconnects.yaml: {name}: bad fabric, bandwidth or latency")
    return Link(name, latency * 1e-6, 1e-9 / bandwidth, fabric,
                str(spec.get("source", "")))


@cache
def interconnects() -> dict[str, Link]:
    """Every interconnect of the bundled YAML, by name, in file order."""
    data = bundled_mapping("perfswarm.model", "interconnects.yaml")
    return {str(name): _link(str(name), spec) for name, spec in data.items()}


def interconnect(name: str) -> Link:
    links = interconnects()
    if name not in links:
        raise PerfswarmError(f"interconnect {name!r}: unknown; known: {', '.join(links)}")
    return links[name]


@dataclass(frozen=True)
class Topology:
    """`devices` devices, `per_node` to a node on `intra`, nodes joined by `inter`."""

    devices: int
    per_node: int
    intra: Link
    inter: Link

    def __post_init__(self) -> None:
        if self.devices < 1 or self.per_node < 1:
            raise PerfswarmError(f"topology: devices ({self.devices}) and devices per node "
                                 f"({self.per_node}) must be at least 1")

    @property
    def nodes(self) -> int:
        return math.ceil(self.devices / self.per_node)

    @property
    def local(self) -> int:
        """Devices in each node (a single partial node holds all of them)."""
        return min(self.devices, self.per_node)

    def describe(self) -> str:
        if self.nodes == 1:
            return f"{self.devices} x {self.intra.name}"
        return f"{self.nodes} nodes x {self.local} ({self.intra.name}) over {self.inter.name}"


def copy_peak_gbps(spec: DeviceSpec, direction: str) -> float:
    """The most a copy in `direction` (analyze.bandwidth's) can move per second on `spec`'s
    device: its PCIe link (this file's rate for its generation) between host and device, NVLink
    between peers where it has it, its memory bandwidth on the device itself."""
    if direction in ("h2d", "d2h") or (direction == "p2p" and spec.nvlink_gbps <= 0):
        return interconnect(f"pcie{spec.pcie_gen}").bandwidth_gbps
    if direction == "p2p":
        return spec.nvlink_gbps
    return spec.memory_bandwidth / 1e9


def with_copy_peaks(bandwidth: list[dict[str, Any]],
                    devices: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """analyze's `bandwidth` (as JSON) with each flow's `peak_gbps` (copy_peak_gbps on the
    Run's device spec, None without one) set in place; `bandwidth` itself is returned."""
    spec = spec_of_devices(devices)
    for flow in (f for b in bandwidth for f in b["flows"]):
        flow["peak_gbps"] = copy_peak_gbps(spec, flow["direction"]) if spec else None
    return bandwidth
