"""What the advice rules read from a Run: its events as one table, plus measured time windows.

Rules only see this object, so each table is decoded once however many rules run. The events
table is a pyarrow view of analyze's events (analyze.frame.Events, decoded once per Run: its
numpy columns, not copied; `row` is an event's row there, `kind` and `name` its codes, read as
text by `name_texts` and matched by `named_like`), the args only for the rows a rule asks for;
interval unions are analyze.intervals', the op that launched a kernel and containment are
analyze.dependencies' (one nesting sweep). A table's selections are numpy masks
(`where`), its columns numpy arrays (`col`), its groups numpy's (`groups`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from functools import cached_property, wraps
from typing import Any, Literal, TypeVar, cast

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from perfswarm.analyze.concurrency import Breakdown, RankConcurrency
from perfswarm.analyze.critical_path import CriticalPath
from perfswarm.analyze.dependencies import SYNC_CALLS, enclosing_rows, looked_up
from perfswarm.analyze.frame import (
    I64,
    KIND,
    Events,
    Mask,
    group_rows,
    lane_key,
    texts_of,
    unique_rows,
)
from perfswarm.analyze.intervals import sorted_unique, total
from perfswarm.analyze.iterations import (
    batch_sizes,
    profiled,
    step_time,
    top_level,
    unprofiled_gaps,
    within_gaps,
)
from perfswarm.analyze.launch import LaunchStats, launch_pairs
from perfswarm.analyze.memory import RankMemory
from perfswarm.analyze.phases import OPTIMIZER, nested, optimizer_calls, phases, step_calls
from perfswarm.analyze.sequences import Sequence_
from perfswarm.analyze.stragglers import Stragglers
from perfswarm.analyze.summary import analyze
from perfswarm.analyze.system import host_cores, recorder_steps
from perfswarm.model.hostcosts import DEFAULT as DEFAULT_COSTS
from perfswarm.model.hostcosts import HostCosts
from perfswarm.model.opcost import OpCost
from perfswarm.model.opstats import costed_ops, costed_rows
from perfswarm.model.specs import DeviceSpec, spec_of_devices
from perfswarm.trace.schema import DEVICE_KINDS, EXPORT, OPTIMIZER_CALL, TAIL, among
from perfswarm.trace.store import Manifest, Run


def events_table(ev: Events) -> pa.Table:
    """analyze's events as a table: their numpy columns (not copied), kinds and names as
    their codes (KIND; indices into `ev.names`)."""
    return pa.table({"row": np.arange(len(ev), dtype=np.int64), "rank": ev.rank, "ts": ev.ts,
                     "dur": ev.dur, "kind": ev.kind, "name": ev.name, "pid": ev.pid,
                     "tid": ev.tid, "device": ev.device, "stream": ev.stream,
                     "correlation": ev.correlation, "step": ev.step})


def col(table: pa.Table, name: str) -> npt.NDArray[Any]:
    """A column of `table` as a numpy array (a text column's as objects)."""
    values = table.column(name)
    return np.asarray(values.to_numpy()) if values.num_chunks else np.zeros(0, np.int64)


def where(table: pa.Table, mask: Mask) -> pa.Table:
    """The rows of `table` where `mask` holds, in their order."""
    return table.filter(pa.array(np.asarray(mask, bool)))


def like(table: pa.Table, column: str, pattern: str) -> Mask:
    """Which of a text column's values match the regex `pattern` anywhere in them."""
    return np.asarray(pc.match_substring_regex(table.column(column), pattern).to_numpy(),
                      bool)


def groups(table: pa.Table, by: Iterable[str]) -> list[tuple[tuple[int, ...], pa.Table]]:
    """(key, its rows) per distinct value of the integer columns `by`, in the order of each
    key's first row, the rows in theirs."""
    if not table.num_rows:
        return []
    keys = np.stack([col(table, c).astype(np.int64) for c in by], axis=1)
    first, inverse = unique_rows(keys)
    rows = group_rows(inverse, np.arange(len(keys)))
    return [(tuple(keys[first[k]].tolist()), table.take(pa.array(rows[int(k)])))
            for k in np.argsort(first)]


def processes(table: pa.Table) -> int:
    """How many distinct processes (rank, pid) have rows in `table`."""
    return len(np.unique(lane_key(col(table, "rank"), col(table, "pid"))))


def with_column(table: pa.Table, name: str, values: Any) -> pa.Table:
    """`table` with its column `name` (replaced, or added) holding `values`."""
    at = table.schema.get_field_index(name)
    return table.set_column(at, name, values) if at >= 0 else table.append_column(name, values)


def texts(table: pa.Table, column: str) -> pa.Table:
    """`table` with its dictionary column `column` as plain text."""
    return with_column(table, column, table.column(column).cast(pa.string()))


T = TypeVar("T")
_HOST_KINDS = ("cpu_op", "user_annotation", "python_function")
# Every .item(), bool(tensor) or float(tensor) ends in this op, the one that waits.
_SCALAR_READ = r"^aten::_local_scalar_dense$"


def per_facts(read: Callable[[Facts], T]) -> Callable[[Facts], T]:
    """`read(facts)` made once per Facts: what several rules read alike (host.contended:
    cpu_contention, thread_oversubscription and the loader's plan; loader.loader_plan:
    data_loading and loader_oversubscription) is not computed again by each."""

    @wraps(read)
    def once(facts: Facts) -> T:
        if read not in facts.made:
            facts.made[read] = read(facts)
        return cast(T, facts.made[read])

    return once


@dataclass
class Facts:
    """A Run's tables as the rules need them; every number a rule reports comes from here."""

    events: pa.Table
    steps: pa.Table
    counters: pa.Table
    manifest: Manifest
    # the Run itself: analyze's events (the launch join) and its recorded op sequence (conv
    # fusion)
    run: Run
    raw_files: dict[str, str] = field(default_factory=dict)
    # The Analysis's launch statistics (its idle split: one definition of host and kernel wait)
    launch: tuple[LaunchStats, ...] = ()
    # Every step the run timed (hooks outside the window too), but the one holding the export
    # and a tail (analyze.iterations).
    run_steps: pa.Table = field(default_factory=lambda: pa.table({}))
    # analyze's memory by category (a memory timeline's counters), per rank
    memory: tuple[RankMemory, ...] = ()
    # analyze's frequent kernel sequences
    sequences: tuple[Sequence_, ...] = ()
    # analyze's concurrency per rank: its device idle time per iteration (or time window)
    concurrency: tuple[RankConcurrency, ...] = ()
    # analyze's stragglers: each rank's wait at the collectives for the last rank to enter
    stragglers: Stragglers | None = None
    # analyze's critical path (the whole run's, each profiled step's in `steps`)
    critical_path: CriticalPath | None = None
    # (rank, step) -> ns of the profiled steps that time the recorder, not the program (the
    # profiler's start, another process's start or export: analyze.system.recorder_steps):
    # in none of the frames above (`steps`, `run_steps`, which leaves out the unprofiled ones
    # too, the breakdowns' and critical path's steps), so that shares divide by the usual steps
    set_aside: dict[tuple[int, int], int] = field(default_factory=dict)
    # what taking a batch from a DataLoader worker costs the training process, and a fused
    # optimizer step (a calibrate profile's, else the defaults)
    costs: HostCosts = DEFAULT_COSTS
    # what `per_facts` functions made of these facts, by function
    made: dict[Callable[[Facts], Any], Any] = field(default_factory=dict, init=False,
                                                    repr=False, compare=False)

    @classmethod
    def of(cls, run: Run, costs: HostCosts = DEFAULT_COSTS) -> Facts:
        # The analysis's results, not computed again: the report, the CLI and the advice
        # read the same launches, memory and kernel sequences (analyze memoizes per Run).
        analysis = analyze(run)
        table = run.table("steps")
        counters = texts(run.table("counters"), "name")
        manifest = run.manifest()
        start = recorder_steps(table, counters, host_cores(manifest) or 1)
        # the steps that only time the recorder: an Adam loop's first profiled step, 146 ms
        # among 27-30 ms, had been 36% of its measured time, and its fused optimizer's gain
        # 21.7% of it for 33% without the execution trace (53% measured); an RPC server's two
        # waits across its trainer's profiler start and export, outlier_steps' 45.7%
        unusual = [int(k) for k in lane_key(*(np.array(side, np.int64) for side in zip(
            *sorted(start), strict=True)))] if start else []
        steps = texts(profiled(table), "source")
        run_steps = texts(table, "source")
        run_steps = where(run_steps, ~np.isin(col(run_steps, "source"), [EXPORT, TAIL]))
        first = np.isin(lane_key(col(steps, "rank"), col(steps, "step")), unusual)
        set_aside = {(int(r), int(s)): int(e - b) for r, s, b, e in zip(
            *(col(steps, c)[first].tolist() for c in ("rank", "step", "start", "end")),
            strict=True)}
        steps = where(steps, ~first)
        run_steps = where(run_steps, ~np.isin(lane_key(col(run_steps, "rank"),
                                                       col(run_steps, "step")), unusual))
        concurrency = tuple(replace(rc, iterations=tuple(
            i for i in rc.iterations if (rc.rank, i.step) not in start))
            for rc in analysis.concurrency.ranks)
        path = analysis.critical_path
        if path is not None and start:
            aside = {s for _, s in start}  # a step's path spans its ranks
            path = replace(path, steps=tuple(p for p in path.steps if p.step not in aside))
        raw: dict[str, str] = {}
        if run.raw_dir.is_dir():
            for p in sorted(run.raw_dir.iterdir()):
                # Only small text side files (topology dumps); traces are read from tables.
                if "topo" in p.name and p.is_file() and p.stat().st_size < 1 << 20:
                    raw[p.name] = p.read_text(errors="replace")
        return cls(events_table(Events.load(run)), steps, counters, manifest, run, raw,
                   analysis.launch, run_steps, analysis.memory, analysis.sequences, concurrency,
                   analysis.stragglers, path, set_aside, costs)

    # -- selections ----------------------------------------------------------
    def with_text(self, frame: pa.Table, column: Literal["args", "detail"]) -> pa.Table:
        """`frame` (rows of `events`) with the events' `column` (a JSON object's text: "{}"
        for none), read for these rows alone: the whole args (memory events), or the fields
        of them the analyses read (trace/detail.py: shapes, bytes)."""
        rows = col(frame, "row")
        order = np.argsort(rows, kind="stable")
        found = np.empty(len(rows), object)
        found[order] = texts_of(self.run, column, rows[order])
        return frame.append_column(column, pa.array(found, pa.string()))

    def at(self, rows: I64) -> pa.Table:
        """The events at `rows` (each once, in their order)."""
        return self.events.take(pa.array(sorted_unique(np.asarray(rows, np.int64))))

    def kind(self, *kinds: str, columns: tuple[str, ...] = ()) -> pa.Table:
        """Events of the given kinds; only `columns` of them (and the kind) when given."""
        frame = self.events.select(["kind", *columns]) if columns else self.events
        return where(frame, self.of_kind(frame, *kinds))

    @staticmethod
    def of_kind(frame: pa.Table, *kinds: str) -> Mask:
        """Which rows of `frame` (of `events`) are of the given kinds."""
        return among(col(frame, "kind"), [KIND[k] for k in kinds], len(KIND))

    def name_texts(self, frame: pa.Table) -> list[str]:
        """The names of the rows of `frame` (of `events`)."""
        return cast(list[str], self._names.take(pa.array(col(frame, "name"))).to_pylist())

    @cached_property
    def _names(self) -> pa.Array:
        return pa.array(Events.load(self.run).names, pa.string())

    def named_like(self, frame: pa.Table, pattern: str) -> Mask:
        """Which rows of `frame` (of `events`) have a name matching the regex `pattern`
        anywhere in it (each distinct name matched once)."""
        hits: Mask = np.asarray(pc.match_substring_regex(self._names, pattern).to_numpy(
            zero_copy_only=False), bool)
        return np.asarray(hits[col(frame, "name")], bool)

    def named_as(self, frame: pa.Table, names: Iterable[str]) -> Mask:
        """Which rows of `frame` (of `events`) have one of `names`."""
        wanted, texts = set(names), Events.load(self.run).names
        return among(col(frame, "name"), [i for i, n in enumerate(texts) if n in wanted],
                     len(texts))

    def by_name(self, frame: pa.Table, values: npt.NDArray[Any]) -> list[tuple[str, int]]:
        """The names of the rows of `frame` (of `events`) with the sum of their `values` (one
        per row), the largest first (on a tie, by name)."""
        codes, at = np.unique(col(frame, "name"), return_inverse=True)
        sums = np.bincount(at, weights=values, minlength=len(codes)).round().astype(np.int64)
        names = self._names.take(pa.array(codes)).to_pylist()
        return sorted(zip(names, sums.tolist(), strict=True), key=lambda ns: (-ns[1], ns[0]))

    def named(self, pattern: str, *kinds: str) -> pa.Table:
        """Events whose name matches the regex `pattern` (optionally of the given kinds)."""
        frame = self.kind(*kinds) if kinds else self.events
        return where(frame, self.named_like(frame, pattern))

    def inside(self, outer: pa.Table, inner: pa.Table) -> pa.Table:
        """The rows of `inner` that lie within a row of `outer` on their rank and thread
        (analyze.dependencies.enclosing_rows: one nesting sweep for the launch join and this)."""
        within, _ = enclosing_rows(Events.load(self.run), col(inner, "row"), col(outer, "row"))
        return where(inner, np.isin(col(inner, "row"), within))

    def around(self, outer: pa.Table, inner: pa.Table) -> pa.Table:
        """The rows of `outer` that hold a row of `inner` as their innermost enclosing one (the
        same nesting sweep as `inside`)."""
        _, around = enclosing_rows(Events.load(self.run), col(inner, "row"), col(outer, "row"))
        return where(outer, np.isin(col(outer, "row"), around))

    @cached_property
    def ranks(self) -> list[int]:
        return Events.load(self.run).ranks

    # -- time windows --------------------------------------------------------
    def window(self, rank: int) -> tuple[int, int, int]:
        """(start, end, measured ns) of one rank: the union of its steps, else its event span."""
        return self._windows[rank]

    @cached_property
    def _windows(self) -> dict[int, tuple[int, int, int]]:
        return {r: self._measure(r) for r in self.ranks}

    def _measure(self, rank: int) -> tuple[int, int, int]:
        mine = col(self.steps, "rank") == rank
        if mine.any():
            s, e = col(self.steps, "start")[mine], col(self.steps, "end")[mine]
            return int(s.min()), int(e.max()), total(s, e)
        ev = Events.load(self.run)
        rows = np.arange(len(ev))[ev.rank_slice(rank)]
        rows = rows[ev.kind[rows] != KIND["trace_span"]]
        if not len(rows):
            return 0, 0, 0
        start, end = int(ev.ts[rows].min()), int(ev.end[rows].max())
        # the time between its profiling windows is not measured (three windows' 1.4 s of
        # gaps had made a 57% DataLoader wait 5% of the time, and its advice vanish)
        return start, end, end - start - within_gaps(self._gaps.get(rank, []), start, end)

    @cached_property
    def _gaps(self) -> dict[int, list[tuple[int, int]]]:
        return unprofiled_gaps(self.run)

    @cached_property
    def wall_ns(self) -> int:
        """Measured time summed over ranks: the denominator of every share and gain."""
        return sum(self.window(r)[2] for r in self.ranks)

    @cached_property
    def measured_as(self) -> str:
        """What wall_ns is, in words: what a share of it is of."""
        ranks = f", summed over {len(self.ranks)} ranks" if len(self.ranks) > 1 else ""
        if self.steps.num_rows and self.set_aside:
            aside = sum(self.set_aside.values()) / 1e6
            rank, step = col(self.steps, "rank"), col(self.steps, "step")
            if all(s < step[rank == r].min(initial=s + 1) for r, s in self.set_aside):
                return (f"the profiled steps{ranks} but the first ({aside:,.3f} ms"
                        f"{' over the ranks' if len(self.set_aside) > 1 else ''}, which starts "
                        "the profiler)")
            return (f"the profiled steps{ranks} but {len(self.set_aside)} that time the "
                    f"recorder ({aside:,.3f} ms: a profiler's start, or another process's "
                    "start or export)")
        if self.steps.num_rows:
            return f"the profiled steps{ranks}"
        return f"the traced span{ranks}" if self.ranks else "nothing traced"

    @property
    def at_program_speed(self) -> str:
        """What wall_ns over the profiler's slowdown is, in words."""
        return (f"{self.measured_as}, at the program's own speed (over the profiler's "
                f"slowdown of the steps, {self.profiler_slowdown:.2f}x)")

    def in_window(self, frame: pa.Table) -> pa.Table:
        """Rows of `frame` that start inside their rank's window, rank by rank."""
        rank, ts = col(frame, "rank"), col(frame, "ts")
        parts = [np.flatnonzero((rank == r) & (ts >= start) & (ts < end))
                 for r in self.ranks for start, end, _ in [self.window(r)]]
        return frame.take(pa.array(np.concatenate(parts) if parts else np.zeros(0, np.int64)))

    @cached_property
    def loop_threads(self) -> dict[int, tuple[int, int]]:
        """Rank -> (pid, tid) of its loop: analyze's (frame.Events.loop_thread, the thread of
        the step markers, else the longest)."""
        ev = Events.load(self.run)
        return {r: found for r in self.ranks if (found := ev.loop_thread(r)) is not None}

    @cached_property
    def perf_samples(self) -> pa.Table:
        """perf's cpu-clock samples of the Run (ts, pid, tid): each a sampling period a
        thread ran on a CPU; none without perf."""
        if not self.run.has_table("samples"):
            return pa.table({c: pa.array([], pa.int64()) for c in ("ts", "pid", "tid")})
        samples = self.run.table("samples", ["ts", "pid", "tid", "source"])
        return samples.filter(pc.equal(samples.column("source").cast(pa.string()),
                                       "perf")).drop_columns(["source"])

    @property
    def recorded(self) -> dict[str, Any]:
        """What the recorder noted of the stepping processes (recorder/build.stepping_facts)."""
        return dict(self.manifest.get("extra", {}).get("record", {}))

    @cached_property
    def without_accelerator(self) -> bool:
        """A recording whose processes had no GPU (CUDA absent, or a CPU build of torch), or
        a trace that names no device (no deviceProperties) and calls no runtime, and that ran
        no device work: nothing on the host can wait for a device."""
        cuda, version = self.recorded.get("cuda"), str(self.recorded.get("torch_version", ""))
        deviceless = (cuda is None and not self.manifest.get("devices")
                      and not self.of_kind(self.events, "runtime", "driver").any())
        return self.device_events.num_rows == 0 and (cuda is False or version.endswith("+cpu")
                                                   or deviceless)

    def _step_calls(self, innermost: bool) -> pa.Table:
        """The optimizer's step() calls in the window, the innermost (the optimizers that
        update: a wrapper's step calls its inner optimizer's) or the outermost (what the
        recorder times), each from where its own work starts (after the forward and backward
        of a closure passed to it: analyze.phases)."""
        ev = Events.load(self.run)
        steps = self.in_window(self.at(step_calls(ev)))
        steps = where(steps, ~nested(ev, col(steps, "row"), innermost))
        calls, starts = optimizer_calls(ev)
        own = np.asarray(starts[np.searchsorted(calls, col(steps, "row"))], np.int64)
        end = col(steps, "ts") + col(steps, "dur")
        return with_column(with_column(steps, "ts", pa.array(own)), "dur", pa.array(end - own))

    @cached_property
    def optimizer_steps(self) -> tuple[pa.Table, pa.Table]:
        """The innermost step() calls in the window from where their own work starts
        (_step_calls), and the aten ops of that work."""
        steps = self._step_calls(innermost=True)
        ev = Events.load(self.run)
        ops = self.inside(self.at(col(steps, "row")), self.named(r"^aten::", "cpu_op"))
        ops = where(ops, phases(ev, col(ops, "row")) == OPTIMIZER)
        return steps, ops

    def busy_ns(self, frame: pa.Table,
                by: tuple[str, ...] = ("rank",)) -> dict[tuple[int, ...], int]:
        """Union of the intervals of `frame` per group (e.g. per rank and device)."""
        out: dict[tuple[int, ...], int] = {}
        for key, group in groups(frame, by):
            ts = col(group, "ts")
            out[key] = total(ts, ts + col(group, "dur"))
        return dict(sorted(out.items()))

    @cached_property
    def breakdowns(self) -> dict[int, list[Breakdown]]:
        """Rank -> analyze's concurrency breakdowns over its iterations (or time windows, or
        its span without either); only ranks with device work in their window."""
        out = {}
        with_work = set(col(self.device_events, "rank").tolist())
        for rc in self.concurrency:
            parts = [i.breakdown for i in rc.iterations] or [rc.total]
            if rc.rank in with_work and sum(b.span_ns for b in parts) > 0:
                out[rc.rank] = parts
        return out

    @cached_property
    def device_idle(self) -> dict[int, tuple[int, int]]:
        """Rank -> (analyze's device idle ns, measured ns) over its breakdowns: the time none
        of its devices worked (analyze.concurrency)."""
        return {r: (sum(b.device_idle_ns for b in parts), sum(b.span_ns for b in parts))
                for r, parts in self.breakdowns.items()}

    def state_ns(self, *states: str) -> int:
        """analyze's nanoseconds in `states` (analyze.concurrency.STATES), summed over the
        ranks and windows of device_idle."""
        return sum(b.ns[s] for parts in self.breakdowns.values() for b in parts for s in states)

    @cached_property
    def device_busy(self) -> dict[int, float]:
        """Rank -> the share of its measured time its devices worked (see device_idle)."""
        return {r: 1 - idle / span for r, (idle, span) in self.device_idle.items()}

    @cached_property
    def kernel_launches(self) -> pa.Table:
        """The runtime and driver calls that launched a kernel (a collective's too): analyze's
        launch, the call joined to its kernel by correlation id (analyze.launch.launch_pairs)."""
        ev = Events.load(self.run)
        dev, calls = launch_pairs(ev)  # analyze's join, made once per Events
        launched = calls[np.isin(ev.kind[dev], [KIND["kernel"], KIND["collective"]])]
        return self.at(launched)

    @cached_property
    def launch_scopes(self) -> pa.Table:
        """The outermost CPU ops that hold a kernel launch (aten::conv2d, an autograd node),
        on their threads: the host work a captured CUDA graph replays without running."""
        ev = Events.load(self.run)
        ops = np.flatnonzero(ev.of_kind("cpu_op"))
        ops = ops[np.lexsort((-ev.dur[ops], ev.ts[ops]))]
        outer = [lane[top_level(ev.ts[lane], ev.end[lane])]
                 for lane in group_rows(lane_key(ev.rank[ops], ev.tid[ops]), ops).values()]
        calls = col(self.kernel_launches, "row")
        top = np.concatenate(outer) if outer else ops[:0]
        return self.at(enclosing_rows(ev, calls, top)[1])

    @cached_property
    def device_events(self) -> pa.Table:
        return self.in_window(self.kind(*sorted(DEVICE_KINDS - {"gpu_annotation"})))

    def step_count(self) -> int:
        """Profiled steps (over ranks); a run without step markers counts as one step per rank
        (0 without events)."""
        return self.steps.num_rows or len(self.ranks)

    @cached_property
    def profiler_slowdown(self) -> float:
        """Median profiled step over the median step the hooks timed after the window (at
        least 1; 1 without both, iterations.StepTime): what the profiler adds to the evidence
        of the window."""
        found = step_time(self.run.table("steps"), batch_sizes(self.run),
                          aside=self.set_aside)
        return found.profiler_slowdown if found is not None else 1.0

    @cached_property
    def optimizer_slowdown(self) -> float | None:
        """The profiler's slowdown of the optimizer's own work: its calls' median own time in
        the window (optimizer_steps) over the median the recorder timed of those that ended
        the steps outside it (counter OPTIMIZER_CALL at the hooks ending `detected` steps);
        at least 1; None without both. Many small ops in a step take more of the profiler's
        per-op cost than the step as a whole does (profiler_slowdown)."""
        ended = where(self.run_steps, col(self.run_steps, "source") == "detected").select(
            ["rank", "end"]).rename_columns(["rank", "ts"])
        timed = where(self.counters, col(self.counters, "name") == OPTIMIZER_CALL).join(
            ended, ["rank", "ts"], join_type="inner")
        inside = self._own_per_step()
        if timed.num_rows == 0 or not inside:
            return None
        outside = float(np.median(col(timed, "value")))
        return max(1.0, float(np.median(inside)) / outside) if outside > 0 else None

    def _own_per_step(self) -> list[int]:
        """Each profiled step's optimizer calls' own time (the outermost calls: what the
        recorder times, summed over the optimizers one step steps, a GAN's two)."""
        calls = self._step_calls(innermost=False)
        out = []
        for (rank,), mine in groups(self.steps, ["rank"]):
            starts, ends = col(mine, "start"), col(mine, "end")
            order = np.argsort(starts)
            starts, ends = starts[order], ends[order]
            theirs = col(calls, "rank") == rank
            ts, dur = col(calls, "ts")[theirs], col(calls, "dur")[theirs]
            at = np.searchsorted(starts, ts, side="right") - 1
            inside = (at >= 0) & (ts < ends[np.maximum(at, 0)])
            sums = np.bincount(at[inside], weights=dur[inside], minlength=len(starts))
            out += [int(v) for v, n in zip(sums, np.bincount(at[inside], minlength=len(starts)),
                                           strict=True) if n]
        return out

    @cached_property
    def host_blocking(self) -> tuple[pa.Table, pa.Table]:
        """(sync calls, scalar reads) in the window: the host calls that wait for the device.
        analyze's one definition of a blocking call (the synchronizes and the synchronous
        cudaMemcpy/hipMemcpy, which returns only when its copy is done), and the .item()s that
        read the device: those that run the copy (a runtime call inside them); of a CPU tensor
        one waits for nothing. A trace of CPU activities alone shows no calls: each read counts
        there."""
        runtime = self.kind("runtime")
        apis = where(runtime, self.named_as(runtime, SYNC_CALLS))
        reads, calls = self.named(_SCALAR_READ, "cpu_op"), self.kind("runtime", "driver")
        items = self.around(reads, calls) if calls.num_rows else reads
        return self.in_window(apis), self.in_window(items)

    @cached_property
    def loader_calls(self) -> pa.Table:
        """The host's waits for the next batch (`enumerate(DataLoader)#...` ranges) in the
        window."""
        return self.in_window(self.named(r"enumerate\(DataLoader\)", *_HOST_KINDS))

    @cached_property
    def host_blocked_ns(self) -> dict[int, int]:
        """Rank -> the union of its host's blocking calls (host_blocking) in its window."""
        blocked = self.busy_ns(pa.concat_tables(self.host_blocking))
        return {r: blocked.get((r,), 0) for r in self.ranks}

    def total_ns(self, frame: pa.Table) -> int:
        return int(col(frame, "dur").sum())

    # -- the model's view ----------------------------------------------------
    @cached_property
    def spec(self) -> DeviceSpec | None:
        """The bundled spec (model/devices.yaml) of the run's first device it knows, if any."""
        return spec_of_devices(self.manifest["devices"])

    def launching_ops(self, device: pa.Table) -> I64:
        """For each row of `device`: the row of the innermost CPU op with a cost model
        (model.opcost, from the recorded shapes) around its launch call (analyze's join: the
        call by correlation id, the op around it on its thread); -1 when the shapes were not
        recorded, the op is not modelled, or the launch call is not in the trace."""
        dev, op = self._launching
        return looked_up(dev, op, col(device, "row"))

    def costs_of(self, ops: I64) -> list[OpCost | None]:
        """The modelled cost of each of `ops` (rows, as `launching_ops` gives them), None for
        -1."""
        costed = costed_ops(self.run, Events.load(self.run))
        return [costed[o][0] if o >= 0 else None for o in ops.tolist()]

    @cached_property
    def _launching(self) -> tuple[I64, I64]:
        """The device ops a modelled op launched (rows, ascending) and that op's row for each:
        arrays, not a dict of every device op or an object per op (30k ops of a 200k-event
        trace had been 7 MB of them)."""
        ev = Events.load(self.run)
        dev, calls = launch_pairs(ev)  # ascending
        op = looked_up(*enclosing_rows(ev, calls, costed_rows(self.run, ev).rows), calls)
        launched = op >= 0
        return dev[launched], op[launched]
