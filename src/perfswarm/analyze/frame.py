"""A Run's events as numpy columns: the one loaded form every analysis works on.

Kinds and names stay interned (small int codes); the name dictionary is kept so
results can speak names without materializing a string per event.
"""

from __future__ import annotations

import re
from array import array
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Final, TypeVar, cast

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from perfswarm.analyze.intervals import sorted_unique, union
from perfswarm.trace.schema import KIND_CODE, PROFILER_STEP, among, window_ends
from perfswarm.trace.store import Run

I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
I8 = npt.NDArray[np.int8]
Mask = npt.NDArray[np.bool_]
T = TypeVar("T")

KIND: Final = KIND_CODE  # the analyses' name for trace/schema.py's table of kind codes
# Host work: what keeps a CPU thread busy on behalf of the workload.
HOST_BUSY_KINDS = ("cpu_op", "user_annotation", "python_function", "runtime", "driver", "syscall")
# A collective run by a CPU process group's own threads: ProcessGroupGloo records each as a range
# named "gloo:" and the op ("gloo:all_reduce", "gloo:broadcast", ...) on the worker thread
# that runs it, from when that thread takes it up until every rank has done its part
HOST_COLLECTIVE: Final = re.compile(r"^gloo:")
# ... of which these pair a sender with a receiver, not the same op on every rank
HOST_P2P: Final = re.compile(r"^gloo:(send|recv)")
# ... issued by the dispatcher op the caller runs ("c10d::allreduce_", "c10d::broadcast_"),
# which queues the work and returns
COLLECTIVE_CALL: Final = re.compile(r"^c10d::")
# A torch.distributed.rpc request, named by perfswarm's recorder as torch's profiler key names
# it: "rpc_sync#FUNC(CALLER -> CALLEE)", a range from the send to the reply's arrival on the
# sending thread: a wait, no work of its own (analyze/rpc.py)
RPC_REQUEST: Final = re.compile(r"^rpc_(?:sync|async)#(.+)\((\S*) -> (\S*)\)$")
# torch.compile's ranges: the compiled region, the autograd function around a compiled forward
# (its inputs are the graph's: the parameters and the batch) and the call of the compiled
# graph; the ops inside run at the graph's shapes (an activation flattened to [batch x
# sequence, width]), not the model's
COMPILED_CALL: Final = "CompiledFunction"
COMPILED_REGION: Final = re.compile(
    r"^(Torch-Compiled Region|CompiledFunction$|## Call CompiledFx)")
# ... the call of a compiled graph alone: on the CPU the kernels inductor generated run inside it
# with no op of their own (its C++), so its time no op inside covers is theirs
COMPILED_GRAPH: Final = re.compile(r"^## Call CompiledFx")
# What a thread does when it works; outside these it is blocked or idle (a user annotation or
# Python frame around a blocking call, such as `## backward ##` around autograd's run, is not
# work of its own)
WORK_KINDS: Final = ("cpu_op", "runtime", "driver", "syscall")
DEVICE_OPS: Final = ("kernel", "collective", "memcpy", "memset")  # what a device runs
EVENT_COLUMNS = ["rank", "ts", "dur", "kind", "name", "pid", "tid", "device", "stream",
                 "correlation", "step"]


def codes(column: pa.ChunkedArray) -> tuple[npt.NDArray[np.int64], list[str]]:
    """Dictionary indices and values of a (possibly multi-chunk) dictionary column."""
    array = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    if not isinstance(array, pa.DictionaryArray):
        array = array.dictionary_encode()
    assert isinstance(array, pa.DictionaryArray)
    idx = array.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    return idx, [str(v) if v is not None else "" for v in array.dictionary.to_pylist()]


def _within_trace(rank: I64, ts: I64, dur: I64, kind: I64) -> I64:
    """Durations with each user annotation ending no later than the profiler's trace window
    that it began in (schema.window_ends)."""
    windows = np.flatnonzero(kind == KIND["trace_span"])
    notes = np.flatnonzero(kind == KIND["user_annotation"])
    if len(windows) == 0 or len(notes) == 0:
        return dur
    out = dur.copy()
    out[notes] = window_ends(rank[windows], ts[windows], (ts + dur)[windows], rank[notes],
                             ts[notes], (ts + dur)[notes]) - ts[notes]
    return out


@dataclass(frozen=True, eq=False)
class Events:
    """Columns of the events table, sorted by (rank, ts) as the store keeps them."""

    rank: I64
    ts: I64
    dur: I64
    kind: I64  # index into schema.KINDS
    name: I64  # index into `names`
    names: tuple[str, ...]
    pid: I64  # the process: a rank's DataLoader workers are processes of their own
    tid: I64
    device: I64
    stream: I64
    correlation: I64
    step: I64
    # what `derived` made of these events, by key (not a field of their identity)
    _derived: dict[Hashable, Any] = field(default_factory=dict, init=False, repr=False)

    @classmethod
    def from_table(cls, table: pa.Table) -> Events:
        kind_idx, kind_values = codes(table.column("kind"))
        remap = np.array([KIND.get(k, KIND["other"]) for k in kind_values] or [0], np.int64)
        name_idx, name_values = codes(table.column("name"))

        def col(name: str) -> I64:
            return np.asarray(table.column(name).to_numpy(), dtype=np.int64)

        rank, ts, kind = col("rank"), col("ts"), remap[kind_idx]
        return cls(rank=rank, ts=ts, dur=_within_trace(rank, ts, col("dur"), kind),
                   kind=kind, name=name_idx, names=tuple(name_values), pid=col("pid"),
                   tid=col("tid"), device=col("device"), stream=col("stream"),
                   correlation=col("correlation"), step=col("step"))

    @classmethod
    def load(cls, run: Run, rank: int | None = None) -> Events:
        """The Run's events, or one rank's (reading only its rows); decoded once per Run."""
        return run.memo(("events", rank),
                        lambda: cls.from_table(run.table("events", columns=EVENT_COLUMNS,
                                                         rank=rank)))

    @classmethod
    def of_run_rank(cls, run: Run, rank: int) -> Events:
        """One rank's events: a view of the Run's frame when that is loaded, else its rows
        read alone and kept for no one (memory stays one rank's, however many)."""
        if run.holds(("events", None)):
            return cls.load(run).of_rank(rank)
        return cls.from_table(run.table("events", columns=EVENT_COLUMNS, rank=rank))

    def select(self, rows: Mask | I64 | slice) -> Events:
        """The events at `rows` (a mask, sorted row numbers or a slice: views), sharing the
        name dictionary."""
        return Events(rank=self.rank[rows], ts=self.ts[rows], dur=self.dur[rows],
                      kind=self.kind[rows], name=self.name[rows], names=self.names,
                      pid=self.pid[rows], tid=self.tid[rows], device=self.device[rows],
                      stream=self.stream[rows], correlation=self.correlation[rows],
                      step=self.step[rows])

    def of_rank(self, rank: int) -> Events:
        """One rank's events; the object itself when it holds no other rank (what is derived
        from it is then shared)."""
        rows = self.rank_slice(rank)
        return self if rows == slice(0, len(self)) else self.select(rows)

    def __len__(self) -> int:
        return len(self.ts)

    def derived(self, key: Hashable, make: Callable[[], T]) -> T:
        """`make()` once per Events object: what several analyses of one command derive from
        the same events alike (the thread hand-overs: iterations, the critical path and the
        simulator's graph each follow them). The caller does not change what it gets."""
        if key not in self._derived:
            self._derived[key] = make()
        return cast(T, self._derived[key])

    @cached_property
    def end(self) -> I64:
        return self.ts + self.dur

    def of_kind(self, *kinds: str) -> Mask:
        return among(self.kind, [KIND[k] for k in kinds], len(KIND))

    @cached_property
    def is_step_marker(self) -> Mask:
        return self._named(PROFILER_STEP)

    @cached_property
    def host_busy(self) -> Mask:
        """Host spans that count as the CPU working (step markers only bracket work, an RPC
        request's range is a wait)."""
        return (self.of_kind(*HOST_BUSY_KINDS) & ~self.is_step_marker & ~self.rpc_request
                & (self.dur > 0))

    @cached_property
    def rpc_request(self) -> Mask:
        """RPC requests' ranges (RPC_REQUEST)."""
        return self._named(RPC_REQUEST) & self.of_kind("user_annotation") & (self.dur > 0)

    @cached_property
    def loop_ops(self) -> Mask:
        """The host's ops and annotations a loop's iterations are read from (no step
        markers, nothing of no length)."""
        return self.of_kind("cpu_op", "user_annotation") & ~self.is_step_marker & (self.dur > 0)

    @cached_property
    def host_collective(self) -> Mask:
        """Collectives run on host threads (HOST_COLLECTIVE): a CPU process group's
        communication, as `collective` rows are a device's."""
        return self._named(HOST_COLLECTIVE) & self.of_kind("user_annotation") & (self.dur > 0)

    @cached_property
    def work(self) -> Mask:
        """What a rank's span covers (concurrency's states): device ops, host work, and
        collectives on host threads; not the profiler's own ranges and instants."""
        return self.of_kind(*DEVICE_OPS) | self.host_busy | self.host_collective

    @cached_property
    def collective_call(self) -> Mask:
        """The calls that issued collectives to a process group (COLLECTIVE_CALL)."""
        return self._named(COLLECTIVE_CALL) & self.of_kind("cpu_op")

    @cached_property
    def collectives(self) -> Mask:
        """Every collective, on a device or on host threads (not a point-to-point send or
        receive: the same op does not run on every rank)."""
        return self.of_kind("collective") | (self.host_collective & ~self._named(HOST_P2P))

    def working(self, rank: int) -> tuple[I64, I64]:
        """When the rank worked, as disjoint sorted spans: its device's compute kernels where
        it has any, else its host's work (host_work)."""
        rows = np.arange(len(self))[self.rank_slice(rank)]
        kernels = rows[self.of_kind("kernel")[rows]]
        return union(self.ts[kernels], self.end[kernels]) if len(kernels) else \
            self.host_work(rank)

    def loop_thread(self, rank: int) -> tuple[int, int] | None:
        """(pid, tid) of the rank's loop, the thread iteration detection reads: of the threads
        with host ops or annotations, the one that holds the step markers (a DataLoader worker
        profiled over the same window can outlast the main thread by a batch), else the one
        whose ops span the longest stretch (on a tie, the most ops); None without host ops."""
        rows = np.arange(len(self))[self.rank_slice(rank)]
        ops = rows[self.loop_ops[rows]]
        if not len(ops):
            return None
        threads = sorted_unique(self.tid[ops])
        marked = np.intersect1d(threads, self.tid[rows[self.is_step_marker[rows]
                                                       & self.of_kind("user_annotation")[rows]]])
        best, best_key = -1, (-1, -1)
        for tid in (marked if len(marked) else threads).tolist():
            mine = ops[self.tid[ops] == tid]
            key = (int(self.end[mine].max() - self.ts[mine].min()), len(mine))
            if key > best_key:
                best, best_key = tid, key
        return int(self.pid[ops][self.tid[ops] == best][0]), int(best)

    def loop_threads(self, rank: int) -> tuple[int, I64] | None:
        """(pid, tids) of the rank's loop: loop_thread's, with every thread of its process
        that holds step markers too (a server's pool, each request's step on the thread that
        took it: torch.distributed.rpc's runs a remote module's forwards so)."""
        loop = self.loop_thread(rank)
        if loop is None:
            return None
        rows = np.arange(len(self))[self.rank_slice(rank)]
        marks = rows[self.is_step_marker[rows] & self.of_kind("user_annotation")[rows]
                     & (self.pid[rows] == loop[0])]
        return loop[0], np.union1d(self.tid[marks], [loop[1]]).astype(np.int64)

    def host_work(self, rank: int) -> tuple[I64, I64]:
        """When the rank's host threads ran ops or runtime calls (WORK_KINDS; not an
        annotation around a wait, a DataLoader's, nor a call that issues a collective to its
        process group), as disjoint sorted spans."""
        rows = np.arange(len(self))[self.rank_slice(rank)]
        rows = rows[self.of_kind(*WORK_KINDS)[rows] & ~self.collective_call[rows]]
        return union(self.ts[rows], self.end[rows])

    def _named(self, pattern: re.Pattern[str]) -> Mask:
        return among(self.name, [i for i, n in enumerate(self.names) if pattern.match(n)],
                     len(self.names))

    @cached_property
    def ranks(self) -> list[int]:
        return [int(r) for r in sorted_unique(self.rank)]

    def rank_slice(self, rank: int) -> slice:
        """Rows of one rank (rows are sorted by rank first)."""
        lo = int(np.searchsorted(self.rank, rank, side="left"))
        hi = int(np.searchsorted(self.rank, rank, side="right"))
        return slice(lo, hi)

    def name_of(self, row: int) -> str:
        return self.names[int(self.name[row])]


def args_of(run: Run, rows: I64, rank: int | None = None) -> list[str]:
    """The whole args JSON text of the events at `rows` (sorted) of the Run (or of `rank`):
    for what `detail_of` leaves out (memory events, CUPTI counters)."""
    return texts_of(run, "args", rows, rank)


def detail_of(run: Run, rows: I64, rank: int | None = None) -> list[str]:
    """The `detail` of the events at `rows` (sorted) of the Run (or of `rank`): the fields of
    their args that the analyses read (shapes, bytes, syncs, launch geometry, collectives;
    trace/detail.py), as JSON objects. One string object per distinct text."""
    return texts_of(run, "detail", rows, rank)


def texts_of(run: Run, column: str, rows: I64, rank: int | None = None) -> list[str]:
    """A text column's values at `rows`, read with the column the other analyses share. A
    mask filter, not a take: taking a few rows of a many-chunk string column copies it
    whole. Of a dictionary column, only the texts these rows hold become Python strings (its
    dictionary holds every distinct text of the column: 40k at 200k events where no two ops
    share shapes, 7.5 MB, for the few hundred collectives a caller wants)."""
    if len(rows) == 0:
        return []
    values = run.table("events", [column], rank=rank).column(column)
    mask = np.zeros(len(values), bool)
    mask[rows] = True
    out: list[str] = []
    for chunk in values.filter(pa.array(mask)).chunks:
        if isinstance(chunk, pa.DictionaryArray):
            used, at = np.unique(chunk.indices.to_numpy(zero_copy_only=False),
                                 return_inverse=True)
            texts = chunk.dictionary.take(pa.array(used)).to_pylist()
            out += [texts[i] for i in at.tolist()]
        else:
            out += [a or "{}" for a in chunk.to_pylist()]
    return out


def int_array(values: I64 | I32) -> array[int]:
    """`values` as a Python array of machine ints: what a per-event Python loop iterates as
    fast as a list, in 8 bytes an entry where a list of ints (beyond the small ones Python
    shares) takes 40."""
    return array("q", np.ascontiguousarray(values, np.int64).tobytes())


LANE_BITS = 40


def lane_key(rank: I64 | int, lane: I64 | int) -> I64:
    """One int64 per (rank, thread or stream) pair: a timeline's identity."""
    return np.asarray((np.asarray(rank, np.int64) << LANE_BITS)
                      | (np.asarray(lane, np.int64) & ((1 << LANE_BITS) - 1)), np.int64)


def unique_rows(keys: I64) -> tuple[I64, I64]:
    """np.unique(keys, axis=0, return_index=True, return_inverse=True) without the values: the
    first row of each distinct key row (keys in lexicographic order) and each row's key index.
    By a lexsort: np.unique's row-view sort is several times slower. The keys are compared
    in order a column at a time, not copied whole in order (4 columns at 120k rows: 3.8 MB)."""
    if not len(keys):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    order = np.lexsort(keys.T[::-1])
    new = np.zeros(len(keys), bool)
    new[0] = True
    for column in keys.T:
        ordered = column[order]
        new[1:] |= ordered[1:] != ordered[:-1]
    inverse = np.empty(len(keys), np.int64)
    inverse[order] = np.cumsum(new) - 1
    return order[new], inverse


def group_rows(keys: I64, rows: I64) -> dict[int, I64]:
    """key -> the rows with that key, keeping their order."""
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    cuts = np.flatnonzero(sorted_keys[1:] != sorted_keys[:-1]) + 1
    starts = np.concatenate([[0], cuts]).astype(np.int64)
    return {int(sorted_keys[s]): rows[part] for s, part in
            zip(starts.tolist(), np.split(order, cuts), strict=True)} if len(keys) else {}
