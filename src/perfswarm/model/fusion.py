"""Fusion candidates, with the roofline time they save: runs of consecutive memory-bound ops whose
intermediates a fused kernel would keep on chip, and two linearly connected convolutions
(depthwise -> pointwise, pointwise -> depthwise, conv -> depthwise, conv -> conv: the blocks of
MobileNets), whose fused kernel computes the intermediate map tile by tile in cache and never
writes it out.

Why a conv pair gains: run separately, the first op writes the intermediate map and the second
reads it back, from memory when the map is larger than the last-level cache (else from the cache,
at its bandwidth); fused, that traffic is gone and the pair's arithmetic intensity is its FLOPs
over only the outer input, weights and output. The pair's roofline times say how much that is
worth on the device: little when the second op is compute-bound and the map stays in cache."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from perfswarm.errors import PerfswarmError
from perfswarm.model.opcost import OpCost, Roofline, roofline
from perfswarm.model.specs import DeviceSpec

ConvKind = Literal["conv", "dw", "pw"]
# the pairs a fused kernel is generated for (depthwise -> depthwise is not one of them)
PAIR_KINDS = ("dw->pw", "pw->dw", "conv->dw", "conv->conv")
MIN_PREDICTED_SPEEDUP = 1.1  # below this the roofline says a pair does not gain
_FLOAT = 4  # fp32 bytes: the fused kernels are fp32

# Families a pointwise/row-wise fuser (e.g. torch.compile's inductor) merges into one kernel.
_FUSIBLE = frozenset({"elementwise", "norm", "softmax", "copy", "reduction"})


@dataclass(frozen=True)
class FusionCandidate:
    """ops[start:end] of the given sequence, all memory-bound on the device."""

    start: int
    end: int
    ops: tuple[str, ...]
    unfused_s: float
    fused_s: float

    @property
    def saving_s(self) -> float:
        return self.unfused_s - self.fused_s

    def to_dict(self) -> dict[str, object]:
        return {"start": self.start, "end": self.end, "ops": list(self.ops),
                "unfused_s": self.unfused_s, "fused_s": self.fused_s, "saving_s": self.saving_s}


def fusion_candidates(costs: Sequence[OpCost | None], spec: DeviceSpec,
                      min_length: int = 2) -> list[FusionCandidate]:
    """Maximal runs of at least ``min_length`` consecutive fusible memory-bound ops (None = an op
    without a cost model, which breaks a run). The fused kernel is estimated to move the traffic of
    the run's largest op once (inputs in, result out; intermediates stay in registers)."""
    # a sequence repeats its ops' cost objects: each object's roofline once (by identity: no
    # hashing of its fields for every op of the sequence)
    roofs: dict[int, tuple[Roofline, bool]] = {}
    for c in costs:
        if c is not None and id(c) not in roofs:
            r = roofline(c, spec)
            roofs[id(c)] = (r, c.family in _FUSIBLE and r.bound == "memory")
    fusible = np.array([c is not None and roofs[id(c)][1] for c in costs], np.int8)
    edge = np.diff(np.concatenate([[0], fusible, [0]]))
    found: list[FusionCandidate] = []
    for start, end in zip(np.flatnonzero(edge == 1).tolist(), np.flatnonzero(edge == -1).tolist(),
                          strict=True):
        if end - start < min_length:
            continue
        run = [c for c in costs[start:end] if c is not None]
        unfused = sum(roofs[id(c)][0].time_s for c in run)
        fused = max(max(c.bytes for c in run) / spec.memory_bandwidth,
                    sum(c.flops for c in run) / spec.peak_for(run[0].dtype))
        found.append(FusionCandidate(start, end, tuple(c.op for c in run), unfused, fused))
    found += _conv_pairs(costs, spec)
    return sorted(found, key=lambda f: f.start)


def _conv_pairs(costs: Sequence[OpCost | None], spec: DeviceSpec) -> list[FusionCandidate]:
    """Two consecutive convolutions (not both depthwise) whose second reads the first's output,
    with the pair's separate and fused roofline times (pair_prediction)."""
    found = []
    for i in range(len(costs) - 1):
        a, b = costs[i], costs[i + 1]
        if a is None or b is None or a.family not in ("conv", "depthwise_conv") \
                or b.family not in ("conv", "depthwise_conv") \
                or a.family == b.family == "depthwise_conv":
            continue
        p = pair_prediction(a, b, spec)
        if p.fused_s < p.separate_s:
            found.append(FusionCandidate(i, i + 2, (a.op, b.op), p.separate_s, p.fused_s))
    return found


@dataclass(frozen=True)
class PairPrediction:
    """The roofline of a pair of ops run separately and fused on one device."""

    first: Roofline   # each op alone, its intermediate at the bandwidth of where it lands
    second: Roofline
    intermediate_bytes: float
    cache_bytes: float
    round_trips_memory: bool  # the intermediate is larger than the last-level cache
    fused_intensity: float    # FLOPs per byte the fused kernel moves
    separate_s: float
    fused_s: float

    @property
    def speedup(self) -> float:
        return self.separate_s / self.fused_s if self.fused_s > 0 else 1.0

    @property
    def gains(self) -> bool:
        """Whether the roofline says fusing pays on this device."""
        return self.speedup >= MIN_PREDICTED_SPEEDUP

    def to_dict(self) -> dict[str, object]:
        return {"first": self.first.to_dict(), "second": self.second.to_dict(),
                "intermediate_bytes": self.intermediate_bytes, "cache_bytes": self.cache_bytes,
                "round_trips_memory": self.round_trips_memory,
                "fused_intensity": self.fused_intensity, "separate_s": self.separate_s,
                "fused_s": self.fused_s, "speedup": self.speedup, "gains": self.gains}


def _staged(cost: OpCost, intermediate: float, bandwidth: float, spec: DeviceSpec) -> Roofline:
    """An op's roofline with `intermediate` of its bytes moved at `bandwidth` (the cache's
    where the map stays there) and the rest at the memory's."""
    compute = cost.flops / spec.peak_for(cost.dtype)
    memory = (cost.bytes - intermediate) / spec.memory_bandwidth + intermediate / bandwidth
    return Roofline(max(compute, memory), compute, memory,
                    "compute" if compute >= memory else "memory")


def pair_prediction(a: OpCost, b: OpCost, spec: DeviceSpec) -> PairPrediction:
    """Op `a`, then op `b` reading a's result (b's first input): separately, each at its own
    roofline, the intermediate written by one and read by the other at the memory's bandwidth,
    or at the cache's when it fits there (and the spec knows that bandwidth); fused, the FLOPs
    of both against the traffic of the outer tensors alone."""
    mid = b.input_bytes
    in_cache = mid <= spec.l2_bytes and spec.cache_bandwidth > 0
    bandwidth = spec.cache_bandwidth if in_cache else spec.memory_bandwidth
    first, second = _staged(a, mid, bandwidth, spec), _staged(b, mid, bandwidth, spec)
    moved = a.bytes + b.bytes - 2 * mid
    fused = max((a.flops + b.flops) / spec.peak_for(a.dtype), moved / spec.memory_bandwidth)
    return PairPrediction(first, second, mid, spec.l2_bytes, mid > spec.l2_bytes,
                          (a.flops + b.flops) / moved, first.time_s + second.time_s, fused)


@dataclass(frozen=True)
class ConvLayer:
    """One 2-d convolution of a pair, fp32, 'same' padding (kernel // 2), no bias."""

    kind: ConvKind
    in_channels: int
    out_channels: int  # a depthwise layer's equal its input's
    kernel: int
    stride: int = 1

    def __post_init__(self) -> None:
        if min(self.in_channels, self.out_channels, self.kernel, self.stride) < 1:
            raise PerfswarmError(f"{self.kind}: channels, kernel and stride must be positive")
        if self.kind == "dw" and self.out_channels != self.in_channels:
            raise PerfswarmError(f"{self.label}: a depthwise conv keeps its {self.in_channels} "
                                 f"channels, not {self.out_channels}")
        if self.kind == "pw" and self.kernel != 1:
            raise PerfswarmError(f"pw: a pointwise conv is 1x1, not {self.kernel}x{self.kernel}")

    @property
    def groups(self) -> int:
        return self.in_channels if self.kind == "dw" else 1

    @property
    def padding(self) -> int:
        return self.kernel // 2

    @property
    def label(self) -> str:
        size = "" if self.kind == "pw" else f"{self.kernel}x{self.kernel}"
        return f"{self.kind}{size}" + (f"/s{self.stride}" if self.stride > 1 else "")

    def out_size(self, size: int) -> int:
        return (size + 2 * self.padding - self.kernel) // self.stride + 1

    def weight_shape(self) -> tuple[int, int, int, int]:
        return (self.out_channels, self.in_channels // self.groups, self.kernel, self.kernel)

    def cost(self, batch: int, height: int, width: int) -> OpCost:
        """FLOPs and bytes at this input size (stride and padding exact, unlike a trace's
        shapes, which carry neither)."""
        out = batch * self.out_channels * self.out_size(height) * self.out_size(width)
        k, c_group = self.kernel, self.in_channels // self.groups
        x = batch * self.in_channels * height * width
        weights = self.out_channels * c_group * k * k
        return OpCost("conv2d", "depthwise_conv" if self.kind == "dw" else "conv",
                      2.0 * out * c_group * k * k, float(_FLOAT * (x + weights + out)), "fp32",
                      float(_FLOAT * weights), True, float(_FLOAT * x))


@dataclass(frozen=True)
class ConvPair:
    """Two convolutions, the second reading the first's output, on an NCHW input."""

    batch: int
    height: int
    width: int
    first: ConvLayer
    second: ConvLayer

    def __post_init__(self) -> None:
        """Shapes that do not chain are refused here, wherever the pair came from."""
        if min(self.batch, self.height, self.width) < 1:
            raise PerfswarmError(f"{self.first.label}: N, H and W must be positive")
        if self.second.in_channels != self.first.out_channels:
            raise PerfswarmError(
                f"{self.first.label} -> {self.second.label}: shapes do not chain: the first "
                f"makes {self.first.out_channels} channels, the second reads "
                f"{self.second.in_channels}")
        if min(*self.mid_size, *self.out_size) < 1:
            raise PerfswarmError(
                f"{self.first.label} -> {self.second.label}: shapes do not chain: "
                f"{self.height}x{self.width} is too small for the kernels")
        if self.kind not in PAIR_KINDS:
            raise PerfswarmError(f"{self.first.label} -> {self.second.label}: not a fusible pair; "
                                 f"one of {', '.join(PAIR_KINDS)}")

    @property
    def kind(self) -> str:
        """One of PAIR_KINDS for a fusible pair (a pointwise conv counts as a conv next to
        anything but a depthwise one)."""
        a, b = self.first.kind, self.second.kind
        if a == "dw" or b == "dw":
            return f"{a}->{b}"
        return "conv->conv"

    @property
    def mid_size(self) -> tuple[int, int]:
        return self.first.out_size(self.height), self.first.out_size(self.width)

    @property
    def out_size(self) -> tuple[int, int]:
        h, w = self.mid_size
        return self.second.out_size(h), self.second.out_size(w)

    @property
    def label(self) -> str:
        """E.g. ``dw3x3 -> pw N=1 C=128 H=56 W=56 K=128``."""
        return (f"{self.first.label} -> {self.second.label} N={self.batch} "
                f"C={self.first.in_channels} H={self.height} W={self.width} "
                f"K={self.second.out_channels}")

    def costs(self) -> tuple[OpCost, OpCost]:
        return (self.first.cost(self.batch, self.height, self.width),
                self.second.cost(self.batch, *self.mid_size))

    def predict(self, spec: DeviceSpec) -> PairPrediction:
        return pair_prediction(*self.costs(), spec)
