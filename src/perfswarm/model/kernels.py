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

import functools
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Final, Protocol

from perfswarm.model.opcost import (
    MATRIX_FAMILIES,
    REDUCED_DTYPES,
    RNN_FAMILIES,
    OpCost,
    channel_blocked,
    inner_parts,
    roofline,
)
from perfswarm.model.profile import KernelModel, LearnedModel, Profile
from perfswarm.model.specs import DeviceSpec

# The profile family that prices each op family when the profile has no sweep of its own.
FALLBACK: Final[Mapping[str, str]] = {
    "conv_backward": "conv", "depthwise_conv": "conv", "sdpa": "gemm", "sdpa_backward": "gemm",
    "rnn": "gemm", "rnn_backward": "gemm", "norm": "reduction",
    "softmax": "reduction", "pool": "reduction", "conv": "gemm", "embedding_bag": "copy",
    "gather": "copy",
}
GPU_FLOOR_NS: Final = 2_000  # a GPU kernel's launch-to-retire floor, whatever its work
SMALL_OP_S: Final = 20e-6  # ops the profile prices under this are mostly fixed cost
# The families whose op, when the run took it longer than its own sweep's model and the run's
# offset, ran a layout the sweep did not, at a time per element: a reduction (the sweep reduces
# contiguous rows) over a strided dimension, as a norm over the channels of [B, C, H, W] (the
# U-Net's RMSNorm: 0.62 ms a call alone where the same elements reduced contiguously take 10.5
# us, and x1.7-2.1 at twice the batch). Not elementwise ops: GELU's excess over its model is
# partly a fixed time per call (alone, [8, 40, 32] 23.5 us, x2.21 at four times the batch), and
# scaled as work it had made the MLP-Mixer's step x1.77-1.79 at four times the batch where its
# prediction had been x1.55-1.57 and paired steps ran x1.60 (docs/benchmarks.md, thirty-first pass)
SLOW_PATH_FAMILIES: Final = frozenset({"reduction"})
WARM_SHARE: Final = 0.5  # the weight of a warm sweep's time: inputs as likely cached as not
# A bf16 or fp16 matrix product or convolution that took this many times what the profile's
# float32 model gives its shape ran a conversion path, not units for its dtype: on the 2-core
# AVX2 VM (no avx512_bf16, AMX) bf16 took 6.7-46x float32's time (a weight gradient's kernel
# 2.2-4.7x), its rate in one layout held from 16 to 64 rows (nn.Linear's addmm 6.3-8.2 and
# 5.6-5.7 GFLOP/s in two runs, row-major mm 1.28-1.36 and 0.48-0.67), where float32's rose
# (addmm 55 -> 70, 40 -> 57): docs/benchmarks.md, thirty-first pass
REDUCED_SLOW: Final = 3.0
Dims = Sequence[Sequence[int]]


class KernelScaler(Protocol):
    def scaled(self, measured_ns: int, old: OpCost, new: OpCost, old_dims: Dims,
               new_dims: Dims) -> int:
        """The kernel's time at `new`, given it took `measured_ns` at `old`."""
        ...


@dataclass(frozen=True)
class ProfileScaler:
    """A calibrated profile, plus what an op costs in the recorded run beyond what the sweep
    saw: a fixed time per op type (`offsets`, seconds), read off the run's small ops, where
    work is no part of it (ops run between other ops: caches, dispatch, the profiler)."""

    profile: Profile
    offsets: Mapping[str, float] = field(default_factory=dict)

    def _family(self, family: str) -> tuple[str, bool] | None:
        """The profile family that prices `family`, and whether it is the family's own: a
        stand-in family's learned correction reads dimensions in another layout, so only its
        roofline part is used."""
        seen = family
        while seen not in self.profile.models:
            if seen not in FALLBACK:
                return None
            seen = FALLBACK[seen]
        return seen, seen == family

    def model_time(self, cost: OpCost, dims: Dims) -> float | None:
        """The profile's time (s) of `cost`, with no offset; None without a model for it. A
        family swept warm too takes the geometric mean of its cold and warm times
        (WARM_SHARE): whether an op's inputs are still in cache depends on what ran since they
        were written, which the trace does not tell, and the mean bends at the cache's size
        as a step's ops do, half as far as the warm sweep. An LSTM layer the profile swept
        (families rnn and rnn_backward) takes its own model; one it did not (a profile from
        before those sweeps), or ATen's own convolution, is the sum of the ops it runs inside
        (`inner_parts`), each priced by its own family; a convolution at the channels its
        kernel computes (`channel_blocked`: the sweep's are whole blocks)."""
        parts = None if self._swept_layer(cost.family) else inner_parts(cost, dims)
        if parts:
            times = [(n, self.model_time(part, tuple(map(tuple, d)))) for n, part, d in parts]
            return None if any(t is None for _, t in times) else sum(
                n * (t or 0.0) for n, t in times)
        found = self._family(cost.family)
        if found is None:
            return None
        family, own = found
        cost = channel_blocked(cost, dims, self.profile.lanes)

        def time(model: KernelModel) -> float:
            if own:
                return model.predict(cost, dims)
            return (model.roofline if isinstance(model, LearnedModel) else model).predict(cost)

        cold = time(self.profile.models[family])
        warm = self.profile.warm.get(family)
        if warm is None:
            return cold
        return float(cold ** (1 - WARM_SHARE) * time(warm) ** WARM_SHARE)

    def by_work(self, cost: OpCost, dims: Dims, seconds: float) -> bool:
        """Whether an op that took `seconds` at `cost` is priced by its work at the rate it ran
        (`scaled`): a bf16 or fp16 matrix product or convolution (MATRIX_FAMILIES) that took
        REDUCED_SLOW times the profile's time of its shape or more. The profile sweeps float32
        alone (SWEPT_DTYPE); such an op runs a conversion path whose time grows as its FLOPs
        (rates measured at 16 to 64 rows), where the float32 model's rate rises with size: a
        bf16-autocast MLP at twice the batch was predicted x1.39-1.43 and ran x2.04. One no
        slower than that ran on units for its dtype, whose scaling the float32 model stands
        for."""
        slow = self.slow_from(cost, dims)
        return slow is not None and seconds >= slow

    def slow_from(self, cost: OpCost, dims: Dims) -> float | None:
        """The time (s) from which an op of `cost` is priced by its work (`by_work`):
        REDUCED_SLOW times the profile's time of its shape; None for an op never so priced
        (no bf16 or fp16 matrix product or convolution, or no model of it)."""
        if cost.dtype not in REDUCED_DTYPES or cost.family not in MATRIX_FAMILIES or (
                cost.flops <= 0):
            return None
        model = self.model_time(cost, tuple(map(tuple, dims)))
        return None if model is None else REDUCED_SLOW * model

    def with_offsets(self, samples: Sequence[tuple[OpCost, Dims, float]]) -> ProfileScaler:
        """Offsets from (cost, dims, typical measured seconds) of a run's ops: per op type,
        the median excess over the model of the ops both the model and the run put under
        SMALL_OP_S (an op the run measured far longer is work the model underrates, which
        grows with the op, not a fixed cost), but ops priced by their work (`by_work`), whose
        excess is a slower path's."""
        excess: dict[str, list[float]] = {}
        model_time = functools.cache(self.model_time)  # samples repeat: one per kernel
        for cost, dims, seconds in samples:
            model = model_time(cost, tuple(map(tuple, dims)))
            if (model is not None and model < SMALL_OP_S and seconds < SMALL_OP_S
                    and not self.by_work(cost, dims, seconds)):
                excess.setdefault(cost.family, []).append(seconds - model)
        return replace(self, offsets={f: max(0.0, statistics.median(v))
                                      for f, v in excess.items()})

    @staticmethod
    def _slow_path(cost: OpCost, seconds: float, model_s: float) -> bool:
        """Whether an op of a family the profile swept itself took a path its sweep did not,
        whose time is work (SLOW_PATH_FAMILIES): one the run measured at SMALL_OP_S or more
        (no op mostly of fixed cost) and longer than its model and the run's offset
        (`model_s`). Scaled by the model's ratio, the sweep's fixed part and the run's offset a
        share of it, the U-Net's RMSNorm norms had read x1.22-1.53 at twice the batch, and its
        step x1.59 where it ran x1.78 in CPU time (docs/benchmarks.md, thirty-first pass)."""
        return (cost.family in SLOW_PATH_FAMILIES and seconds >= SMALL_OP_S
                and seconds > model_s)

    def _swept_layer(self, family: str) -> bool:
        """Whether `family` is an LSTM layer's (or its backward's) that the profile swept
        itself (families rnn and rnn_backward), not one priced by its parts."""
        return family in RNN_FAMILIES and family in self.profile.models

    def _fixed_s(self, family: str) -> float | None:
        """The fixed time per call of the model pricing `family`: its roofline's intercept
        (None for a layer priced as the ops inside it, whose sum has no one intercept)."""
        found = self._family(family) if family not in RNN_FAMILIES else None
        if found is None:
            return None
        model = self.profile.models[found[0]]
        return (model.roofline if isinstance(model, LearnedModel) else model).coef[0]

    def scaled(self, measured_ns: int, old: OpCost, new: OpCost, old_dims: Dims,
               new_dims: Dims) -> int:
        """The measured time at the new shapes: times the model's ratio (the run's offset on
        both sides) for an op type the profile swept itself, whose scaling with shape, fixed
        part included, the model knows. An op priced by a stand-in of another type (a pool or
        a norm by the reduction sweep, a convolution's backward by the convolution's) keeps
        its fixed part (the stand-in's time per call and the run's offset) and scales the rest
        as the stand-in's work: a CPU max pool at 46x its stand-in, a 1-D conv's batch norms
        at 10-20x, is work the stand-in underrates (the measured time times the ratio had
        grown them x1.9-2.9 for four times the batch, where they ran x3.4-4.4), where a small
        GEMM's excess over its own model is no work (scaled as work, a GRU's [144, B] x [B, 48]
        weight gradient read x3.97 at four times the batch, and ran x1.42). So does a reduction
        the run took on a slower path than its own sweep's (`_slow_path`). Where the run took
        no longer than the fixed part, the whole scales by the ratio.

        An LSTM layer or its backward (families rnn, rnn_backward) priced by its parts (a
        profile without the layer's own sweeps) keeps what it took beyond them, and only the
        parts' time changes: that excess is the time of oneDNN's RNN primitive that is no GEMM
        or gate pass, spent per call whatever the shapes (descriptors made, weights reordered,
        memory allocated and freed: at one time step, B 8 and H 40 or 80, a call took
        176-268 us where its parts are priced 13-55 us); scaled with the parts, it had made
        the layer too steep in H and T (x2.52 for twice the width at T 35, B 8, H 40, where it
        ran x1.85). Priced by its own sweep, whose model holds that time per call, the layer
        scales by the model's ratio, as every op type the profile swept does: what it takes
        in a step beyond the layer alone (an LSTM LM's layer 1.1-1.9x alone) grows with it.
        Measured in one process at both configurations, the LM's layer ran x1.53-1.70 at
        twice the batch (alone x1.50-1.58, the model x1.55-1.67), x1.96-2.28 at twice the
        width (alone x2.11-2.12, the model x2.20-2.23); held, that excess had made the
        layer x1.31-1.35 and x1.65, the LM's step x1.38 where it ran x1.52-1.63 and
        x1.51-1.65 (docs/benchmarks.md, twenty-ninth pass).

        A bf16 or fp16 matrix product or convolution on a slower path than the float32 model's
        (`by_work`) scales by its FLOPs: the rate it ran at in the Run, held.
        """
        if self.by_work(old, old_dims, measured_ns * 1e-9):
            return round(measured_ns * new.flops / old.flops)
        before, after = self.model_time(old, old_dims), self.model_time(new, new_dims)
        if before is None or after is None:
            return measured_ns
        if (old.family in RNN_FAMILIES and not self._swept_layer(old.family)
                and measured_ns * 1e-9 > before):
            return round(measured_ns + (after - before) * 1e9)
        offset = self.offsets.get(old.family, 0.0)
        per_call = self._fixed_s(old.family)
        fixed = (per_call or 0.0) + offset
        found = self._family(old.family)
        own = found is not None and found[1] and not self._slow_path(
            old, measured_ns * 1e-9, before + offset)
        if (per_call is None or own
                or measured_ns * 1e-9 <= fixed or min(before, after) <= per_call):
            return round(measured_ns * (after + offset) / (before + offset))
        work = (after - per_call) / (before - per_call)
        return round(fixed * 1e9 + (measured_ns - fixed * 1e9) * work)


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

    def unmodelled(self, measured_ns: int, compute_bound: bool, dtype: str = "fp32") -> int:
        """A kernel of unknown work on the target: a GEMM, convolution or attention kernel (by
        its name) scales with the peak of its `dtype` (tf32: FP32 data on tensor cores),
        anything else (elementwise, reductions, layout changes) with memory bandwidth."""
        work = measured_ns - self.floor_ns
        if work <= 0 or self.source is self.target:
            return measured_ns
        ratio = (self.source.peak_for(dtype) / self.target.peak_for(dtype) if compute_bound
                 else self.source.memory_bandwidth / self.target.memory_bandwidth)
        return self.floor_ns + round(work * ratio)
