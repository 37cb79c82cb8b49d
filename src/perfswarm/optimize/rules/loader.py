"""Rules about the DataLoader: training that waits for its batches, more worker processes
than the cores can keep busy, and pin_memory=True with no accelerator to pin for. The first
two read one pipeline model (LoaderPlan), so that they agree on how many cores the loader has
and how many workers fill them.

Worker processes make batches beside the training process, on the same cores: the training
process waiting on their queue says they are behind, not that they wait themselves; what they
cost is their own fetches' time and CPU (perf's samples of them). A 2-core host running an
expensive `__getitem__` (45.5 ms a step with no worker) took 43 ms with 1 worker, 23.7 with 2,
and no less with 4: the advice had said 1 worker (one core kept for training) for 9%, and on
the 2-worker run "double the workers" for 50% beside "1 worker" for oversubscription.

The cores are those other processes left free wherever the system sampler measured them, not
only where they held the training process back: a compiled loop that kept its core while
others held the other had been told 1 worker for 8.8% (the host's 2 cores taken as free), and
the worker, with no free core to run on, ran 17-44% slower. Without the sampler (`-c torch`),
a training process loading its batches itself whose loop thread waited on a runqueue for a
large share of its profiled steps (its run delay, read at the step hooks) had no free core
either: the cores were all busy while it waited.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa

from perfswarm.analyze.dependencies import enclosing_rows
from perfswarm.analyze.frame import Events, group_rows
from perfswarm.analyze.iterations import hook_deltas
from perfswarm.analyze.loaded import Loaded
from perfswarm.analyze.system import host_cores
from perfswarm.model.receive import ReceiveCost
from perfswarm.optimize.rules.base import Advice, advice, pct
from perfswarm.optimize.rules.facts import Facts, col, per_facts, processes
from perfswarm.optimize.rules.host import host_load, on_cpu_share, pageable_copies
from perfswarm.optimize.rules.threads import free_cores
from perfswarm.trace.schema import HOOK_DELAY

_FETCH = r"^DataLoader worker fetch$"  # a worker's span around each batch (recorder/inject)
_WAITING = 0.5  # a loader on a CPU under this share of the time it can have there waits (I/O)
_MAX_WORKERS = 8  # the most workers advised
_SHARE = 10.0  # % of the measured time the training process waits for batches: a finding
_QUEUED = 0.1  # a loop thread on a runqueue this share of its steps or more had no free core
# default_collate's ops, as it makes each field of the samples the batch's tensor
_COLLATE = frozenset(f"aten::{op}" for op in ("stack", "lift_fresh", "to", "empty", "detach_"))


@dataclass(frozen=True)
class LoaderPlan:
    """A Run's input pipeline, a step at a time (averaged over its ranks' measured steps).

    With W worker processes a step takes max(compute, batches x latency / W, all the CPU work /
    cores): the training process's own time, the workers making its batches W at a time, and
    the cores they all share (the training process's time is counted as CPU time: at most
    that). Without workers it takes compute + the wait. `latency` is a batch's time on one
    worker: its CPU time, where the loader computes (its time off a CPU is a wait for a core,
    which the CPU term prices), else its whole time (reads, sleeps), which workers overlap."""

    step_ns: float  # measured
    wait_ns: float  # the training process's wait for its batches (enumerate(DataLoader))
    batches: float  # batches a step
    workers: float  # worker processes a rank now (traced fetches; 0: loading in the process)
    batch_ns: float | None  # one batch's making, start to end; None: its workers untraced
    batch_cpu_ns: float | None  # its CPU time (perf), else its whole time
    on_cpu: float | None  # perf's share of the loader's time on a CPU (None: no perf)
    cores: float | None  # the host's cores a rank, those other processes left free where
    # measured (None: an imported trace's unknown host)
    free: float | None  # the host's cores other processes left free (None: not measured)
    # how `free` was measured: the system sampler's readings, or (no sampler) the loop
    # thread's run delay share of the profiled steps (`queued`)
    queued: float | None
    # tensors a batch: the recorder's count of the batches the loaders handed the steps, else
    # default_collate's in the trace (None: neither; priced as 1, the least)
    tensors: float | None
    counted: bool  # `tensors` is the recorder's count
    receive: ReceiveCost  # taking a batch from a worker, unprofiled (model/receive.py)
    slowdown: float  # the profiler's of the steps (Facts.profiler_slowdown)

    @property
    def receive_ns(self) -> float:
        """A batch a worker made, received by the training process, at the profiled steps'
        speed (the rest of the model's times are profiled ones)."""
        return self.receive.of(self.tensors or 1) * self.slowdown

    @property
    def compute_ns(self) -> float:
        """The training process's own time a step: its time not waiting for a batch."""
        return self.step_ns - self.wait_ns

    @property
    def fed_ns(self) -> float:
        """The training process's own time a step with workers: loading in the process now,
        it would take each batch from a worker's queue instead (receive_ns); with workers
        now, that is already in its time."""
        return self.compute_ns + (self.batches * self.receive_ns if self.workers <= 0 else 0.0)

    @property
    def core_share(self) -> float:
        """The share of a core each worker can have: the cores the rank's training process
        leaves (its own time a step as CPU time), over its workers; 1 without workers, or
        without the cores."""
        if self.workers <= 0 or self.cores is None:
            return 1.0
        return min(1.0, max(0.0, self.cores - self.compute_ns / self.step_ns) / self.workers)

    @property
    def waiting(self) -> bool:
        """Whether the loader mostly waits (reads, sleeps): perf saw it on a CPU under half
        the share of a core it can have (4 workers on 2 cores ran 42% of their fetches'
        time, as much as the cores let them: they computed)."""
        return self.on_cpu is not None and self.on_cpu < _WAITING * self.core_share

    @property
    def latency_ns(self) -> float:
        assert self.batch_ns is not None and self.batch_cpu_ns is not None
        return self.batch_ns if self.waiting else self.batch_cpu_ns

    @property
    def cpu_bound_ns(self) -> float:
        """All the CPU work of a step over the cores (0 where they are unknown)."""
        assert self.batch_cpu_ns is not None
        if not self.cores:  # none left free: no step at all
            return 0.0 if self.cores is None else math.inf
        return (self.batches * self.batch_cpu_ns + self.fed_ns) / self.cores

    def step_with(self, workers: float) -> float:
        """The modelled step with `workers` workers (0: the measured step)."""
        if workers <= 0:
            return self.step_ns
        return max(self.fed_ns, self.batches * self.latency_ns / workers, self.cpu_bound_ns)

    @property
    def floor_ns(self) -> float:
        """The step with as many workers as it takes: the training process's own time, or
        the cores' bound."""
        return max(self.fed_ns, self.cpu_bound_ns)

    @property
    def best(self) -> int:
        """The fewest workers that reach floor_ns (at most _MAX_WORKERS): more share the same
        cores (a 2-core host ran 4 workers no faster than 2)."""
        floor = self.floor_ns
        need = math.ceil(self.batches * self.latency_ns / floor - 1e-9) if floor > 0 else 1
        return max(1, min(_MAX_WORKERS, need))

    @property
    def gain(self) -> tuple[float, float]:
        """The modelled step with `best` workers, and what it saves a step (at most the wait;
        0 where they are no more than the workers now)."""
        then = self.step_with(self.best)
        if self.best <= self.workers:
            return then, 0.0
        return then, min(self.wait_ns, self.step_with(self.workers) - then)

    @property
    def loader_cores(self) -> float | None:
        """The cores a rank's loader has: the rank's less the training process's share of the
        step it would take with enough workers (it waits, or computes, the rest of it)."""
        if self.cores is None:
            return None
        floor = self.floor_ns
        return self.cores - (self.fed_ns / floor if floor > 0 else 1.0)


def _tensors_a_batch(facts: Facts, loads: pa.Table) -> int | None:
    """Tensors a batch holds where the trace tells: default_collate, the last thing the wait
    for a batch does, makes each field of the samples one tensor, an `aten::stack` of the
    samples' tensors (of numpy arrays too, after a `lift_fresh` each) or a `torch.tensor` of
    their Python numbers (`empty`, `to`, `lift_fresh`, `detach_`). Counted in the run of those
    ops that ends each wait (the samples' own ops before it stop the count), a stack each and
    a `detach_` after the first stack (one before it may be the dataset's own torch.tensor):
    the median over the waits, at least. None where it counted none: a collate_fn of its own,
    batch_size=None, fields of Python numbers alone, workers making the batches."""
    if loads.num_rows == 0:
        return None
    ev = Events.load(facts.run)
    ops, waits = enclosing_rows(ev, np.flatnonzero(ev.of_kind("cpu_op")), col(loads, "row"))
    top = ~np.isin(ops, enclosing_rows(ev, ops, ops)[0])  # those no other op holds
    order = np.argsort(ev.ts[ops[top]], kind="stable")  # group_rows keeps it
    ops, waits = ops[top][order], waits[top][order]
    counts = [0] * loads.num_rows  # each wait's (0 for those without a stack)
    for i, mine in enumerate(group_rows(waits, ops).values()):
        names = [ev.names[c] for c in ev.name[mine]]
        tail = list(itertools.takewhile(_COLLATE.__contains__, reversed(names)))[::-1]
        if "aten::stack" in tail:
            first = tail.index("aten::stack")
            counts[i] = tail.count("aten::stack") + tail[first:].count("aten::detach_")
    return int(np.median(counts)) or None


def _workers_per_rank(facts: Facts) -> float:
    """DataLoader worker processes a rank, from their traced fetches."""
    fetches = facts.named(_FETCH, "user_annotation")
    return processes(fetches) / max(1, len(facts.ranks))


@per_facts
def loader_plan(facts: Facts) -> LoaderPlan | None:
    """The Run's LoaderPlan; None without measured steps or traced loading (neither a wait
    for a batch nor a worker's fetch)."""
    loads = facts.loader_calls
    fetches = facts.named(_FETCH, "user_annotation")
    steps = facts.step_count()
    if steps == 0 or facts.wall_ns <= 0 or loads.num_rows + fetches.num_rows == 0:
        return None
    wait = sum(facts.busy_ns(loads).values()) if loads.num_rows else 0
    workers = _workers_per_rank(facts)
    single = workers == 0 and loads.num_rows > 0 and bool(
        facts.named_like(loads, "SingleProcess").any())
    if single:  # the training process makes each batch in its wait for it
        made = loads
    else:  # the workers' fetches in the window (all of them where none starts in it)
        inside = facts.in_window(fetches)
        made = inside if inside.num_rows else fetches
    batch_ns = float(col(made, "dur").mean()) if made.num_rows else None
    on_cpu = on_cpu_share(facts, made) if made.num_rows else None
    cores: float | None = host_cores(facts.manifest)
    # other processes held some: the loader and the training process share the rest (the
    # window's, else every timed step's, where a window of short steps holds too few readings)
    load = host_load(facts) or host_load(facts, timed=True)
    free = None if load is None else free_cores(load)
    queued = _queued_share(facts) if load is None and single else None
    if queued is not None and queued >= _QUEUED:
        free = 1.0 - queued
    if cores is not None and free is not None:
        cores = min(cores, free)
    counted = Loaded.of(facts.counters, facts.steps).tensors_a_batch()
    tensors = counted if counted is not None else (
        _tensors_a_batch(facts, loads) if single else None)
    return LoaderPlan(
        step_ns=facts.wall_ns / steps, wait_ns=wait / steps,
        batches=(loads.num_rows or made.num_rows) / steps, workers=workers, batch_ns=batch_ns,
        batch_cpu_ns=None if batch_ns is None else batch_ns * (1.0 if on_cpu is None else on_cpu),
        on_cpu=on_cpu, cores=None if cores is None else cores / max(1, len(facts.ranks)),
        free=free, queued=queued,
        tensors=tensors, counted=counted is not None, receive=facts.costs.receive,
        slowdown=facts.profiler_slowdown)


def _queued_share(facts: Facts) -> float | None:
    """The share of the profiled steps their loop thread sat runnable on a runqueue (its run
    delay at the step hooks, HOOK_DELAY); None where the recorder read none. While it waited
    every core was busy; a process loading its batches in its one loop thread got the rest of
    the time, the share of a core other processes left it (2 busy processes beside it on 2
    cores: a third each)."""
    steps = facts.steps
    waited = hook_deltas(facts.counters, steps, HOOK_DELAY)
    read = ~np.isnan(waited)
    if not read.any():
        return None
    dur = col(steps, "end")[read] - col(steps, "start")[read]
    return min(1.0, float(waited[read].sum()) / max(1, int(dur.sum())))


def _free_text(plan: LoaderPlan) -> str:
    """How the cores other processes left free were measured."""
    if plan.queued is None:
        return "measured by the system sampler"
    return (f"no system sampler: its loop thread waited for a core {100 * plan.queued:.0f}% "
            "of the profiled steps (its run delay at the step hooks), every core busy then, "
            "and had the rest")


def _ms(ns: float) -> str:
    return f"{ns / 1e6:,.2f} ms"


def _receive_text(plan: LoaderPlan) -> str:
    """How the model priced taking a batch from a worker, and from what."""
    cost = plan.receive
    tensors = (f"{plan.tensors:.3g} tensors a batch (the recorder's count of the batches the "
               "DataLoader handed the profiled steps, each storage once)" if plan.counted else
               f"{plan.tensors:g} tensors a batch (default_collate's, read in the trace)"
               if plan.tensors else "the tensors a batch not in the trace (no default_collate "
               "stack) nor counted by the recorder: 1, the least")
    return (f"taking a batch from a worker: {_ms(cost.batch_ns)} + {_ms(cost.tensor_ns)} a "
            f"tensor, {tensors}, x{plan.slowdown:.2f} the profiler's slowdown; {cost.source}")


def data_loading(facts: Facts) -> Advice | None:
    """Steps wait on `enumerate(DataLoader)`: the input pipeline holds up the training."""
    plan = loader_plan(facts)
    loads = facts.loader_calls
    if plan is None or loads.num_rows == 0:
        return None
    share = pct(plan.wait_ns, plan.step_ns)
    if share < _SHARE:
        return None
    steps = facts.step_count()
    single = plan.workers == 0 and plan.batch_ns is not None
    evidence = {"loader_calls": loads.num_rows, "loader_ns": sum(facts.busy_ns(loads).values()),
                "loader_share_pct": share, "single_process": single,
                "pageable_h2d_copies": pageable_copies(facts).num_rows,
                "cores": host_cores(facts.manifest), "workers": round(plan.workers, 2),
                "batch_ns": None if plan.batch_ns is None else round(plan.batch_ns),
                "batch_cpu_ns": None if plan.batch_cpu_ns is None else round(plan.batch_cpu_ns),
                "loader_on_cpu_pct": None if plan.on_cpu is None else round(100 * plan.on_cpu, 1),
                "free_cores": None if plan.free is None else round(plan.free, 2),
                "loop_run_delay_pct": None if plan.queued is None else round(100 * plan.queued, 1),
                "tensors_per_batch": None if plan.tensors is None else round(plan.tensors, 2),
                "receive_ns": round(plan.receive_ns) if single else None}
    # Pinned memory only speeds copies to an accelerator (torch warns when there is none).
    pin = ", pin_memory=True" if facts.device_events.num_rows else ""
    title = "training waits for the DataLoader"
    if plan.batch_ns is None:
        # workers whose fetches were not traced: how long they take and what they cost is
        # unknown; they make a batch in a step (compute + wait), twice as many in half that
        compute, wait = plan.compute_ns * steps, plan.wait_ns * steps
        host_n = host_cores(facts.manifest)
        most = f"{host_n} cores" if host_n else "the host's cores"
        return advice(facts, "data_loading", title, evidence,
                      wait - max(0.0, (wait - compute) / 2),
                      "pipeline model, the workers untraced: they now make a batch in compute "
                      "+ wait; twice as many make it in half that (the cores they share not "
                      "counted), and a step waits only for what exceeds its compute",
                      f"raise DataLoader num_workers (2x, up to {most}) and prefetch_factor "
                      f"(4){pin.replace(',', ';')}; move per-sample decoding out of the "
                      "training process")
    best, now = plan.best, plan.step_with(plan.workers)
    then, gain = plan.gain
    host_n = host_cores(facts.manifest)
    cores = ("" if plan.cores is None else f", all the CPU work / {plan.cores:g} cores"
             if plan.free is None or host_n is None or plan.free >= host_n else
             f", all the CPU work / {plan.cores:.2f} cores a rank (of the {plan.free:.2f} "
             f"other processes left free of {host_n}, {_free_text(plan)}: a worker runs on "
             "those, and what it takes the training process loses)")
    own = (f"its own {_ms(plan.fed_ns)} ({_ms(plan.compute_ns)} + {plan.batches:g} x "
           f"{_ms(plan.receive_ns)} taking a batch from a worker)" if plan.workers <= 0
           else f"its own {_ms(plan.compute_ns)}")
    model = (f"pipeline model: a step takes max({own}, "
             f"{plan.batches:g} x {_ms(plan.latency_ns)} a batch / workers{cores}) with "
             f"workers, its own time + the wait without; now {_ms(now)}"
             + (f" (measured {_ms(plan.step_ns)})" if plan.workers else "")
             + (f", with {best} {_ms(then)}" if gain > 0 else "")
             + ("; the recording host's cores are not in the trace: not bounded by them"
                if plan.cores is None else "")
             + ("; other processes' use of the cores not recorded (no system sampler): "
                "taken as free" if plan.cores is not None and plan.free is None else "")
             + (f"; {_receive_text(plan)}" if plan.workers <= 0 else "")
             + (f"; the loader waits (perf saw it on a CPU {100 * (plan.on_cpu or 0):.0f}% of "
                "its time): workers beyond the cores overlap its waits" if plan.waiting else ""))
    if gain > 0:
        return advice(facts, "data_loading", title, evidence, gain * steps, model,
                      f"DataLoader(num_workers={best}{pin}, prefetch_factor=4, "
                      "persistent_workers=True)")
    if single:
        # the host's cores free, a worker would gain: other processes' load took it away
        if plan.free is None or host_n is None or plan.free >= host_n:
            return None  # one core, or a batch costs more to take from a worker than to make
        idle = replace(plan, cores=host_n / max(1, len(facts.ranks)), free=float(host_n))
        if idle.gain[1] <= 0:
            return None
        return advice(facts, "data_loading", title, evidence, None,
                      f"none: other processes held {host_n - plan.free:.2f} of the {host_n} "
                      f"cores ({model}); a worker would take its CPU from the training process",
                      "no DataLoader worker while other processes hold the cores (with them "
                      f"free the model gives num_workers={idle.best}, "
                      f"{_ms(idle.gain[1])} a step); make each batch cheaper to produce, or "
                      "run where the cores are free")
    if plan.cpu_bound_ns >= max(plan.compute_ns, plan.batches * plan.latency_ns / plan.workers):
        basis = (f"none: {plan.workers:g} workers a rank and the training process need all "
                 f"of the {plan.cores:g} cores a rank has ({model}); more workers would share "
                 "them")
        change = ("make each sample cheaper to produce (decode or augment less, cache decoded "
                  "samples, batch the augmentation), or produce the data on more cores or "
                  "ahead of the run")
    else:
        basis = (f"none: the {plan.workers:g} workers keep up ({model}); the wait is the "
                 "batches' way to the training process, not their making")
        change = ("find where the training process waits for its batch beside the workers: "
                  "the batch's transfer from them (share memory: tensors, not Python objects; "
                  "smaller dtypes), a collate_fn or pin_memory's thread (py-spy of the "
                  "training process)")
    return advice(facts, "data_loading", title, evidence, None, basis, change)


def loader_oversubscription(facts: Facts) -> Advice | None:
    """More DataLoader workers a rank than the cores its loader has (LoaderPlan.loader_cores:
    the rank's cores less the training process's share): they share those cores, and
    data_loading's model gains nothing from them."""
    plan = loader_plan(facts)
    lc = None if plan is None else plan.loader_cores
    if plan is None or lc is None or plan.workers == 0 or plan.batch_ns is None:
        return None
    if plan.waiting:  # workers that mostly wait share no core
        return None
    if plan.workers <= math.ceil(lc - 1e-9):
        return None
    fetches = facts.named(_FETCH, "user_annotation")
    evidence = {"cores": host_cores(facts.manifest), "workers": processes(fetches),
                "ranks": len(facts.ranks), "loader_cores": round(lc, 2),
                "batch_cpu_ns": round(plan.batch_cpu_ns or 0)}
    return advice(facts, "loader_oversubscription",
                  "more DataLoader workers than the cores can keep busy", evidence, None,
                  f"no time model: {plan.workers:g} workers a rank share the {lc:.2f} cores "
                  f"its loader has (the {plan.cores:g} a rank less the training process's "
                  f"{_ms(plan.compute_ns)} of a {_ms(plan.floor_ns)} step); "
                  f"{plan.best} make its batches as fast (data_loading's model)",
                  f"DataLoader(num_workers={plan.best})")


def pin_memory_unused(facts: Facts) -> Advice | None:
    """A DataLoader(pin_memory=True) that pinned nothing (the recorder saw its iterator turn
    the option off: no accelerator), on a run that ran no device work: the option asks for a
    copy to a device that is not there, and torch warns of it on stderr."""
    if facts.recorded.get("pin_memory_unused") is not True or not facts.without_accelerator:
        return None
    return advice(facts, "pin_memory_unused", "pin_memory=True without an accelerator",
                  {"pin_memory": True, "cuda": facts.recorded.get("cuda")}, 0,
                  "measured: torch pinned nothing (it turns pin_memory off without an "
                  "accelerator), so dropping it saves no time; it only speeds copies to a device",
                  "DataLoader(pin_memory=False), or pin only where an accelerator is "
                  "(pin_memory=torch.accelerator.is_available())")
