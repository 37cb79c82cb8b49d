"""What-if projection of a training Run onto more devices, other interconnects and schemes.

From the Run: per step and rank, the device-busy compute time (union of kernel, memcpy and memset
intervals; collectives excluded), each collective's op and bytes (from its kernel's args), and the
compute done before each collective was launched, which is when its gradients were ready. The
projection replays every step on a compressed timeline: compute runs back to back, collectives run
in order on their own stream, each starting at the latest arrival among the ranks (or when the
previous one ends) and lasting as the alpha-beta model says for the target topology; the compute
after the step's last collective (the optimizer) waits for it. Runs with several ranks keep each
rank's own arrivals, so their skew shows up as collective waits; targets larger than the Run reuse
the measured ranks cyclically.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from perfswarm.analyze.concurrency import Activity, HostComm, breakdowns, host_compute
from perfswarm.analyze.dependencies import enclosing_rows, issued, launching_op_rows
from perfswarm.analyze.frame import Events, Mask, group_rows, lane_key, texts_of
from perfswarm.analyze.intervals import I64, union
from perfswarm.analyze.iterations import profiled
from perfswarm.analyze.ops import kernel_category
from perfswarm.analyze.phases import BACKWARD, parameter_rows, scopes, step_calls
from perfswarm.analyze.summary import analysis_made
from perfswarm.defaults import DEFAULT_DEVICES, Scheme
from perfswarm.errors import NotApplicable, ParameterError, PerfswarmError
from perfswarm.model.collective_fit import Measurement, fit_link
from perfswarm.model.collectives import (
    PS_OPS,
    SCHEMES,
    CollectiveConfig,
    Op,
    collective_time,
)
from perfswarm.model.opcost import element_bytes, shapes_from_args
from perfswarm.model.predict import Change, predict, recorded_threads
from perfswarm.model.specs import load_spec
from perfswarm.model.topology import Link, Topology, interconnects
from perfswarm.model.topology import interconnect as link_named
from perfswarm.optimize.layouts import LayoutChoice, choose_layout, run_model
from perfswarm.trace.store import Run

COMPUTE_KINDS: Final = ("kernel", "memcpy", "memset")
# kernels bound by memory bandwidth rather than FLOPs, by analyze.ops's name categories (GEMMs,
# convolutions, attention and names it cannot tell are not): what tensor parallelism splits
# only in part (model.parallelism)
MEMORY_BOUND: Final = frozenset({"reduction", "elementwise", "embedding"})
NETWORKS: Final = ("eth-100g", "ib-hdr", "eth-400g", "ib-ndr")
DEVICES_PER_NODE: Final = 8   # an HGX/DGX board's GPUs
# a CPU Run's ranks on one host: gloo over the loopback (interconnects.yaml, measured)
HOST_LOOPBACK: Final = "host-loopback"
# what a rank is (a device; a CPU Run's, a process) -> its plural, as the projection words it
RANK_UNITS: Final = {"device": "devices", "process": "processes"}
GOOD_EFFICIENCY: Final = 0.9
# Kineto's "Collective name" values -> model ops; barriers and point-to-point are not modelled.
_OPS: Final[dict[str, Op]] = {
    "allreduce": "all_reduce", "all_reduce": "all_reduce", "allreduce_coalesced": "all_reduce",
    "broadcast": "broadcast", "allgather": "all_gather", "all_gather": "all_gather",
    "_allgather_base": "all_gather", "allgather_into_tensor_coalesced": "all_gather",
    "reduce_scatter": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter", "all_to_all": "all_to_all",
    "alltoall": "all_to_all", "alltoall_base": "all_to_all", "all_to_allv": "all_to_all",
}
HOST_STEPS: Final = "step spans (no device work)"  # a CPU Run's compute_source
# ranges a library records around its reduction of the parameters' gradients: FSDP2's (torch
# 2.13: "FSDP::post_backward_reduce (3)", in RegisterPostBackwardFunctionBackward's node, and
# the root's in its post-backward callback), whose reduce-scatters gloo runs as all-reduces
GRADIENT_REDUCTION: Final = re.compile(r"^FSDP::post_backward_reduce\b")
_DTYPE_BYTES: Final = {"float": 4, "double": 8, "half": 2, "bfloat16": 2, "long": 8, "int": 4,
                       "short": 2, "char": 1, "byte": 1, "bool": 1, "float8_e4m3fn": 1,
                       "float8_e5m2": 1, "complexfloat": 8, "complexdouble": 16}


@dataclass(frozen=True)
class Call:
    """One collective of one step on one rank."""

    op: Op
    nbytes: int
    ready_ns: int     # compute busy time of the step before the call was launched
    dur_ns: int       # measured kernel time (includes any wait for other ranks)
    world: int        # group size in the Run
    elems: int = 0    # values it carries
    gradient: bool = True  # carries the parameters' gradients (gradient_issuers)


@dataclass(frozen=True)
class StepProfile:
    rank: int
    step: int
    wall_ns: int
    compute_ns: int
    tail_ns: int      # compute after the last collective ended (waits for it)
    overlapped_ns: int
    calls: tuple[Call, ...]
    idle_ns: int = 0  # of its marked step, the time no device work ran (host-bound time)
    memory_bound_ns: int = 0  # of compute_ns, the memory-bound kernels and copies (MEMORY_BOUND)
    unpriced: int = 0  # collectives on host threads of no recorded size: in no call

    @property
    def collective_ns(self) -> int:
        return sum(c.dur_ns for c in self.calls)


@dataclass(frozen=True)
class Profile:
    ranks: tuple[int, ...]
    steps: tuple[StepProfile, ...]
    world: int
    grad_bytes: int
    grad_bytes_source: str
    whole_run: bool = False    # no step markers: the Run is one iteration
    compute_source: str = "measured"

    def per_step(self) -> dict[int, list[StepProfile]]:
        out: dict[int, list[StepProfile]] = {}
        for s in self.steps:
            out.setdefault(s.step, []).append(s)
        return out

    @property
    def overlap_fraction(self) -> float:
        total = sum(s.collective_ns for s in self.steps)
        return sum(s.overlapped_ns for s in self.steps) / total if total else 0.0

    @property
    def grad_elems(self) -> int:
        """Values the gradient all-reduces carry per step (median; 0 without them: a tensor
        parallel layer's reduce activations, gradient_issuers)."""
        return int(statistics.median(sum(c.elems for c in st.calls if c.op == "all_reduce"
                                         and c.gradient) for st in self.steps))

    def measured_link(self) -> Link | None:
        """Alpha-beta fitted to the Run's own all-reduce kernels (waits included)."""
        ms = tuple(Measurement("all_reduce", c.nbytes, c.dur_ns * 1e-9) for s in self.steps
                   for c in s.calls if c.op == "all_reduce" and c.dur_ns > 0)
        if len({m.nbytes for m in ms}) < 2 or self.world < 2:
            return None
        return fit_link(ms, self.world, name="measured")

    def to_dict(self) -> dict[str, Any]:
        med = statistics.median
        return {"ranks": list(self.ranks), "steps": len(self.per_step()), "world": self.world,
                "grad_bytes": self.grad_bytes, "grad_bytes_source": self.grad_bytes_source,
                "whole_run": self.whole_run, "compute_source": self.compute_source,
                "compute_ms": med(s.compute_ns for s in self.steps) / 1e6,
                "step_wall_ms": med(s.wall_ns for s in self.steps) / 1e6,
                "collective_ms": med(s.collective_ns for s in self.steps) / 1e6,
                "collectives_per_step": med(len(s.calls) for s in self.steps),
                "unpriced_collectives_per_step": med(s.unpriced for s in self.steps),
                "overlap_fraction": self.overlap_fraction}


def _call(args_text: str, ready: int, dur: int, gradient: bool) -> Call | None:
    args = orjson.loads(args_text) if args_text else {}
    op = _OPS.get(str(args.get("Collective name", "")).lower())
    if op is None:
        return None
    dtype = str(args.get("dtype", "float")).lower()
    elems = max(int(args.get("In msg nelems", 0) or 0), int(args.get("Out msg nelems", 0) or 0))
    return Call(op, elems * _DTYPE_BYTES.get(dtype, 4), ready, dur,
                int(args.get("Group size", 0) or 0), elems, gradient)


def gradient_issuers(ev: Events, rows: I64) -> Mask:
    """Which of `rows` (the ops that issued collectives: a host's c10d call, the op that
    launched a device's collective kernel) issued one carrying the parameters' gradients (data
    parallelism): those where the gradients are taken (phases.parameter_rows: a gradient's
    accumulation, where DDP's reducer hooks issue their buckets' all-reduces, and an
    optimizer's own work), those in a range its library names a gradients' reduction
    (GRADIENT_REDUCTION: FSDP2's post-backward, in an autograd node of its own) and those
    outside any autograd node after their step's last one (an all-reduce of the gradients
    between the backward and the optimizer: Megatron's, a hand-written one). One issued in
    the forward carries an activation, one inside another autograd node the input gradient it
    computes: tensor parallelism's (RowwiseParallel's output, ColwiseParallel's input
    gradient), no parameter's."""
    reductions = np.flatnonzero(np.isin(ev.name, [i for i, n in enumerate(ev.names)
                                                  if GRADIENT_REDUCTION.match(n)]))
    out = np.isin(rows, parameter_rows(ev, rows)) | np.isin(
        rows, enclosing_rows(ev, rows, reductions)[0])
    nodes = scopes(ev, BACKWARD)
    if not len(nodes) or not len(rows):
        return out
    in_node = np.isin(rows, enclosing_rows(ev, rows, nodes)[0]) | np.isin(rows, nodes)
    keys = lane_key(ev.rank[nodes], ev.step[nodes])
    order = np.lexsort((ev.end[nodes], keys))
    last = np.append(keys[order][1:] != keys[order][:-1], True)
    step_keys, step_end = keys[order][last], ev.end[nodes][order][last]
    at = np.clip(np.searchsorted(step_keys, lane_key(ev.rank[rows], ev.step[rows])), 0,
                 len(step_keys) - 1)
    after = (step_keys[at] == lane_key(ev.rank[rows], ev.step[rows])) & (
        ev.ts[rows] >= step_end[at]) & (ev.step[rows] >= 0)
    return np.asarray(out | (~in_node & after), bool)


def _carry_gradients(run: Run, kernels: I64) -> Mask:
    """Which of the Run's collective kernels (rows of its events) carry the parameters'
    gradients, by the op that launched them (gradient_issuers; one without a launching op in
    the trace is taken as the gradients', as all were)."""
    if not len(kernels):
        return np.zeros(0, bool)
    ev = Events.load(run)
    external_id = np.asarray(run.table("events", ["external_id"]).column("external_id")
                             .to_numpy(), np.int64)
    ops = launching_op_rows(ev, external_id, kernels)
    out = np.ones(len(kernels), bool)
    out[ops >= 0] = gradient_issuers(ev, ops[ops >= 0])
    return out


def _busy_before(starts: I64, ends: I64, t: int) -> int:
    """Length of the (disjoint, sorted) intervals' part before t."""
    return int(np.clip(np.minimum(ends, t) - starts, 0, None).sum())


def _overlap(starts: I64, ends: I64, lo: int, hi: int) -> int:
    return int(np.clip(np.minimum(ends, hi) - np.maximum(starts, lo), 0, None).sum())


def _column(table: pa.Table, name: str) -> I64:
    return np.asarray(table.column(name).to_numpy(), dtype=np.int64)


def _step_spans(run: Run) -> dict[tuple[int, int], tuple[int, int]]:
    """(rank, step) -> (start, end) of the Run's marked steps (those a trace covers: the steps
    the recorder timed outside its window, the trace's export among them, had counted too)."""
    table = profiled(run.table("steps", ["rank", "step", "start", "end", "source"]))
    return {(int(r), int(s)): (int(b), int(e)) for r, s, b, e in zip(
        *(_column(table, c) for c in ("rank", "step", "start", "end")), strict=True)}


def _device_idle(run: Run, spans: dict[tuple[int, int], tuple[int, int]]
                 ) -> dict[tuple[int, int], int]:
    """(rank, step) -> the time of its marked step no device work ran: analyze's device idle
    (analyze.concurrency) over the step's span, taken from the analysis when it was made of
    the same spans."""
    made = analysis_made(run)
    known = {(r.rank, i.breakdown.start, i.breakdown.end): i.breakdown.device_idle_ns
             for r in made.concurrency.ranks for i in r.iterations} if made else {}
    out = {k: known[(k[0], *span)] for k, span in spans.items() if (k[0], *span) in known}
    for rank in {k[0] for k in spans if k not in out}:
        keys = sorted(k for k in spans if k[0] == rank and k not in out)
        found = breakdowns(Activity.of_rank(Events.load(run), rank), [spans[k] for k in keys])
        out.update({k: b.device_idle_ns for k, b in zip(keys, found, strict=True)})
    return out


def _host_steps(run: Run) -> list[StepProfile]:
    """A Run without device work (a CPU Run): each marked step's span is its compute, less the
    time its loop sat waiting for its process group's collectives on their own threads
    (gloo's: analyze.concurrency.HostComm's communication not under the rank's ops); those
    collectives are its calls (_host_calls)."""
    spans = {k: v for k, v in sorted(_step_spans(run).items()) if v[1] > v[0]}
    ev = Events.load(run)
    comm: dict[tuple[int, int], HostComm] = {}
    for rank in {r for r, _ in spans}:
        keys = [k for k in spans if k[0] == rank]
        found = HostComm.of_rank(ev, rank, [spans[k] for k in keys])
        if found is not None:
            comm.update(zip(keys, found, strict=True))
    colls = np.flatnonzero(ev.collectives & ev.host_collective)
    # (their args: detail keeps no shapes of an annotation)
    args = dict(zip(colls.tolist(), texts_of(run, "args", colls), strict=True))
    out = []
    for (r, s), (b, e) in spans.items():
        host = comm.get((r, s))
        calls, last_end, unpriced = _host_calls(ev, args, r, b, e) if host else ((), e, 0)
        ws, we = host_compute(ev, r)
        out.append(StepProfile(r, s, e - b, e - b - (host.ns["comm_only"] if host else 0),
                               _busy_before(ws, we, e) - _busy_before(ws, we, last_end),
                               host.ns["overlapped"] if host else 0, calls,
                               unpriced=unpriced))
    return out


def _host_calls(ev: Events, args: dict[int, str], rank: int, start: int, end: int
                ) -> tuple[tuple[Call, ...], int, int]:
    """The collectives on host threads (gloo's, not a send or receive) the rank ran in
    [start, end), as calls: their op from their name, their bytes from their tensor's recorded
    shape (gloo's all-gather records the rank's input: the output is the world's), ready when
    the rank's compute before them (analyze.concurrency.host_compute) in the step was done
    (`args`: the Run's such collectives' args, by row); the last one's end (`end` without
    any); and how many had no size recorded (a trace without record_shapes) or an op no scheme
    models."""
    rows = np.arange(len(ev))[ev.rank_slice(rank)]
    rows = rows[(ev.collectives & ev.host_collective)[rows]]
    rows = rows[(ev.ts[rows] >= start) & (ev.ts[rows] < end)]
    rows = rows[np.argsort(ev.ts[rows], kind="stable")]
    world = len(ev.ranks)
    ws, we = host_compute(ev, rank)
    issuers = issued(ev).call
    by = np.array([issuers.get(row, -1) for row in rows.tolist()], np.int64)
    gradient = np.ones(len(rows), bool)  # (a collective whose call the window missed: as all)
    gradient[by >= 0] = gradient_issuers(ev, by[by >= 0])
    calls = []
    for row, grads in zip(rows.tolist(), gradient.tolist(), strict=True):
        op = _OPS.get(ev.names[ev.name[row]].split(":", 1)[1])
        shapes = shapes_from_args(args[row])
        if op is None or shapes is None or not shapes.dims:
            continue
        elems = int(np.prod(shapes.dims[0])) * (world if op == "all_gather" else 1)
        calls.append(Call(op, elems * element_bytes(shapes), _busy_before(ws, we, int(
            ev.ts[row])) - _busy_before(ws, we, start), int(ev.dur[row]), world, elems, grads))
    return tuple(calls), int(ev.end[rows].max()) if len(rows) else end, len(rows) - len(calls)


def profile(run: Run, grad_bytes: int | None = None, *,
            shaped_grad_bytes: int | None = None) -> Profile:
    """Per-step compute, collectives and overlap of every rank of the Run (a CPU Run's: its
    collectives on host threads, gloo's). Gradient bytes: `grad_bytes` (--grad-bytes), else
    the Run's all-reduce kernels, else `shaped_grad_bytes` (the parameters its layers' shapes
    show)."""
    table = run.table("events", columns=["rank", "ts", "dur", "kind", "name", "step"])
    # (kinds and names matched on their dictionaries: no text per row)
    kinds = table.column("kind")
    keep = pc.is_in(kinds, pa.array([*COMPUTE_KINDS, "collective"]))
    in_steps = pc.and_(keep, pc.greater_equal(table.column("step"), 0))
    whole_run = not pc.any(in_steps).as_py()
    if not whole_run:   # without step markers the whole Run counts as one iteration
        keep = in_steps
    kept = np.flatnonzero(np.asarray(keep.to_numpy(zero_copy_only=False), dtype=bool))
    table = table.filter(keep)
    kind, names = table.column("kind"), table.column("name")
    is_coll = pc.is_in(kind, pa.array(["collective"]))
    rank, step, ts, dur = (_column(table, c) for c in ("rank", "step", "ts", "dur"))
    coll = np.asarray(is_coll.to_numpy(zero_copy_only=False), dtype=bool)
    bound = [n for n in pc.unique(names.cast(pa.string())).to_pylist()
             if n is not None and kernel_category(n) in MEMORY_BOUND]
    memory = np.asarray(pc.or_(pc.is_in(kind, pa.array(["memcpy", "memset"])), pc.and_(
        pc.is_in(kind, pa.array(["kernel"])), pc.is_in(names, pa.array(bound, pa.string()))))
        .to_numpy(zero_copy_only=False), dtype=bool)
    # the collectives' detail alone, by their place among the collectives (kernels' go unread)
    args = run.table("events", ["detail"]).column("detail").filter(
        pc.and_(keep, pc.is_in(kinds, pa.array(["collective"])))).to_pylist()
    coll_at = np.cumsum(coll) - 1
    gradient = _carry_gradients(run, kept[coll])
    steps: list[StepProfile] = []
    idle = _device_idle(run, _step_spans(run))
    groups = group_rows(lane_key(rank, step), np.arange(len(rank)))
    for r, s, rows in sorted((int(rank[g[0]]), int(step[g[0]]), g) for g in groups.values()):
        work = rows[~coll[rows]]
        cs, ce = union(ts[work], ts[work] + dur[work])
        if len(cs) == 0:
            continue
        calls: list[Call] = []
        overlapped, last_end = 0, int(cs[0])
        for i in rows[coll[rows]].tolist():
            start, end = int(ts[i]), int(ts[i] + dur[i])
            call = _call(args[coll_at[i]] or "", _busy_before(cs, ce, start), int(dur[i]),
                         bool(gradient[coll_at[i]]))
            if call is not None:
                calls.append(call)
                overlapped += _overlap(cs, ce, start, end)
                last_end = max(last_end, end)
        compute = int((ce - cs).sum())
        tail = compute - _busy_before(cs, ce, last_end) if calls else 0
        lo = int(min(cs[0], ts[rows].min()))
        hi = int(max(ce[-1], (ts[rows] + dur[rows]).max()))
        mem = rows[memory[rows]]
        ms, me = union(ts[mem], ts[mem] + dur[mem])
        steps.append(StepProfile(r, s, hi - lo, compute, tail, overlapped, tuple(calls),
                                 idle.get((r, s), 0), int((me - ms).sum())))
    compute_source = "measured"
    if not steps and len(table) == 0:
        steps, whole_run, compute_source = _host_steps(run), False, HOST_STEPS
    if not steps:
        raise NotApplicable(None, "no device kernels or marked steps; nothing to project",
                            subject=run.path)
    world = max([c.world for st in steps for c in st.calls] or [len({st.rank for st in steps})])
    # the all-reduces of the parameters' gradients: a tensor-parallel layer's reduce activations
    # and input gradients (gradient_issuers)
    measured = [sum(c.nbytes for c in st.calls if c.op == "all_reduce" and c.gradient)
                for st in steps]
    if grad_bytes is None and any(measured):
        grad_bytes, source = int(statistics.median(measured)), (
            "collective kernels" if compute_source != HOST_STEPS else "collectives on host threads")
    elif grad_bytes is not None or shaped_grad_bytes:
        grad_bytes, source = ((grad_bytes, "--grad-bytes") if grad_bytes is not None
                              else (shaped_grad_bytes or 0, "parameter shapes"))
        if not any(measured) and (compute_source != HOST_STEPS
                                  or not any(st.calls for st in steps)):
            # No collectives to learn from: one all-reduce of the gradients after the backward.
            steps = [replace(st, tail_ns=0, overlapped_ns=0, calls=(
                         Call("all_reduce", grad_bytes, st.compute_ns, 0, world),))
                     for st in steps]
    else:
        raise NotApplicable(None, "no all-reduce kernels with sizes and no layer shapes of a "
                            "trained model (a backward, an optimizer step) in the Run: no "
                            "gradients to exchange; give their size with {grad_bytes}",
                            subject=run.path)
    return Profile(tuple(sorted({st.rank for st in steps})), tuple(steps), world, grad_bytes,
                   source, whole_run, compute_source)

def simulate_step(ranks: Sequence[StepProfile], topology: Topology,
                  config: CollectiveConfig) -> tuple[float, float]:
    """(step seconds, modelled collective seconds) of one step on `topology.devices` devices:
    its device work replayed back to back with the collectives, then each rank's time of the
    step its device sat idle (waiting on the host), as measured: a host-bound step stays so."""
    p = topology.devices
    compute = max((st.compute_ns + st.idle_ns) for st in ranks) * 1e-9
    if p == 1:
        return compute, 0.0
    ready_at = [[c.ready_ns * 1e-9 for c in st.calls] for st in ranks]
    calls = ranks[0].calls
    if any(len(st.calls) != len(calls) for st in ranks):
        raise NotApplicable(None, "ranks launched different numbers of collectives; cannot "
                            "pair them", subject=f"step {ranks[0].step}")
    members = [ready_at[i % len(ranks)] for i in range(min(p, len(ranks)))]
    end, modelled = 0.0, 0.0
    for k, call in enumerate(calls):
        t = collective_time(call.op, call.nbytes, topology, config)
        end = max(*(r[k] for r in members), end) + t
        modelled += t
    step = max(max((st.compute_ns - st.tail_ns) * 1e-9, end) + (st.tail_ns + st.idle_ns) * 1e-9
               for st in ranks)
    return max(step, compute), modelled


@dataclass(frozen=True)
class Point:
    devices: int
    step_s: float
    compute_s: float    # the same steps on one device
    comm_s: float       # modelled collective time, hidden or not

    @property
    def efficiency(self) -> float:
        return self.compute_s / self.step_s

    @property
    def throughput(self) -> float:
        """Per-device batches per second (weak scaling)."""
        return self.devices / self.step_s

    def to_dict(self) -> dict[str, Any]:
        return {"devices": self.devices, "step_ms": self.step_s * 1e3,
                "compute_ms": self.compute_s * 1e3, "comm_ms": self.comm_s * 1e3,
                "exposed_comm_ms": (self.step_s - self.compute_s) * 1e3,
                "efficiency": self.efficiency, "throughput_per_s": self.throughput}


def curve(prof: Profile, devices: Sequence[int], intra: Link, inter: Link, per_node: int,
          config: CollectiveConfig) -> list[Point]:
    """Median over steps of the simulated step, for each device count."""
    groups = list(prof.per_step().values())
    single = statistics.median(simulate_step(g, Topology(1, per_node, intra, inter), config)[0]
                               for g in groups)
    points = []
    for n in devices:
        top = Topology(n, per_node, intra, inter)
        sims = [simulate_step(g, top, config) for g in groups]
        step = statistics.median(s for s, _ in sims)
        comm = statistics.median(c for _, c in sims)
        points.append(Point(n, step, single, comm))
    return points


@dataclass(frozen=True)
class Choice:
    interconnect: str
    scheme: Scheme
    efficiency: float     # at the largest device count

    def to_dict(self) -> dict[str, Any]:
        return {"interconnect": self.interconnect, "scheme": self.scheme,
                "efficiency": self.efficiency}


@dataclass(frozen=True)
class Projection:
    profile: Profile
    intra: Link
    inter: Link
    per_node: int
    scheme: Scheme
    points: tuple[Point, ...]
    options: tuple[Choice, ...]     # every network x scheme at the largest device count
    recommended: Choice
    layouts: LayoutChoice | None    # data, tensor, pipeline parallel at the largest count
    layouts_note: str               # why there are none
    rank_unit: str = "device"       # what a rank is: "device", or "process" on a CPU Run
    per_node_source: str = "given"  # how per_node was chosen (project)

    def to_dict(self) -> dict[str, Any]:
        measured = self.profile.measured_link()
        return {"profile": self.profile.to_dict(),
                "measured_link": measured.to_dict() if measured else None,
                "intra": self.intra.to_dict(), "inter": self.inter.to_dict(),
                "devices_per_node": self.per_node, "per_node_source": self.per_node_source,
                "rank_unit": self.rank_unit, "rank_units": RANK_UNITS[self.rank_unit],
                "scheme": self.scheme,
                "points": [p.to_dict() for p in self.points],
                "options": [c.to_dict() for c in self.options],
                "recommended": self.recommended.to_dict(),
                "layouts": self.layouts.to_dict() if self.layouts else None,
                "layouts_note": self.layouts_note}


def default_intra(run: Run) -> str:
    """NVSwitch of the Run's GPU generation, else PCIe 4."""
    names = " ".join(str(d.get("name", "")) for d in run.manifest().get("devices", []))
    if "H100" in names or "H200" in names or "H800" in names:
        return "nvswitch-h100"
    return "nvswitch-a100" if "A100" in names or "A800" in names else "pcie4"


def _memory(run: Run, device: str | None, memory_gb: float | None) -> float | None:
    """Memory per device for the layouts: --memory-gb, else the --device spec's, else the
    Run's own devices' (None on a Run without devices)."""
    if memory_gb is not None:
        return memory_gb * 1e9
    if device is not None:
        return load_spec(device).memory_bytes
    sizes = [float(d["totalGlobalMem"]) for d in run.manifest().get("devices", [])
             if isinstance(d.get("totalGlobalMem"), int | float)]
    return min(sizes) if sizes else None


def processes_per_host(run: Run) -> tuple[int, str]:
    """A CPU Run's ranks (processes) a host, and why: as many as the recording host's cores
    hold at the threads each rank ran (the manifest's cores over recorded_threads), at least
    1; 1 where either is unknown (an imported trace does not say what host recorded it)."""
    cores, threads = run.manifest().get("host", {}).get("cores"), recorded_threads(run)
    if not isinstance(cores, int) or isinstance(cores, bool) or cores < 1 or not threads:
        return 1, "the recording host's cores or threads a rank unknown"
    return max(1, cores // threads), (f"{cores} cores on the host, {threads} intra-op "
                                      "thread(s) a rank")


MAX_DEVICES: Final = 2**24


def project(run: Run, devices: Sequence[int], *, interconnect: str = "ib-ndr",
            bandwidth_gbps: float | None = None, scheme: Scheme = "ring",
            intra: str | None = None, per_node: int | None = None, servers: int = 1,
            grad_bytes: int | None = None, intra_link: Link | None = None,
            device: str | None = None, memory_gb: float | None = None) -> Projection:
    """`intra_link` (a measured one, see collective_fit.link_of_profile) replaces the
    bundled intra-node link; with `device`, compute is predicted on that GPU; `per_node`
    None: DEVICES_PER_NODE, on a CPU Run (no device work: its ranks are processes)
    processes_per_host, whose intra-node link is then the host's loopback. The layouts of
    the Run's model (optimize.layouts) are chosen for the largest device count."""
    if (isinstance(devices, int | str) or not devices
            or not all(isinstance(n, int) and not isinstance(n, bool) for n in devices)
            or min(devices) < 1 or max(devices) > MAX_DEVICES):
        raise ParameterError("devices", f"give device counts from 1 to {MAX_DEVICES:,}, "
                             "e.g. 1,2,4,8")
    if scheme not in SCHEMES:
        raise ParameterError("scheme", f"one of {', '.join(SCHEMES)}", value=scheme)
    for param, name in (("interconnect", interconnect), ("intra", intra)):
        if name is not None and name not in interconnects():
            raise ParameterError(param, f"unknown; known: {', '.join(interconnects())}",
                                 value=name)
    for name, value, top in (("bandwidth_gbps", bandwidth_gbps, 10**9),
                             ("memory_gb", memory_gb, 10**9), ("grad_bytes", grad_bytes, 2**60),
                             ("per_node", per_node, 2**16), ("servers", servers, 2**16)):
        if value is not None and not 0 < value <= top:  # nan and inf too
            raise ParameterError(name, f"must be above 0 and at most {top:,}", value=value)
    devices = sorted(set(devices))
    memory = _memory(run, device, memory_gb)
    shaped = run_model(run, min(run.manifest().get("ranks") or [0]))
    # its layers' parameters have gradients only where it trains (a backward, an optimizer
    # step): replicas serving inference exchange none
    ev = Events.load(run)
    trains = bool(len(scopes(ev, BACKWARD)) or len(step_calls(ev)))
    prof = profile(run, grad_bytes, shaped_grad_bytes=(
        shaped.params * shaped.value_bytes or None) if trains else None)
    on_host = prof.compute_source == HOST_STEPS  # a CPU Run: its ranks are processes
    if device is not None:
        prof = on_device(run, prof, device)
    per_node, per_node_source = ((per_node, "given") if per_node is not None
                                 else processes_per_host(run) if on_host
                                 else (DEVICES_PER_NODE, "an HGX/DGX board's"))
    inside = intra_link or link_named(intra or (HOST_LOOPBACK if on_host else default_intra(run)))
    inter = link_named(interconnect)
    if bandwidth_gbps is not None:
        inter = inter.with_bandwidth(bandwidth_gbps)
    config = CollectiveConfig(scheme, servers)
    points = curve(prof, devices, inside, inter, per_node, config)
    largest = devices[-1:]
    networks = [inter] + [link_named(n) for n in NETWORKS if n != inter.name]
    # Slowest first, so the recommendation is the least network that scales well enough.
    networks.sort(key=lambda link: (link.bandwidth_gbps, -link.alpha_s))
    # (a parameter server pushes and pulls, no all-gather: FSDP's, on gloo or a device)
    ops = {c.op for st in prof.steps for c in st.calls}
    options = tuple(Choice(net.name, s, curve(prof, largest, inside, net, per_node,
                                              CollectiveConfig(s, servers))[0].efficiency)
                    for net in networks for s in SCHEMES if s != "ps" or ops <= set(PS_OPS))
    if prof.grad_elems:
        shaped = replace(shaped, params=prof.grad_elems, params_source="gradient all-reduce",
                         value_bytes=prof.grad_bytes // prof.grad_elems)
    chosen, note = None, ""
    if shaped.params:
        groups = prof.per_step().values()
        compute = statistics.median(max(st.compute_ns for st in g) for g in groups) * 1e-9
        host = statistics.median(max(st.idle_ns for st in g) for g in groups) * 1e-9
        share = statistics.median(st.memory_bound_ns / st.compute_ns if st.compute_ns else 0.0
                                  for st in prof.steps)
        chosen = choose_layout(shaped, compute, devices[-1], per_node=per_node, intra=inside,
                               inter=inter, memory_bytes=memory, host_s=host,
                               memory_share=share)
    else:
        note = ("no parameter count: no gradient all-reduce kernels with sizes and no layer "
                "shapes (record with shapes)")
    return Projection(prof, inside, inter, per_node, scheme, tuple(points), options,
                      recommend(options), chosen, note,
                      "process" if on_host else "device", per_node_source)


def on_device(run: Run, prof: Profile, device: str) -> Profile:
    """The profile with its compute as `perfswarm predict --device` predicts it: each step's
    compute (and the compute before each collective) scaled by the predicted over the
    measured device-active time of the Run's iterations."""
    predicted = predict(run, Change(device=device))
    measured = predicted.median_active("measured")
    if measured <= 0:
        raise PerfswarmError(f"{run.path}: no device time to predict on {device}")
    ratio = predicted.median_active("predicted") / measured

    def scaled(st: StepProfile) -> StepProfile:
        calls = tuple(replace(c, ready_ns=round(c.ready_ns * ratio)) for c in st.calls)
        return replace(st, compute_ns=round(st.compute_ns * ratio),
                       tail_ns=round(st.tail_ns * ratio), calls=calls,
                       memory_bound_ns=round(st.memory_bound_ns * ratio))

    return replace(prof, steps=tuple(scaled(st) for st in prof.steps),
                   compute_source=f"predicted on {predicted.target_device}")


def recommend(options: Sequence[Choice]) -> Choice:
    """The first network of `options` (slowest first) whose best scheme reaches 90% scaling
    efficiency at the largest device count; if none does, the most efficient option."""
    for name in dict.fromkeys(c.interconnect for c in options):
        best = max((c for c in options if c.interconnect == name), key=lambda c: c.efficiency)
        if best.efficiency >= GOOD_EFFICIENCY:
            return best
    return max(options, key=lambda c: c.efficiency)


def report_projection(run: Run) -> dict[str, Any]:
    """The report's projection of a Run onto DEFAULT_DEVICES with the defaults of `project`;
    NotApplicable when the Run cannot have one (no collectives nor layer shapes to tell its
    gradients: `grad_bytes`)."""
    return project(run, DEFAULT_DEVICES).to_dict()
