"""Arrow schemas of the Run's tables and the closed set of event kinds.

Names and kinds are dictionary-encoded: a 200k-event trace typically has a few
thousand distinct names, so interning keeps tables and memory small.
"""

from __future__ import annotations

import re
from typing import Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa

# Event kinds, normalized across Kineto versions and vendors (see trace/kineto.py).
KINDS: Final = (
    "cpu_op",
    "user_annotation",
    "gpu_annotation",
    "python_function",
    "runtime",
    "driver",
    "kernel",
    "memcpy",
    "memset",
    "sync",
    "collective",
    "instant",
    "profiler_range",
    "overhead",
    "trace_span",
    "syscall",
    "other",
)
DEVICE_KINDS: Final = frozenset({"kernel", "memcpy", "memset", "collective", "gpu_annotation"})
KIND_CODE: Final = {k: i for i, k in enumerate(KINDS)}  # each kind's code in the dictionary
# torch.profiler's iteration markers: a user_annotation `ProfilerStep#N` spans iteration N
PROFILER_STEP: Final = re.compile(r"^ProfilerStep#(\d+)$")
HOST = -1  # `device` value of host-side events
NONE = -1  # `stream`, `correlation`, `external_id`, `rf_id`, `step` when absent

# The fields of `args` the analyses read (trace/detail.py): JSON objects, a few hundred distinct
# ones, so the store writes them with Parquet dictionary pages and reads them as a dictionary
# (in a trace's chunks they stay plain text: unifying many chunks' dictionaries costs more)
DETAIL: Final = pa.field("detail", pa.string())
DICTIONARY_TEXT: Final = frozenset({DETAIL.name})
EVENTS: Final = pa.schema(
    [
        ("rank", pa.int32()),
        ("ts", pa.int64()),
        ("dur", pa.int64()),
        ("kind", pa.dictionary(pa.int8(), pa.string())),
        ("name", pa.dictionary(pa.int32(), pa.string())),
        ("pid", pa.int64()),
        ("tid", pa.int64()),
        ("device", pa.int32()),
        ("stream", pa.int64()),
        ("correlation", pa.int64()),
        ("external_id", pa.int64()),
        ("rf_id", pa.int64()),
        ("step", pa.int32()),
        ("args", pa.string()),
        DETAIL,
    ]
)

COUNTERS: Final = pa.schema(
    [
        ("rank", pa.int32()),
        ("ts", pa.int64()),
        ("name", pa.dictionary(pa.int32(), pa.string())),
        ("device", pa.int32()),
        ("value", pa.float64()),
    ]
)
# A recorded process's minor page faults so far, at each optimizer step (per rank)
FAULTS: Final = "minor page faults"
# ... and the stepping thread's run delay so far (ns it sat runnable on a runqueue, schedstat),
# at each step hook: a step's wait for a core, which the system sampler's readings (50 ms)
# cannot place in steps shorter than them
HOOK_DELAY: Final = "loop thread run delay ns"
# ... and torch.get_num_threads() at each step hook: the intra-op threads of the step it ends (a
# program may change them inside the window; the manifest's extra.record.threads is the count
# as the window opened)
HOOK_THREADS: Final = "intra-op threads"
# ... and the ns torch.compile spent compiling so far (dynamo's compile callbacks), at each step
# hook: a step's compiling (its first steps, a recompilation on a new input shape), outside the
# profiling window too
HOOK_COMPILE: Final = "compile ns"
# ... and the ns it spent starting DataLoader workers so far (a new iterator of a loader with
# workers, each worker's first batch, the last iterator's workers joined: a new epoch's
# loader), at each step hook, outside the profiling window too
HOOK_LOADER: Final = "loader start ns"
# ... and what the process's DataLoader iterators handed it so far, at each step hook,
# outside the profiling window too (a process that took no batch has none): the batches,
# their tensors (each batch's distinct storages: what a worker's pickler hands over, a
# shared-memory file each), their samples where the loader batches by a batch sampler (the
# length of the index list drawn for each batch: torch_geometric's graphs, not the nodes its
# first layer reads), and those samples of batches taken with autograd on (a training
# step's; an evaluation's under no_grad is not)
LOADER_BATCHES: Final = "loader batches"
LOADER_TENSORS: Final = "loader tensors"
LOADER_SAMPLES: Final = "loader samples"
LOADER_GRAD_SAMPLES: Final = "loader samples with grad"
LOADED: Final = (LOADER_BATCHES, LOADER_TENSORS, LOADER_SAMPLES, LOADER_GRAD_SAMPLES)
# A recorded process's optimizer.step() own time (ns, after a closure's backward), at each
# optimizer step (per rank), in the profiling window and outside it
OPTIMIZER_CALL: Final = "optimizer step ns"
# The leading dimension of the top-level module's first input at each forward-driven step's
# start (an inference loop's batch; per rank)
STEP_BATCH: Final = "step batch"
# ... and the elements of that input (batch x sequence: a generate loop's prefill and decode)
STEP_INPUT: Final = "step input elements"
# ... and the ns from its start to its return: the step's busy work, the rest of the step up to
# the next forward a wait (an inference server's for requests)
STEP_FORWARD: Final = "step forward ns"

# A memory timeline's or snapshot's bytes alive in a category: counters MEMORY_PREFIX + category
# (trace/readers/memory_timeline.py), and a snapshot's bytes the allocator held reserved (not a
# category, so not in the totals); here, where analyze reads them without the readers
MEMORY_PREFIX: Final = "memory."
MEMORY_RESERVED: Final = "memory_reserved"
# The system sampler's host memory (recorder/system.py), /proc/meminfo's MemAvailable
HOST_AVAILABLE: Final = "mem.available_bytes"

# Chrome-trace flow points (ph s/f/t): ac2g links launches to kernels, fwdbwd
# links a forward op to its backward op. Kept raw; analyses resolve them.
FLOWS: Final = pa.schema(
    [
        ("rank", pa.int32()),
        ("id", pa.int64()),
        ("cat", pa.dictionary(pa.int8(), pa.string())),
        ("phase", pa.dictionary(pa.int8(), pa.string())),
        ("pid", pa.int64()),
        ("tid", pa.int64()),
        ("ts", pa.int64()),
    ]
)

STEPS: Final = pa.schema(
    [
        ("rank", pa.int32()),
        ("step", pa.int32()),
        ("start", pa.int64()),
        ("end", pa.int64()),
        ("source", pa.dictionary(pa.int8(), pa.string())),
    ]
)

# The steps table's source of the steps a trace covers (ProfilerStep#N). A recording also times
# the steps outside its profiling window by the optimizer hook (`detected`), and marks the one
# that holds the trace export (`export`): they carry no events, so every share and per-step
# rate of the events divides by the profiled steps alone. A marked step that no step hook
# ended (the program exited or raised inside the window: its exit, or the exception's
# unwinding, is no step), or an imported trace's last marker that holds next to no event (the
# loop ended inside the profiler's active steps: build.mend_steps), is marked `tail`.
PROFILED: Final[str] = "marker"
EXPORT: Final[str] = "export"
TAIL: Final[str] = "tail"

SAMPLES: Final = pa.schema(
    [
        ("rank", pa.int32()),
        ("ts", pa.int64()),
        ("source", pa.dictionary(pa.int8(), pa.string())),
        ("pid", pa.int64()),
        ("tid", pa.int64()),
        ("stack_id", pa.int64()),
        ("weight", pa.int64()),
    ]
)

# One row per frame: stack_id, depth 0 = leaf.
STACKS: Final = pa.schema(
    [
        ("stack_id", pa.int64()),
        ("depth", pa.int32()),
        ("function", pa.dictionary(pa.int32(), pa.string())),
        ("module", pa.dictionary(pa.int32(), pa.string())),
        ("address", pa.int64()),
    ]
)

GRAPH_NODES: Final = pa.schema(
    [
        ("rank", pa.int32()),
        ("node_id", pa.int64()),
        ("parent", pa.int64()),
        ("name", pa.dictionary(pa.int32(), pa.string())),
        ("op_schema", pa.string()),
        ("rf_id", pa.int64()),
        ("tid", pa.int64()),
        ("inputs", pa.string()),
        ("outputs", pa.string()),
        ("attrs", pa.string()),
    ]
)

# Tensor producer -> consumer edges, and parent -> child edges of the op tree.
GRAPH_EDGES: Final = pa.schema(
    [
        ("rank", pa.int32()),
        ("src", pa.int64()),
        ("dst", pa.int64()),
        ("kind", pa.dictionary(pa.int8(), pa.string())),
        ("tensor", pa.string()),
    ]
)

# What every Run holds (written by trace/build.write_tables, empty or not); the others are
# there when their source was.
TRACE_TABLES: Final = ("steps", "flows", "counters", "events")
TABLES: Final[dict[str, pa.Schema]] = {
    "events": EVENTS,
    "counters": COUNTERS,
    "flows": FLOWS,
    "steps": STEPS,
    "samples": SAMPLES,
    "stacks": STACKS,
    "graph_nodes": GRAPH_NODES,
    "graph_edges": GRAPH_EDGES,
}


def empty(name: str) -> pa.Table:
    """An empty table with the schema of `name`."""
    return TABLES[name].empty_table()


def among(values: npt.NDArray[np.integer], wanted: list[int], size: int
          ) -> npt.NDArray[np.bool_]:
    """Which of `values` (codes in [0, size): kinds, names, phases) are in `wanted`: a table of
    `size` flags read at every value: np.isin took 1.0 CPU ms for 120k events, this 0.06 ms,
    and the analyses ask for kinds and names of every event dozens of times (an import, for
    each chunk's phases and kinds)."""
    table = np.zeros(size, bool)
    table[wanted] = True
    return np.asarray(table[values], bool)


def window_ends(win_rank: npt.NDArray[np.int64], win_start: npt.NDArray[np.int64],
                win_end: npt.NDArray[np.int64], rank: npt.NDArray[np.int64],
                start: npt.NDArray[np.int64], end: npt.NDArray[np.int64]
                ) -> npt.NDArray[np.int64]:
    """Each span's end, no later than the end of its rank's profiler trace window (Kineto's
    `trace_span`) that it began in (the last to start at or before it). A profiler stopped
    from inside a range (from an optimizer step hook, inside `Optimizer.step#...`, or inside
    a ProfilerStep) closes that range only after its stop and export: on nanoGPT 9.7% of a CPU
    step late, 31.7 ms after a 16.1 ms step on an H200 (the `Record Window End` instant's
    time), HTA's triton example's only step 13.3 s for 1.7 ms traced; none of it the loop's
    work. The analyses' user annotations (analyze.frame) and the steps table's marked steps
    (build.mend_steps) are clipped alike."""
    out = end.copy()
    for r in np.unique(win_rank).tolist():
        mine = np.flatnonzero(win_rank == r)
        mine = mine[np.argsort(win_start[mine], kind="stable")]
        rows = np.flatnonzero(rank == r)
        at = np.searchsorted(win_start[mine], start[rows], side="right") - 1  # began in
        began = at >= 0
        rows, stop = rows[began], win_end[mine][at[began]]
        late = (start[rows] < stop) & (end[rows] > stop)
        out[rows[late]] = stop[late]
    return out
