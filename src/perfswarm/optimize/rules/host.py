"""Rules about the host side: input pipeline, copies from pageable memory, syncs, CPU threads."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from perfswarm.analyze.frame import Events, Mask, lane_key
from perfswarm.analyze.intervals import Coverage, union
from perfswarm.analyze.iterations import UNUSUAL, hook_deltas, step_batches
from perfswarm.analyze.system import (
    descheduled,
    host_cores,
    others_delay,
    others_held,
    readings,
    saturated,
)
from perfswarm.model.opstats import backward_flops
from perfswarm.model.topology import copy_peak_gbps, interconnect
from perfswarm.optimize.rules.base import Advice, advice, pct
from perfswarm.optimize.rules.facts import (
    Facts,
    col,
    groups,
    like,
    per_facts,
    processes,
    where,
)
from perfswarm.optimize.rules.threads import ENVIRONMENT, TIMED, fewer_threads, ran_with
from perfswarm.trace.schema import (
    HOOK_COMPILE,
    HOOK_DELAY,
    HOOK_LOADER,
    PROFILED,
    STEP_BATCH,
    STEP_INPUT,
)

_PAGEABLE_H2D = r"HtoD.*Pageable|Pageable.*Device"
# Without a device spec: pinned host memory roughly doubles HtoD bandwidth and lets the copy
# run asynchronously.
_PINNED_SPEEDUP = 2.0


def _torchrun(command: list[str]) -> bool:
    """Whether the command runs torchrun (`torchrun`, `python -m torch.distributed.run`),
    after any `env A=B` or interpreter in front of it: its words up to the first script."""
    for word in command:
        if Path(word).name == "torchrun" or word in ("torch.distributed.run",
                                                     "torch.distributed.launch"):
            return True
        if word.endswith(".py"):
            return False
    return False


def _cores(facts: Facts) -> int:
    """The recording host's cores (the sampler's rules run on recorded Runs, which know)."""
    return host_cores(facts.manifest) or 1


def pageable_copies(facts: Facts) -> pa.Table:
    return facts.in_window(facts.named(_PAGEABLE_H2D, "memcpy"))


def on_cpu_share(facts: Facts, spans: pa.Table) -> float | None:
    """The share of the spans' time their threads ran on a CPU: perf's cpu-clock samples of
    those threads inside them (each a sampling period of CPU time) over the spans' time; None
    without perf samples of the run (perf missing, or an imported trace)."""
    hz = facts.recorded.get("perf_hz")
    perf = facts.perf_samples
    if not hz or spans.num_rows == 0 or perf.num_rows == 0:
        return None
    seen = set(col(perf, "pid").tolist())  # processes perf followed at all
    inside, spent = 0, 0.0
    for (pid, tid), group in groups(spans, ["pid", "tid"]):
        if pid not in seen:
            continue
        lo = col(group, "ts")
        inside += int(_samples_in(_thread_samples(facts, pid, tid), lo, lo + col(group, "dur"))
                      .sum())
        spent += float(col(group, "dur").sum())
    return min(1.0, inside * 1e9 / float(hz) / spent) if spent else None


def _thread_samples(facts: Facts, pid: int, tid: int) -> npt.NDArray[np.int64]:
    """The times of perf's cpu-clock samples of one thread, sorted."""
    perf = facts.perf_samples
    mine = (col(perf, "pid") == pid) & (col(perf, "tid") == tid)
    return np.sort(col(perf, "ts")[mine].astype(np.int64))


def _samples_in(ts: npt.NDArray[np.int64], lo: npt.NDArray[np.int64],
                hi: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """How many of the sorted sample times `ts` fall in each [lo, hi)."""
    return np.searchsorted(ts, hi) - np.searchsorted(ts, lo)


def pageable_h2d(facts: Facts) -> Advice | None:
    """Host-to-device copies from pageable memory: staged through a bounce buffer, synchronous."""
    copies = pageable_copies(facts)
    if copies.num_rows == 0:
        return None
    # a detail is a flat JSON object (trace/detail.py): its integer `bytes`, 0 without
    sizes = pc.struct_field(pc.extract_regex(facts.with_text(copies, "detail").column(
        "detail"), r'"bytes":(?P<n>-?\d+)[,}]'), [0]).cast(pa.int64())
    copy_ns = facts.total_ns(copies)
    nbytes = int(pc.sum(pc.fill_null(sizes, 0)).as_py() or 0)
    evidence = {"copies": copies.num_rows, "bytes": nbytes, "copy_ns": copy_ns,
                "bandwidth_gbps": round(nbytes / copy_ns, 3) if copy_ns else 0.0}
    spec = facts.spec
    if spec is not None and nbytes:
        link = interconnect(f"pcie{spec.pcie_gen}")
        pinned_ns = 1e9 * (copies.num_rows * link.alpha_s + nbytes * link.beta_s_per_byte)
        evidence["pinned_estimate_ns"] = round(pinned_ns)
        # what a host-to-device copy can reach on this device: the report's peak (analyze's
        # bandwidth flows), achieved against it
        evidence["peak_gbps"] = round(copy_peak_gbps(spec, "h2d"), 3)
        gain = copy_ns - pinned_ns
        basis = (f"link model (model/interconnects.yaml): the same {copies.num_rows} copies at "
                 f"{link.name}'s achieved {link.bandwidth_gbps:g} GB/s and "
                 f"{link.alpha_s * 1e6:g} µs each, the PCIe generation of {spec.name}")
    else:
        gain = copy_ns * (1 - 1 / _PINNED_SPEEDUP)
        basis = ("fixed factor, no model (no device spec or byte counts for the link model): "
                 f"pinned copies run about {_PINNED_SPEEDUP:g}x faster")
    return advice(facts, "pageable_h2d", "host-to-device copies from pageable memory", evidence,
                  gain, basis,
                  "pin the host tensors (tensor.pin_memory() or DataLoader(pin_memory=True)) and "
                  "copy with .to(device, non_blocking=True)")


def host_syncs(facts: Facts) -> Advice | None:
    """The host blocks on the device (.item(), .cpu(), synchronize) several times per step."""
    if facts.without_accelerator:
        return None  # its .item()s read host memory: they wait for nothing
    apis, items = facts.host_blocking
    d2h = facts.in_window(facts.named(r"DtoH", "memcpy"))
    points = apis.num_rows + items.num_rows
    steps = facts.step_count()
    per_step = points / steps if steps else 0.0
    if per_step < 3:
        return None
    blocked = sum(facts.host_blocked_ns.values())
    by_name = dict(sorted(facts.by_name(apis, np.ones(apis.num_rows, np.int64))))
    evidence = {"sync_calls": apis.num_rows, "by_api": by_name, "scalar_reads": items.num_rows,
                "dtoh_copies": d2h.num_rows, "per_step": round(per_step, 2), "blocked_ns": blocked}
    return advice(facts, "host_syncs", "the host waits for the device inside steps", evidence,
                  blocked, "measured, no model: the host's blocked time goes; it queues the "
                  "next work instead",
                  "keep values on the device (no .item()/.cpu()/print of tensors per step; "
                  "accumulate metrics as tensors and read them every N steps); drop explicit "
                  "torch.cuda.synchronize() calls outside timing code")


def thread_oversubscription(facts: Facts) -> Advice | None:
    """More compute threads than cores: ranks on one host each start a full OpenMP/MKL pool."""
    env = facts.manifest.get("extra", {}).get("env", {})
    procs = max(1, len(facts.manifest["ranks"]))
    cores = _cores(facts)
    declared = [int(env[k]) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
                if str(env.get(k, "")).isdigit()]
    counted = col(facts.counters, "value")[like(facts.counters, "name", r"\.num_threads$")]
    ran = ran_with(facts)
    threads = 0
    if ran is not None and ran.source != ENVIRONMENT:
        # what each stepping process ran with (torchrun sets OMP_NUM_THREADS=1), at the later
        # profiled steps where it changed them
        procs, per_proc, threads, source = ran.processes, ran.threads, ran.total, ran.source
    elif declared:
        per_proc, source = max(declared), "environment"
    elif counted.size:
        per_proc, source = int(counted.max()), "counters"
    elif facts.manifest["collectors"] and procs > 1 and _torchrun(facts.manifest["command"]):
        per_proc, source = 1, "torchrun's default (OMP_NUM_THREADS=1 in each worker)"
    elif facts.manifest["collectors"] and procs > 1:
        per_proc, source = cores, "torch default (one thread per core in each process)"
    else:
        return None  # an imported trace says nothing about the threads it ran with
    threads = threads or per_proc * procs
    if threads <= cores:
        return None
    host_ns = sum(facts.busy_ns(facts.in_window(facts.kind("cpu_op"))).values())
    evidence = {"cores": cores, "processes": procs, "threads_per_process": per_proc,
                "threads": threads, "source": source}
    best, why = max(1, cores // procs), "cores / processes"
    # other processes holding the cores leave fewer free: cpu_contention's number, the same
    # (8 threads on 2 busy cores took 66-80 ms a step, 2 threads 56-210, 1 thread 16-26)
    busy = contended(facts)
    fewer = fewer_threads(facts, busy[2]) if busy is not None else None
    if fewer is not None and fewer.advised < best:
        best, why = fewer.advised, (f"the {fewer.free_cores:.2f} cores other processes left "
                                    "free / processes, as cpu_contention says")
        evidence["free_cores"] = round(fewer.free_cores, 2)
    if per_proc <= best:
        return None  # each process runs that few already: the processes are over the cores
        # (Hogwild's workers, 4 of one thread on 2 cores), which no thread setting changes
    return advice(facts, "thread_oversubscription", "more CPU threads than cores", evidence,
                  host_ns * (1 - cores / threads),
                  "core-sharing model: CPU ops stop sharing cores, so their time shrinks by "
                  "cores / threads",
                  f"OMP_NUM_THREADS={best} MKL_NUM_THREADS={best} ({why}), or "
                  f"torch.set_num_threads({best}) in each process")


def _window_counters(facts: Facts, pattern: str, timed: bool = False) -> pa.Table:
    """Counters named by the regex `pattern` inside the measured windows of the ranks (host
    counters, rank -1, in every rank's window), or with `timed` inside the span of every step
    the run timed (its steps outside the profiler's window too); all of them in a Run without
    events."""
    named = where(facts.counters, like(facts.counters, "name", pattern))
    if not facts.ranks:
        return named
    spans = ([(r, lo, hi) for r in facts.ranks for lo, hi, _ in [facts.window(r)]]
             if not timed else
             [(r, int(col(g, "start").min()), int(col(g, "end").max()))
              for (r,), g in groups(facts.run_steps, ["rank"])])
    rank, ts = col(named, "rank"), col(named, "ts")
    parts = [np.flatnonzero(np.isin(rank, [r, -1]) & (ts >= lo) & (ts < hi))
             for r, lo, hi in spans]
    return named.take(pa.array(np.concatenate(parts) if parts else np.zeros(0, np.int64)))


def cpu_contention(facts: Facts) -> Advice | None:
    """The cores were busy, but mostly not with the recorded processes: others took the CPU;
    over the profiled steps, or over every step the run timed where other processes held it
    back more there (a quiet window, a loaded rest of the run)."""
    found = contended(facts)
    if found is None:
        return None
    gain, whole, evidence, model = found
    # a Run that timed no step (a program that only exits) has no step time to inflate
    times = "step times" if facts.run_steps.num_rows else "times"
    title, change = "other processes took most of the CPU", (
        "run on an idle machine (or reserve cores: taskset/cgroups) and find the other "
        "busy processes (top, or `perfswarm record -c system` counters): the "
        f"{times} measured here are inflated by them")
    fewer = fewer_threads(facts, evidence)  # more intra-op threads than the cores left free
    if fewer is not None:
        evidence = {**evidence, **fewer.evidence()}
        title += f", and its {fewer.threads} intra-op threads wait for each other"
        change = f"{fewer.change()}; or {change}"
    return advice(facts, "cpu_contention", title, evidence, gain, model, change,
                  of=(whole, evidence["over"]))


# What a Run without events is measured over (the profiled steps' words had been said of one
# that timed no step).
_RECORDING = "the recording (the system sampler's span: no step timed, nothing traced)"


@per_facts
def contended(facts: Facts) -> tuple[float, int, dict[str, Any], str] | None:
    """_contention over the profiled steps or over every timed step, whichever loses the
    larger share; None where other processes held the run back little in both."""
    found = [c for timed in (False, True) if (c := _contention(facts, timed)) is not None]
    return max(found, key=lambda c: c[0] / c[1]) if found else None


class HostLoad(TypedDict):
    cores: int
    host_busy_cores: float
    process_cores: float
    recorder_cores: float


def host_load(facts: Facts, timed: bool = False) -> HostLoad | None:
    """The host's CPU over the profiled steps, or with `timed` over every step the run timed,
    from the system sampler's readings there (cpu_contention's evidence, threads.free_cores'
    input): its cores, the busy ones (usr + sys), the run's processes' (proc.cpu_cores, the
    mean) and the recorder's own tools' (perf, py-spy: no other process of the machine's);
    None with under 3 readings of the run's processes (no system sampler: `-c torch`)."""
    proc = col(_window_counters(facts, r"^proc\.cpu_cores$", timed), "value")
    busy = col(_window_counters(facts, r"^cpu\.core\d+\.(usr|sys)$", timed), "value")
    if proc.size < 3 or busy.size == 0:
        return None
    cores = _cores(facts)
    return HostLoad(cores=cores, host_busy_cores=float(busy.sum()) / (busy.size / 2 / cores),
                    process_cores=float(proc.mean()), recorder_cores=_recorder_cores(facts))


def _contention(facts: Facts, timed: bool) -> tuple[float, int, dict[str, Any], str] | None:
    """cpu_contention's (gain, time it is of, evidence, model) over the profiled steps, or with
    `timed` over every step the run timed; None where other processes held it back little."""
    if timed and facts.run_steps.num_rows <= facts.steps.num_rows:
        return None
    # nothing traced but steps timed (the program ran its own torch profiler): the steps are
    # what was measured, not the recording's span around them
    if not timed and not facts.ranks and facts.run_steps.num_rows:
        return None
    load = host_load(facts, timed)
    if load is None:
        return None
    cores, host = load["cores"], load["host_busy_cores"]
    got, tools = load["process_cores"], load["recorder_cores"]
    if not saturated(host, cores) or host - got - tools < others_held(cores):
        return None
    proc = col(_window_counters(facts, r"^proc\.cpu_cores$", timed), "value")
    free = float(np.percentile(proc, 90))
    delay = col(_window_counters(facts, r"^proc\.run_delay_cores$", timed), "value")
    evidence: dict[str, Any] = {
        "over": (TIMED if timed else facts.measured_as if facts.ranks
                 else _RECORDING),
        "cores": cores, "host_busy_cores": round(host, 2), "process_cores": round(got, 2),
        "process_cores_p90": round(free, 2), "recorder_cores": round(tools, 2),
        "samples": int(proc.size)}
    ts = col(_window_counters(facts, r"^proc\.cpu_cores$", timed), "ts")
    steps = facts.run_steps
    # A Run without events (no profiling window) is measured by its sampler's span.
    whole = (int((col(steps, "end") - col(steps, "start")).sum()) if timed
             else facts.wall_ns or int(ts.max() - ts.min()))
    # the outlier steps' time beyond their usual step is the program's own periodic work
    # (outlier_steps'), no share of it another process's: the two had claimed 103% of an RPC
    # server's time between them
    claimed = _outlier_excess(facts, timed)
    evidence["outlier_excess_ns"] = claimed
    if delay.size:
        # The kernel's own account: the time its threads sat runnable on a runqueue. Of the
        # threads that wanted a core (those that ran and those that waited), those beyond
        # the machine's cores wait for each other (more DataLoader workers than cores:
        # loader_oversubscription's); the rest of the wait is the other processes'. k threads
        # waiting at once lose the wall time once: over the threads that wanted a core.
        waited = float(delay.mean())
        wanted = got + waited
        # the recorder's own tools held some of the cores it waited for: that part of the
        # wait is theirs, not the machine's other processes' (perf starting up held 0.75 of
        # 2 cores beside 0.95 of others' through a program that only exits)
        foreign = host - got
        others = others_delay(got, waited, cores) * (
            max(0.0, foreign - tools) / foreign if foreign > 0 else 0.0)
        evidence["run_delay_cores"] = round(waited, 3)
        evidence["others_delay_cores"] = round(others, 3)
        gain = (whole - claimed) * others / max(1.0, wanted)
        if gain < _WAITED * whole:  # the cores were busy, but the run's threads hardly waited
            return None
        model = ("the kernel's run delay (schedstat): the time the run's threads waited on a "
                 "runqueue for other processes (the wait beyond the cores is for each other, "
                 "and the recorder's tools' share of the cores it waited for is theirs), over "
                 "the threads that wanted a core")
        if timed:
            # the steps it sat descheduled in (outlier_steps' test), their time beyond the usual
            # step, measured: a loop whose threads meet at barriers loses more than its run
            # delay's share (a VAE's 30-804 ms steps for 10: 80% of its time, 42.8% modelled)
            measured = _descheduled_excess(facts)
            evidence["descheduled_excess_ns"] = measured
            if measured > gain:
                gain, model = measured, ("measured: the steps it sat descheduled in (the cores "
                                         "busy, its run delay beyond a usual step's share half "
                                         "their excess or more), their time beyond the usual "
                                         "step")
        return gain, whole, evidence, model
    # Its own CPU time at the parallelism it reached when it ran most freely (90th
    # percentile of its sampled cores) instead of what it got on average: a reading
    # of 50 ms counts 10 ms ticks, so a one-thread process reads 0.8-1.2 cores when it
    # has one; the 90th percentile is above its mean by that alone (Runs recorded
    # before the run delay was sampled)
    if free <= got:
        return None
    return (whole - claimed) * (1 - got / free), whole, evidence, (
        "time-share model from the system sampler: the run's CPU time at the cores it used "
        "when it ran most freely (90th percentile) instead of its mean")


_WAITED = 0.02  # run delay under this share of the time: other processes did not hold it back


def _recorder_cores(facts: Facts) -> float:
    """The cores the recorder's own tools (perf, py-spy: manifest extra.record.tool_cpu_ns)
    kept busy on average over the recording."""
    record = facts.manifest.get("extra", {}).get("record", {})
    tools, start, end = record.get("tool_cpu_ns", {}), record.get("start_ns"), record.get("end_ns")
    if not isinstance(start, int) or not isinstance(end, int) or end <= start:
        return 0.0
    return sum(v for v in tools.values() if isinstance(v, int)) / (end - start)


_OUTLIER = UNUSUAL  # a step this many times the median step is an outlier (a validation pass every
# few steps took 2.3-2.5x one in the audited loops: 16-21% of the time, unflagged at 3x)


@dataclass(frozen=True)
class _Outliers:
    """outlier_steps' findings: the timed steps (`_timed_steps`), the outliers it keeps as the
    program's own work (`slow`, their time beyond their usual step `beyond`), and what it left
    to other rules or set aside."""

    steps: pa.Table
    dur: npt.NDArray[np.int64]
    slow: pa.Table
    beyond: npt.NDArray[np.float64]
    compiling: npt.NDArray[np.int64]  # dynamo's compile time in each of `slow`
    # the recorder's time starting DataLoader workers in each (HOOK_LOADER; NaN: not read),
    # and whether that is a new epoch's loader (half their excess or more, less `waiting`,
    # the loop thread's wait for a core beyond its median step's)
    starting: npt.NDArray[np.float64]
    epoch: Mask
    waiting: npt.NDArray[np.float64]
    warm: int
    starved: int
    fed: int
    profiler_only: int


@per_facts
def _outliers(facts: Facts) -> _Outliers | None:
    """The steps over _OUTLIER times their usual one that are the program's periodic work:
    not its warm-up, nor slow only under the profiler, nor descheduled (cpu_contention's), nor
    waiting for the DataLoader (data_loading's); None where there are none."""
    found = _timed_steps(facts)
    if found is None:
        return None
    steps, dur, usual = found
    median = float(np.median(dur))
    over = dur > _OUTLIER * usual
    # a rank's first steps, slow until its first usual one, are its warm-up (JIT profiling
    # executors, first-call compilation, caches filling), which runs once: not periodic work
    rank = col(steps, "rank")
    warm = np.zeros(len(over), bool)
    for r in np.unique(rank):
        at = np.flatnonzero(rank == r)
        warm[at] = np.cumprod(over[at]).astype(bool)
    over &= ~warm
    # slow only under the profiler, while as many steps or more outside its window ran at the
    # usual pace: the profiler's cost (its buffers, a heap growing under it: a GNN's gathers
    # 10x slower in its window's last steps), not the program's periodic work
    # (a step torch.compile compiled in, half its excess or more, is the program's: once)
    profiled = col(steps, "source") == PROFILED
    # torch.compile compiling again inside them (a new input shape, a guard that failed):
    # the recorder's clock of dynamo's compiles (HOOK_COMPILE, in every step; a compiled
    # model's recompilation on its last short batch, outside the window, had been called
    # periodic work), or dynamo's whole-frame compile spans (an imported trace's), clipped to
    # the slow steps
    compiling = np.zeros(len(over), np.int64)
    long = where(steps, over)
    clocked = np.nan_to_num(hook_deltas(facts.counters, long, HOOK_COMPILE)).astype(np.int64)
    compiling[over] = np.maximum(clocked, _within(facts.named(_COMPILE, "cpu_op",
                                                              "user_annotation"), long))
    compiled = compiling >= (dur - usual) / 2
    # a profiled step that ran no more ops than its rank's usual profiled step, its ops
    # covering half its excess or more, did the usual work slower: the profiler's growing
    # cost (x-transformers' window grew from 834 to 4,320 ms a step, 9,545 ops in each, its
    # steps outside it 375 ms), not periodic work, which adds ops (an evaluation's forward)
    # or untraced time (a checkpoint's write); judged so too where a step outside the window
    # is an outlier (a generate() every 20 steps had kept the window's slow steps in)
    usual_work = profiled & over & ~compiled & _usual_work(facts, steps, dur, usual, profiled)
    profiler_only = int(usual_work.sum())
    over &= ~usual_work
    if (~profiled).sum() >= profiled.sum() and not over[~profiled].any():
        profiler_only += int((over & profiled & ~compiled).sum())
        over &= ~profiled | compiled
    slow = where(steps, over)
    if median <= 0 or slow.num_rows == 0:
        return None
    # the recorder timed a new epoch's DataLoader starting its workers in them (HOOK_LOADER;
    # NaN where it did not read it): half their excess or more is the loader's start, which
    # outlier_steps names, no burst of batches; their excess less the time their loop thread
    # waited for a core beyond its median step's wait (HOOK_DELAY: the new workers start on
    # its cores; denoising-diffusion-pytorch's epoch step 32, 262 ms over the median, had 129
    # ms timed starting them and 88 ms more on a runqueue)
    starting = hook_deltas(facts.counters, steps, HOOK_LOADER)
    started = np.nan_to_num(starting)
    queued = hook_deltas(facts.counters, steps, HOOK_DELAY)
    waiting = (np.maximum(0.0, np.nan_to_num(queued - np.nanmedian(queued)))
               if not np.isnan(queued).all() else np.zeros(len(dur)))
    epoch = (started > 0) & (started >= (dur - usual - waiting) / 2)
    # a step the process sat descheduled in (other processes held the cores) is contention,
    # not the loop's own work: cpu_contention's; one that waited for its DataLoader half its
    # excess or more is data_loading's, not this rule's, as is one outside the window (where
    # no loader wait is traced) of a rank whose slow steps in the window all waited for it,
    # unless torch.compile compiled in it half its excess or more (a compiled model's
    # recompilation on its last short batch had been read as the loader's)
    starved = np.asarray(descheduled(facts.counters, _cores(facts), slow, steps), bool)
    loading = _within(facts.loader_calls, slow)
    beyond = col(slow, "end") - col(slow, "start") - usual[over]
    bursty = _loader_bound(facts, steps, dur, median, ~epoch)
    unseen = (col(slow, "source") != PROFILED) & np.isin(col(slow, "rank"), bursty) & (
        compiling[over] < beyond / 2) & ~epoch[over]
    fed = ~starved & ((loading >= beyond / 2) | unseen)
    kept = ~starved & ~fed
    if not kept.any():
        return None
    return _Outliers(steps, dur, where(slow, kept), beyond[kept], compiling[over][kept],
                     starting[over][kept], epoch[over][kept], waiting[over][kept],
                     int(warm.sum()), int(starved.sum()),
                     int(fed.sum()), profiler_only)


def _usual_work(facts: Facts, steps: pa.Table, dur: npt.NDArray[np.int64],
                usual: npt.NDArray[np.float64], profiled: Mask) -> Mask:
    """The profiled steps that ran no more ops than their rank's median profiled step, and
    whose time no op covers grew by under half their time beyond their usual step: the usual
    work, slower."""
    ops = facts.kind("cpu_op", columns=("rank", "ts", "dur"))
    rank = col(steps, "rank")
    count = np.zeros(len(dur), np.int64)
    untraced = dur.copy()
    untraced[profiled] -= _within(ops, where(steps, profiled))
    same = np.zeros(len(dur), bool)
    for r in np.unique(rank[profiled]).tolist():
        ts = np.sort(col(ops, "ts")[col(ops, "rank") == r].astype(np.int64))
        at = profiled & (rank == r)
        count[at] = (np.searchsorted(ts, col(steps, "end")[at].astype(np.int64))
                     - np.searchsorted(ts, col(steps, "start")[at].astype(np.int64)))
        same[at] = (count[at] > 0) & (count[at] <= np.median(count[at])) & (
            untraced[at] - np.median(untraced[at]) <= (dur[at] - usual[at]) / 2)
    return same


def outlier_steps(facts: Facts) -> Advice | None:
    """A few steps take many times the median one: periodic work (evaluation, generate(),
    checkpoints, logging) runs between optimizer steps, or a new epoch's DataLoader starts its
    workers."""
    found = _outliers(facts)
    if found is None:
        return None
    steps, dur, slow = found.steps, found.dur, found.slow
    median = float(np.median(dur))
    slow_dur = col(slow, "end") - col(slow, "start")
    timed = float(dur.sum())
    excess = float(found.beyond.sum())
    compile_ns = int(found.compiling.sum())
    # those a new epoch's DataLoader starting its workers (_outliers) are named so, with the
    # time the recorder timed it (the last epoch's joined, new ones forked, their first batches)
    started, epoch = np.nan_to_num(found.starting), found.epoch
    evidence = {"median_step_ns": round(median), "steps": steps.num_rows,
                "warmup_steps": found.warm, "descheduled_steps": found.starved,
                "loader_steps": found.fed, "profiler_only_steps": found.profiler_only,
                "compile_ns": compile_ns,
                "outliers": [{"rank": int(r), "step": int(s), "dur_ns": int(e - b)}
                             for r, s, b, e in zip(*(col(slow, c)[np.lexsort((
                                 col(slow, "step"), col(slow, "rank")))].tolist()
                                 for c in ("rank", "step", "start", "end")), strict=True)][:10],
                "outlier_ns": int(slow_dur.sum()),
                "outlier_share_pct": pct(float(slow_dur.sum()), timed),
                # both null on a Run recorded without the counter (HOOK_LOADER)
                **dict.fromkeys(("loader_start_steps", "loader_start_ns"))}
    if not np.isnan(found.starting).all():
        evidence |= {"loader_start_steps": int(epoch.sum()),
                     "loader_start_ns": int(started.sum())}
    change, off_cpu = _periodic_change(facts, found, ~epoch)
    if off_cpu is not None:
        evidence["off_cpu_excess_ns"] = off_cpu
    if epoch.any():
        named = ", ".join(str(s) for s in sorted(col(slow, "step")[epoch].tolist())[:10])
        loader = (f"{'step' if epoch.sum() == 1 else 'steps'} {named} "
                  f"{'starts' if epoch.sum() == 1 else 'start'} a new epoch's "
                  f"DataLoader workers: the recorder timed {started[epoch].sum() / 1e6:,.1f} "
                  f"ms of their {found.beyond[epoch].sum() / 1e6:,.1f} ms beyond the median "
                  "step starting them (the last epoch's workers joined, new ones forked, "
                  "their first batches)"
                  + (f"; their loop thread sat {found.waiting[epoch].sum() / 1e6:,.1f} ms "
                     "longer than in a usual step on a runqueue, waiting for a core, while "
                     "starting them or beside" if found.waiting[epoch].sum() >= 1e6 else "")
                  + ": keep the workers across epochs "
                  "(DataLoader(persistent_workers=True)) or make the epochs longer")
        change = loader if epoch.all() else f"{loader}; the other outliers: {change}"
    return advice(facts, "outlier_steps", f"{slow.num_rows} step(s) over {_OUTLIER:g}x the median",
                  evidence, excess, "measured, no model: the outlier steps' time beyond the "
                  "median step (of their batch, where a forward-driven loop's batches differ), "
                  "of all the steps the run timed", change,
                  of=(timed, "every step the run timed"))


def _periodic_change(facts: Facts, found: _Outliers, mine: Mask) -> tuple[str, int | None]:
    """What to do about the outliers `mine` of `found` (those no new epoch's loader explains):
    a recompile where compiling is half their excess or more; a wait where their loop thread
    was off the CPU beyond a usual step's share for half of it or more (perf); else find what
    runs in them. And the time all of `found`'s outliers were off the CPU so (evidence
    `off_cpu_excess_ns`; None without perf's samples of the loop thread)."""
    steps, dur = found.steps, found.dur
    excess = float(found.beyond[mine].sum())
    # the loop thread off the CPU in them beyond a usual step's share (perf), less the time
    # its threads sat on a runqueue (other processes' cores): they waited (a sleep, I/O, a
    # lock, requests arriving), not computed
    cpu = _loop_cpu(facts, steps)
    waited, off_cpu = 0, None
    if cpu is not None:
        slow = found.slow
        over = np.isin(lane_key(col(steps, "rank"), col(steps, "step")),
                       lane_key(col(slow, "rank"), col(slow, "step")))
        off = dur - cpu - _queued(facts, steps)
        beyond_usual = np.maximum(0, off - np.median(off))
        off_cpu = int(beyond_usual[over].sum())
        theirs = np.isin(lane_key(col(steps, "rank"), col(steps, "step")),
                         lane_key(col(slow, "rank")[mine], col(slow, "step")[mine]))
        waited = int(beyond_usual[theirs].sum())
    if found.compiling[mine].sum() >= excess / 2:
        return _RECOMPILE, off_cpu
    if waited >= excess / 2:
        return (f"their loop thread was off the CPU for {min(100.0, 100 * waited / excess):.0f}"
                "% of their time beyond the median step: find what they waited for (a sleep, "
                "a read or a checkpoint's write, a lock, requests or input arriving; py-spy's "
                "stacks of the loop thread in them); a wait the program needs is no cost to "
                "cut", off_cpu)
    return ("find what runs in those steps (evaluation, generate(), checkpointing or logging "
            "in a callback; `perfswarm analyze` swarms, py-spy samples): run it less often, "
            "asynchronously or outside the training loop", off_cpu)


def _loader_bound(facts: Facts, steps: pa.Table, dur: npt.NDArray[np.int64],
                  median: float, judged: Mask) -> list[int]:
    """The ranks whose profiled steps over _OUTLIER times the median step (of those `judged`:
    not a new epoch's loader starting its workers, which is no burst) all waited for their
    DataLoader half their time beyond it or more (there are some): a loader whose workers hand
    batches over in bursts (2 workers of 17 ms batches: every other step 12-21 ms among 0.5-6 ms
    ones), whose slow steps outside the window, where no wait is traced, are the same wait."""
    window = (col(steps, "source") == PROFILED) & (dur > _OUTLIER * median) & judged
    if not window.any():
        return []
    long = where(steps, window)
    fed = _within(facts.loader_calls, long) >= (dur[window] - median) / 2
    rank = col(long, "rank")
    return [int(r) for r in np.unique(rank).tolist() if fed[rank == r].all()]


def _queued(facts: Facts, steps: pa.Table) -> npt.NDArray[np.int64]:
    """Each step's time its tree's threads sat runnable on a runqueue: the sampler's
    proc.run_delay_cores readings in it (each covering the interval before it) times its
    length; 0 without them."""
    ts, value = readings(facts.counters, "proc.run_delay_cores")
    out = np.zeros(steps.num_rows, np.int64)
    for i, (lo, hi) in enumerate(zip(col(steps, "start").tolist(), col(steps, "end").tolist(),
                                     strict=True)):
        inside = value[int(np.searchsorted(ts, lo)):int(np.searchsorted(ts, hi)) + 1]
        if len(inside):
            out[i] = round(float(inside.mean()) * (hi - lo))
    return out


def _loop_cpu(facts: Facts, steps: pa.Table) -> npt.NDArray[np.int64] | None:
    """Each step's CPU time of its rank's loop thread (Facts.loop_threads), from perf's
    cpu-clock samples of it in the step (each a sampling period); None without them."""
    hz = facts.recorded.get("perf_hz")
    if not hz or facts.perf_samples.num_rows == 0 or not facts.loop_threads:
        return None
    out = np.zeros(steps.num_rows, np.int64)
    rank = col(steps, "rank")
    lo, hi = col(steps, "start"), col(steps, "end")
    for r, (pid, tid) in facts.loop_threads.items():
        at = rank == r
        out[at] = _samples_in(_thread_samples(facts, pid, tid), hi=hi[at], lo=lo[at]) * round(
            1e9 / float(hz))
    return out


def _within(spans: pa.Table, steps: pa.Table) -> npt.NDArray[np.int64]:
    """Per step (rank, start, end), the time the events of `spans` on its rank cover of it
    (their union: intervals.Coverage, one per rank)."""
    out = np.zeros(steps.num_rows, np.int64)
    rank = col(steps, "rank")
    lo, hi = col(steps, "start"), col(steps, "end")
    for r in np.unique(rank).tolist():
        mine = col(spans, "rank") == r
        ts = col(spans, "ts")[mine].astype(np.int64)
        at = rank == r
        out[at] = Coverage(*union(ts, ts + col(spans, "dur")[mine].astype(np.int64))).between(
            lo[at].astype(np.int64), hi[at].astype(np.int64))
    return out


_COMPILE = r"^entire_frame_compile$"  # dynamo's span around compiling a frame (torch.compile)
_RECOMPILE = ("torch.compile compiled again in them (half their excess or more is dynamo's "
              "entire_frame_compile: a new input shape, such as a last short batch, or a guard "
              "that failed): keep the shapes fixed (drop_last=True, pad the batch), mark the "
              "changing dimension dynamic (torch._dynamo.mark_dynamic, or compile with "
              "dynamic=True), or find the reason with TORCH_LOGS=recompiles")


def _timed_steps(facts: Facts
                 ) -> tuple[pa.Table, npt.NDArray[np.int64], npt.NDArray[np.float64]] | None:
    """The steps the run timed (by rank and step), their times, and each one's usual time
    (_usual; a profiled step's times the profiler's slowdown: the profiler slows every step it
    records), but the steps that time the recorder (analyze.system.recorder_steps: a rank's
    first profiled step that starts its profiler, a step another process's recorder held; the
    steps advice's shares leave out too); None under five."""
    steps = facts.run_steps
    if steps.num_rows < 5:
        return None
    steps = steps.take(pa.array(np.lexsort((col(steps, "step"), col(steps, "rank")))))
    dur = col(steps, "end") - col(steps, "start")
    usual = _usual(facts, steps, dur)
    usual[col(steps, "source") == PROFILED] *= facts.profiler_slowdown
    return steps, dur, usual


def _outlier_excess(facts: Facts, timed: bool) -> int:
    """outlier_steps' time beyond their usual step of its outliers among every step the run
    timed, or with `timed` False among the profiled ones."""
    found = _outliers(facts)
    if found is None:
        return 0
    mine = np.full(found.slow.num_rows, timed) | (col(found.slow, "source") == PROFILED)
    return round(float(found.beyond[mine].sum()))


def _descheduled_excess(facts: Facts) -> int:
    """The time beyond their usual step of the timed steps over _OUTLIER times it that the
    process sat descheduled in (analyze.system.descheduled: outlier_steps leaves those to
    cpu_contention)."""
    found = _timed_steps(facts)
    if found is None:
        return 0
    steps, dur, usual = found
    over = dur > _OUTLIER * usual
    if not over.any():
        return 0
    starved = np.asarray(descheduled(facts.counters, _cores(facts), where(steps, over),
                                      steps), bool)
    return int((dur[over] - usual[over])[starved].sum())


def _usual(facts: Facts, steps: pa.Table, dur: npt.NDArray[np.int64]
           ) -> npt.NDArray[np.float64]:
    """Each step's usual time: the median step's, or, where the recorder saw the inputs of a
    forward-driven loop differ (STEP_INPUT, its elements: a generate loop's prefill of 32
    tokens and decode steps of 1, of one batch; else STEP_BATCH: an inference server's
    requests of 1 to 64), the median of the steps of its size (of them all, scaled by its size
    over theirs, with fewer than three): a batch of 64 is no outlier among batches of 8, nor
    a prefill among decode steps."""
    median = np.full(len(dur), float(np.median(dur)))
    rank, start, end = (col(steps, c).astype(np.int64) for c in ("rank", "start", "end"))
    batch = np.zeros(len(dur), np.int64)
    for name in (STEP_INPUT, STEP_BATCH):
        sizes = where(facts.counters, col(facts.counters, "name") == name)
        if sizes.num_rows:
            batch = step_batches(rank, start, end, sizes.select(["rank", "ts", "value"]))
            if len(np.unique(batch[batch > 0])) >= 2:
                break
    known = batch > 0
    if len(np.unique(batch[known])) < 2:
        return _by_work(facts, steps, dur, median)
    median[known] = _of_size(dur[known], batch[known])
    return median


def _of_size(dur: npt.NDArray[np.int64], size: npt.NDArray[Any]) -> npt.NDArray[np.float64]:
    """Each step's usual time among steps of sizes `size` (all known): the median of the
    steps of its size, or with fewer than three, of them all scaled by its size over theirs."""
    out = np.zeros(len(dur))
    per_unit = float(np.median(dur / size))
    for b in np.unique(size):
        same = size == b
        out[same] = float(np.median(dur[same])) if same.sum() >= 3 else per_unit * b
    return out


def _by_work(facts: Facts, steps: pa.Table, dur: npt.NDArray[np.int64],
             median: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Where the profiled steps' backward work differs (model.opstats.backward_flops: batches
    of bucketed sequence lengths, 16 to 64 tokens), a profiled step's usual time is that of
    the profiled steps of its work (_of_size; over the profiler's slowdown, which _timed_steps
    puts back), and a step outside the window, whose work is untraced, the median step's times
    the most work a traced step did over the median traced work: a step of 64 tokens is no
    outlier among steps of 16. Else `median`. An evaluation or generate() in a step adds no
    backward work: it stays an outlier."""
    work = backward_flops(facts.run, Events.load(facts.run))
    done = np.array([work.get((r, s), 0.0) for r, s in zip(col(steps, "rank").tolist(),
                                                           col(steps, "step").tolist(),
                                                           strict=True)])
    traced = (col(steps, "source") == PROFILED) & (done > 0)
    if traced.sum() < 3 or done[traced].max() < _WORK_VARIES * done[traced].min():
        return median
    out = median * float(done[traced].max() / np.median(done[traced]))
    out[traced] = _of_size(dur[traced], done[traced]) / facts.profiler_slowdown
    return out


_WORK_VARIES = 1.1  # the most backward FLOPs of a traced step over the fewest: the work differs


_PYTHON_SHARE = 30.0  # % of the steps the loop's thread ran nothing traced
_ON_CPU = 0.8  # the cores its process kept busy on average meanwhile: it ran, it did not wait


def untraced_python(facts: Facts) -> Advice | None:
    """On a CPU run, the loop's process (the one the steps are marked in) runs no op,
    DataLoader or optimizer call or other annotated span, on any of its threads (an autograd
    or gloo thread the loop waits for counts), for much of its steps, while it keeps a core
    busy and, where perf sampled it, its loop thread is on the CPU for that much beyond its
    traced time: Python between the ops (a simulated environment, per-sample handling,
    metrics) is the step's cost, and no op shows it. On a GPU run the device's idle time is
    launch_bound's and low_utilization's."""
    found = _untraced(facts)
    if found is None:
        return None
    traced, busy, untraced = found
    share = pct(untraced, facts.wall_ns)
    # the sampler's cores are of every recorded process: a loop process's share of them
    loops = processes(traced)
    proc = col(_window_counters(facts, r"^proc\.cpu_cores$"), "value")
    cores = float(proc.mean()) / max(1, loops) if proc.size else 0.0
    if share < _PYTHON_SHARE or cores < _ON_CPU:
        return None
    evidence = {"untraced_ns": untraced, "untraced_share_pct": share,
                "traced_ns": busy, "cores_per_loop_process": round(cores, 2)}
    # the loop's own thread, where perf sampled it: on the CPU in the untraced time, or
    # waiting there (a server's sleep between requests, reads) while another of its
    # process's threads kept the core (an idle OpenMP worker spinning)
    python = _untraced_on_cpu(facts, traced)
    if python is not None:
        evidence["untraced_on_cpu_ns"] = python
        if pct(python, facts.wall_ns) < _PYTHON_SHARE:
            return None
    return advice(facts, "untraced_python",
                  f"the loop runs Python between its ops for {share:g}% of its steps", evidence,
                  None, "measured, no model: how much of it can go is the program's; the time "
                  "its thread ran nothing traced while its process kept a core busy",
                  "find the Python in the py-spy stacks (`perfswarm analyze` swarms, or "
                  "`py-spy top`); vectorize it (numpy, torch ops on batches), run it less "
                  "often, or move it out of the loop (a DataLoader worker, a separate process "
                  "feeding a queue)")


def _untraced(facts: Facts) -> tuple[pa.Table, int, int] | None:
    """On a CPU run with steps: the traced spans of the loop's processes (ops, DataLoader and
    optimizer calls, other annotations; not the step markers) in the window, their busy time
    and the steps' time none of them covers; None on a run with an accelerator or no steps."""
    if not facts.without_accelerator or facts.steps.num_rows == 0:
        return None
    loop = facts.named(r"^ProfilerStep#", "user_annotation")
    ev = facts.events
    traced = facts.in_window(where(ev, facts.of_kind(ev, "cpu_op", "user_annotation")
                                   & ~facts.named_like(ev, r"^ProfilerStep#")))
    traced = where(traced, np.isin(lane_key(col(traced, "rank"), col(traced, "pid")),
                                   lane_key(col(loop, "rank"), col(loop, "pid"))))
    busy = sum(facts.busy_ns(traced).values())
    return traced, busy, facts.wall_ns - busy


_WAIT_SHARE = 30.0  # % of the steps the loop's thread waited, off the CPU, outside its spans
# the same while the host's cores wait on I/O and the run reads from storage: the disk says what
# it waits for (a loop reading its batch with random O_DIRECT reads waited 21% of its steps,
# and a prefetch thread hid it)
_IO_WAIT_SHARE = 10.0


def untraced_wait(facts: Facts) -> Advice | None:
    """On a CPU run, the loop's thread off the CPU outside every traced span for much of its
    steps (perf saw it nowhere there): it waits for something no op shows, most often its own
    input read in the loop (np.load, open, an image decode's file), else a sleep or a lock.
    With the host's iowait in the window and the run reading from storage: the disk. Each
    rank's loop on its own; the one that waits most is told."""
    found = _untraced(facts)
    if found is None:
        return None
    traced = found[0]
    waits = [w for rank in facts.ranks if (w := _rank_wait(facts, traced, rank)) is not None]
    if not waits:
        return None
    rank, window, busy, untraced, python, queued = max(
        waits, key=lambda w: (pct(max(0, w[3] - w[4] - w[5]), w[1]), -w[0]))
    waited = max(0, untraced - python - queued)
    share = pct(waited, window)
    iowait = _window_counters(facts, r"^cpu\.core\d+\.iowait$")
    io = (float(col(iowait, "value").sum()) / max(1, len(np.unique(col(iowait, "ts"))))
          if iowait.num_rows else 0.0)
    # the I/O is the run's own where its processes read from storage meanwhile (another
    # process reading the disk had made a loop that sleeps read as waiting on it)
    reads = col(_window_counters(facts, r"^proc\.read_bytes$"), "value")
    read = float(reads.max() - reads.min()) if reads.size else 0.0
    on_io = io >= _IOWAIT and read >= _OWN_READS
    if share < (_IO_WAIT_SHARE if on_io else _WAIT_SHARE):
        return None
    evidence = {"rank": rank, "untraced_ns": untraced, "untraced_on_cpu_ns": python,
                "run_delay_ns": queued, "waited_ns": waited, "waited_share_pct": share,
                "traced_ns": busy, "iowait_cores": round(io, 3), "read_bytes": round(read)}
    change = ("where it reads its input in the loop (np.load, open, PIL, torch.load): read the "
              "next batch in a background thread (concurrent.futures, one ahead) or in "
              "DataLoader workers (num_workers >= 1) while this one computes; where a thread of "
              "its own already reads ahead, the reads bound it (more at once, faster storage); "
              "where it sleeps or waits for requests, that is the program's pace; py-spy "
              "--idle shows where it waits")
    who = f"rank {rank}'s loop" if len(facts.ranks) > 1 else "the loop"
    mine = (window, f"rank {rank}'s profiled steps" if len(facts.ranks) > 1 else
            facts.measured_as)
    if not on_io:  # nothing says what it waits for: the program's to say
        return advice(facts, "untraced_wait", f"{who} waits outside its ops for {share:g}% "
                      "of its steps", evidence, None, "no time model: the run read nothing "
                      "from storage while the host waited on I/O, so a sleep, a lock, requests "
                      "or a thread of its own may be what it waits for", change, of=mine)
    return advice(facts, "untraced_wait", f"{who} waits outside its ops for {share:g}% of "
                  f"its steps, reading from storage ({read / 2**20:,.1f} MiB; the host's cores "
                  f"on I/O {io:.2f} cores' worth)", evidence,
                  min(waited, busy),
                  "prefetch model from this run's times: a thread (or DataLoader workers) that "
                  "reads the next batch while the step computes hides the wait under the "
                  "traced work, at most the smaller of the two", change, of=mine)


def _rank_wait(facts: Facts, traced: pa.Table, rank: int
               ) -> tuple[int, int, int, int, int, int] | None:
    """(rank, its measured ns, traced ns, untraced ns, its loop thread's untraced ns on a CPU,
    ns it sat on a runqueue) of one rank's loop; None without perf samples of it. The runqueue
    time is its loop thread's own where the sampler read it (the process's first thread,
    where a Python loop runs), else, at most, its whole tree's: two ranks' OpenMP threads
    over the cores had queued 1.0 s of threads beside one thread's 0.4 s of sleep, and hidden
    it."""
    mine = where(traced, col(traced, "rank") == rank)
    python = _untraced_on_cpu(facts, mine, rank)
    if python is None:
        return None
    window = facts.window(rank)[2]
    busy = sum(facts.busy_ns(mine).values())
    pid, tid = facts.loop_threads[rank]
    own = col(_window_counters(facts, rf"^proc\.{pid}\.main_run_delay_cores$"), "value")
    tree = col(_window_counters(facts, r"^proc\.run_delay_cores$"), "value")
    delay = own if own.size and tid == pid else tree
    queued = round(float(delay.mean()) * window) if delay.size else 0
    return rank, window, busy, window - busy, python, queued


_IOWAIT = 0.1  # cores' worth of the host waiting on I/O: the loop's wait is the disk's
_OWN_READS = 1 << 20  # bytes the run's processes read from storage in the window: theirs


def _untraced_on_cpu(facts: Facts, traced: pa.Table, rank: int | None = None
                     ) -> int | None:
    """The time the loop's thread (Facts.loop_threads; of `rank`, else of the first rank
    marking steps) ran on a CPU in its steps outside every `traced` span: perf's cpu-clock
    samples of it there (each a sampling period of its CPU time); None without perf samples
    of it."""
    hz = facts.recorded.get("perf_hz")
    marks = facts.in_window(facts.named(r"^ProfilerStep#", "user_annotation"))
    if rank is not None:
        marks = where(marks, col(marks, "rank") == rank)
    if not hz or marks.num_rows == 0 or facts.perf_samples.num_rows == 0:
        return None
    found = facts.loop_threads.get(int(col(marks, "rank")[0]))
    if found is None:
        return None
    ts = _thread_samples(facts, *found)
    if not len(ts):
        return None

    def inside(frame: pa.Table) -> int:
        lo, hi = union(col(frame, "ts"), col(frame, "ts") + col(frame, "dur"))
        return int(_samples_in(ts, lo, hi).sum())

    within = where(traced, col(traced, "dur") > 0)
    return round((inside(marks) - (inside(within) if within.num_rows else 0)) * 1e9 / float(hz))
