"""Kernel times at changed shapes or on another device, from a measured time and a kernel model.

A prediction never replaces a measured kernel time by a model's absolute figure: it scales
the measured time by the model's ratio between the new and the recorded case, so the
model's error for that kernel cancels and only its trend with shape (or device) counts.
- `ProfileScaler`: a calibrated device profile (perfswarm calibrate), the local device;
- `RooflineScaler`: device specs, for GPUs: a kernel takes a fixed floor plus its roofline
  time over the efficiency it reached in the trace, so a kernel at 60% of the A100 roofline
  runs at 60% of the H100 one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

from perfswarm.model.calibrate import KernelModel, LearnedModel, Profile
from perfswarm.model.opcost import OpCost, roofline
from perfswarm.model.specs import DeviceSpec

# The profile family that prices each op family when the profile has no sweep of its own.
FALLBACK: Final[Mapping[str, str]] = {
    "conv_backward": "conv", "sdpa": "gemm", "norm": "reduction", "softmax": "reduction",
    "pool": "reduction", "conv": "gemm", "embedding_bag": "copy",
}
GPU_FLOOR_NS: Final = 2_000  # a GPU kernel's launch-to-retire floor, whatever its work
Dims = Sequence[Sequence[int]]


class KernelScaler(Protocol):
    def scaled(self, measured_ns: int, old: OpCost, new: OpCost, old_dims: Dims,
               new_dims: Dims) -> int:
        """The kernel's time at `new`, given it took `measured_ns` at `old`."""
        ...


@dataclass(frozen=True)
class ProfileScaler:
    profile: Profile

    def _model(self, family: str) -> tuple[KernelModel, bool] | None:
        """The family's model and whether it is the family's own: a stand-in family's learned
        correction reads dimensions in another layout, so only its roofline part is used."""
        if family in self.profile.models:
            return self.profile.models[family], True
        seen = family
        while seen in FALLBACK:
            seen = FALLBACK[seen]
            model = self.profile.models.get(seen)
            if model is not None:
                return (model.roofline if isinstance(model, LearnedModel) else model), False
        return None

    def scaled(self, measured_ns: int, old: OpCost, new: OpCost, old_dims: Dims,
               new_dims: Dims) -> int:
        found = self._model(old.family)
        if found is None:
            return measured_ns
        model, own = found
        before = model.predict(old, old_dims if own else ())
        after = model.predict(new, new_dims if own else ())
        return round(measured_ns * after / before)


@dataclass(frozen=True)
class RooflineScaler:
    source: DeviceSpec
    target: DeviceSpec
    floor_ns: int = GPU_FLOOR_NS

    def scaled(self, measured_ns: int, old: OpCost, new: OpCost, old_dims: Dims,
               new_dims: Dims) -> int:
        work = measured_ns - self.floor_ns
        if work <= 0:
            return measured_ns
        before = roofline(old, self.source).time_s
        after = roofline(new, self.target).time_s
        return self.floor_ns + round(work * after / before) if before > 0 else measured_ns

    def unmodelled(self, measured_ns: int, compute_bound: bool) -> int:
        """A kernel of unknown work on the target: a GEMM, convolution or attention kernel (by
        its name) scales with the FP32 peak, anything else (elementwise, reductions, layout
        changes) with memory bandwidth."""
        work = measured_ns - self.floor_ns
        if work <= 0 or self.source is self.target:
            return measured_ns
        ratio = (self.source.peak_for("fp32") / self.target.peak_for("fp32") if compute_bound
                 else self.source.memory_bandwidth / self.target.memory_bandwidth)
        return self.floor_ns + round(work * ratio)
