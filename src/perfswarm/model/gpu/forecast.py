"""GPU kernel times on another GPU (or at other shapes) from the learned kernel model: the
KernelScaler predict uses for GPU runs, and the device time of an op graph."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from perfswarm.model.gpu.aten import kernels, op_kernels
from perfswarm.model.gpu.hardware import Hardware
from perfswarm.model.gpu.learned import KernelModel, bundled
from perfswarm.model.kernels import GPU_FLOOR_NS, Dims, RooflineScaler
from perfswarm.model.opcost import OpCost, Shapes
from perfswarm.model.specs import DeviceSpec


@dataclass(frozen=True)
class LearnedScaler:
    """Kernel times from the learned model: a recorded kernel's time times the model's ratio
    between the new case on the target and the recorded case on the source (rather than the
    model's absolute time: benchmarks/gpu_forecast.py finds the two about as good on whole
    models, and the ratio keeps a kernel exactly as measured when nothing changes); kernels
    whose op the model cannot price move with the roofline (`roofline`)."""

    source: Hardware
    target: Hardware
    roofline: RooflineScaler
    model: KernelModel
    floor_ns: int = GPU_FLOOR_NS

    @classmethod
    def of(cls, source: DeviceSpec, target: DeviceSpec,
           model: KernelModel | None = None) -> LearnedScaler:
        return cls(Hardware.of_spec(source), Hardware.of_spec(target),
                   RooflineScaler(source, target), model or bundled())

    def seconds(self, cost: OpCost, dims: Dims, hw: Hardware) -> float | None:
        """The model's time of the op's kernels on `hw` (no launch floor); None where it has
        no model for them."""
        works = kernels(cost, dims)
        if not works or any(w.family not in self.model.families for w in works):
            return None
        return float(self.model.seconds(works, hw).sum())

    def scaled(self, measured_ns: int, old: OpCost, new: OpCost, old_dims: Dims,
               new_dims: Dims) -> int:
        after = self.seconds(new, new_dims, self.target)
        # at the recorded op on the recorded GPU (a replay, a report) the two are one case
        same = (old, old_dims, self.source) == (new, new_dims, self.target)
        before = after if same else self.seconds(old, old_dims, self.source)
        if after is None or before is None:
            return self.roofline.scaled(measured_ns, old, new, old_dims, new_dims)
        work = measured_ns - self.floor_ns
        if work <= 0 or before <= 0:
            return measured_ns
        return self.floor_ns + round(work * after / before)

    def unmodelled(self, measured_ns: int, compute_bound: bool, dtype: str = "fp32") -> int:
        return self.roofline.unmodelled(measured_ns, compute_bound, dtype)


def op_seconds(ops: Sequence[tuple[str, Shapes, bool]], target: DeviceSpec,
               model: KernelModel | None = None) -> list[tuple[float, str] | None]:
    """Per (aten name, shapes, on tensor cores) op: its kernels' predicted time on `target`
    (launch floor included per kernel) and the family of the largest; None for an op the
    model cannot price."""
    model = model or bundled()
    hw = Hardware.of_spec(target)
    out: list[tuple[float, str] | None] = []
    for name, shapes, tensor in ops:
        works = op_kernels(name, shapes, tensor)
        if not works or any(w.family not in model.families for w in works):
            out.append(None)
            continue
        times = model.seconds(works, hw)
        family = works[int(times.argmax())].family
        out.append((float(times.sum()) + len(works) * GPU_FLOOR_NS * 1e-9, family))
    return out
