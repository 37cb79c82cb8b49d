"""Fusion candidates, with the roofline time they save: runs of consecutive memory-bound ops whose
intermediates a fused kernel would keep on chip, and a convolution followed by a depthwise one
(the pair of a separable block), whose fused kernel never writes the intermediate map out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from perfswarm.model.opcost import OpCost, roofline
from perfswarm.model.specs import DeviceSpec

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


def _fusible(cost: OpCost | None, spec: DeviceSpec) -> bool:
    return (cost is not None and cost.family in _FUSIBLE
            and roofline(cost, spec).bound == "memory")


def fusion_candidates(costs: Sequence[OpCost | None], spec: DeviceSpec,
                      min_length: int = 2) -> list[FusionCandidate]:
    """Maximal runs of at least ``min_length`` consecutive fusible memory-bound ops (None = an op
    without a cost model, which breaks a run). The fused kernel is estimated to move the traffic of
    the run's largest op once (inputs in, result out; intermediates stay in registers)."""
    found: list[FusionCandidate] = []
    start = 0
    for end in range(len(costs) + 1):
        if end < len(costs) and _fusible(costs[end], spec):
            continue
        run = [c for c in costs[start:end] if c is not None]
        if len(run) >= min_length:
            unfused = sum(roofline(c, spec).time_s for c in run)
            fused = max(max(c.bytes for c in run) / spec.memory_bandwidth,
                        sum(c.flops for c in run) / spec.peak_for(run[0].dtype))
            found.append(FusionCandidate(start, end, tuple(c.op for c in run), unfused, fused))
        start = end + 1
    found += _conv_pairs(costs, spec)
    return sorted(found, key=lambda f: f.start)


def _conv_pairs(costs: Sequence[OpCost | None], spec: DeviceSpec) -> list[FusionCandidate]:
    """A convolution and the depthwise convolution that reads its output: fused, the map is
    written once and read once less (no faster than the slower of the two alone)."""
    found = []
    for i in range(len(costs) - 1):
        a, b = costs[i], costs[i + 1]
        if a is None or b is None or a.family not in ("conv", "depthwise_conv") \
                or b.family != "depthwise_conv":
            continue
        ra, rb = roofline(a, spec).time_s, roofline(b, spec).time_s
        fused = max(ra + rb - 2 * b.input_bytes / spec.memory_bandwidth, ra, rb)
        found.append(FusionCandidate(i, i + 2, (a.op, b.op), ra + rb, fused))
    return found
