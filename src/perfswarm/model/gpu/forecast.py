"""GPU kernel times on another GPU (or at other shapes) from the learned kernel model: the
KernelScaler predict uses for GPU runs, and the device time of an op graph."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from perfswarm.model.gpu.aten import kernels, op_kernels
from perfswarm.model.gpu.hardware import Hardware
from perfswarm.model.gpu.learned import KernelModel, bundled
from perfswarm.model.gpu.work import Work, launched
from perfswarm.model.kernels import GPU_FLOOR_NS, Dims, RooflineScaler
from perfswarm.model.opcost import OpCost, Shapes
from perfswarm.model.specs import DeviceSpec

# Kernel families that move to another GPU at the model's own time there, not at its ratio
# applied to the measured kernel. Each GPU left out, seeds 0-2, the whole models from another
# GPU's Run (benchmarks/gpu_label_runs.py's "from run", mean |error| of the e2e over the 29
# cases): every family by the ratio 8.79%, layer norms absolute 8.78% (closer at each seed, by
# 0.01 point: 0.7% of the labels' node time), GEMMs absolute 9.96%, elementwise 8.82%,
# softmax 8.87%, every family absolute 10.78%. Against the nodes' own latencies (its
# decomposition) the absolute time is the closer for GEMMs (10.4% vs 11.3%), elementwise
# (4.2% vs 5.0%) and softmax (4.0% vs 5.1%), the ratio for layer norms (11.6% vs 13.5%); a
# forecast from a run is the source's e2e times the moved over the measured kernels, and the
# ratio carries the source's e2e over its nodes' sum (0.89 on the A100, 0.95 on the V100) to
# the target where an absolute time does not (docs/benchmarks.md, twenty-eighth pass).
ABSOLUTE: Final = frozenset({"norm"})
# torch's multi_tensor_apply (ATen/native/cuda/MultiTensorApply.cuh), which the foreach and
# fused optimizers launch: at most this many tensors per launch by the number of tensor lists
# (1 to 5), and 320 chunks of 65,536 elements
MAX_TENSORS: Final = (110, 64, 48, 36, 30)
LAUNCH_ELEMENTS: Final = 320 * 65_536


@dataclass(frozen=True)
class LearnedScaler:
    """Kernel times from the learned model: a recorded kernel's time times the model's ratio
    between the new case on the target and the recorded case on the source (the ratio keeps a
    kernel exactly as measured when nothing changes), or, moved to another GPU, the model's
    own time there for the families (`ABSOLUTE`) where that is closer; kernels whose op the
    model cannot price move with the roofline (`roofline`). `given`: the model to price with,
    None for the bundled one, loaded when a kernel is first priced (a GPU Run predicted at its
    recorded configuration keeps every kernel as measured and never loads it)."""

    source: Hardware
    target: Hardware
    roofline: RooflineScaler
    given: KernelModel | None = None
    floor_ns: int = GPU_FLOOR_NS

    @classmethod
    def of(cls, source: DeviceSpec, target: DeviceSpec,
           model: KernelModel | None = None) -> LearnedScaler:
        return cls(Hardware.of_spec(source), Hardware.of_spec(target),
                   RooflineScaler(source, target), model)

    @property
    def model(self) -> KernelModel:
        return self.given or bundled()

    def seconds(self, cost: OpCost, dims: Dims, hw: Hardware) -> float | None:
        """The model's time of the op's kernels as `hw` runs them (Hardware.runs; no launch
        floor); None where it has no model for them."""
        works = kernels(hw.runs(cost), dims)
        if not works or any(w.family not in self.model.families for w in works):
            return None
        return float(self.model.seconds(works, hw).sum())

    def scaled(self, measured_ns: int, old: OpCost, new: OpCost, old_dims: Dims,
               new_dims: Dims) -> int:
        if (old, old_dims, self.source) == (new, new_dims, self.target):
            return measured_ns  # the recorded op on the recorded GPU (a replay, a report)
        after = self.seconds(new, new_dims, self.target)
        before = self.seconds(old, old_dims, self.source)
        if after is None or before is None:
            return self.roofline.scaled(measured_ns, old, new, old_dims, new_dims)
        if self.source != self.target and all(
                w.family in ABSOLUTE for w in kernels(new, new_dims) or []):
            return self.floor_ns + round(after * 1e9)
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
    model cannot price. FP32 work on tensor cores runs as `target` runs it (Hardware.runs).
    A convolution whose
    reduction the library splits over `target`'s idle SMs gets the kernel that sums the
    slices (work.launched; a GEMM's is inside its learned price)."""
    model = model or bundled()
    hw = Hardware.of_spec(target)
    found = [op_kernels(name, shapes, tensor, hw) for name, shapes, tensor in ops]
    found = [launched(works, hw) if works else works for works in found]
    priced = [works if works and all(w.family in model.families for w in works) else None
              for works in found]
    # every op's kernels at once: the model's trees run once per family and device
    flat = [w for works in priced if works for w in works]
    times = model.seconds(flat, hw)
    out: list[tuple[float, str] | None] = []
    at = 0
    for works in priced:
        if works is None:
            out.append(None)
            continue
        mine, at = times[at:at + len(works)], at + len(works)
        out.append((float(mine.sum()) + len(works) * GPU_FLOOR_NS * 1e-9,
                    works[int(mine.argmax())].family))
    return out


@dataclass(frozen=True)
class MultiTensor:
    """Ops that one multi-tensor op does on a GPU (torch's foreach kernels: an optimizer's
    per-parameter updates, clip_grad_norm_'s norms; one op name over many tensors): its time on
    the target (launch floors included), the family, and how many launches it takes."""

    seconds: float
    family: str
    launches: int


def multi_tensor_seconds(ops: Sequence[tuple[str, Shapes]], target: DeviceSpec,
                         model: KernelModel | None = None) -> MultiTensor | None:
    """The per-tensor ops `ops` (one name, one tensor each) as the multi-tensor kernels that do
    them together: their elements streamed in launches of at most MAX_TENSORS tensors (by the
    op's tensor inputs) and LAUNCH_ELEMENTS elements; None when the model cannot price them."""
    model = model or bundled()
    found = [op_kernels(name, shapes) for name, shapes in ops]
    works = [w for ws in found if ws is not None for w in ws]
    if not ops or any(ws is None for ws in found) or not works or any(
            w.family not in model.families for w in works):
        return None
    first = works[0]
    elements = sum(w.b * w.m * w.n for w in works)
    depth = min(len(MAX_TENSORS), max(1, sum(1 for d in ops[0][1].dims if d)))
    launches = max(math.ceil(len(ops) / MAX_TENSORS[depth - 1]),
                   math.ceil(elements / LAUNCH_ELEMENTS))
    cols = max(w.n for w in works)
    each = Work(first.family, first.kind, sum(w.flops for w in works) / launches,
                sum(w.bytes for w in works) / launches, 1,
                max(1, math.ceil(elements / launches / cols)), cols, 1, first.peak)
    seconds = float(model.seconds([each], Hardware.of_spec(target)).sum())
    return MultiTensor(launches * (seconds + GPU_FLOOR_NS * 1e-9), first.family, launches)
