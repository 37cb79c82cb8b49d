"""A Run recorded on a CPU (or any op graph with shapes) forecast on a GPU: every innermost
aten op with shapes becomes the GPU kernels it would launch, priced by the learned model, and
the host launches them at the per-op time of a GPU host; the device runs them in order.

The host's time per op (`HOST_OP_NS`: a launching op's median duration, its launch call
included; `LAUNCH_NS` the call alone) is that of the corpus's GPU training trace, the A100
DDP run of ../shared/corpus (the MI250 one shows 39 us; `host_overheads` recomputes them from
a Run, and a test checks the constants against the corpus trace). A profiled op's host time:
the forecast carries the profiler's overhead, as the traces it compares with do.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass, field, replace
from typing import Final

import numpy as np

from perfswarm.analyze.dependencies import enclosing_ops, enclosing_rows
from perfswarm.analyze.frame import Events, group_rows, lane_key
from perfswarm.analyze.iterations import top_level
from perfswarm.analyze.phases import OPTIMIZER, optimizer_calls, phases
from perfswarm.model.gpu.forecast import multi_tensor_seconds, op_seconds
from perfswarm.model.gpu.learned import KernelModel
from perfswarm.model.opcost import RNN_FAMILIES, Shapes, data_cost
from perfswarm.model.specs import DeviceSpec

HOST_OP_NS: Final = 51_761
LAUNCH_NS: Final = 9_713
ZEROING: Final = frozenset({"aten::zero_", "aten::fill_"})  # an op setting up its output
# ... or, before a product accumulates into it, copying its addend there (addmm's bias,
# expanded: CUDA's addmm runs that copy, then the GEMM with beta 1, as the CPU's does)
SETUP: Final = ZEROING | {"aten::copy_"}
PRODUCTS: Final = frozenset({"gemm", "conv", "depthwise_conv", "conv_backward", "sdpa"})
# torch's own ops and autograd's nodes: an unpriced one is a view, a wrapper or a dispatch
NATIVE: Final = ("aten::", "autograd::", "torch::autograd::", "Optimizer.", "c10d::")
PARAMETER_LOOP: Final = 8  # consecutive ops of one name over parameters: a loop over them
LAUNCHES: Final = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "hipLaunchKernel",
                   "hipExtLaunchKernel")


def host_overheads(ev: Events) -> tuple[int, int]:
    """(median duration of the innermost ops that launch kernels, median launch call) of a
    GPU Run's events."""
    launch = [i for i, n in enumerate(ev.names) if n in LAUNCHES]
    calls = np.flatnonzero(ev.of_kind("runtime", "driver") & np.isin(ev.name, launch))
    ops = np.unique(enclosing_rows(ev, calls)[1])
    if len(calls) == 0 or len(ops) == 0:
        return 0, 0
    return int(np.median(ev.dur[ops])), int(np.median(ev.dur[calls]))


@dataclass(frozen=True)
class StepForecast:
    predicted_ns: int
    device_ns: int
    families_ns: dict[str, int]
    unpriced: Counter[str]
    host_ns: dict[str, int]  # the host's time by part: python, dispatch, launch
    left_out: Counter[str] = field(default_factory=Counter)  # unforecast's, ns by op name


def innermost_ops(ev: Events, shapes: Callable[[int], Shapes | None], lo: int, hi: int
                  ) -> list[int]:
    """Rows of the aten ops in [lo, hi) with shapes and a cost model that enclose no other
    such op on their thread (aten::linear's addmm, not the linear), in start order; an op
    that encloses only the zeroing of its output (ZEROING: max_pool2d_with_indices_backward,
    nll_loss_backward), or a product that encloses only that or the copy of its addend
    (SETUP: addmm's bias), runs its own kernel after it, and counts too (the bias's copy had
    been every Linear's forward on a GPU, its GEMM dropped)."""
    rows = np.flatnonzero(ev.of_kind("cpu_op") & (ev.ts >= lo) & (ev.ts < hi))
    costed = [r for r in rows.tolist() if ev.name_of(r).startswith("aten::")
              and (s := shapes(r)) is not None and data_cost(ev.name_of(r), s) is not None]
    lanes = sorted(costed, key=lambda r: (int(ev.rank[r]), int(ev.tid[r]), int(ev.ts[r]),
                                          -int(ev.end[r])))
    family = {r: cost.family for r in costed
              if (cost := data_cost(ev.name_of(r), shapes(r) or Shapes((), ()))) is not None}

    def runs_own_kernel(r: int, a: int) -> bool:
        """Whether r, enclosing a, still runs a kernel of its own: a is its setup (SETUP,
        ZEROING), or a copy of an input into the layout r wants (contiguous, clone, to: a
        convolution backward's gradient, a clamp's bounds), or, in a product or a recurrent
        layer, an elementwise op on the way (an LSTM layer's bias sum): a copy around copies
        passes the work on, as a wrapper around its own family (linear around addmm) does.
        (Left out, 4 of 9 convolution backwards of a ResNet, every attention backward of a
        ViT and every LSTM layer had left their kernels unpriced.)"""
        name = ev.name_of(r)
        if name in SETUP:
            return False
        heavy = family.get(r) in (*PRODUCTS, *RNN_FAMILIES)
        return (ev.name_of(a) in (SETUP if heavy else ZEROING)
                or (family.get(a) == "copy" and family.get(r) not in (None, "copy"))
                or (heavy and family.get(a) == "elementwise"))

    outer = set()
    for i, r in enumerate(lanes):
        for a in lanes[i + 1:]:
            if (ev.rank[a], ev.tid[a]) != (ev.rank[r], ev.tid[r]) or ev.ts[a] >= ev.end[r]:
                break  # past what r encloses
            if not runs_own_kernel(r, a):
                outer.add(r)
                break
    return [r for r in costed if r not in outer]


def unforecast(ev: Events, costed: Set[int], lo: int, hi: int) -> Counter[str]:
    """ns by name of the outermost ops in [lo, hi) (per thread) of another library than torch's
    own (NATIVE) that hold none of `costed` (the step's innermost ops with shapes and a cost
    model, innermost_ops, which op_graph_steps finds once), themselves included:
    work the forecast has no GPU kernel for (an int8 quantized linear, a custom op), which it
    leaves out."""
    rows = np.flatnonzero(ev.of_kind("cpu_op") & (ev.ts >= lo) & (ev.ts < hi))
    out: Counter[str] = Counter()
    for thread in group_rows(lane_key(ev.rank[rows], ev.tid[rows]), rows).values():
        lane = thread[np.lexsort((-ev.end[thread], ev.ts[thread]))]
        held = np.array(sorted(int(ev.ts[r]) for r in lane if int(r) in costed), np.int64)
        for r in lane[top_level(ev.ts[lane], ev.end[lane])].tolist():
            inside = np.searchsorted(held, ev.end[r]) - np.searchsorted(held, ev.ts[r])
            if not inside and int(r) not in costed and not ev.name_of(r).startswith(NATIVE):
                out[ev.name_of(r)] += int(ev.dur[r])
    return out


def _top_level_ns(ev: Events, rows: Sequence[int]) -> int:
    """Time of the ops among `rows` that no other of them encloses (per thread)."""
    total, lane, end = 0, None, 0
    for r in sorted(rows, key=lambda r: (int(ev.rank[r]), int(ev.tid[r]), int(ev.ts[r]),
                                         -int(ev.end[r]))):
        if (ev.rank[r], ev.tid[r]) != lane:
            lane, end = (ev.rank[r], ev.tid[r]), 0
        if ev.ts[r] >= end:
            total += int(ev.dur[r])
            end = int(ev.end[r])
    return total


@dataclass(frozen=True)
class Precision:
    """How an FP32 matrix product and an FP32 convolution run on a CUDA GPU: on TF32 tensor
    cores or not. A recorded process's own settings when it had set them by its profiling
    window (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32: the
    recorder writes them down even on a CPU, where they change nothing), else torch's defaults:
    matrix products in full FP32, convolutions on TF32."""

    matmul_tf32: bool = False
    conv_tf32: bool = True
    recorded: bool = False  # read off the recording, not torch's defaults

    @classmethod
    def of_record(cls, record: Mapping[str, object]) -> Precision:
        """From a Run's `manifest.extra.record` (`fp32_matmul`, `fp32_conv`: "tf32" or
        "ieee"), torch's defaults where it has none."""
        matmul, conv = record.get("fp32_matmul"), record.get("fp32_conv")
        if matmul is None and conv is None:
            return cls()
        return cls(matmul == "tf32", conv != "ieee", True)

    def describe(self) -> str:
        def how(tf32: bool) -> str:
            return "on TF32 tensor cores" if tf32 else "in full FP32"

        where = "as the recorded process had set them" if self.recorded else "torch's defaults"
        return (f"on the GPU, FP32 matrix products run {how(self.matmul_tf32)} and "
                f"convolutions {how(self.conv_tf32)} ({where})")

    def tensor_cores(self, family: str) -> bool:
        if family == "gemm":
            return self.matmul_tf32
        return self.conv_tf32 and family in ("conv", "depthwise_conv", "conv_backward")


@dataclass(frozen=True)
class _Launch:
    """What the host launches in the forecast, in order: one op, or the ops of a loop over
    tensors that one multi-tensor op does on a GPU (`multi_tensor_groups`)."""

    name: str
    seconds: float | None  # on the device, launch floors included; None: unpriced
    family: str
    launches: int  # host dispatches it costs


def multi_tensor_groups(ev: Events, rows: Sequence[int],
                        shapes: Callable[[int], Shapes | None],
                        parameters: Set[tuple[int, ...]] = frozenset()
                        ) -> tuple[list[int], list[list[int]]]:
    """`rows` (in start order) split into the ops that launch on their own and the groups that
    one multi-tensor op does on a CUDA GPU, where a CPU loops over the tensors: inside the
    optimizer (analyze.phases: an `Optimizer.` range), one group per op name in first-seen
    order (torch.optim's foreach default, or fused); outside it, a run of PARAMETER_LOOP or more
    consecutive ops of one name on one thread, each on a tensor of a parameter's shape (a loop
    over the parameters or their gradients: torch.nn.utils.clip_grad_norm_'s norms and scaling,
    foreach on CUDA)."""
    phase = phases(ev, np.asarray(rows, np.int64))
    alone: list[int] = []
    groups: dict[str, list[int]] = {}
    for r, p in zip(rows, phase, strict=True):
        if p == OPTIMIZER:
            groups.setdefault(ev.name_of(r), []).append(r)
        else:
            alone.append(r)

    def on_parameter(r: int) -> bool:
        found = shapes(r)
        first = next((tuple(d) for d in found.dims if d), None) if found else None
        return first in parameters

    # consecutive ops alike: one name, one thread, on a parameter's shape or not
    kept: list[int] = []
    loops: list[list[int]] = []
    keys = [(int(ev.name[r]), int(ev.tid[r]), on_parameter(r)) for r in alone]
    i = 0
    while i < len(alone):
        j = i + 1
        while j < len(alone) and keys[j] == keys[i]:
            j += 1
        run = alone[i:j]
        if len(run) >= PARAMETER_LOOP and keys[i][2]:
            loops.append(run)
        else:
            kept.extend(run)
        i = j
    return kept, [*groups.values(), *loops]


def _launches(ev: Events, shapes: Callable[[int], Shapes | None], rows: Sequence[int],
              target: DeviceSpec, precision: Precision, model: KernelModel | None,
              parameters: Set[tuple[int, ...]]) -> list[_Launch]:
    """The step's ops as launches in start order."""
    outside, groups = multi_tensor_groups(ev, rows, shapes, parameters)

    def shaped(r: int) -> Shapes:
        return shapes(r) or Shapes((), ())

    def family(r: int) -> str:
        cost = data_cost(ev.name_of(r), shaped(r))
        return cost.family if cost is not None else ""

    priced = op_seconds([(ev.name_of(r), shaped(r), precision.tensor_cores(family(r)))
                         for r in outside], target, model)
    starts = [int(ev.ts[r]) for r in outside]
    out = [_Launch(ev.name_of(r), found[0] if found else None, found[1] if found else "", 1)
           for r, found in zip(outside, priced, strict=True)]
    for group in groups:
        together = multi_tensor_seconds([(ev.name_of(r), shaped(r)) for r in group], target,
                                        model)
        starts.append(int(ev.ts[group[0]]))
        out.append(_Launch(ev.name_of(group[0]), together.seconds if together else None,
                           together.family if together else "",
                           together.launches if together else len(group)))
    return [out[i] for i in np.argsort(np.asarray(starts, np.int64), kind="stable")]


def forecast_step(ev: Events, shapes: Callable[[int], Shapes | None], rows: Sequence[int],
                  target: DeviceSpec, own_ns: Mapping[str, int],
                  model: KernelModel | None = None, precision: Precision = Precision(),
                  parameters: Set[tuple[int, ...]] = frozenset()) -> StepForecast:
    """One iteration on `target` of its innermost costed ops `rows`: the host's own time
    (`own_ns`, by part: outside those ops) plus HOST_OP_NS per launch, each op's kernels queued
    on one stream behind the ones before; loops over tensors as multi-tensor ops
    (`multi_tensor_groups`, `parameters` the shapes of the model's parameters)."""
    launches = _launches(ev, shapes, rows, target, precision, model, parameters)
    host_ns = sum(own_ns.values())
    unpriced: Counter[str] = Counter()
    families: Counter[str] = Counter()
    gap = host_ns / max(1, len(launches))
    host = 0.0 if launches else float(host_ns)
    device = busy = 0.0
    for launch in launches:
        host += gap + HOST_OP_NS * launch.launches
        if launch.seconds is None:
            unpriced[launch.name] += launch.launches
            continue
        device = max(device, host) + launch.seconds * 1e9
        busy += launch.seconds * 1e9
        families[launch.family] += round(launch.seconds * 1e9)
    return StepForecast(round(max(host, device)), round(busy), dict(families), unpriced,
                        {**own_ns, "launch": HOST_OP_NS * sum(a.launches for a in launches)})


@dataclass(frozen=True)
class _HostParts:
    """A recorded step's host time that stays on a GPU host: the Python outside every op (less
    the optimizer's loop over the parameters, which its multi-tensor ops replace), and the ops
    that compute nothing there and launch nothing, each a dispatch (`self_ns`: their own time
    less their children's)."""

    python_ns: int
    dispatch_self_ns: list[int]


def _host_parts(ev: Events, inside: Sequence[int], inner: Sequence[int], lo: int,
                hi: int) -> _HostParts:
    rows = np.asarray(inside, np.int64)
    parent = enclosing_ops(ev, rows, rows)
    children: Counter[int] = Counter()
    for row, up in parent.items():
        children[up] += int(ev.dur[row])
    costed = set(inner)

    def under_costed(row: int) -> bool:
        while row in parent:
            row = parent[row]
            if row in costed:
                return True
        return False

    phase = phases(ev, rows)
    dispatch = [int(ev.dur[r]) - children[r] for r, p in zip(inside, phase, strict=True)
                if p != OPTIMIZER and r not in costed and not under_costed(r)]
    python = hi - lo - _top_level_ns(ev, inside) - _optimizer_python_ns(ev, inside, lo, hi)
    return _HostParts(max(0, python), dispatch)


def _optimizer_python_ns(ev: Events, inside: Sequence[int], lo: int, hi: int) -> int:
    """The host's time in the step's optimizer ranges outside their ops, from where each one's
    own work starts (after a closure passed to it): the Python of a loop over the parameters."""
    calls, starts = optimizer_calls(ev)
    chosen = (ev.ts[calls] >= lo) & (ev.ts[calls] < hi) & ev.of_kind("user_annotation")[calls]
    total = 0
    for r, start in zip(calls[chosen].tolist(), starts[chosen].tolist(), strict=True):
        ops = [i for i in inside if start <= ev.ts[i] < ev.end[r] and ev.tid[i] == ev.tid[r]]
        total += max(0, int(ev.end[r]) - start - _top_level_ns(ev, ops))
    return total


def op_graph_steps(ev: Events, shapes: Callable[[int], Shapes | None],
                   steps: Sequence[tuple[int, int]], target: DeviceSpec,
                   model: KernelModel | None = None, precision: Precision = Precision(),
                   parameters: Set[tuple[int, ...]] = frozenset(),
                   steady: Sequence[bool] = ()) -> list[StepForecast]:
    """Every (start, end) iteration of a CPU Run forecast on `target`. Its host time on the GPU's
    host: its Python outside the ops as recorded (less the optimizer's parameter loop), a
    dispatch per op that computes nothing on the GPU and launches nothing (a view, a reshape,
    an autograd node around its op; each at the median of such ops' own time in the Run: the
    recording host's dispatch speed, the few that computed on the CPU inside an op of no cost
    model, a cat of a tensor list, left out), and HOST_OP_NS per launch. That median is read
    off the `steady` steps (one flag per step; every step when none is flagged), as predict
    reads typical times: the profiler's first step runs its ops' dispatch 5-10x slower
    (nanoGPT here: 8-12 us against 1-2.5 in the others)."""
    found = []
    for lo, hi in steps:
        inside = np.flatnonzero(ev.of_kind("cpu_op") & (ev.ts >= lo) & (ev.ts < hi)).tolist()
        inner = innermost_ops(ev, shapes, lo, hi)
        found.append((inner, _host_parts(ev, inside, inner, lo, hi)))
    typical = [f for f, keep in zip(found, steady, strict=True) if keep] if any(steady) else found
    every = [ns for _, parts in typical for ns in parts.dispatch_self_ns]
    dispatch_ns = float(np.median(every)) if every else 0.0
    return [replace(forecast_step(ev, shapes, inner, target, {
        "python": parts.python_ns,
        "dispatch": round(dispatch_ns * len(parts.dispatch_self_ns))}, model, precision,
        parameters), left_out=unforecast(ev, set(inner), lo, hi))
            for (inner, parts), (lo, hi) in zip(found, steps, strict=True)]
