"""A CUDA memory snapshot (`torch.cuda.memory._dump_snapshot`, after
`_record_memory_history()`): the allocator's history, read into the same bytes-alive-per-category
states as a memory timeline (memory_timeline.py), plus the bytes the allocator reserved.

The file is a pickle, and unpickling can call any function the file names. It is read by an
unpickler whose `find_class` refuses every global, so a pickle that names one (os.system, any
class) is refused before anything it names is looked up, let alone called: what is left to a
pickle without globals is dicts, lists, tuples, strings, bytes, numbers, bools and None, which is
all a snapshot holds (torch.cuda.memory._snapshot() builds it from them).

The keys read (torch's docs, "Understanding CUDA Memory Usage", and torch/cuda/_memory_viz.py):
- `device_traces[device]`: the history, oldest first, entries `{action, addr, size, stream,
  frames, time_us}`. `alloc` makes `size` bytes at `addr` active; `free_completed` (or the legacy
  `free`) ends them, as torch's MemoryViz.js active memory timeline does: after `free_requested`
  a block may still await other streams (record_stream), and it is not reusable until then.
  `segment_alloc`/`segment_map` add to the reserved bytes, `segment_free`/`segment_unmap` take
  from them; other actions (`free_requested`, `snapshot`, `oom`) change neither.
- `segments`: the state when the snapshot was taken, `{device, address, total_size, blocks}`,
  blocks `{size, state, address}` in address order (a block without `address` starts where the
  one before it ends, as _memory_viz assumes).
The history is a ring buffer: what was allocated before it begins is found from the end state
(an active block the history never allocates) and from frees of addresses it never allocated;
both count from its first entry, as `unknown`, and the reserved bytes at the start are the end's
total less the history's changes. An allocation's category is its entry's `category` where it has
one, else `unknown`, as MemoryViz.js colours it (torch's _memory_viz writes one when it turns a
profile into a snapshot, from the profiler's categories): a live snapshot's stack frames name no
category, and torch reads none from them.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final, NoReturn

import numpy as np
import numpy.typing as npt

from perfswarm.errors import TraceFormatError

FREES: Final = frozenset({"free_completed", "free"})
RESERVES: Final = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}
# the end state's blocks still held (pending free: freed, awaiting other streams; torch's
# snapshots say pending, its docs awaiting)
ACTIVE: Final = frozenset({"active_allocated", "active_pending_free", "active_awaiting_free"})


class _DataOnly(pickle.Unpickler):
    """Unpickles data only: every global (function, class) is refused unlooked-up."""

    def find_class(self, module: str, name: str) -> NoReturn:
        raise pickle.UnpicklingError(f"it names the global {module}.{name}")


def load(path: Path, text: bytes | bytearray) -> Any:
    """The pickle's data, or a one-line error: nothing the file names is ever called."""
    try:
        return _DataOnly(io.BytesIO(text)).load()
    except pickle.UnpicklingError as exc:
        why = str(exc)
        raise TraceFormatError(path, "pickle", (
            f"a pickle that is not a torch.cuda memory snapshot: {why}, and perfswarm loads no "
            "globals (loading one runs code from the file)") if why.startswith("it names")
            else f"corrupt pickle ({why})") from None
    except (EOFError, ValueError, TypeError, KeyError, IndexError, AttributeError,
            OverflowError, MemoryError) as exc:  # what corrupt pickles raise (mutation-tested)
        raise TraceFormatError(path, "pickle", f"corrupt pickle ({type(exc).__name__}: "
                               f"{exc})") from None


def _bad(path: Path, where: str, why: str) -> NoReturn:
    raise TraceFormatError(path, "$" + where, why)


def _int(path: Path, item: dict[str, Any], key: str, where: str) -> int:
    value = item.get(key)
    if type(value) is not int:
        _bad(path, f"{where}[{key!r}]", f"expected an integer; got {value!r:.40}")
    return value


def _dicts(path: Path, value: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        _bad(path, where, f"expected a list of dicts; got {type(value).__name__}")
    return value


def states(path: Path, data: Any, categories: Sequence[str]
           ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], int]:
    """(times ns, at each the bytes allocated per category then the bytes reserved, the device
    or -1 when the history spans several) of a snapshot's data; `categories` ends in unknown."""
    if not (isinstance(data, dict) and "device_traces" in data and "segments" in data):
        keys = ", ".join(f"{k!r:.30}" for k in list(data)[:6]) if isinstance(data, dict) else ""
        _bad(path, "", "not a torch.cuda memory snapshot (a dict with segments and "
             f"device_traces); it is a {type(data).__name__}" + (f" with keys {keys}" if keys
                                                                 else ""))
    traces = data["device_traces"]
    if not isinstance(traces, list):
        _bad(path, "['device_traces']", "expected a list (one history per device)")
    entries: list[tuple[int, int, dict[str, Any], str]] = []  # (time ns, device, entry, where)
    for device, trace in enumerate(traces):
        where = f"['device_traces'][{device}]"
        for i, entry in enumerate(_dicts(path, trace, where)):
            at = f"{where}[{i}]"
            if not isinstance(entry.get("action"), str):
                _bad(path, f"{at}['action']", "expected a string")
            entries.append((_int(path, entry, "time_us", at) * 1000, device, entry, at))
    if not entries:
        _bad(path, "['device_traces']", "no allocation history: take the snapshot after "
             "torch.cuda.memory._record_memory_history()")
    entries.sort(key=lambda e: e[0])  # stable: each device's order, the devices merged by time
    unknown = len(categories) - 1
    index = {c: j for j, c in enumerate(categories)}
    live: dict[tuple[int, int], tuple[int, int]] = {}  # (device, addr) -> (size, category)
    start = np.zeros(len(categories) + 1, np.int64)
    rows = np.zeros((len(entries), len(categories) + 1), np.int64)  # each entry's change
    for i, (_, device, entry, at) in enumerate(entries):
        action = entry["action"]
        if action == "alloc" or action in FREES:
            key = (device, _int(path, entry, "addr", at))
            size = _int(path, entry, "size", at)
        if action == "alloc":
            category = entry.get("category")
            live[key] = (size, index.get(category, unknown) if isinstance(category, str)
                         else unknown)
            rows[i, live[key][1]] = size
        elif action in FREES and key in live:
            size, j = live.pop(key)
            rows[i, j] = -size
        elif action in FREES:
            start[unknown] += size  # allocated before the history began
            rows[i, unknown] = -size
        elif action in RESERVES:
            rows[i, -1] = RESERVES[action] * _int(path, entry, "size", at)
    reserved = 0
    for s, segment in enumerate(_dicts(path, data["segments"], "['segments']")):
        at = f"['segments'][{s}]"
        device = _int(path, segment, "device", at)
        reserved += _int(path, segment, "total_size", at)
        addr = _int(path, segment, "address", at)
        for b, block in enumerate(_dicts(path, segment.get("blocks"), f"{at}['blocks']")):
            where = f"{at}['blocks'][{b}]"
            size = _int(path, block, "size", where)
            addr = _int(path, block, "address", where) if "address" in block else addr
            if block.get("state") in ACTIVE and (device, addr) not in live:
                start[unknown] += size  # allocated before the history and still alive
            addr += size
    start[-1] = reserved - rows[:, -1].sum()
    devices = {device for _, device, _, _ in entries}
    times = np.array([t for t, _, _, _ in entries], np.int64)
    return times, start + np.cumsum(rows, axis=0), devices.pop() if len(devices) == 1 else -1
