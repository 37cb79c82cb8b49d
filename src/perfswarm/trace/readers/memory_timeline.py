"""torch.profiler's memory timeline (`profile_memory=True`, then `export_memory_timeline`): the
bytes alive per category over time, read into counters.

torch writes it in two forms, as JSON (gzipped when the name ends in .gz):
- `[times, sizes]`: the times in us on the profiler's clock, and at each the bytes alive per
  category, `[0, PARAMETER, OPTIMIZER_STATE, INPUT, TEMPORARY, ACTIVATION, GRADIENT,
  AUTOGRAD_DETAIL, unknown]`;
- raw (a name ending in raw.json.gz): one `[t, action, bytes, category]` per change, t in ns
  (-1 for tensors alive before profiling began: they count from the first time), bytes signed,
  category an index into the same list without its leading 0.
Both become counters `memory.<category>` (bytes alive from that time on), one reading where a
category's bytes change. The profiler's clock is the trace's, so the readings line up with the
events of the Run. The file does not say its device (the export's `device` argument): the
readings have device -1.

A CUDA memory snapshot (a pickle, memory_snapshot.py) becomes the same counters, and its
reserved bytes a counter `memory_reserved`, through the same code once it is read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import orjson
import pyarrow as pa

from perfswarm.errors import TraceFormatError
from perfswarm.trace.kineto import PICKLE, invalid_json, read_bytes
from perfswarm.trace.readers import memory_snapshot
from perfswarm.trace.readers.fields import Placement, SideTables
from perfswarm.trace.schema import COUNTERS, MEMORY_PREFIX, MEMORY_RESERVED

CATEGORIES: Final = ("parameter", "optimizer_state", "input", "temporary", "activation",
                     "gradient", "autograd_detail", "unknown")
WHAT: Final = ("a torch.profiler memory timeline (export_memory_timeline: [times, sizes per "
               "category], or its raw [[t, action, bytes, category], ...])")


def _ints(value: Any) -> bool:
    return isinstance(value, list) and all(type(v) is int for v in value)


def _states(path: Path, data: Any) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """(times ns, bytes alive per category at each), from either form."""
    if (isinstance(data, list) and len(data) == 2 and _ints(data[0])
            and isinstance(data[1], list) and len(data[0]) == len(data[1])):
        times, sizes = data
        for i, row in enumerate(sizes):
            if not (_ints(row) and len(row) == len(CATEGORIES) + 1):
                raise TraceFormatError(path, f"$[1][{i}]", f"expected {len(CATEGORIES) + 1} "
                                       f"integers (0, then bytes per category); got {row!r:.60}")
        if not times:
            raise TraceFormatError(path, "$", f"an empty memory timeline: {WHAT}")
        return (np.array(times, np.int64) * 1000,
                np.array(sizes, np.int64).reshape(-1, len(CATEGORIES) + 1)[:, 1:])
    if isinstance(data, list) and data and all(_ints(r) and len(r) == 4 for r in data):
        raw = np.array(data, np.int64)
        bad = np.flatnonzero((raw[:, 3] < 0) | (raw[:, 3] >= len(CATEGORIES)))
        if len(bad):
            raise TraceFormatError(path, f"$[{bad[0]}][3]", f"category {raw[bad[0], 3]} is not "
                                   f"one of 0..{len(CATEGORIES) - 1}")
        t = raw[:, 0]
        started = t[t >= 0]
        t = np.where(t < 0, started.min() if len(started) else 0, t)
        order = np.argsort(t, kind="stable")
        t, category, delta = t[order], raw[order, 3], raw[order, 2]
        alive = np.zeros((len(t), len(CATEGORIES)), np.int64)
        alive[np.arange(len(t)), category] = delta
        return t, np.cumsum(alive, axis=0)  # read() keeps the state once every change at t is in
    raise TraceFormatError(path, "$", f"not {WHAT}")


def read(path: Path, at: Placement) -> SideTables:
    """The file's counters on its rank; its format: memory_timeline or memory_snapshot."""
    text = read_bytes(path)
    names = [MEMORY_PREFIX + c for c in CATEGORIES]
    form = "memory_snapshot" if text[:1] == PICKLE else "memory_timeline"
    if form == "memory_snapshot":
        times, alive, device = memory_snapshot.states(path, memory_snapshot.load(path, text),
                                                      CATEGORIES)
        names.append(MEMORY_RESERVED)
    else:
        try:
            data = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            raise invalid_json(path, bytes(text[:1]), exc) from None
        (times, alive), device = _states(path, data), -1
    last = np.append(times[1:] != times[:-1], True)  # torch repeats a time for what preexisted
    times, alive = times[last], alive[last]
    if np.any(np.diff(times) < 0):
        raise TraceFormatError(path, "$[0]", "times go backwards")
    if np.any(alive < 0):
        raise TraceFormatError(path, "$", "bytes alive fall below 0")
    changed = np.vstack([np.ones((1, alive.shape[1]), bool), alive[1:] != alive[:-1]])
    changes, category = np.nonzero(changed)
    order = np.lexsort((category, changes))
    changes, category = changes[order], category[order]
    labels = pa.DictionaryArray.from_arrays(pa.array(category, pa.int32()), pa.array(names))
    return SideTables(form, counters=pa.table({
        "rank": pa.array(np.full(len(changes), at.rank, np.int32)),
        "ts": pa.array(times[changes], pa.int64()), "name": labels,
        "device": pa.array(np.full(len(changes), device, np.int32)),
        "value": pa.array(alive[changes, category].astype(np.float64))}, schema=COUNTERS))
