"""The overview's step-time breakdown, model FLOP/s (MFU, HFU) and throughput (samples and
tokens a second), as TensorBoard's profiler shows them.

Each instant of a step falls in one category by priority: device compute (a kernel runs),
communication (a collective), memory copy (memcpy/memset), data loading (a DataLoader span on
the host), host compute (any other op on a host thread), other (synchronization and the rest),
and idle (nothing). The categories partition the step, so they add up to its duration.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

import numpy as np
import orjson
import pyarrow as pa

from perfswarm.analyze.concurrency import Activity
from perfswarm.analyze.dependencies import enclosing_rows
from perfswarm.analyze.frame import (
    COMPILED_CALL,
    COMPILED_REGION,
    DEVICE_OPS,
    Events,
    detail_of,
    lane_key,
)
from perfswarm.analyze.intervals import I64, Mask, state_sweep
from perfswarm.analyze.iterations import batch_sizes, step_batches
from perfswarm.analyze.loaded import Loaded
from perfswarm.analyze.phases import BACKWARD, nested, parameter_rows, phases, step_calls
from perfswarm.analyze.summary import analyze
from perfswarm.analyze.system import host_cores, recorder_steps
from perfswarm.model.opcost import (
    FLOAT_TYPES,
    RNN_OPS,
    Shapes,
    has_cost_model,
    shapes_cost,
    token_input,
)
from perfswarm.model.opstats import RowShapes
from perfswarm.model.predict import batch_flag
from perfswarm.model.specs import spec_of_devices
from perfswarm.trace.store import Run

CATEGORIES: Final = ("device compute", "communication", "memory copy", "data loading",
                     "host compute", "other", "idle", "untraced")
# a rank with no device work (a CPU run, or a program without torch whose steps were found in
# sampled stacks or syscalls): time no span covers is not idle, it is unseen by any trace
# (Python between the ops, or a wait: perf's samples tell the CPU busy card which)
UNTRACED: Final = CATEGORIES.index("untraced")
LOADER: Final = re.compile(r"DataLoader")
_NOT_WORK: Final = ("instant", "trace_span", "profiler_range")
ACCUMULATE_GRAD: Final = "torch::autograd::AccumulateGrad"  # a parameter's gradient, a pass


def _sets(ev: Events, rank: int) -> list[tuple[I64, I64]]:
    """The rank's intervals of each category but idle, in CATEGORIES' order: analyze's
    activity (kernels, collectives, copies, the busy host) with the host's DataLoader spans
    and the other work besides; then its collectives on host threads (gloo's: communication,
    under the host's compute: _PRIORITY)."""
    activity = Activity.of_rank(ev, rank)
    rows = ev.rank_slice(rank)
    loader_codes = [i for i, n in enumerate(ev.names) if LOADER.search(n)]
    loading = (ev.host_busy & np.isin(ev.name, loader_codes))[rows]
    work = ((ev.dur > 0) & ~ev.of_kind(*_NOT_WORK) & ~ev.is_step_marker)[rows]
    taken = ev.of_kind(*DEVICE_OPS)[rows] | ev.host_busy[rows]
    other = work & ~taken
    ts, end = ev.ts[rows], ev.end[rows]
    # the host set stands for host compute: where a loader span runs, data loading wins
    return [activity.compute, activity.comm, activity.memory, (ts[loading], end[loading]),
            activity.host, (ts[other], end[other]), activity.host_comm]


# _sets' index -> its category, in the order an instant takes the first that covers it
_PRIORITY: Final = ((0, 0), (1, 1), (2, 2), (3, 3), (4, 4), (6, 1), (5, 5))


def step_breakdown(ev: Events, steps: Mapping[str, Sequence[Mapping[str, Any]]],
                   ) -> list[dict[str, Any]]:
    """ns per category of every step (`steps`: the analysis's iterations per rank)."""
    rows: list[dict[str, Any]] = []
    for rank_key, windows in sorted(steps.items(), key=lambda kv: int(kv[0])):
        rank = int(rank_key)
        bounds = np.asarray([w["start"] for w in windows] + [w["end"] for w in windows],
                            np.int64)
        mine = ev.rank_slice(rank)
        device = bool(ev.of_kind(*DEVICE_OPS)[mine].any())
        rest = CATEGORIES.index("idle") if device else UNTRACED

        def category(covers: list[Mask], rest: int = rest) -> I64:
            return np.select([covers[s] for s, _ in _PRIORITY], [c for _, c in _PRIORITY],
                             default=rest).astype(np.int64)

        sums = state_sweep(_sets(ev, rank), category, len(CATEGORIES), rest, bounds)
        ns = sums.between(bounds[:len(windows)], bounds[len(windows):]).tolist()
        for w, n in zip(windows, ns, strict=True):
            rows.append({"rank": rank, "step": w["step"], "dur_ns": int(w["end"] - w["start"]),
                         "ns": dict(zip(CATEGORIES, n, strict=True))})
    return rows


def model_flops(op_cost: Mapping[str, Any], devices: Sequence[Mapping[str, Any]],
                step_ns: float, steps: int, ranks: int) -> dict[str, Any] | None:
    """FLOP/s per rank at the step time the rate cards are over (`step_ns`: the median step;
    a forward-driven loop's mean, its waits for input included: StepTime.rate_ns), two ways
    (PaLM's MFU and HFU): a step's FLOPs (those of the profiled `steps` over their count)
    over it. Hardware FLOPs are those of every costed op that ran (forward, backward with any
    recomputation, optimizer); model FLOPs are the forward's, times 3 when a backward ran
    (its two products per forward product: the input's and the weight's gradient), but once
    for the forward ops autograd made no node for (a no-grad evaluation inside the steps:
    no backward follows them). On a GPU with a spec, each against its peak for the ops'
    dtype. (Over the profiled steps' sum, a slow first step had put a loop's rate 23% under
    its own step time's.)"""
    phase = op_cost["phase_flops"]
    hardware = float(op_cost["flops"])
    no_grad = float(op_cost["no_grad_flops"])
    model = (3 * (phase["forward"] - no_grad) + no_grad) if phase["backward"] \
        else phase["forward"]
    if not hardware or step_ns <= 0 or steps <= 0:
        return None
    seconds = step_ns * steps / 1e9
    spec = spec_of_devices(devices) if op_cost["device"] else None
    ops = op_cost["ops"]
    dtype = max(ops, key=lambda o: o["flops"] * o["count"])["dtype"] if ops else "fp32"
    peak = spec.peak_for(dtype) if spec is not None else None
    hfu_rate, mfu_rate = hardware / ranks / seconds, model / ranks / seconds
    return {"flops": hardware, "model_flops": model, "phase_flops": dict(phase),
            "no_grad_flops": no_grad,
            "flops_per_s": hfu_rate, "model_flops_per_s": mfu_rate, "dtype": dtype,
            "peak_flops_per_s": peak, "hfu": hfu_rate / peak if peak else None,
            "mfu": mfu_rate / peak if peak else None,
            "device": spec.name if spec is not None else None,
            "coverage": float(op_cost["coverage"])}


EMBEDDING: Final = "aten::embedding"
EMBEDDING_BACKWARD: Final = "aten::embedding_dense_backward"
_FIRST_FAMILIES: Final = ("gemm", "conv", "depthwise_conv")
_BIAS_FIRST: Final = frozenset({"aten::addmm", "aten::baddbmm", "aten::addbmm"})
_RNN_PROBES: Final = 8  # an RNN's calls read to tell its layout


def _in_windows(ev: Events, rows: I64, windows: Sequence[Mapping[str, Any]]) -> I64:
    starts = np.asarray([w["start"] for w in windows], np.int64)
    ends = np.asarray([w["end"] for w in windows], np.int64)
    i = np.searchsorted(starts, ev.ts[rows], side="right") - 1
    return rows[(i >= 0) & (ev.ts[rows] < ends[np.maximum(i, 0)])]


def _in_order(run: Run, ev: Events, rows: I64) -> list[tuple[int, Shapes | None]]:
    """(row, recorded shapes) of the rows (ascending) of the Run's events, in time order, an
    outer op before the ops inside it: the shapes parsed once per Run (RowShapes: the op costs
    and the advice have parsed most of these rows already)."""
    shapes = dict(zip(rows.tolist(), RowShapes.of(run).get(rows), strict=True))
    return [(r, shapes[r]) for r in rows[np.lexsort((-ev.dur[rows], ev.ts[rows]))].tolist()]


def run_throughput(run: Run) -> dict[str, Any] | None:
    """`throughput` of the Run's events over its analysis's steps, once per Run object (the
    report's cards and the per-sample advice both read it: 0.08 CPU s at 200k events)."""
    def make() -> dict[str, Any] | None:
        steps = analyze(run).iterations.steps
        return throughput(run, Events.load(run),
                          {str(r): [w.to_dict() for w in ws] for r, ws in steps.items()})

    return run.memo(("throughput",), make)


def throughput(run: Run, ev: Events, steps: Mapping[str, Sequence[Mapping[str, Any]]],
               ) -> dict[str, Any] | None:
    """Samples (and tokens) per second of the first rank's steps that ran the model, and where
    the batch came from: the samples the DataLoaders handed each step, where the recorder
    counted them (`_from_loader`: a graph network's graphs, where its first layer reads their
    nodes); else, best first, the token embedding's indices (batch x sequence, or
    sequence x batch where an RNN runs time-major on them; the passes its backward trained
    where it has one, every lookup of an inference step); the leading dimension of the
    activation input of each step's first matrix product or convolution; of a forward-driven
    loop whose products no cost model prices (quantize_dynamic's quantized::linear_dynamic),
    the recorder's step batch; or the recorded command's --batch-size (every step), each times
    the step's forward and backward passes (_passes: a gradient accumulation's micro-batches;
    one without a backward). A step where
    the model did not run (a window the profiler cut before its forward) is left out. Per the
    median step where every step ran the same batch (the profiler's first step runs slow);
    where they differ (an inference server's requests), every sample over the steps' whole
    time; where every step only decodes (one token for each of its sequences), tokens and no
    samples. None when none of them says."""
    if not steps:
        return None
    rank, windows = min(steps.items(), key=lambda kv: int(kv[0]))
    if not windows:
        return None
    mine = np.arange(len(ev))[ev.rank_slice(int(rank))]
    found = _samples(run, ev, int(rank), mine, windows)
    if found is None:
        return None
    samples, tokens, source = found
    same = len(set(samples.values())) == 1
    if not same:
        # every sample over the steps' whole time: a step that times the recorder (the
        # profiler's start, another process's start or export) left out, as advice leaves it
        # (a graph network's 16.9 ms among steps of 4-9 had been 27% of the time its samples
        # were over), and the samples read again over the others: the source's count of
        # steps is the figure's
        aside = {step for r, step in recorder_steps(run.table("steps"), run.table("counters"),
                                                    host_cores(run.manifest()) or 1)
                 if r == int(rank)}
        kept = [w for w in windows if w["step"] not in aside]
        again = _samples(run, ev, int(rank), mine, kept) if 0 < len(kept) < len(windows) \
            else None
        if again is not None:
            left = sorted(aside & {w["step"] for w in windows})
            samples, tokens, source = again
            source += (f"; step {left[0]} left out: it times" if len(left) == 1 else
                       f"; steps {', '.join(map(str, left))} left out: they time") + \
                " the recorder, not the program"
            windows, same = kept, len(set(samples.values())) == 1
    ran = sorted(samples)
    counts = np.array([samples[i] for i in ran], np.float64)
    durs = np.array([windows[i]["end"] - windows[i]["start"] for i in ran], np.float64)
    # per the median step, as the steps/s card (the profiler's first step runs slow), unless
    # the steps' batches differ
    step_s = float(np.median(durs) if same else durs.mean()) / 1e9
    tok = np.array([tokens[i] for i in ran], np.float64) if tokens is not None else None
    if not counts.any():  # every step decodes: tokens, and no sample started
        return ({"samples_per_s": None, "samples_per_step": None,
                 "tokens_per_s": tok.mean() / step_s, "tokens_per_step": tok.mean(),
                 "steps": len(ran), "same_batch": same, "source": source, "rank": int(rank)}
                if tok is not None and tok.any() else None)
    return {"samples_per_s": counts.mean() / step_s, "samples_per_step": counts.mean(),
            "tokens_per_s": tok.mean() / step_s if tok is not None else None,
            "tokens_per_step": tok.mean() if tok is not None else None,
            "steps": len(ran), "same_batch": same, "source": source + ("" if same else (
                "; the steps' batches differ: every sample over the steps' whole time")),
            "rank": int(rank)}


def _samples(run: Run, ev: Events, rank: int, mine: I64,
             windows: Sequence[Mapping[str, Any]]
             ) -> tuple[dict[int, int], dict[int, int] | None, str] | None:
    """Samples (and tokens) per window of `rank` (its rows `mine`), and where they came from,
    from the first source that says (`throughput`'s order); None when none does. The
    loaders' samples count in the steps where the model's own count found the model ran (a
    window the profiler cut before its forward is left out), where they were counted in half
    of those or more (a loader of large chunks that the loop splits into steps hands most
    steps none), and the words say what the model's own count read where it differs (a
    graph network's first layer: its nodes)."""
    loaded = _from_loader(run, rank, windows)
    own = _model_samples(run, ev, rank, mine, windows)
    ran = set(own[0]) if own is not None else set(range(len(windows)))
    loaded = {i: n for i, n in loaded.items() if i in ran}
    if 2 * len(loaded) < len(ran):  # no batch a step: a loader of chunks the loop splits
        return own
    source = ("the samples of the batches the DataLoader handed each step (the length of "
              "each batch's index list from its batch sampler, as the recorder counted them), "
              f"in {len(loaded)} of {len(windows)} steps")
    if own is None:
        return loaded, None, source
    samples, tokens, said = own
    read = float(np.median(list(samples.values())))
    if read != float(np.median(list(loaded.values()))):
        source += f"; the model's own count ({said}) reads {read:,.4g} a step"
    return loaded, tokens, source


def _from_loader(run: Run, rank: int, windows: Sequence[Mapping[str, Any]]
                 ) -> dict[int, int]:
    """Per window of `rank`, the samples its DataLoaders handed it, as the recorder counted
    them at the step hooks (analyze.loaded: those of batches taken with autograd on, where
    it took any), where it counted some."""
    steps = pa.table({"rank": np.full(len(windows), rank, np.int64),
                      **{k: np.asarray([w[k] for w in windows], np.int64)
                         for k in ("start", "end")}})
    found = Loaded.of(run.table("counters", ["rank", "ts", "name", "value"]), steps
                      ).step_samples()
    return {int(i): int(found[i]) for i in np.flatnonzero(~np.isnan(found))}


def _model_samples(run: Run, ev: Events, rank: int, mine: I64,
                   windows: Sequence[Mapping[str, Any]]
                   ) -> tuple[dict[int, int], dict[int, int] | None, str] | None:
    """Samples (and tokens) per window from the model's own ops, else the recorder's step
    batch, else the command's --batch-size (`throughput`'s order); None when none says."""
    samples, tokens, source = _from_embedding(run, ev, mine, windows)
    if not samples:
        samples, tokens, source = _from_compiled(run, ev, mine, windows)
    if not samples:
        samples, source = _from_first_op(run, ev, mine, windows)
    if not samples:
        samples, source = _from_step_batch(run, rank, windows)
    if not samples:
        flag = batch_flag(run.manifest()["command"])
        if flag is None:
            return None
        passes = np.maximum(_passes(ev, mine, windows), 1)
        samples = {i: flag * int(p) for i, p in enumerate(passes)}
        source = f"the command's --batch-size {flag}" + (
            ", x the forward and backward passes of each step" if passes.max() > 1 else "")
    return samples, tokens, source


def _steps_of(ev: Events, windows: Sequence[Mapping[str, Any]], rows: Sequence[int]
              ) -> list[int]:
    """The index of the window each row starts in (rows already in one, `_in_windows`)."""
    starts = np.asarray([w["start"] for w in windows], np.int64)
    found: list[int] = (np.searchsorted(starts, ev.ts[np.asarray(rows, np.int64)],
                                        side="right") - 1).tolist()
    return found


def _args_of(run: Run, rows: I64) -> list[dict[str, Any]]:
    """The recorded args fields (detail) of the rows, parsed whole: tensor lists and scalar
    values too, which `shapes_from_args` leaves out."""
    out = []
    for text in detail_of(run, rows):
        try:
            value = orjson.loads(text or "{}")
        except orjson.JSONDecodeError:
            value = {}
        out.append(value if isinstance(value, dict) else {})
    return out


def _time_major(run: Run, ev: Events, rows: I64, index: tuple[int, ...]) -> bool:
    """Whether token indices [a, b] are [sequence, batch]: an RNN (nn.LSTM, nn.GRU, nn.RNN:
    batch_first=False unless set) runs on an input [a, b, features] with its batch_first
    argument, its last, False."""
    codes = [i for i, n in enumerate(ev.names) if n in RNN_OPS]
    found = rows[np.isin(ev.name[rows], codes)][:_RNN_PROBES] if codes else rows[:0]
    for args in _args_of(run, found):
        dims, concrete = args.get("Input Dims"), args.get("Concrete Inputs")
        if (isinstance(dims, list) and dims and isinstance(dims[0], list)
                and tuple(dims[0][:2]) == index and isinstance(concrete, list) and concrete
                and concrete[-1] == "False"):
            return True
    return False


def _from_embedding(run: Run, ev: Events, mine: I64, windows: Sequence[Mapping[str, Any]],
                    ) -> tuple[dict[int, int], dict[int, int] | None, str]:
    """Samples and tokens per step of the token embedding (the first lookup's table): the
    indices of its backward passes where the step trained it (a lookup under no_grad, an
    evaluation inside the step, trains nothing), else of every lookup."""
    codes = [i for i, n in enumerate(ev.names) if n == EMBEDDING]
    rows = _in_windows(ev, mine[np.isin(ev.name[mine], codes) & ev.of_kind("cpu_op")[mine]],
                       windows)
    calls = [(r, s.dims) for r, s in _in_order(run, ev, rows)
             if s is not None and len(s.dims) >= 2 and len(s.dims[0]) == 2 and len(s.dims[1]) == 2]
    if not calls:
        return {}, None, ""
    table = calls[0][1][0]  # the first lookup's table is the token table
    lookups = [(r, dims[1]) for r, dims in calls if dims[0] == table]
    first = lookups[0][1]
    ops = _in_windows(ev, mine[ev.of_kind("cpu_op")[mine]], windows)
    time_major = len(first) == 2 and _time_major(run, ev, ops, first)
    # the backward of the same table (num_weights, its third argument, the table's rows)
    back_codes = [i for i, n in enumerate(ev.names) if n == EMBEDDING_BACKWARD]
    backs = ops[np.isin(ev.name[ops], back_codes)] if back_codes else ops[:0]
    backs = backs[np.argsort(ev.ts[backs], kind="stable")]
    trained = [(int(r), tuple(a["Input Dims"][1])) for r, a in zip(backs.tolist(),
                                                                   _args_of(run, backs),
                                                                   strict=True)
               if _is_backward_of(a, table)]
    samples: dict[int, int] = {}
    tokens: dict[int, int] = {}
    trained_at = _steps_of(ev, windows, [r for r, _ in trained])
    looked_at = _steps_of(ev, windows, [r for r, _ in lookups])
    trained_steps = set(trained_at)  # a step that trained it counts its backward passes
    # the lookups one pass trains (a sequence-to-sequence model's encoder and decoder sharing
    # the table, as T5's) are one batch: that of the forward's first, its backward's last; a
    # step that trained it once has one (no sweep of the rank's passes)
    group = (_pass_of(ev, mine, windows, np.asarray([r for r, _ in trained], np.int64))
             if len(set(trained_at)) < len(trained_at) else np.arange(len(trained)))
    last = {g: i for i, g in enumerate(group)}
    passes = [*((s, idx, last[g] == i) for i, (s, (_, idx), g) in enumerate(
                  zip(trained_at, trained, group, strict=True))),
              *((s, idx, True) for s, (_, idx) in zip(looked_at, lookups, strict=True)
                if s not in trained_steps)]
    decoded = 0  # untrained lookups of one token a sequence: a decode continues them
    for step, idx, batched in passes:
        if len(idx) != 2:
            continue
        batch, length = (idx[1], idx[0]) if time_major else idx
        decoding = length == 1 and step not in trained_steps
        decoded += decoding
        samples[step] = samples.get(step, 0) + (batch if batched and not decoding else 0)
        tokens[step] = tokens.get(step, 0) + idx[0] * idx[1]
    order = "sequence x batch, an RNN running time-major" if time_major else "batch x sequence"
    counted = (f"{len(last)} backward passes" + (
        f" ({len(trained)} lookups trained)" if len(trained) > len(last) else "")
        if trained else f"{len(lookups)} lookups")
    decodes = (f"; {decoded} of them decode one token for each of their sequences, which "
               "they do not start: no sample" if decoded else "")
    return samples, tokens, (
        f"{EMBEDDING}'s indices {first[0]}x{first[1]} ({order}) into the {table[0]}x{table[1]} "
        f"table, {counted} in {len(samples)} of {len(windows)} steps{decodes}")


def _from_compiled(run: Run, ev: Events, mine: I64, windows: Sequence[Mapping[str, Any]],
                   ) -> tuple[dict[int, int], dict[int, int] | None, str]:
    """Samples (and tokens) per step of torch.compile's compiled forwards that train
    (CompiledFunction: its inputs are the graph's, the parameters and the batch), every call
    of a step (a gradient accumulation's micro-batches): their token indices (an integer input
    [batch, sequence]; the embedding inside the graph leaves no op), else their first float
    input of two dimensions or more that is shaped like no tensor the optimizer updates (an
    image batch among the convolutions' weights)."""
    codes = [i for i, n in enumerate(ev.names) if n == COMPILED_CALL]
    rows = _in_windows(ev, mine[np.isin(ev.name[mine], codes)], windows)
    parsed = [(r, shapes) for r, shapes in _in_order(run, ev, rows) if shapes is not None]
    calls = [(r, idx) for r, shapes in parsed if (idx := token_input(shapes)) is not None]
    if calls:
        what = "the token indices {} (batch x sequence)"
    elif parsed and (updated := _updated_shapes(run, ev, mine, windows)):
        calls = [(r, found[0]) for r, shapes in parsed if (found := [
            d for d, kind in zip(shapes.dims, shapes.types, strict=False)
            if len(d) >= 2 and kind in FLOAT_TYPES and d not in updated])]
        what = "the activation input {} (the first not shaped like a parameter)"
    samples: dict[int, int] = {}
    tokens: dict[int, int] = {}
    for step, (_, idx) in zip(_steps_of(ev, windows, [r for r, _ in calls]), calls,
                              strict=True):
        samples[step] = samples.get(step, 0) + idx[0]
        tokens[step] = tokens.get(step, 0) + int(np.prod(idx[:2]))
    if not calls:
        return {}, None, ""
    first = calls[0][1]
    return samples, tokens if "token" in what else None, (
        f"{what.format('x'.join(map(str, first)))} of torch.compile's compiled forwards, "
        f"{len(calls)} in {len(samples)} of {len(windows)} steps")


def _updated_shapes(run: Run, ev: Events, mine: I64, windows: Sequence[Mapping[str, Any]]
                    ) -> set[tuple[int, ...]]:
    """The shapes of the parameters (phases.parameter_rows) the steps' ops took."""
    ops = parameter_rows(ev, _in_windows(ev, mine[ev.of_kind("cpu_op")[mine]], windows))
    return {d for shapes in RowShapes.of(run).get(ops) if shapes is not None
            for d in shapes.dims if d}


def _is_backward_of(args: Mapping[str, Any], table: tuple[int, ...]) -> bool:
    dims, concrete = args.get("Input Dims"), args.get("Concrete Inputs")
    return (isinstance(dims, list) and len(dims) >= 2 and isinstance(dims[1], list)
            and isinstance(concrete, list) and len(concrete) >= 3
            and str(concrete[2]) == str(table[0]))


def _pass_starts(ev: Events, mine: I64, windows: Sequence[Mapping[str, Any]]
                 ) -> tuple[I64, Mask, I64]:
    """The rows that begin a forward and backward pass (runs of autograd work in time order on
    the threads that run it and the step markers' (the loop's), each begun after other work of
    them), in time order; whether each is the first of its optimizer call (passes inside one
    call are a closure evaluated again on the same batch: LBFGS's line search; a pass outside
    any call is its own); and the outermost optimizer calls of their ranks, in time order."""
    rows = _in_windows(ev, mine[ev.of_kind("cpu_op")[mine] | ev.is_step_marker[mine]], windows)
    back = phases(ev, rows) == BACKWARD
    lanes = np.unique(lane_key(ev.pid[rows], ev.tid[rows])[back | ev.is_step_marker[rows]])
    keep = np.isin(lane_key(ev.pid[rows], ev.tid[rows]), lanes) & ~ev.is_step_marker[rows]
    rows, back = rows[keep], back[keep]
    order = np.argsort(ev.ts[rows], kind="stable")
    rows, back = rows[order], back[order]
    begun = rows[back & ~np.concatenate(([False], back[:-1]))]
    calls = step_calls(ev)
    calls = calls[np.isin(ev.rank[calls], np.unique(ev.rank[begun]))]
    outer = calls[~nested(ev, calls, inner=False)]
    outer = outer[np.argsort(ev.ts[outer], kind="stable")]
    at = np.searchsorted(ev.ts[outer], ev.ts[begun], side="right") - 1
    within = (at >= 0) & (ev.ts[begun] < ev.end[outer][np.maximum(at, 0)]) if len(outer) \
        else np.zeros(len(begun), bool)
    first = ~within | ~np.concatenate(([False], within[:-1] & (at[1:] == at[:-1])))
    return begun, first, outer


def _pass_of(ev: Events, mine: I64, windows: Sequence[Mapping[str, Any]], rows: I64) -> I64:
    """The forward and backward pass (`_pass_starts`; those of one optimizer call one) each of
    the backward ops `rows` ran in, numbered in time order; a row in no pass (an op no autograd
    node holds) is its own, numbered below 0."""
    begun, first, _ = _pass_starts(ev, mine, windows)
    at = np.searchsorted(ev.ts[begun], ev.ts[rows], side="right") - 1
    inside = (at >= 0) & (phases(ev, rows) == BACKWARD)
    numbered = np.concatenate(([0], np.cumsum(first)))  # pass i's number at i + 1
    return np.where(inside, numbered[at + 1], -1 - np.arange(len(rows)))


def _passes(ev: Events, mine: I64, windows: Sequence[Mapping[str, Any]]) -> I64:
    """The batches each window ran forward and backward (`_pass_starts`: gradient accumulation
    runs several a step, an inference step none; those inside one optimizer call are one), and
    a step that steps k optimizers (a GAN's discriminator and generator) runs k passes a
    batch."""
    begun, first, outer = _pass_starts(ev, mine, windows)
    passes = np.bincount(_steps_of(ev, windows, begun[first].tolist()), minlength=len(windows))
    # a step that steps several optimizers (a GAN's two) feeds each its own passes of one batch
    stepped = _stepped(ev, outer, windows)
    return np.where(stepped > 1, np.round(passes / np.maximum(stepped, 1)), passes
                    ).astype(np.int64)


def _stepped(ev: Events, outer: I64, windows: Sequence[Mapping[str, Any]]) -> I64:
    """The outermost optimizer calls (`_pass_starts`') in each window."""
    return np.bincount(_steps_of(ev, windows, _in_windows(ev, outer, windows).tolist()),
                       minlength=len(windows))


def _from_first_op(run: Run, ev: Events, mine: I64, windows: Sequence[Mapping[str, Any]],
                   ) -> tuple[dict[int, int], str]:
    """Per step, the leading dimension of the activation input of its first matrix product
    or convolution (the first input; addmm's and baddbmm's second, after the bias), times
    the backward passes the step ran (a forward each; one in a step without). An unbatched
    call (a 1-D input: one observation through a policy) is not the batch, nor is a weight.
    Under torch.func.vmap the op inside the first that gained dimensions in front is read."""
    codes = [i for i, n in enumerate(ev.names) if has_cost_model(n)]
    rows = _in_windows(ev, mine[np.isin(ev.name[mine], codes) & ev.of_kind("cpu_op")[mine]],
                       windows)
    # inside torch.compile's graphs the shapes are the graph's: [batch x sequence, width]
    compiled = mine[np.isin(ev.name[mine], [i for i, n in enumerate(ev.names)
                                            if COMPILED_REGION.match(n)])]
    rows = rows[~np.isin(rows, enclosing_rows(ev, rows, compiled)[0])]
    # step index -> (row, its input, its weight)
    first: dict[int, tuple[int, tuple[int, ...], tuple[int, ...]]] = {}
    ordered = _in_order(run, ev, rows)
    for (row, shapes), step in zip(ordered, _steps_of(ev, windows, [r for r, _ in ordered]),
                                   strict=True):
        found = first.get(step)
        # torch.func.vmap's logical op ([1, 64] a sample) encloses the op it batches to
        # ([128, 1, 64]: the vmapped dimension in front); a matmul that folds its batch
        # into rows ([4, 8, 64] -> mm [32, 64]) loses a dimension instead
        inside = found is not None and ev.tid[row] == ev.tid[found[0]] \
            and ev.end[row] <= ev.end[found[0]]
        if (found is not None and not inside) or shapes is None:
            continue
        name = ev.name_of(row)
        cost = shapes_cost(name, shapes)
        at = 1 if name in _BIAS_FIRST else 0
        batch = shapes.dims[at] if len(shapes.dims) > at else ()
        if (cost is not None and cost.family in _FIRST_FAMILIES and len(batch) >= 2
                and (found is None or len(batch) > len(found[1]))):
            first[step] = (row, batch, _weight(name, shapes.dims))
    if not first:
        return {}, ""
    first, folded = _unfolded(run, ev, mine, first)
    row, batch, weight = first[min(first)]
    # a plain batch of rows (torch.func.vmap's batch in front of the logical op's is not)
    trained = _weight_gradients(run, ev, mine, windows, weight) if len(batch) == 2 else {}
    passes = np.maximum(_passes(ev, mine, windows), 1)
    if trained:
        # a step of several passes (a gradient accumulation's micro-batches, an RPC server's
        # requests): an optimizer step each, the samples of all its passes (said: the step is
        # the optimizer's, not a pass's)
        accumulated = int(np.median(passes[sorted(trained)]))
        return trained, (
            f"the samples the first layer's weight gradient summed in each step's backward "
            f"(aten::mm over the batch, {'x'.join(map(str, weight))} weights: every row "
            "its forwards gave it, one at a time or batched"
            + (f"; {accumulated} forward and backward passes a step: a step is an optimizer "
               "step, its samples those of all of them" if accumulated > 1 else "")
            + f"), in {len(trained)} of {len(windows)} steps")
    each = f", x {int(passes[min(first)])} forward and backward passes" \
        if passes[min(first)] > 1 else ""
    return {step: b[0] * int(passes[step]) for step, (_r, b, _w) in first.items()}, (
        f"the activation input of each step's first GEMM or convolution ({ev.name_of(row)} "
        f"{folded.get(min(first), 'x'.join(map(str, batch)))} in the first{each}), in "
        f"{len(first)} of {len(windows)} steps")


def _from_step_batch(run: Run, rank: int, windows: Sequence[Mapping[str, Any]]
                     ) -> tuple[dict[int, int], str]:
    """Per step of a forward-driven loop, the recorder's STEP_BATCH: the leading dimension of
    its top-level module's first input as the step began."""
    sizes = batch_sizes(run)
    if not sizes.num_rows:
        return {}, ""
    start, end = (np.asarray([w[k] for w in windows], np.int64) for k in ("start", "end"))
    found = step_batches(np.full(len(windows), rank, np.int64), start, end, sizes)
    samples = {i: int(b) for i, b in enumerate(found.tolist()) if b > 0}
    return samples, ("the recorder's step batch (the leading dimension of the top-level "
                     f"module's first input as each step began), in {len(samples)} of "
                     f"{len(windows)} steps")


def _unfolded(run: Run, ev: Events, mine: I64,
              first: Mapping[int, tuple[int, tuple[int, ...], tuple[int, ...]]],
              ) -> tuple[dict[int, tuple[int, tuple[int, ...], tuple[int, ...]]], dict[int, str]]:
    """Each step's first product (row, input, weight), its input read from the op it runs in
    where that op multiplies its batch's tokens as rows: torch's transformer fast path
    (aten::_native_multi_head_attention on [3, 10, 32], inside it aten::mm on [30, 32]); its
    input [B, ..., width] has leading dimensions that multiply to the product's rows; with a
    padding mask, the fast path packs only the valid tokens into a nested tensor (whose shape
    the trace leaves empty: an 8 x 64 batch's 376 tokens as aten::mm [376, 128], read as a
    batch of 376), so the padded input [B, L, width] the step's last
    aten::_nested_tensor_from_mask before the product took is the batch, where its B x L
    holds the rows. And per step so read, the words that say so (the product's input, then
    the op's)."""
    rows = np.fromiter((r for r, _b, _w in first.values()), np.int64, len(first))
    inner, around = enclosing_rows(ev, rows, mine[ev.of_kind("cpu_op")[mine]
                                                  & ~np.isin(mine, rows)])
    ops = np.unique(around)  # RowShapes reads rows ascending, once each
    shapes_of = dict(zip(ops.tolist(), RowShapes.of(run).get(ops), strict=True))
    outer = {i: (o, shapes_of[o]) for i, o in zip(inner.tolist(), around.tolist(), strict=True)}
    packers = mine[np.isin(ev.name[mine], [i for i, n in enumerate(ev.names) if n == NESTED])]
    packers = packers[np.argsort(ev.ts[packers], kind="stable")]
    packed = dict(zip(packers.tolist(), RowShapes.of(run).get(packers), strict=True))
    ordered = np.sort(rows)
    own = dict(zip(ordered.tolist(), RowShapes.of(run).get(ordered), strict=True))
    out, said = dict(first), {}
    for step, (row, batch, weight) in first.items():
        op, shapes = outer.get(row, (-1, None))
        dims: tuple[int, ...] = shapes.dims[0] if shapes is not None and shapes.dims else ()
        if len(dims) >= 3 and len(batch) == 2 and dims[-1] == batch[1] \
                and int(np.prod(dims[:-1])) == batch[0]:
            out[step] = (row, dims, weight)
            said[step] = (f"{'x'.join(map(str, batch))}: the rows of "
                          f"{ev.name_of(op)}'s {'x'.join(map(str, dims))}")
            continue
        if _batch_first_attention(own[row], batch, weight):
            out[step] = (row, (batch[1], batch[0], *batch[2:]), weight)
            said[step] = (f"{'x'.join(map(str, batch))}: nn.MultiheadAttention's batch_first "
                          f"input, {batch[1]}x{batch[0]}x{batch[2]} transposed")
            continue
        before = packers[(ev.ts[packers] <= ev.ts[row]) & (ev.tid[packers] == ev.tid[row])]
        nested = packed[int(before[-1])] if op >= 0 and not dims and len(before) else None
        padded: tuple[int, ...] = nested.dims[0] if nested is not None and nested.dims else ()
        if len(padded) == 3 and len(batch) == 2 and padded[-1] == batch[1] \
                and padded[0] * padded[1] >= batch[0]:
            out[step] = (row, padded, weight)
            said[step] = (f"{'x'.join(map(str, batch))}: the valid tokens of {NESTED}'s "
                          f"{'x'.join(map(str, padded))} (its padding masked out)")
    return out, said


def _batch_first_attention(shapes: Shapes | None, batch: tuple[int, ...],
                           weight: tuple[int, ...]) -> bool:
    """Whether the product is nn.MultiheadAttention's packed input projection (weight
    [3E, E]) of an input [B, L, E] it took batch_first and transposed to an [L, B, E] view
    (strides: its first dimension's step under its second's) before it: the batch is that
    view's second dimension, not its first (the sequence length)."""
    strides = shapes.strides[0] if shapes is not None and shapes.strides else ()
    return (len(batch) == 3 and len(strides) == 3 and strides[0] < strides[1]
            and weight == (3 * batch[2], batch[2]))


# packs a padded batch's valid tokens, as the mask says, into a nested tensor (torch's
# transformer fast path under a src_key_padding_mask)
NESTED: Final = "aten::_nested_tensor_from_mask"


def _weight(name: str, dims: Sequence[tuple[int, ...]]) -> tuple[int, ...]:
    """The weight's dimensions of a first product (linear's [out, in]; addmm's and mm's
    second matrix [in, out], read as [out, in]); () for others (a convolution)."""
    at = {"aten::linear": 1, "aten::addmm": 2, "aten::mm": 1, "aten::matmul": 1}.get(name)
    if at is None or len(dims) <= at or len(dims[at]) != 2:
        return ()
    return dims[at] if name == "aten::linear" else (dims[at][1], dims[at][0])


def _weight_gradients(run: Run, ev: Events, mine: I64, windows: Sequence[Mapping[str, Any]],
                      weight: tuple[int, ...]) -> dict[int, int]:
    """Per step, the batch rows the weight `weight` ([out, in], not square: a first layer
    whose input width is its own) had its gradient summed over in the backward: its
    backward's aten::mm [out, B] x [B, in] (the output's gradient, transposed, times the
    input), B summed, over the parameters of that shape each pass accumulated a gradient into
    (torch::autograd::AccumulateGrad, once a parameter and pass: blocks whose first layer is
    of the first layer's shape are as many gradients of one batch; one layer run on six
    observations, six of one), once a call of an optimizer that evaluates its closure again
    on the same batch (LBFGS); {} without. A step that steps several optimizers (a GAN's) runs
    a pass for each on one batch, which each sums at least once (a discriminator's over its
    real and its fake rows, a generator's through the discriminator and itself: twin models
    had read 3 batches a step): the fewest rows of its passes. A layer of the transposed shape
    (an autoencoder's last, [in, out]) is another's."""
    if len(weight) != 2 or weight[0] == weight[1]:
        return {}
    codes = [i for i, n in enumerate(ev.names) if n in ("aten::mm", ACCUMULATE_GRAD)]
    rows = _in_windows(ev, mine[np.isin(ev.name[mine], codes)], windows)
    rows = rows[phases(ev, rows) == BACKWARD]
    # torch.func's transforms dispatch each op again at every level they wrap it in, an
    # aten::mm inside an aten::mm of one product (grad's three): the innermost is the product
    rows = rows[~nested(ev, rows, inner=True)]
    # a pass that evaluates an optimizer's closure again (LBFGS) sums the same samples again
    begun, first, outer = _pass_starts(ev, mine, windows)
    stepped = _stepped(ev, outer, windows)
    of_pass = np.searchsorted(ev.ts[begun], ev.ts[rows], side="right") - 1
    keep = (of_pass < 0) | first[np.maximum(of_pass, 0)]
    rows, of_pass = rows[keep], of_pass[keep]
    pass_of = dict(zip(rows.tolist(), of_pass.tolist(), strict=True))
    summed: dict[tuple[int, int], int] = {}  # (step, pass) -> B summed
    params: dict[int, int] = {}  # pass -> its parameters of the weight's shape
    for (row, shapes), step in zip(ordered := _in_order(run, ev, rows),
                                   _steps_of(ev, windows, [r for r, _ in ordered]), strict=True):
        if shapes is None or not shapes.dims:
            continue
        if ev.name_of(row) == ACCUMULATE_GRAD:
            if shapes.dims[0] == weight:
                params[pass_of[row]] = params.get(pass_of[row], 0) + 1
            continue
        a, b = shapes.dims[0], shapes.dims[1] if len(shapes.dims) > 1 else ()
        if len(a) == 2 and len(b) == 2 and a[1] == b[0] and (a[0], b[1]) == weight:
            summed[step, pass_of[row]] = summed.get((step, pass_of[row]), 0) + a[1]
    out: dict[int, int] = {}
    for (step, at), rows_summed in summed.items():
        rows_of_pass = round(rows_summed / params.get(at, 1))
        out[step] = (min(out.get(step, rows_of_pass), rows_of_pass) if stepped[step] > 1
                     else out.get(step, 0) + rows_of_pass)
    return out
