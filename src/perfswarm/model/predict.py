"""Replay and predict a Run's iterations by simulating its dependency graph (model/graph.py).

- replay: the measured durations and gaps, with typical (per-rank) latencies between
  lanes. How close it lands to the measured iteration tests the graph.
- predict: each step from its own measured ops, each scaled by a kernel model's ratio
  between the new and the recorded case, at the recorded configuration or a changed one,
  so that the steady steps' predicted median is the same statistic as their measured one
  (every op at its typical time had made every steady step the same sum of means, which
  skewed steps' median is not: a GPT's +9.3% at its own configuration):
  - kernel times: each kernel's measured time times its key's ratio, the model's time at
    the new case over its typical time (model/kernels.py): a calibrated profile on the CPU,
    device specs on GPUs (a GPU kernel's op is the CPU op that launched it, by External id);
    plus, on the CPU, the time of writing fresh pages, which a profiling window makes the
    step's largest allocations pay (`_first_touch`);
  - host time: every op's overheads (T1..T5) as measured, or at its type's mean in another
    Run's CPU-overhead model where one is given (model/overheads.py);
  - batch size: batch-dependent bytes and FLOPs of every modelled op scale by the
    batch ratio (parameters do not: their shapes are read off the optimizer and the
    gradient accumulation; embedding tables with sparse gradients do, their updates touch
    the rows looked up); per-sample work (a DataLoader fetch that runs once per sample)
    scales by the batch ratio in count;
  - dimensions (`dims`, OLD -> NEW): every recorded dimension equal to OLD (or to a
    parameter dimension that is a whole multiple of it: `derived_dims`) becomes NEW,
    parameters included: how layer widths change;
  - device: GPU kernels move to another device's roofline at the efficiency they reached
    on the recorded one; the host is the same.
"""

from __future__ import annotations

import functools
import math
import re
import statistics
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Final, Literal

import numpy as np
import numpy.typing as npt
import orjson
import pyarrow as pa

from perfswarm.analyze.dependencies import (
    dependencies,
    launching_op_rows,
    sync_events,
    tensor_handoffs,
)
from perfswarm.analyze.frame import (
    COMPILED_CALL,
    COMPILED_GRAPH,
    I32,
    I64,
    KIND,
    Events,
    Mask,
    detail_of,
    int_array,
)
from perfswarm.analyze.groups import process_groups
from perfswarm.analyze.intervals import Covered, WindowSums, sorted_unique, union
from perfswarm.analyze.iterations import (
    StepKey,
    batch_sizes,
    event_steps,
    iterations,
    step_faults,
    step_time,
)
from perfswarm.analyze.ops import is_tensor_core, kernel_category
from perfswarm.analyze.phases import parameter_rows
from perfswarm.analyze.step_threads import (
    history,
    prevailing,
    profiled_threads,
    step_threads,
)
from perfswarm.errors import NotApplicable, ParameterError
from perfswarm.model.accuracy import gmae
from perfswarm.model.gpu.forecast import LearnedScaler
from perfswarm.model.gpu.learned import KernelModel
from perfswarm.model.gpu.opgraph import HOST_OP_NS, Precision, op_graph_steps
from perfswarm.model.graph import ANCHOR, DEVICE, HOST, Graph, build_graph, collective_waits
from perfswarm.model.kernels import REDUCED_SLOW, KernelScaler, ProfileScaler
from perfswarm.model.opcost import (
    JOINS,
    PAGE_BYTES,
    REDUCED_DTYPES,
    OpCost,
    Shapes,
    as_cpu_conv,
    attention_q,
    batch_scaled,
    column_major,
    cpu_conv_at,
    data_cost,
    element_bytes,
    heads_follow,
    joined_shapes,
    kernels_kept,
    lstm_shape,
    output_bytes,
    row_spread,
    scale_batch,
    tf32_if_fp32,
    token_input,
)
from perfswarm.model.opstats import RowShapes
from perfswarm.model.overheads import (
    Instances,
    OverheadModel,
    Steady,
    apply_overheads,
    fit_overheads,
    instances,
    stalled,
    steady_of,
    typical,
)
from perfswarm.model.profile import SWEPT_DTYPE, UNUSABLE_GMAE, Profile
from perfswarm.model.simulate import Schedule, Timeline, simulate
from perfswarm.model.specs import DeviceSpec, load_spec, spec_of_devices
from perfswarm.trace.store import Run

Platform = Literal["gpu", "cpu"]
LOADER: Final = "enumerate(DataLoader)#"
COMPUTE_CATEGORIES: Final = frozenset({"gemm", "conv", "attention"})
# what a CPU prediction without a profile rests on: at the recorded configuration the profile's
# kernel model gives each kernel a ratio of 1 (the same shapes), so the figures are the Run's own
# (the 18 base recordings of the twenty-ninth pass's judged run predicted the same to the ns
# with a profile calibrated here); the kernel counts' "unmodelled" alone had not said whether a
# default stood in for one
NO_PROFILE_NOTE: Final = ("no CPU profile given: kernel times are the Run's own measured times, "
                          "no model's (at the recorded configuration a profile gives every op a "
                          "ratio of 1); a changed "
                          "batch size or dimension needs one: `perfswarm calibrate --threads N` "
                          "with the Run's intra-op threads, then --profile cpu-profile.json")
UNPRICED_NOTE: Final = (
    "at the new shapes the step's largest results change: {ops} may write fresh pages there or "
    "not (the results that wrote them in the Run are no longer the largest, or the largest "
    "never wrote them; which do is glibc's heap's history, which the trace does not hold): "
    "priced as none; had they all, {ms:.2f} ms a step more at the Run's share of page faults "
    "(first_touch_unpriced_ns)")
COMPILED_NOTE: Final = (
    "torch.compile's generated kernels run inside its compiled graphs' calls with no op of their "
    "own (inductor's C++ on the CPU): {ms:.3f} ms a step ({pct:.1f}% of the steady median), "
    "which no kernel model prices: held as measured, in the framework's time{changed}")
UNSWEPT_NOTE: Final = (
    "{ops} compute in {dtypes}, {ms:.3f} ms a step ({pct:.1f}% of the steady median): the "
    "profile swept {swept} alone, so their prediction is a {swept} model's (on a CPU without "
    "units for {dtypes} they can run slower per FLOP than {swept}, by how much the sweeps do "
    "not say)")
BY_WORK_NOTE: Final = (
    "{ops} compute in {dtypes}, {ms:.3f} ms a step ({pct:.1f}% of the steady median), at "
    "{slow:.0f}x the profile's {swept} time of their shapes and more (a conversion path, no "
    "units for {dtypes}): priced at the rate they ran, their time in proportion to their FLOPs")
SPREAD_AFTER_NOTE: Final = (
    "the {steps} steps after the profiler's window vary by {spread:.0f}% of their median "
    "{median:.3f} ms (a robust spread, over {alike:.0f}%: their work differs, or other load "
    "stretched some): no one step stands for the program's own, so none is given")
THREADS_NOTE: Final = (
    "the profiled steps' intra-op threads changed (torch.get_num_threads() at each step's hook): "
    "{history}; the prediction is of the {steps} at {threads}, the count most of them ran (the "
    "later on a tie: what the program runs at from then on), their typical kernel times too: "
    "a step at another count is other work")
WINDOW_NOTE: Final = ("no iterations found (no ProfilerStep markers, no repeating op sequence): "
                      "the whole profiled window is one iteration")
ALIKE: Final = 0.25  # steps whose robust spread is within this share of their median: alike
NOISY_SPREAD: Final = 0.1  # steady steps varying more than this: a busy machine, said in a note
FAULT_EXCESS: Final = 0.1  # a window taking this share of its steps' page faults more: said
LEFT_OUT_SHARE: Final = 0.01  # ops a GPU forecast leaves out, named from this share of the steps
SIZE_CLASS: Final = 0.99  # results within 1% of the largest allocation are of its size
_BATCH_FLAG = re.compile(r"^--?(?:batch(?:[-_]size)?|bs)(?:=(\d+))?$")
# a kernel's name, its op's shapes and, where its op has none, its own size (a copy's or a set's
# bytes, a kernel's grid and block): what shares its typical time
Key = tuple[int, Shapes | None, tuple[int, ...]]
Costs = Callable[[str, Shapes], tuple[OpCost, OpCost, Shapes] | None]  # _Transform.costs


@dataclass(frozen=True)
class Change:
    """What differs from the recorded run; the default changes nothing."""

    batch_size: int | None = None
    recorded_batch_size: int | None = None  # when the Run does not tell
    dims: tuple[tuple[int, int], ...] = ()  # (OLD, NEW) dimension substitutions
    device: str | None = None  # a devices.yaml name

    def to_dict(self) -> dict[str, Any]:
        return {"batch_size": self.batch_size, "dims": {str(a): b for a, b in self.dims},
                "device": self.device}


@dataclass(frozen=True)
class StepResult:
    rank: int
    step: int
    measured_ns: int
    replayed_ns: int
    predicted_ns: int
    device_active_ns: Mapping[str, int]  # measured, replayed, predicted
    breakdown_ns: Mapping[str, int]  # the predicted iteration, see `categories`

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "step": self.step, "measured_ns": self.measured_ns,
                "replayed_ns": self.replayed_ns, "predicted_ns": self.predicted_ns,
                "device_active_ns": dict(self.device_active_ns),
                "breakdown_ns": dict(self.breakdown_ns)}


@dataclass(frozen=True)
class Prediction:
    path: str
    platform: Platform
    source_device: str
    target_device: str
    change: Change
    batch: tuple[int, int] | None  # (recorded, predicted) batch size
    steps: tuple[StepResult, ...]
    kernels: Mapping[str, int]  # how the kernel times were obtained: node counts
    lags: Mapping[int, Mapping[str, int]]
    overheads: OverheadModel
    compare: tuple[str, int, int] | None = None  # (path, median step, median device active)
    notes: tuple[str, ...] = field(default=())
    steady: frozenset[StepKey] = frozenset()  # the steps judged, typical times read off
    # the program's own step outside the profiler's window (iterations.step_time), of the
    # recorded Run and of the compared one, where the recorder timed steps there
    unprofiled_ns: int | None = None
    compare_unprofiled_ns: int | None = None
    # a step's time of writing fresh pages that the rule leaves unpriced (`unpriced_pages`)
    first_touch_unpriced_ns: int = 0

    def _steady(self) -> Steady:
        return steady_of({(s.rank, s.step): s.measured_ns for s in self.steps}, self.steady)

    @property
    def measured_steady_ns(self) -> int:
        """The median measured step of the steady steps (all, when none is marked)."""
        return self._steady().median_ns

    def median(self, what: str) -> int:
        values = [getattr(s, f"{what}_ns") for s in self.steps]
        return int(statistics.median(values)) if values else 0

    @property
    def predicted_steady_ns(self) -> int:
        """The median predicted step of the steady steps (all, when none is marked): the
        steps the measured median it is judged against is of (the median of every predicted
        step against that of 9 steady of 10 had read 30% off for steps each within 8%)."""
        kept = [s.predicted_ns for s in self.steps if (s.rank, s.step) in self.steady]
        return int(statistics.median(kept)) if kept else self.median("predicted")

    def median_active(self, what: str) -> int:
        values = [s.device_active_ns[what] for s in self.steps]
        return int(statistics.median(values)) if values else 0

    @property
    def replay_error(self) -> float:
        return gmae([s.replayed_ns for s in self.steps], [s.measured_ns for s in self.steps])

    @property
    def predicted_error(self) -> float | None:
        """The steady steps' median predicted step against the compared Run's median step,
        else, when
        nothing changed, against the median of the steady steps: the prediction is of a typical
        step, which a step the profiler's start or a burst of other load stretched is not
        (a per-step error is never under the steps' own spread, which `steady_spread` says)."""
        if self.compare is not None:
            return gmae([self.predicted_steady_ns], [self.compare[1]])
        if self.batch is None and not self.change.dims and self.change.device is None:
            return gmae([self.predicted_steady_ns], [self.measured_steady_ns])
        return None

    @property
    def predicted_unprofiled_ns(self) -> int | None:
        """The program's own step (no profiler) at the target configuration: the steady
        steps' predicted median times the recorded Run's own step over its profiled one
        (`unprofiled_ns` over their steady median). The prediction scales each profiled op's
        time, the window's cost in it too, with the op's work, and the window's page faults
        grow with the tensors (3.6-4.7x at 4x the batch): held as a share of the step, it read
        9.7% (geomean) off the own step measured on 31 quiet pairs of four scripts at half and
        four times the batch, held per step 21.0% (docs/benchmarks.md, twenty-third pass). At
        the recorded configuration it is the own step times the prediction's error, no test
        of it; None without an own step, and for another device (the recorded one's profiler
        cost is no part of the target's step)."""
        if self.unprofiled_ns is None or self.target_device != self.source_device:
            return None
        return round(self.predicted_steady_ns * self.unprofiled_ns / self.measured_steady_ns)

    @property
    def steady_spread(self) -> float:
        """GMAE of the steady steps around their median: how much alike they ran."""
        return self._steady().spread

    def to_dict(self) -> dict[str, Any]:
        categories = sorted({k for s in self.steps for k in s.breakdown_ns})
        return {
            "path": self.path, "platform": self.platform, "source_device": self.source_device,
            # what device_active_ns is, in words: a GPU's ops (a CPU run forecast on a GPU
            # too), or a CPU's compute ops
            "active_label": ("compute active" if self.platform == "cpu"
                             and self.target_device == self.source_device else "device active"),
            "target_device": self.target_device, "change": self.change.to_dict(),
            "batch": ({"recorded": self.batch[0], "predicted": self.batch[1]}
                      if self.batch else None),
            "measured_ns": self.median("measured"), "replayed_ns": self.median("replayed"),
            "predicted_ns": self.median("predicted"), "replay_error": self.replay_error,
            "predicted_error": self.predicted_error,
            "steady": {"steps": len(self.steady), "measured_ns": self.measured_steady_ns,
                       "predicted_ns": self.predicted_steady_ns, "spread": self.steady_spread},
            "device_active_ns": {k: self.median_active(k)
                                 for k in ("measured", "replayed", "predicted")},
            "breakdown_ns": {c: int(statistics.median(s.breakdown_ns.get(c, 0)
                                                      for s in self.steps))
                             for c in categories} if self.steps else {},
            "unprofiled_ns": self.unprofiled_ns,
            "predicted_unprofiled_ns": self.predicted_unprofiled_ns,
            "first_touch_unpriced_ns": self.first_touch_unpriced_ns,
            "compare": ({"path": self.compare[0], "measured_ns": self.compare[1],
                         "device_active_ns": self.compare[2],
                         "unprofiled_ns": self.compare_unprofiled_ns} if self.compare else None),
            "steps": [s.to_dict() for s in self.steps], "kernels": dict(self.kernels),
            "lags": {str(r): dict(v) for r, v in self.lags.items()},
            "overheads": self.overheads.to_dict(), "notes": list(self.notes)}


@dataclass
class _Model:
    """A Run loaded for simulation: events, graph, schedule, and what the nodes stand for."""

    run: Run
    ev: Events
    # the host calls that waited for a device op (Dependencies.sync_target's keys): all the
    # prediction reads of the dependencies once they are the graph's edges (the whole
    # Dependencies, dicts of every launch and stream order, stayed to a command's peak)
    synced_calls: I64
    graph: Graph
    schedule: Schedule
    platform: Platform
    compute: Mask  # host nodes that are kernel work (CPU runs)
    step: I64  # each event's step, as analyze's steps hold it (iterations.event_steps)
    window: bool = False  # no iterations found: each rank's profiled window is one (step -1)

    @cached_property
    def _shapes(self) -> RowShapes:
        return RowShapes.of(self.run)

    def shapes(self, rows: Sequence[int]) -> list[Shapes | None]:
        """The recorded shapes of `rows`, those not parsed yet from one read of the column
        (each read filters the whole column: a read per row made predict quadratic in the
        rows). Parsed once per Run: several passes ask for the same rows, and so do the
        report's other parts."""
        found, index = self._shapes.indexed(rows)
        joins = self._joins
        return [joins[r] if found[i] is None and r in joins else found[i]
                for r, i in zip(rows, index.tolist(), strict=True)]

    @cached_property
    def _joins(self) -> dict[int, Shapes | None]:
        """The joins' (opcost.JOINS) shapes by row, their tensor lists joined
        (`joined_shapes`): what predict prices them by; the recorded lists stay as they are
        for every other reader of the shapes."""
        ids = [i for i, n in enumerate(self.ev.names) if n in JOINS]
        rows = np.flatnonzero(np.isin(self.ev.name, ids)) if ids else np.zeros(0, np.int64)
        return {r: joined_shapes(self.ev.name_of(r), text)
                for r, text in zip(rows.tolist(), detail_of(self.run, rows), strict=True)}

    def iterations(self, timeline: Timeline, durations: I64
                   ) -> list[tuple[int, int, int, int, int]]:
        """(rank, step, start, end, device-active ns) of every iteration on `timeline`."""
        g = self.graph
        busy = _device_busy(self, timeline, durations)
        out = []
        if self.window:  # from the first node's start to the last one's end, device ops too
            for rank in sorted_unique(g.rank[g.role != ANCHOR]).tolist():
                mine = (g.rank == rank) & (g.role != ANCHOR)
                lo, hi = int(timeline.start[mine].min()), int(timeline.end[mine].max())
                out.append((rank, -1, lo, hi, busy(rank, lo, hi)))
            return out
        for rank, anchors in g.steps.items():
            for step, a, b in anchors:
                lo, hi = int(timeline.start[a]), int(timeline.start[b])
                out.append((rank, step, lo, hi, busy(rank, lo, hi)))
        return out


def load_model(run: Run) -> _Model:
    ev = Events.load(run)
    if len(ev) == 0:
        raise NotApplicable(None, "the Run has no events to simulate", subject=run.path)
    deps = dependencies(ev, sync_events(run, ev), process_groups(run, ev, ev.ranks))
    steps = {r: list(w) for r, w in iterations(run, ev).steps.items() if w}
    step = event_steps(ev, steps)
    graph = build_graph(ev, deps, steps, tensor_handoffs(run, ev))
    if not np.any(graph.role != ANCHOR):
        raise NotApplicable(None, "the Run has no host or device work to simulate",
                            subject=run.path)
    platform: Platform = "gpu" if np.any(graph.role == DEVICE) else "cpu"
    synced_calls = np.fromiter(deps.sync_target, np.int64, len(deps.sync_target))
    del deps
    model = _Model(run, ev, synced_calls, graph, Schedule.of(graph), platform,
                   np.zeros(len(graph), bool), step, window=not steps)
    if platform == "cpu":
        model.compute = _compute_nodes(model)
    return model


def _compute_nodes(m: _Model) -> Mask:
    """Host pieces of CPU ops that do the work: shaped ops that move data, less those that
    only dispatch to one of their own family (`_enclosing`: linear around addmm, conv1d around
    convolution around mkldnn_convolution, clone around copy_): a wrapper's own time is the
    framework's (argument checks, dispatch, views), the same at any size, so it is held as
    measured, not scaled with the work its inner op does (the MLP-Mixer's linear was predicted
    x1.81 at twice the batch and measured x0.9)."""
    g, ev = m.graph, m.ev
    host = np.flatnonzero((g.role == HOST) & (g.row >= 0))
    self_ns = np.bincount(g.row[host], weights=g.dur[host], minlength=len(ev)).astype(np.float64)
    candidates = np.flatnonzero((self_ns > 0) & ev.of_kind("cpu_op"))
    family: dict[int, str] = {}
    rows = candidates.tolist()
    for row, shapes in zip(rows, m.shapes(rows), strict=True):
        cost = data_cost(ev.name_of(row), shapes) if shapes is not None else None
        if cost is not None:
            family[row] = cost.family
    working = np.zeros(len(ev), bool)
    working[sorted(set(family) - _enclosing(ev, family, self_ns))] = True
    out = np.zeros(len(g), bool)
    out[host] = working[g.row[host]]
    return out


def _cpu_shapes(m: _Model) -> list[Shapes]:
    """The recorded shapes of the Run's CPU ops (those that have some)."""
    rows = np.flatnonzero(m.ev.of_kind("cpu_op")).tolist()
    return [s for s in m.shapes(rows) if s is not None]


def _enclosing(ev: Events, value: Mapping[int, object],
               own: npt.NDArray[np.float64] | None = None) -> set[int]:
    """Rows of `value` that enclose, on their own thread, another of its rows of the same value
    (a family, a result size): the outer one passes the work, or the result, on to the inner.
    With `own` (each row's own time), only where the outer one's is at most the inner ones':
    a wrapper's own time is dispatch, less than the work it passes on (an upsample's own
    interpolation, 1.9 ms around a 0.3 ms copy of its input, had been held as the
    framework's)."""
    rows = np.array(sorted(value, key=lambda r: (int(ev.ts[r]), -int(ev.end[r]))), np.int64)
    starts = ev.ts[rows]
    outer = set()
    for i, r in enumerate(rows.tolist()):
        within = rows[i + 1:int(np.searchsorted(starts, ev.end[r], side="right"))]
        same = np.array([value[w] == value[r] for w in within.tolist()], bool)
        inner = within[(ev.tid[within] == ev.tid[r]) & (ev.rank[within] == ev.rank[r])
                       & (ev.end[within] <= ev.end[r]) & same]
        if len(inner) and (own is None or own[r] <= own[inner].sum()):
            outer.add(r)
    return outer


def parameter_shapes(m: _Model) -> set[tuple[int, ...]]:
    """Shapes of the tensors the optimizer updates and gradients accumulate into."""
    g = m.graph
    host = np.flatnonzero((g.role == HOST) & (g.row >= 0))
    shapes: set[tuple[int, ...]] = set()
    rows = parameter_rows(m.ev, sorted_unique(g.row[host].astype(np.int64)))
    for found in m.shapes(rows.tolist()):
        if found is not None:
            shapes |= {d for d in found.dims if d}
    return shapes


def sparse_tables(m: _Model) -> set[tuple[int, ...]]:
    """Shapes of embedding tables whose gradients are sparse (the run builds sparse gradients
    in its embedding backward): their updates touch the rows a batch looked up, so they scale
    with the batch, unlike a dense parameter's."""
    if not any("sparse" in n for n in m.ev.names if n.startswith("aten::")):
        return set()
    tables: set[tuple[int, ...]] = set()
    names = [i for i, n in enumerate(m.ev.names)
             if n in ("aten::embedding_bag", "aten::_embedding_bag", "aten::embedding")]
    for shapes in m.shapes(np.flatnonzero(np.isin(m.ev.name, names)).tolist()):
        if shapes is not None and shapes.dims and len(shapes.dims[0]) == 2:
            tables.add(shapes.dims[0])
    return tables


MULTIPLES: Final = range(2, 9)  # a layer's width times these: fused QKV 3W, MLP 4W, gates 4H


def derived_dims(dims: Mapping[int, int], parameters: set[tuple[int, ...]]) -> dict[int, int]:
    """The dimension changes, plus each dimension of a parameter that is a whole multiple (2 to
    8) of a changed one held by the same parameter, changed as many times over: a layer derives
    its width from its input's (GPT's fused QKV [3W, W] and MLP [4W, W], an LSTM's four gates
    [4H, H]) and a parameter has no batch dimension that could be a multiple by chance. The
    activations of those dimensions follow (every recorded dimension equal to one changes).
    Explicit changes take precedence. A multiple in no parameter beside the changed dimension
    is another size of its own: nanoGPT's block size 64 in its position table [64, W] is twice
    a head of 32, and doubling it with the head doubled every activation's sequence (predicted
    attention x7.3 at width x2, measured x1.8). A divisor (a head's W / heads) is not derived:
    it is as likely another parameter's own size. Derived dimensions derive in turn: a
    MobileNet block's expansion [4W, 2W] holds no W, but 2W, itself derived (its 4W had stayed:
    -16% at width x2)."""
    out = dict(dims)
    todo = list(dims.items())
    while todo:
        old, new = todo.pop(0)
        beside = {d for shape in parameters if old in shape for d in shape}
        for k in MULTIPLES:
            if k * old in beside and k * old not in out:
                out[k * old] = k * new
                todo.append((k * old, k * new))
    return out


def _heads_following(m: _Model, dims: Mapping[int, int]) -> set[tuple[int, int]]:
    """The head dimensions (old, new) that opcost.heads_follow changes in the Run's attention
    ops under these dimension changes."""
    if not dims:
        return set()
    rows = _op_rows(m)
    out = set()
    for name, shapes in {(m.ev.name_of(r), s) for r, s in zip(rows, m.shapes(rows), strict=True)
                         if s is not None}:
        substituted = shapes.substitute(dims)
        followed = heads_follow(name, shapes, substituted, dims)
        if followed != substituted and (found := attention_q(name, shapes.dims)):
            out.add((shapes.dims[found[0]][3], followed.dims[found[0]][3]))
    return out


def is_batch_flag(flag: str) -> bool:
    """Whether a command-line flag sets the batch size (--batch-size, --batch_size, --batch,
    --bs)."""
    return _BATCH_FLAG.match(flag.split("=", 1)[0]) is not None


def batch_flag(command: Sequence[str]) -> int | None:
    """The value of a recorded command's --batch-size (--batch_size, --batch, --bs, -bs; `=N`
    or a separate word), if it has one."""
    for i, word in enumerate(command):
        match = _BATCH_FLAG.match(word)
        if match:
            value = match.group(1) or (command[i + 1] if i + 1 < len(command) else "")
            if value.isdigit() and int(value) > 0:
                return int(value)
    return None


def recorded_batch_size(m: _Model, fixed: set[tuple[int, ...]]) -> tuple[int | None, str]:
    """The batch size of the recorded command's --batch-size flag, else the batch of the
    token indices torch.compile's compiled forwards took (its graphs' ops run flattened,
    [batch x sequence, width]), else an LSTM layer's B (its input is [T, B, I] however the
    model lays its tensors out: a time-major model's other ops lead with the sequence), else
    the most common leading dimension of the compute ops' non-parameter inputs, unless it is
    an attention op's sequence L, whose batch is then its q's B ([B, H, L, D]:
    nn.TransformerEncoder's [L, B, E] had been read as a batch of 100, its sequence; a
    windowed attention's B, batch x windows, is no batch); and a note
    when the steps' own most common ones differ (an inference server's requests of several
    sizes)."""
    flag = batch_flag(m.run.manifest()["command"])
    if flag is not None:
        return flag, ""
    compiled = [i for i, n in enumerate(m.ev.names) if n == COMPILED_CALL]
    calls: list[int] = np.flatnonzero(np.isin(m.ev.name, compiled)).tolist() if compiled else []
    tokens = Counter(idx[0] for shapes in m.shapes(calls)
                     if shapes is not None and (idx := token_input(shapes)) is not None)
    if tokens:
        return tokens.most_common(1)[0][0], ""
    leading: Counter[int] = Counter()
    recurrent: Counter[int] = Counter()
    attended: dict[int, int] = {}
    by_step: dict[int, Counter[int]] = {}
    rows = _op_rows(m)
    for row, shapes in zip(rows, m.shapes(rows), strict=True):
        if shapes is not None:
            dims = [d[0] for d in shapes.dims if len(d) >= 2 and d not in fixed]
            leading.update(d for d in dims if d > 1)
            by_step.setdefault(int(m.step[row]), Counter()).update(dims)  # 1 is a size too
            layer = lstm_shape(m.ev.name_of(row).removeprefix("aten::"), shapes.dims)
            if layer is not None:
                recurrent[layer[1]] += 1
            if (found := attention_q(m.ev.name_of(row), shapes.dims)) is not None:
                attended[found[1][2]] = found[1][0]  # its sequence -> its batch
    if recurrent:
        return recurrent.most_common(1)[0][0], ""
    if not leading:
        return None, ""
    batch = leading.most_common(1)[0][0]
    if batch in attended:  # the tensors lead with attention's sequence: its batch is q's B
        return attended[batch], ""
    sizes = sorted({c.most_common(1)[0][0] for c in by_step.values() if c})
    return batch, (f"the steps' batches differ ({', '.join(map(str, sizes))}): every step is "
                   f"scaled from {batch}" if len(sizes) > 1 else "")


def _op_rows(m: _Model) -> list[int]:
    """Rows whose shapes price kernels: compute pieces' ops (CPU), launching ops (GPU)."""
    if m.platform == "cpu":
        return sorted(set(m.graph.row[m.compute].tolist()))
    ops = _launching_ops(m)
    return sorted(set(ops[ops >= 0].tolist()))


def _launching_ops(m: _Model) -> I64:
    """Each device node's op row's launching CPU op (-1: none), in node order."""
    ext = m.run.table("events", columns=["external_id"]).column("external_id").to_numpy()
    return launching_op_rows(m.ev, ext, m.graph.row[m.graph.role == DEVICE])


@dataclass(frozen=True)
class _Transform:
    """A Change made concrete: the op cost at the new shapes."""

    factor: float  # batch ratio
    dims: Mapping[int, int]
    fixed: set[tuple[int, ...]]
    threads: int | None = None  # the Run's intra-op threads (CPU), where it recorded them

    def costs(self, name: str, shapes: Shapes) -> tuple[OpCost, OpCost, Shapes] | None:
        """An op's cost at its recorded shapes and at the new ones, and the new shapes: as the
        op ATen runs there, where that is another (a CPU convolution's backend, `cpu_conv_at`:
        a 1x1 one's per-sample GEMMs at batch 8 on one thread are oneDNN's at 16)."""
        marks = self.marks(shapes)
        old = data_cost(name, shapes, marks)
        if old is None:
            return None
        new_shapes, scaled = self.resized(name, shapes, marks)
        runs = (cpu_conv_at(name, shapes, scaled, self.threads) if self.threads is not None
                else None)
        if runs is not None:
            marks = self.marks(as_cpu_conv(name, shapes, runs))
            new_shapes, scaled = (as_cpu_conv(name, s, runs) for s in (new_shapes, scaled))
            name = runs
        new = data_cost(name, new_shapes, marks) if self.dims or runs else old
        if new is None:
            return None
        # the layout at the new batch: MHA's rows lie B x E apart
        return (old, replace(scale_batch(new, self.factor),
                             row_spread=row_spread(name, scaled)), scaled)

    def marks(self, shapes: Shapes) -> list[bool]:
        """Which of an op's inputs are parameters (`is_parameter`)."""
        return [self.is_parameter(shapes, i) for i in range(len(shapes.dims))]

    def resized(self, name: str, shapes: Shapes, marks: Sequence[bool]
                ) -> tuple[Shapes, Shapes]:
        """An op's shapes at the new dimensions, and at those and the new batch."""
        new = (kernels_kept(name, shapes, heads_follow(name, shapes, shapes.substitute(
            self.dims), self.dims)) if self.dims else shapes)
        return new, batch_scaled(name, new, marks, self.factor)

    def is_parameter(self, shapes: Shapes, i: int) -> bool:
        """A parameter's shape, a transposed view of one (nn.Linear's weight in its addmm:
        column-major, its shape reversed), or one with a unit dimension inserted (a 1-D
        convolution's weight [C_out, C_in, K] as mkldnn_convolution records it, [C_out, C_in,
        1, K]: else a batch change would grow its C_out). A column-major matrix of a
        parameter's shape is the transposed view of a [d1, d0] tensor, no parameter unless that
        is one: at batch 64 a weight gradient's g^T [256, 64] (a view of the [64, 256] output
        gradient) read as a Linear(64, 256)'s weight had the batch grow the product's n, not its
        k, and its result, [256, 2048], took the first touch of every result of 1 MB."""
        d = shapes.dims[i]
        transposed = len(d) == 2 and column_major(shapes.dims, shapes.strides, i)
        return ((d in self.fixed and not transposed)
                or (transposed and (d[1], d[0]) in self.fixed)
                or any(x == 1 and d[:j] + d[j + 1:] in self.fixed for j, x in enumerate(d)))


def recorded_threads(run: Run, counted: Mapping[StepKey, int] | None = None) -> int | None:
    """The intra-op threads the Run's processes ran with: the count most of the profiled steps
    ran with, the later on a tie (`prevailing` of `counted`, the profiled steps' counts,
    step_threads.profiled_threads, read when not given), else, in a Run recorded before the
    steps' counts, torch.get_num_threads() as the recorder's window opened where it recorded
    one count for all; None otherwise (a trace imported, not recorded)."""
    found = prevailing(profiled_threads(run) if counted is None else counted)
    if found is not None:
        return found
    seen = run.manifest().get("extra", {}).get("record", {}).get("threads")
    counts = {t for t in seen if isinstance(t, int) and not isinstance(t, bool)} \
        if isinstance(seen, list) else set()
    return counts.pop() if len(counts) == 1 else None


def _source_spec(m: _Model, override: str | None) -> DeviceSpec | None:
    return (load_spec(override, "source_device") if override
            else spec_of_devices(m.run.manifest()["devices"]))


def _scale_kernels(m: _Model, t: _Transform, scaler: KernelScaler | None,
                   unmodelled: LearnedScaler | None, dur: I64, steady: Steady
                   ) -> tuple[Counter[str], FirstTouch]:
    """Kernel times at the new shapes or device, in place; counts of how each was priced, and
    the time of writing fresh pages taken out and put back (`_first_touch`).

    A kernel takes its own measured time times its key's ratio: the model's time at the new
    case over the key's base, its typical time over the kernels of its name and op shapes in
    the `steady` steps, else the undisturbed ones (model/overheads.py `typical`: iterations
    repeat them; a step the machine stalled is not the kernel's, and the mean keeps what it
    costs an iteration). Each step keeps its own kernels' times, their stalls and cache
    misses too, so the steady steps' predicted median is of steps as unlike as the measured
    ones: every kernel at its base had made each steady step the same sum of means, a GPT's
    +9.3% where its steps spread 12% (docs/benchmarks.md, thirty-second pass)."""
    g, ev = m.graph, m.ev
    counts: Counter[str] = Counter()
    # each pair: a kernel (or a CPU op's compute pieces), the op that launched it (-1: none),
    # its measured ns, and its nodes (`node`, by `pair_of` node); as arrays, no per-event lists
    if m.platform == "cpu":
        node = np.flatnonzero(m.compute)
        row_arr, pair_of = np.unique(g.row[node], return_inverse=True)
        op_arr: I64 | I32 = row_arr
        measured = np.bincount(g.row[node], weights=g.dur[node], minlength=len(ev)
                               )[row_arr].astype(np.int64)
    else:
        node = np.flatnonzero(g.role == DEVICE)
        row_arr, pair_of = g.row[node], np.arange(len(node))
        op_arr = _launching_ops(m)
        measured = dur[node]
    # per pair, as machine-int arrays for the loops below (a list of 40k large ints is 1.6 MB,
    # and this runs at a prediction's peak)
    rows, measured_ns = int_array(row_arr), int_array(measured)
    name = int_array(ev.name[row_arr])
    op_names = int_array(np.where(op_arr >= 0, ev.name[np.maximum(op_arr, 0)], -1))
    launching = iter(m.shapes(op_arr[op_arr >= 0].tolist()))
    shaped = [None if op < 0 else next(launching) for op in int_array(op_arr)]
    own = _own_sizes(m, [r for r, sh in zip(rows, shaped, strict=True) if sh is None]) \
        if m.platform == "gpu" else {}
    # by name and shapes (layout included: a GEMM on a transposed operand is another kernel)
    ids: dict[Key, int] = {}  # each key once, by number: a pair's group is a few ints
    kid = [ids.setdefault((n, sh, own.get(r, ())), len(ids))
           for n, sh, r in zip(name, shaped, rows, strict=True)]
    keys = list(ids)
    samples: list[tuple[list[float], list[StepKey]]] = [([], []) for _ in keys]
    # each (rank, step) one tuple, however many kernels it holds (a tuple per kernel had
    # been 2.2 MB of 40k kernels, at the prediction's peak)
    step_keys: dict[StepKey, StepKey] = {}
    for k, ns, rk, st in zip(kid, measured_ns, int_array(ev.rank[row_arr]),
                             int_array(m.step[row_arr]), strict=True):
        samples[k][0].append(ns)
        samples[k][1].append(step_keys.setdefault((rk, st), (rk, st)))
    base_of = [typical(*found, steady.keys, steady.undisturbed) for found in samples]
    costs = functools.cache(t.costs)  # per op name and shapes: many kernels share them

    @functools.cache
    def priced(k: int, op_name: int) -> tuple[OpCost, OpCost, Shapes] | None:
        """A key's costs at the recorded and the new shapes, by the op that launched it."""
        shapes = keys[k][1]
        return (_on_tensor_cores(costs(ev.names[op_name], shapes), ev.names[keys[k][0]])
                if op_name >= 0 and shapes else None)

    touch = FirstTouch({})
    if isinstance(scaler, ProfileScaler) and scaler.profile.page_s > 0:
        keyed: dict[Key, list[int]] = {}
        for k, row in zip(kid, rows, strict=True):
            keyed.setdefault(keys[k], []).append(row)
        touch = _first_touch(m, costs, keyed, scaler.profile.page_s)
    if isinstance(scaler, ProfileScaler):
        scaler = scaler.with_offsets([(found[0], shapes.dims, base_of[k] * 1e-9)
                                      for k, op in zip(kid, op_names, strict=True)
                                      if (found := priced(k, op)) is not None
                                      and (shapes := keys[k][1]) is not None])
    scaled = functools.cache(scaler.scaled) if scaler is not None else None  # per key, once

    @functools.cache
    def after_of(k: int, op_name: int, kind: int) -> tuple[float, bool, bool]:
        """A group's time after the change (it depends on no more than the key, the op's name
        and the kind), whether it was modelled and whether first touch was in it."""
        key, base = keys[k], round(base_of[k])
        shapes, found = key[1], priced(k, op_name)
        if found is not None and scaled is not None:
            old, new, new_shapes = found
            before_ns, after_ns = touch.times.get(key, (0, 0))
            work = (scaler.model_time(old, shapes.dims) if before_ns and shapes
                    and isinstance(scaler, ProfileScaler) else None)
            held, after_ns = held_first_touch(base, before_ns, after_ns,
                                              round((work or 0.0) * 1e9))
            return (after_ns + scaled(base - held, old, new, shapes.dims if shapes else (),
                                      new_shapes.dims), True, bool(after_ns))
        if unmodelled is not None and kind in (KIND["kernel"], KIND["memset"]):
            kernel = ev.names[key[0]]
            return (unmodelled.unmodelled(base, kernel_category(kernel) in COMPUTE_CATEGORIES,
                                          "tf32" if is_tensor_core(kernel) else "fp32"),
                    False, False)
        return base, False, False

    after = np.zeros(len(rows))
    how = np.zeros(len(rows), np.int64)  # 0 unmodelled, 1 modelled, 2 modelled with first touch
    for i, (k, op, kd, ns) in enumerate(zip(kid, op_names, int_array(ev.kind[row_arr]),
                                            measured_ns, strict=True)):
        if ns > 0:
            after[i], modelled, touched = after_of(k, op, kd)
            how[i] = 2 if touched else int(modelled)
    mine = measured[pair_of] > 0
    node, pair_of = node[mine], pair_of[mine]
    nodes = np.bincount(pair_of, minlength=len(rows))
    timed = measured > 0
    if np.any(timed & (how >= 1)):  # (first touch counted, if none, where any was modelled)
        counts["first_touch"] += int(nodes[how == 2].sum())
        counts["modelled"] += int(nodes[how >= 1].sum())
    if np.any(timed & (how == 0)):
        counts["unmodelled"] += int(nodes[how == 0].sum())
    # each pair's own time times its key's ratio, new over typical (a key of no typical time:
    # its new one), as Python's round(d * after / base) would, per node
    base = np.rint(np.asarray(base_of, np.float64)[np.asarray(kid, np.int64)])
    base = np.where(base > 0, base, measured)
    dur[node] = np.rint(dur[node] * after[pair_of] / base[pair_of]).astype(np.int64)
    return counts, touch


ENGINE_NODE: Final = "autograd::engine::evaluate_function: "  # the engine running a node
# glibc's default M_MMAP_THRESHOLD: a smaller chunk comes from the heap, and its free hands no
# page back by itself
MMAP_THRESHOLD: Final = 128 << 10
# glibc's cap on its dynamic mmap threshold (64-bit; the recorder's standalone
# inject/_perfswarm_heap.py holds it too): a chunk this large is always mapped, and unmapped
# when freed
MMAP_THRESHOLD_MAX: Final = 32 << 20


def _release_tails(m: _Model, t: _Transform, dur: I64) -> int:
    """Autograd engine nodes' time after their last child, at the new shapes, in place: the
    memory their function let go of (its saved tensors, the gradients it consumed) handed
    back to the system, which glibc does by the page (it unmaps a chunk past its mmap
    threshold, trims its heap's top): a U-Net's max-pool node spent 0.56 ms a step there,
    1.53 ms at twice the width, and 3 us with malloc's thresholds raised. Beyond the Run's
    least such tail (what every node spends there), scaled as the largest tensor of the ops
    under the node, where that is as large as glibc maps by itself (MMAP_THRESHOLD: a GRU's
    nodes on [8, 48] tensors spend their tails otherwise, scaled they read +13% at four times
    the batch). Returns how many nodes' tails were scaled."""
    g, ev = m.graph, m.ev
    engine = [i for i, n in enumerate(ev.names) if n.startswith(ENGINE_NODE)]
    rows = np.flatnonzero(np.isin(ev.name, engine))
    last = g.last_nodes(rows)
    after = (last >= 0) & (g.ts[np.maximum(last, 0)] > ev.ts[rows])  # a child before it
    rows, last = rows[after], last[after]
    if not len(rows):
        return 0
    floor = int(dur[last].min())
    ops = np.flatnonzero(ev.of_kind("cpu_op") & ~np.isin(ev.name, engine))
    ops = ops[np.argsort(ev.ts[ops], kind="stable")]
    starts = ev.ts[ops]
    shapes = dict(zip(ops.tolist(), m.shapes(ops.tolist()), strict=True))

    def size(of: Shapes) -> int:
        return max((math.prod(d) for d in of.dims if d), default=0) * element_bytes(of)

    @functools.cache
    def largest(name: str, found: Shapes) -> tuple[int, int]:
        return size(found), size(t.resized(name, found, t.marks(found))[1])

    scaled = 0
    for row, node in zip(rows.tolist(), last.tolist(), strict=True):
        lo, hi = np.searchsorted(starts, [ev.ts[row], ev.end[row]], side="right")
        sizes = [largest(ev.name_of(r), found) for r in ops[lo:hi].tolist()
                 if ev.tid[r] == ev.tid[row] and ev.rank[r] == ev.rank[row]
                 and (found := shapes[r]) is not None]
        old, new = max((a for a, _ in sizes), default=0), max((b for _, b in sizes), default=0)
        if old >= MMAP_THRESHOLD and new != old and dur[node] > floor:
            dur[node] = floor + round((int(dur[node]) - floor) * new / old)
            scaled += 1
    return scaled


def _own_sizes(m: _Model, rows: Sequence[int]) -> dict[int, tuple[int, ...]]:
    """Device ops' sizes as their trace gives them, by row: a copy's or a set's bytes, a
    kernel's grid and block (copies of 4 KB and of 100 MB share a name: one mean made the
    corpus's A100 H2D copies 6.4 ms where they took 50.7)."""
    wanted = sorted_unique(np.asarray(rows, np.int64))
    return dict(zip(wanted.tolist(), map(_own_size, detail_of(m.run, wanted)), strict=True))


def _own_size(text: str) -> tuple[int, ...]:
    try:
        args = orjson.loads(text)
    except orjson.JSONDecodeError:
        return ()
    if not isinstance(args, dict):
        return ()
    found = [args.get("bytes"), *(args.get("grid") or []), *(args.get("block") or [])]
    return tuple(v for v in found if isinstance(v, int))


def _on_tensor_cores(found: tuple[OpCost, OpCost, Shapes] | None, kernel: str
                     ) -> tuple[OpCost, OpCost, Shapes] | None:
    """An FP32 op whose kernel runs on tensor cores (TF32: cutlass tensorop, s1688, ...) is
    bounded by the tensor-core peak."""
    if found is None or not is_tensor_core(kernel):
        return found
    return tf32_if_fp32(found[0]), tf32_if_fp32(found[1]), found[2]


@dataclass(frozen=True)
class FirstTouch:
    """`_first_touch`'s answer: per kernel key, the time (ns) its op spends writing fresh pages
    in the recorded run and at the new shapes; and the time a step the rule leaves unpriced
    (`unpriced_pages`, at the same share and page time) with the ops it is of, largest first."""

    times: dict[Key, tuple[int, int]]
    unpriced_ns: int = 0
    unpriced_ops: tuple[str, ...] = ()


def _first_touch(m: _Model, costs: Costs, keyed: Mapping[Key, list[int]],
                 page_s: float) -> FirstTouch:
    """Per kernel key, the time (ns) its op spends writing fresh pages, in the recorded run and
    at the new shapes.

    Inside a profiling window, glibc's heap keeps growing: the profiler's small allocations
    take a piece of the holes freed tensors leave, so a tensor as large as a step's largest no
    longer fits any and lands on new pages, which fault on first write (the transformer's
    4 MB activations: about 1,000 faults each, every step, where 3 MB ones reuse holes).
    Modelled so: ops whose result is of the step's largest size (SIZE_CLASS) write fresh
    pages, at the profile's first-touch time per page, times the share of them the recorded
    run's page-fault counter confirms (0 to 1). Taken out of the recorded time before scaling
    and added back at the new shapes on the keys that still write fresh pages there
    (`fresh_pages`).

    A result of MMAP_THRESHOLD_MAX or more is glibc's mapping of its own whatever the heap's
    history, in the window or out of it: every page of it, at every call, at the page time
    (`mapped_pages`; outside the rule above, whose share the counter's other faults give)."""
    counted = step_faults(m.run)  # without the counter, no share of the rule above
    steps = sum(len(anchors) for anchors in m.graph.steps.values())
    if steps == 0:
        return FirstTouch({})
    out_old: dict[Key, float] = {}
    out_new: dict[Key, float] = {}
    for key, rows in keyed.items():
        name, shapes = m.ev.name_of(rows[0]), key[1]
        found = costs(name, shapes) if shapes is not None else None
        out_old[key] = output_bytes(name, shapes) if shapes is not None else 0.0
        if found is not None and found[1].op != found[0].op:  # another op there (cpu_conv_at)
            name = f"aten::{found[1].op}"
        out_new[key] = output_bytes(name, found[2]) if found is not None else out_old[key]
    allocating = _allocating(m, keyed, out_old)
    mapped_old, mapped_new = mapped_pages(allocating, out_old), mapped_pages(allocating, out_new)
    heap = {k: n for k, n in allocating.items() if k not in mapped_old}
    old, new = fresh_pages(heap, out_old, out_new)
    expected = sum(p * heap[k] for k, p in old.items()) / steps
    mapped = sum(p * allocating[k] for k, p in mapped_old.items()) / steps
    faults = counted.profiled if counted is not None else 0.0
    share = min(1.0, max(0.0, faults - mapped) / expected) if expected > 0 else 0.0
    ns, page_ns = share * page_s * 1e9, page_s * 1e9
    left = {k: p for k, p in unpriced_pages(heap, out_old, out_new).items()
            if k not in mapped_new}
    return FirstTouch({k: (round(page_ns * mapped_old[k] if k in mapped_old
                                 else ns * old.get(k, 0.0)),
                           round(page_ns * mapped_new[k] if k in mapped_new
                                 else ns * new.get(k, 0.0)))
                       for k in keyed},
                      round(ns * sum(p * allocating[k] for k, p in left.items()) / steps),
                      tuple(dict.fromkeys(m.ev.name_of(keyed[k][0]) for k in sorted(
                          left, key=lambda k: -left[k] * allocating[k]))))


def fresh_pages(allocating: Collection[Key], out_old: Mapping[Key, float],
                out_new: Mapping[Key, float]) -> tuple[dict[Key, float], dict[Key, float]]:
    """The pages of each allocating key's result taken to land on fresh memory, at the recorded
    and at the new shapes: the results of the step's largest size (SIZE_CLASS) at the recorded
    shapes, and of those the ones still of the largest size at the new.

    A step's fresh pages are glibc's trims of its heap's top: a free that leaves more free
    space there than the trim threshold (twice the dynamic mmap threshold, the largest chunk
    freed) hands it back, and the next allocation there faults it in again. The threshold
    follows the step's largest allocation, so a recorded faulting result that another
    outgrows at the new shapes no longer fills the top past it: the autoencoder's Adam
    temporaries of its 802 KB weights, 784 faults a step at batch 16, ran in 0.08-0.35 of
    their time at batch 64, where its activations are 1.6 MB (196 faults a step in all).
    Which results sit at the top when it is trimmed is the heap's history, which the trace
    does not hold: a result that becomes the largest only at the new shapes is given no fresh
    pages (priced so, the autoencoder's activations read +26% of its step at batch 64; a
    GPT's FFN results, outgrowing its logits at twice the width, did fault there)."""
    old = _largest_pages(allocating, out_old)
    return old, {k: p for k, p in _largest_pages(allocating, out_new).items() if k in old}


def mapped_pages(allocating: Collection[Key], out: Mapping[Key, float]) -> dict[Key, float]:
    """The pages of each allocating key's result that glibc maps at every allocation (one of
    MMAP_THRESHOLD_MAX or more), all of which fault at first write: an `add` of two 32 MiB
    tensors took 8,193 faults a call and 26.0 ms, where 24 MiB ones took none and 3.2 ms
    (docs/benchmarks.md, thirtieth pass)."""
    return {k: out[k] / PAGE_BYTES for k in allocating if out[k] >= MMAP_THRESHOLD_MAX}


def _largest_pages(allocating: Collection[Key], out: Mapping[Key, float]) -> dict[Key, float]:
    """The pages of each allocating key's result of the step's largest size (SIZE_CLASS)."""
    largest = max((out[k] for k in allocating), default=0.0)
    return {k: out[k] / PAGE_BYTES for k in allocating if out[k] >= SIZE_CLASS * largest > 0}


def unpriced_pages(allocating: Collection[Key], out_old: Mapping[Key, float],
                   out_new: Mapping[Key, float]) -> dict[Key, float]:
    """The pages at the new shapes of the results `fresh_pages` gives none though either could
    land on fresh memory there: those that did at the recorded shapes and are no longer of the
    step's largest size, at their new size, and those of the largest size only at the new
    shapes. Glibc's heap decides which, and Runs took each (their page-fault counters: a
    ResNet's activations kept faulting at twice the width, 1,298-1,706 faults a step in three
    recordings (621-729 at the base), where the rule gives 0; a GPT's logits stopped and its
    FFN's results took 800-1,120; the autoencoder's Adam temporaries stopped at four times the
    batch and its new largest activations took none, 196 a step in all): what the prediction
    may leave out (docs/benchmarks.md, twenty-sixth pass)."""
    old = _largest_pages(allocating, out_old)
    new = _largest_pages(allocating, out_new)
    return {**{k: out_new[k] / PAGE_BYTES for k in old if k not in new and out_new[k] > 0},
            **{k: p for k, p in new.items() if k not in old}}


def held_first_touch(measured_ns: int, before_ns: int, after_ns: int, work_ns: int = 0
                     ) -> tuple[int, int]:
    """The first-touch time (ns) an op of `measured_ns` is taken to spend, of the `before_ns`
    `_first_touch` gives it, and its time at the new shapes: at most 3/4 of what the op took,
    and no more than it took beyond its work (`work_ns`: the profile's time of its kernel at
    the recorded shapes), the new one in the same proportion where it was held. The run's
    fault share, spread over every op of the largest size, can put more on one than it
    measured: the MLP-Mixer's patch convolution, 48 us with 225 us of faults, was predicted
    x9.9 at twice the batch. And more than its kernel left: the LSTM LM's decoder addmm
    ([280, 40] x [40, 500], the profile's 170 us; it took 152 us, and 170-181 us timed alone)
    was given 410 us of its [280, 500] result's pages, held to 114 us, so 38 us of GEMM
    scaled x1.82 at twice the width, the op x1.21 where it ran x1.53-1.89
    (docs/benchmarks.md, thirty-second pass)."""
    held = max(0, min(before_ns, measured_ns - measured_ns // 4, measured_ns - work_ns))
    return held, after_ns if held == before_ns else round(after_ns * held / before_ns)


def _allocating(m: _Model, keyed: Mapping[Key, list[int]], out: Mapping[Key, float]
                ) -> dict[Key, int]:
    """Keys with a result, and how many of their rows allocate it: a row that encloses another
    compute row of the same result size (clone around copy_) only passes that one's result
    on."""
    size = {r: out[k] for k, rs in keyed.items() if out[k] > 0 for r in rs}
    outer = _enclosing(m.ev, size)
    counts = {k: sum(r not in outer for r in rs) for k, rs in keyed.items() if out[k] > 0}
    return {k: n for k, n in counts.items() if n > 0}


def _per_sample(m: _Model, insts: Instances, batch: int, factor: float, dur: I64,
                gap: I64) -> int:
    """DataLoader fetches that run an op once per sample take `factor` times as long."""
    scaled = 0
    loaders = [i for i, kind in enumerate(insts.kinds) if kind.startswith(LOADER)]
    for inst in np.flatnonzero(np.isin(insts.kind, loaders)).tolist():
        nodes = insts.nodes_of(inst).tolist()
        names = Counter(int(m.ev.name[m.graph.row[n]]) for n in nodes)
        if any(c >= batch and c % batch == 0 for c in names.values()):
            for n in nodes:
                dur[n] = round(dur[n] * factor)
                if n != insts.first[inst]:
                    gap[n] = round(gap[n] * factor)
            scaled += len(nodes)
    return scaled


def _device_busy(m: _Model, tl: Timeline, durations: I64) -> Callable[[int, int, int], int]:
    """Device-busy time of a rank in [lo, hi): union of device ops (GPU), compute pieces (CPU).
    Built once per timeline and rank, each window a few binary searches (not a pass over the
    graph per iteration, which grew with iterations x events)."""
    g = m.graph

    @functools.cache
    def of_rank(rank: int) -> Covered | WindowSums:
        if m.platform == "gpu":
            mine = (g.role == DEVICE) & (g.rank == rank)
            return Covered(tl.start[mine], tl.end[mine])
        mine = m.compute & (g.rank == rank)
        return WindowSums(tl.start[mine], durations[mine])

    return lambda rank, lo, hi: of_rank(rank).within(lo, hi)


def _breakdowns(m: _Model, tl: Timeline, durations: I64
                ) -> Callable[[int, int, int], dict[str, int]]:
    """Per rank and [lo, hi): device time per kind (GPU), or a partition of the host's time
    (CPU): compute (the union of its pieces over the threads), framework (the rest of the
    union of every op piece: threads working at once, a DDP rank's gloo threads beside its
    loop, count once) and python (the rest); built once per timeline, like _device_busy."""
    g, ev = m.graph, m.ev

    @functools.cache
    def of_rank(rank: int) -> dict[str, Covered]:
        if m.platform == "gpu":
            out: dict[str, Covered] = {}
            for kind in ("kernel", "collective", "memcpy", "memset"):
                mine = (g.role == DEVICE) & (g.rank == rank) & (g.row >= 0)
                mine[mine] = ev.kind[g.row[mine]] == KIND[kind]
                out[kind] = Covered(tl.start[mine], tl.end[mine])
            return out
        host = (g.role == HOST) & (g.rank == rank)
        ends = tl.start + durations
        return {"compute": Covered(tl.start[host & m.compute], ends[host & m.compute]),
                "busy": Covered(tl.start[host], ends[host])}

    def breakdown(rank: int, lo: int, hi: int) -> dict[str, int]:
        out = {k: v.within(lo, hi) for k, v in of_rank(rank).items()}
        if m.platform != "gpu":
            busy = out.pop("busy")
            out["framework"] = busy - out["compute"]
            out["python"] = hi - lo - busy
        return out

    return breakdown


def predict(run: Run, change: Change = Change(), *, profile: Profile | None = None,
            overheads: OverheadModel | None = None, compare: Run | None = None,
            source_device: str | None = None, gpu_model: KernelModel | None = None
            ) -> Prediction:
    """`gpu_model`: the GPU kernel model to price GPU kernels with (default the bundled one)."""
    m = load_model(run)
    g = m.graph
    notes: list[str] = [WINDOW_NOTE] if m.window else []
    # the replay's iterations, not its timeline (a start and an end per node, to the end)
    replayed = m.iterations(simulate(m.schedule), g.dur)
    dur, gap = g.dur.copy(), g.gap.copy()
    is_call = np.zeros(len(g), bool)
    host = np.flatnonzero((g.role == HOST) & (g.row >= 0))
    is_call[host] = m.ev.of_kind("runtime", "driver")[g.row[host]]
    kernel_point = m.compute if m.platform == "cpu" else is_call
    insts = instances(g, m.ev, kernel_point)
    measured = m.iterations(Timeline(g.ts, g.end), g.end - g.ts)
    lengths = {(rank, step): hi - lo for rank, step, lo, hi, _ in measured}
    every = step_threads(run.table("counters", columns=["rank", "ts", "name", "value"]),
                         run.table("steps"))  # every step's threads, read once
    counted = {k: n for k, n in every.items() if k in lengths}  # the profiled steps'
    threads = recorded_threads(run, counted)
    if changed := history(counted):  # the steps of one count are of the program: the others'
        lengths = {k: v for k, v in lengths.items() if counted.get(k, threads) == threads}
        notes.append(THREADS_NOTE.format(history=changed, threads=threads, steps=len(lengths)))
    found = steady_of(lengths)
    steady = found.keys
    if found.spread > NOISY_SPREAD or 2 * len(steady) <= len(lengths):
        notes.append(f"{len(steady)} of {len(lengths)} profiled steps are steady and they vary "
                     f"by {100 * found.spread:.1f}% (GMAE): their work differs (inputs of "
                     "varying sizes) or other load stretched some; no prediction can be judged "
                     "closer than that")
    stalls = stalled(g, m.ev)
    # waits, neither fitted nor set: a thread's through whole steps, and on other ranks
    waits, waited = collective_waits(g, m.ev)
    idle = g.idle_gaps() | waited
    model = overheads or fit_overheads(g, m.ev, insts, stalls, idle, waits, m.step, found)
    if overheads is not None:  # another Run's model prices the host; this Run's own is as measured
        keep = stalls | waits
        synced = g.last_nodes(m.synced_calls)
        keep[synced[synced >= 0]] = True
        apply_overheads(model, g, m.ev, insts, dur, gap, keep, idle)
    # the instances again only for a batch's per-sample work: not held through the kernels'
    # pass and the simulation otherwise (4.7 MB at 200k trace events)
    per_sample = insts if change.batch_size is not None else None
    del insts

    shapeless = (m.platform == "cpu" and change.device is None and not m.compute.any()
                 and not _cpu_shapes(m))
    if shapeless:
        why = "no op has recorded shapes (torch.profiler's record_shapes=False, its default)"
        if change.batch_size is not None or change.dims:  # (every op had been kept at its
            # time, the same step predicted; a profile or batch size asked for first)
            raise ParameterError(None, f"{why}: a changed batch size or dimension needs them; "
                                 "record with record_shapes=True", subject=run.path)
        notes.append(f"{why}: no op can be told to compute, so compute reads 0 and every op's "
                     "own time counts as the framework's; record with record_shapes=True to "
                     "split them")

    fixed = parameter_shapes(m) - sparse_tables(m)
    batch: tuple[int, int] | None = None
    factor = 1.0
    if change.batch_size is not None:
        recorded, differ = (change.recorded_batch_size, "") if change.recorded_batch_size \
            else recorded_batch_size(m, fixed)
        notes += [differ] if differ else []
        if recorded is None:
            raise ParameterError(None, "cannot tell the recorded batch size; give it with "
                                 "{recorded_batch_size}", subject=run.path)
        batch, factor = (recorded, change.batch_size), change.batch_size / recorded
    source = _source_spec(m, source_device) if m.platform == "gpu" else None
    target_name = change.device
    scaler: KernelScaler | None
    unmodelled: LearnedScaler | None = None
    if m.platform == "cpu":
        if change.device is not None:
            if batch is not None or change.dims or compare is not None or source_device:
                # (a comparison Run and a source device had been taken and ignored)
                raise ParameterError(None, "recorded on the CPU; {device} forecasts it at its "
                                     "recorded shapes (no {batch_size}, {dim}, {compare} or "
                                     "{source_device})", subject=run.path)
            return _op_graph_prediction(m, change, model, replayed, measured, notes,
                                        steady, gpu_model)
        needs_model = batch is not None or bool(change.dims)
        if needs_model and profile is None:  # named: the parameter that asked for the model
            raise ParameterError("batch_size" if batch is not None else "dims",
                                 "a changed batch size or dimension on a CPU run needs a "
                                 "kernel profile: run `perfswarm calibrate` and pass "
                                 "{profile} cpu-profile.json", subject="predict",
                                 value=change.batch_size)
        scaler = ProfileScaler(profile) if profile is not None else None
        if profile is None:
            notes.append(NO_PROFILE_NOTE)
        source_name = target_name = "cpu"
        if profile is not None and profile.unusable() and needs_model:
            notes.append("the profile's held-out error is above "
                         f"{100 * UNUSABLE_GMAE:.0f}% for {', '.join(profile.unusable())}: "
                         "its sweeps timed other load; recalibrate on a quieter machine")
    else:
        if source is None and (change.device or batch or change.dims):
            raise ParameterError(None, "cannot tell which GPU recorded this run; give "
                                 "{source_device}", subject=run.path)
        target = load_spec(change.device) if change.device else source
        if source is not None and target is not None:
            learned = LearnedScaler.of(source, target, gpu_model)
            scaler, unmodelled = learned, learned if change.device else None
        else:
            scaler = None
        source_name = source.name if source else "unknown GPU"
        target_name = target.name if target else source_name
    if change.dims and (absent := sorted({a for a, _ in change.dims} - {
        x for s in _cpu_shapes(m) for d in s.dims for x in d})):
        # (it had changed nothing, the recorded step predicted as if at the new size)
        raise ParameterError("dims", "no op of the Run has a recorded dimension "
                             + ", ".join(map(str, absent)) + ": nothing to change",
                             subject=run.path)
    dims = derived_dims(dict(change.dims), fixed)
    if len(dims) > len(change.dims):
        notes.append("dimensions following the change as parameters' multiples of it: "
                     + ", ".join(f"{a} -> {b}" for a, b in sorted(dims.items())
                                 if a not in dict(change.dims)))
    if heads := _heads_following(m, dims):
        notes.append("attention's head dimension following the width (its heads kept): "
                     + ", ".join(f"{a} -> {b}" for a, b in sorted(heads)))
    transform = _Transform(factor, dims, fixed, threads)
    counts, touch = _scale_kernels(m, transform, scaler, unmodelled, dur, found)
    if m.platform == "cpu" and (compiled := _compiled_kernels_ns(m, measured, steady)):
        notes.append(COMPILED_NOTE.format(
            ms=compiled / 1e6, pct=100 * compiled / found.median_ns,
            changed=", at the new shapes too (unmodelled: it grows with the activations it "
            "computes)" if batch is not None or dims else ""))
    if isinstance(scaler, ProfileScaler) and (batch is not None or dims):
        notes += _unswept(m, scaler, measured, steady, found.median_ns)
    if touch.unpriced_ns:
        notes.append(UNPRICED_NOTE.format(ops=", ".join(touch.unpriced_ops[:4]),
                                          ms=touch.unpriced_ns / 1e6))
    if (m.platform == "cpu" and scaler is not None and (batch is not None or dims)
            and (released := _release_tails(m, transform, dur))):
        counts["release"] = released
    if batch is not None:
        assert per_sample is not None
        counts["per_sample"] = _per_sample(m, per_sample, batch[0], factor, dur, gap)
        if counts["per_sample"] == 0:
            notes.append("no per-sample DataLoader work found; input pipeline time kept")
    gap = g.anchor_gaps(dur, gap)
    predicted = simulate(m.schedule, dur, gap)
    notes += _window_faults(run, profile, every, threads)
    own = unprofiled(run, every, threads, notes)
    compared = _compare(compare) if compare is not None else None
    breakdown = _breakdowns(m, predicted, dur)
    steps = [StepResult(rank, step, hi - lo, r_hi - r_lo, p_hi - p_lo,
                        {"measured": active, "replayed": r_active, "predicted": p_active},
                        breakdown(rank, p_lo, p_hi))
             for (rank, step, lo, hi, active), (_, _, r_lo, r_hi, r_active),
             (_, _, p_lo, p_hi, p_active) in zip(measured, replayed,
                                                 m.iterations(predicted, dur), strict=True)]
    return Prediction(str(run.path), m.platform, source_name, target_name or source_name,
                      change, batch, tuple(steps), dict(counts),
                      {r: lags.to_dict() for r, lags in g.lags.items()}, model, compared,
                      tuple(notes), steady, own,
                      unprofiled(compare) if compare is not None else None,
                      touch.unpriced_ns)


def _op_graph_prediction(m: _Model, change: Change, overheads: OverheadModel,
                         replayed: list[tuple[int, int, int, int, int]],
                         measured: list[tuple[int, int, int, int, int]], notes: list[str],
                         steady: frozenset[tuple[int, int]],
                         gpu_model: KernelModel | None) -> Prediction:
    """A CPU Run's iterations forecast on a GPU from its op graph (model/gpu/opgraph.py), beside
    what `predict` found of them (replayed, measured, steady, its notes)."""
    target = load_spec(change.device or "")
    g = m.graph
    precision = Precision.of_record(m.run.manifest().get("extra", {}).get("record", {}))
    ev = m.ev
    ops = np.zeros(len(ev), bool)
    for _, _, lo, hi, _ in measured:
        ops |= (ev.ts >= lo) & (ev.ts < hi)
    rows = np.flatnonzero(ops & ev.of_kind("cpu_op")).tolist()
    known = dict(zip(rows, m.shapes(rows), strict=True))  # every op of the steps, one read
    forecasts = op_graph_steps(ev, known.__getitem__, [(lo, hi) for _, _, lo, hi, _ in measured],
                               target, gpu_model, precision, parameter_shapes(m),
                               [(rank, step) in steady for rank, step, *_ in measured])
    notes = [*notes, precision.describe()]
    steps = tuple(StepResult(rank, step, hi - lo, r_hi - r_lo, f.predicted_ns,
                             {"measured": active, "replayed": r_active,
                              "predicted": f.device_ns}, f.families_ns)
                  for (rank, step, lo, hi, active), (_, _, r_lo, r_hi, r_active), f
                  in zip(measured, replayed, forecasts, strict=True))
    if not any(f.families_ns or f.unpriced for f in forecasts):
        raise NotApplicable(None, "no ops with recorded shapes to forecast on a GPU (record "
                            "with shapes: torch.profiler record_shapes=True)",
                            subject=m.run.path)
    host = {part: statistics.median(f.host_ns[part] for f in forecasts) / 1e6
            for part in ("python", "dispatch", "launch")}
    notes = [*notes, f"host per step on the GPU's host: Python {host['python']:.3f} ms and "
             f"dispatch of the ops that launch nothing {host['dispatch']:.3f} ms, at the "
             f"recording host's speed, and launches {host['launch']:.3f} ms at a GPU host's "
             f"{HOST_OP_NS / 1e3:.1f} us each (medians), each as the profiler records it: a "
             "step the host holds up runs faster bare (docs/benchmarks.md: 1.5-2.9x on an "
             "H200's host)"]
    unpriced = sum((f.unpriced for f in forecasts), Counter())
    if unpriced:
        notes = [*notes, "ops it could not price (kept at the host's time per op): "
                 + ", ".join(f"{n} x{c}" for n, c in unpriced.most_common(8))]
    left = sum((f.left_out for f in forecasts), Counter())
    whole = sum(hi - lo for _, _, lo, hi, _ in measured)
    big = [(n, ns) for n, ns in left.most_common(5) if ns >= LEFT_OUT_SHARE * whole]
    if big:
        notes = [*notes, "left out, no GPU kernel model for them: " + ", ".join(
            f"{n} ({100 * ns / whole:.1f}% of the steps' time on the CPU)" for n, ns in big)]
    return Prediction(str(m.run.path), m.platform, "cpu", target.name, change, None, steps,
                      {"priced": sum(sum(f.families_ns.values()) > 0 for f in forecasts),
                       "unpriced": sum(unpriced.values())},
                      {r: lags.to_dict() for r, lags in g.lags.items()}, overheads, None,
                      tuple(notes), steady)


Measured = Sequence[tuple[int, int, int, int, int]]  # m.iterations: rank, step, start, end, active


def _steady_median(rank: I64, ts: I64, dur: I64, measured: Measured,
                   steady: frozenset[StepKey]) -> float:
    """The median over the steady `measured` steps (all of them without steady ones) of the
    time `dur` of the pieces (on `rank`, starting at `ts`) in each step."""
    per_step = [int(dur[(rank == r) & (ts >= lo) & (ts < hi)].sum())
                for r, step, lo, hi, _ in measured if not steady or (r, step) in steady]
    return statistics.median(per_step) if per_step else 0.0


def _compiled_kernels_ns(m: _Model, measured: Measured, steady: frozenset[StepKey]) -> int:
    """The time a step spends in torch.compile's generated kernels on the CPU: its compiled
    graphs' calls' time (COMPILED_GRAPH) that no op inside them on their thread covers, the
    `_steady_median`; 0 without compiled graphs. (It had been counted as the framework's
    time, unsaid.)"""
    ev = m.ev
    codes = [i for i, n in enumerate(ev.names) if COMPILED_GRAPH.match(n)]
    calls = np.flatnonzero(np.isin(ev.name, codes)) if codes else np.zeros(0, np.int64)
    if not len(calls):
        return 0
    ops = np.flatnonzero(ev.of_kind("cpu_op"))
    own = np.zeros(len(calls), np.int64)
    for i, c in enumerate(calls.tolist()):
        inner = ops[(ev.rank[ops] == ev.rank[c]) & (ev.tid[ops] == ev.tid[c])
                    & (ev.ts[ops] >= ev.ts[c]) & (ev.end[ops] <= ev.end[c])]
        starts, ends = union(ev.ts[inner].astype(np.int64), ev.end[inner].astype(np.int64))
        own[i] = int(ev.end[c] - ev.ts[c]) - int((ends - starts).sum())
    return round(_steady_median(ev.rank[calls], ev.ts[calls], own, measured, steady))


def _unswept(m: _Model, scaler: ProfileScaler, measured: Measured,
             steady: frozenset[StepKey], step_ns: float) -> list[str]:
    """Notes where ops with a cost model, which a CPU profile prices, compute in a reduced
    precision (bf16, fp16: the profile swept SWEPT_DTYPE alone): BY_WORK_NOTE of those the
    scaler prices by their work (ProfileScaler.by_work, on a node's own time; the model priced
    once an op), UNSWEPT_NOTE
    of the rest, each with the four names with the most compute time, and that time a step of
    them all (`_steady_median`), of the steady median step `step_ns`."""
    g, ev = m.graph, m.ev
    node = np.flatnonzero(m.compute)
    rows = np.unique(g.row[node])
    costs = [(data_cost(ev.names[ev.name[r]], sh), sh.dims) if sh is not None else (None, ())
             for r, sh in zip(rows.tolist(), m.shapes(rows.tolist()), strict=True)]
    reduced = {r: (ev.names[ev.name[r]], c, dims) for r, (c, dims) in zip(rows.tolist(), costs,
                                                                         strict=True)
               if c is not None and c.dtype in REDUCED_DTYPES}
    hit = node[np.isin(g.row[node], list(reduced))]
    slow = {r: scaler.slow_from(c, dims) for r, (_, c, dims) in reduced.items()}  # an op's once
    by_work = np.array([(s := slow[r]) is not None and t * 1e-9 >= s
                        for r, t in zip(g.row[hit].tolist(), g.dur[hit].tolist(), strict=True)],
                       bool)
    notes = []
    for note, part in ((BY_WORK_NOTE, hit[by_work]), (UNSWEPT_NOTE, hit[~by_work])):
        ns = _steady_median(ev.rank[g.row[part]], g.ts[part], g.dur[part], measured, steady)
        if ns <= 0:
            continue
        by_name: Counter[str] = Counter()
        for r, t in zip(g.row[part].tolist(), g.dur[part].tolist(), strict=True):
            by_name[reduced[r][0]] += t
        notes.append(note.format(
            ops=", ".join(n for n, _ in by_name.most_common(4)),
            dtypes="/".join(sorted({reduced[r][1].dtype for r in g.row[part].tolist()})),
            ms=ns / 1e6, pct=100 * ns / step_ns, swept=SWEPT_DTYPE, slow=REDUCED_SLOW))
    return notes


def _window_faults(run: Run, profile: Profile | None, counted: Mapping[StepKey, int],
                   threads: int | None) -> list[str]:
    """A note where the profiled steps took more page faults than the steps after the
    window (iterations.StepFaults): a profiled step's own cost, which the prediction, of a
    profiled step, carries. Steps `counted` (step_threads) at other intra-op threads than
    the prediction's `threads` are left out on both sides, as `unprofiled` leaves them."""
    found = step_faults(run, [k for k, n in counted.items() if threads not in (None, n)])
    if found is None or found.outside is None or found.profiled - found.outside < (
            FAULT_EXCESS * found.profiled) or found.profiled <= 0:
        return []
    extra = found.profiled - found.outside
    cost = (f" (at the profile's {profile.page_s * 1e6:.2f} us a page, "
            f"{extra * profile.page_s * 1e3:.2f} ms a step)"
            if profile is not None and profile.page_s > 0 else "")
    return [f"the profiled steps took {found.profiled:,.0f} page faults each, those after the "
            f"window {found.outside:,.0f}: the profiler's allocations share glibc's heap with "
            f"the program's, so more of a profiled step's tensors land on fresh pages{cost}; "
            "the prediction, of a profiled step, carries them"]


def unprofiled(run: Run, counted: Mapping[StepKey, int] | None = None,
               threads: int | None = None, notes: list[str] | None = None) -> int | None:
    """The Run's program step outside the profiler's window (iterations.step_time: the
    median of the steps the recorder timed after it), None where it timed none there or
    where those steps differ (a robust spread over ALIKE of their median: sequences bucketed
    by length, or other load stretching some), which no one step stands for: said in `notes`
    (the row had gone missing unsaid). With `threads` (the count the
    prediction is of), a step `counted` (every step's intra-op threads, step_threads) at
    other intra-op threads is another program's: left out, and those after the window said
    in `notes`."""
    steps, sizes = run.table("steps"), batch_sizes(run)
    timing = step_time(steps, sizes)
    if counted and timing is not None and threads is not None:
        ran = [counted.get((r, s), threads) for r, s in zip(
            steps.column("rank").to_pylist(), steps.column("step").to_pylist(), strict=True)]
        kept = step_time(steps.filter(pa.array([n == threads for n in ran])), sizes)
        left = (timing.steps if timing.outside else 0) - (kept.steps if kept is not None
                                                          and kept.outside else 0)
        if left > 0 and notes is not None:
            notes.append(f"{left} steps after the window ran at other intra-op threads ("
                         + ", ".join(map(str, sorted(set(ran) - {threads}))) + ") than the "
                         f"prediction's {threads}: left out of the program's own step there")
        timing = kept
    if timing is None or not timing.outside:
        return None
    if timing.spread_ns > ALIKE * timing.median_ns:
        if notes is not None:
            notes.append(SPREAD_AFTER_NOTE.format(
                steps=timing.steps, spread=100 * timing.spread_ns / timing.median_ns,
                median=timing.median_ns / 1e6, alike=100 * ALIKE))
        return None
    return round(timing.median_ns)


def _compare(run: Run) -> tuple[str, int, int]:
    """The median steady step of another Run (the target configuration, measured: its steps
    judged as the recorded Run's are, `steady_steps`) and their median device-active time."""
    m = load_model(run)
    steps = m.iterations(Timeline(m.graph.ts, m.graph.end), m.graph.end - m.graph.ts)
    found = steady_of({(rank, step): hi - lo for rank, step, lo, hi, _ in steps})
    kept = [s for s in steps if (s[0], s[1]) in found.keys] or steps
    return (str(run.path), found.median_ns, int(statistics.median(active for *_, active in kept)))
