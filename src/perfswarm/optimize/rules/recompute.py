"""Rule: activation checkpointing (torch.utils.checkpoint) re-runs the forward inside the
backward, on a host or device with memory to spare for the activations it frees.

What the trace says of it: an autograd node's own work runs with grad mode off, so its ops
carry no `Sequence number` (the profiler writes one for an op that records autograd history).
The ops a checkpoint recomputes run with grad mode on inside the node that first unpacked one
of its segment's saved tensors (the non-reentrant default: the saved-tensor hook runs the
segment's forward there, early-stopped at its last saved tensor) or inside
`CheckpointFunctionBackward` (use_reentrant=True): forward ops, each with a `Sequence number`,
directly under a backward node, before the node's own ops (without one). Double backward
(create_graph=True) records a node's own ops too, and no op without one is beside them there:
not checkpointing (and checkpointing under create_graph is not told from it).

The node's own time beside its ops (its self time) is the recomputation's Python: the
segment's module code, the hooks, torch.random.fork_rng's RNG save and restore, the autocast
contexts. Neither is in the forward's time: both are what dropping checkpointing saves.
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from perfswarm.analyze.annotations import host_calls
from perfswarm.analyze.frame import Events
from perfswarm.analyze.phases import BACKWARD, scopes
from perfswarm.model.opcost import VIEW_OPS, element_bytes, shapes_from_args
from perfswarm.optimize.rules.base import Advice, advice, pct
from perfswarm.optimize.rules.device import device_capacity, peak_memory
from perfswarm.optimize.rules.facts import Facts, col, where
from perfswarm.trace.schema import HOST_AVAILABLE

_MIN_SHARE: Final = 5.0  # % of the measured time recomputation (and its Python) costs, at least
_GRAD_RECORDED: Final = '"Sequence number"'  # in an op's args: it recorded autograd history
# the activations it frees must fit in this share of the free memory to advise dropping it
_HEADROOM: Final = 0.5


def recomputed(facts: Facts) -> tuple[pa.Table, pa.Table] | None:
    """(the recomputed forward ops, outermost, in the window; the backward nodes they ran
    in); None where the Run recomputed nothing: no node ran grad-recording ops and, beside
    them, its own (double backward runs only the former)."""
    ev = Events.load(facts.run)
    nodes = scopes(ev, BACKWARD)
    parent = host_calls(ev).parent
    ops = facts.in_window(facts.kind("cpu_op"))
    rows = col(ops, "row")
    direct = where(ops, np.isin(parent[rows], nodes) & ~np.isin(rows, nodes))
    if direct.num_rows == 0:
        return None
    args = facts.with_text(direct, "args")
    grad = np.asarray(pc.match_substring(args.column("args"), _GRAD_RECORDED).to_numpy(
        zero_copy_only=False), bool)
    held_by = parent[col(direct, "row")]
    # a node that recomputed runs its own work too, with grad mode off
    holding = np.intersect1d(held_by[grad], held_by[~grad])
    if not len(holding):
        return None
    grad &= np.isin(held_by, holding)
    return where(args, grad), facts.at(holding)


def activation_checkpointing(facts: Facts) -> Advice | None:
    """Recomputation (its forward ops and their Python) takes a real share of the measured
    time, where the activations it frees would fit in the memory free: drop checkpointing,
    or, where only some segments' would, checkpoint that many fewer (the gain theirs). Where
    not one segment's would fit, said, with no gain."""
    found = recomputed(facts)
    if found is None:
        return None
    ops, nodes = found
    calls = host_calls(Events.load(facts.run))
    recompute_ns = facts.total_ns(ops)
    python_ns = int(calls.cpu_self[col(nodes, "row")].sum())
    cost = recompute_ns + python_ns
    share = pct(cost, facts.wall_ns)
    if share < _MIN_SHARE:
        return None
    steps = facts.step_count()
    frees = _activation_bytes(facts, ops) // steps
    free, where_free = _free_bytes(facts)
    segments = nodes.num_rows / steps  # a step's
    # how many of a step's segments may go unchecked: the activations of each (their mean)
    # within _HEADROOM of the free memory; all of them where it was not sampled
    room = segments if free is None or not frees else min(
        segments, float(np.floor(_HEADROOM * free / (frees / segments))))
    evidence: dict[str, Any] = {
        "segments": nodes.num_rows, "recomputed_ops": ops.num_rows,
        "recompute_ns": recompute_ns, "recompute_python_ns": python_ns,
        "recompute_share_pct": share, "per_step_ns": round(cost / steps),
        "activation_bytes": frees, "free_bytes": free, "free_of": where_free,
        "fits": room >= segments, "segments_that_fit": round(room),
        "top_ops": [f"{n} {t / 1e6:,.3f} ms"
                    for n, t in facts.by_name(ops, col(ops, "dur"))[:3]]}
    title = (f"{share:g}% of the time recomputes checkpointed activations "
             f"({nodes.num_rows} segments, {cost / steps / 1e6:,.3f} ms a step)")
    memory = (f"the activations it frees, about {frees / 2**20:,.1f} MiB a step "
              f"({segments:g} segments)")
    if room < 1:
        return advice(facts, "activation_checkpointing", title + ": they would not fit",
                      evidence, None,
                      f"no time saved: {memory} need more than {_HEADROOM:.0%} of the "
                      f"{where_free}'s free {(free or 0) / 2**20:,.1f} MiB, one segment's too",
                      "keep activation checkpointing: the memory it saves is needed here")
    basis = ("measured: the recomputed forward ops' time in the backward nodes that ran them, "
             "plus those nodes' own time beside their ops (the recomputation's Python: the "
             "segment's module code, the saved-tensor hooks, the RNG state's restore, the "
             "autocast contexts); the forward's checkpoint calls are not counted")
    if free is None:
        change = (f"drop torch.utils.checkpoint (call the blocks directly) or checkpoint fewer "
                  f"segments: {memory}, against memory the Run did not sample (record with the "
                  "system collector, or check the peak without checkpointing)")
    elif room >= segments:
        change = (f"drop torch.utils.checkpoint (call the blocks directly): {memory} fit in the "
                  f"{where_free}'s free {free / 2**20:,.1f} MiB")
    else:
        basis += (f"; {room:g} of a step's {segments:g} segments' share of it (their "
                  "activations' mean each)")
        change = (f"checkpoint {room:g} fewer of a step's {segments:g} segments (call those "
                  f"blocks directly): {memory}, {room:g} of them within {_HEADROOM:.0%} of the "
                  f"{where_free}'s free {free / 2**20:,.1f} MiB")
    return advice(facts, "activation_checkpointing", title, evidence, cost * room / segments,
                  basis, change)


def _activation_bytes(facts: Facts, ops: pa.Table) -> int:
    """What the recomputed ops' saved activations hold, estimated: each op's first input
    (its activation: a layer's weight comes second), its recorded shape and dtype; the
    outermost ops alone, so that a composite op's inner ops count once, and no view."""
    total = 0
    views = {f"aten::{v}" for v in VIEW_OPS}  # a view holds no memory of its own
    for name, text in zip(facts.name_texts(ops), ops.column("args").to_pylist(), strict=True):
        shapes = None if name in views else shapes_from_args(text)
        if shapes is not None and shapes.dims and shapes.dims[0]:
            total += int(np.prod(shapes.dims[0])) * element_bytes(shapes)
    return total


def _free_bytes(facts: Facts) -> tuple[int | None, str]:
    """The memory the activations would live in, free at its fullest (bytes), and what it
    is: a device's capacity less its peak use where the Run ran device work; the host's
    available memory at its lowest in the window and the samples either side of it (the
    system sampler's) else; None without either."""
    if facts.device_events.num_rows:
        capacity = device_capacity(facts)
        peaks = peak_memory(facts, {r for r, _ in capacity})
        free = [capacity[k] - round(p) for k, (p, _) in peaks.items() if k in capacity]
        return (min(free), "device") if free else (None, "device")
    counters = where(facts.counters, col(facts.counters, "name") == HOST_AVAILABLE)
    spans = [facts.window(r)[:2] for r in facts.ranks]  # the sampler's are host-wide (rank -1)
    if counters.num_rows == 0 or not spans:
        return None, "host"
    order = np.argsort(col(counters, "ts"), kind="stable")
    ts, value = col(counters, "ts")[order], col(counters, "value")[order]
    # the samples in the window and the one on either side of it: a window of a few short
    # steps can fall between two of the sampler's (20 Hz) samples
    lo = max(int(np.searchsorted(ts, min(s for s, _ in spans), "right")) - 1, 0)
    hi = int(np.searchsorted(ts, max(e for _, e in spans), "left")) + 1
    return int(value[lo:hi].min()), "host"
