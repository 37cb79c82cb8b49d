"""Fusion candidates: runs of consecutive memory-bound ops whose intermediates a fused kernel would
keep on chip, with the roofline time that saves."""

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
    return found
