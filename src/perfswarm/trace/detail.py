"""The events table's `detail` column: the fields of an event's args that the analyses read.

An event's `args` (Kineto's JSON object, kept as text) is most of a trace's bytes, and most of
it is new in every event (its ids, its call stack). The analyses read a few fields of the
ops, kernels, copies, syncs and collectives: the shapes record_shapes wrote, a copy's bytes,
what a sync waited on, a kernel's launch geometry, a collective's message and process group.
`detail` is those fields alone, as a JSON object with the args' own value text, in a fixed key
order ("{}" for an event with none of them, and for every event of another kind). Every
iteration repeats the same ones, so the column is a small dictionary, and a command reads it
instead of the args.
The importers derive it when they build the events; the store derives it when it reads a Run
written before the column existed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import msgspec
import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
from msgspec import UNSET, Raw, UnsetType

from perfswarm.trace.schema import DETAIL

# The kinds whose args hold fields the analyses read (a Python function's, an annotation's or
# a runtime call's args are never read, and are most of a trace with call stacks)
DETAIL_KINDS: Final = ("cpu_op", "kernel", "memcpy", "memset", "sync", "collective")
NO_DETAIL: Final = "{}"


# The args keys the analyses read, in the order a detail lists them
KEYS: Final = (
    # record_shapes (model.opcost.shapes_from_args)
    "Input Dims", "Input type", "Input Strides", "Concrete Inputs",
    # copies and sets (analyze.bandwidth, model.predict)
    "bytes",
    # syncs (analyze.dependencies); a kernel's stream
    "cuda_sync_kind", "stream", "wait_on_stream", "wait_on_cuda_event_record_corr_id",
    # kernels' launch geometry, in Kineto's order (report.views, model.predict)
    "registers per thread", "shared memory", "blocks per SM", "warps per SM", "grid", "block",
    "est. achieved occupancy %",
    # collectives (optimize.project), and their process group (analyze.groups)
    "Collective name", "In msg nelems", "Out msg nelems", "Group size", "dtype",
    "Process Group Name", "Process Group Ranks",
)
# Those fields of an args object, as their JSON text; absent ones are left out
_Detail: Final = msgspec.defstruct(
    "_Detail", [(f"f{i}", Raw | UnsetType, UNSET) for i in range(len(KEYS))],
    rename={f"f{i}": key for i, key in enumerate(KEYS)})


# (list[_Detail] spelled for the type checker, to which a class made at run time is no type)
_ALL: Final = msgspec.json.Decoder(list.__class_getitem__(_Detail))
_ONE: Final = msgspec.json.Decoder(_Detail)
_ENCODE: Final = msgspec.json.Encoder()
_NONE: Final = _Detail()  # encodes as "{}"


def detail_rows(kinds: pa.Array | pa.ChunkedArray) -> npt.NDArray[np.int64]:
    """The rows (of events of these kinds) that can have a detail."""
    found = pc.is_in(kinds.cast(pa.string()), value_set=pa.array(DETAIL_KINDS, pa.string()))
    return np.flatnonzero(found.to_numpy(zero_copy_only=False))


def detail_column(texts: Sequence[bytes], rows: npt.NDArray[np.int64], n: int) -> pa.Array:
    """The `detail` of `n` events whose `rows` have the args `texts` (JSON objects; the other
    rows have none). All are decoded at once, in C, from one JSON array, and written back
    as lines."""
    found: list[msgspec.Struct | None]
    try:
        found = list(_ALL.decode(b"[" + b",".join(texts) + b"]"))
    except msgspec.DecodeError:  # a text that is not an object: no detail (not written here)
        found = [_one(t) for t in texts]
    every: list[msgspec.Struct] = [_NONE] * n  # the other rows: none
    for row, d in zip(rows.tolist(), found, strict=True):
        every[row] = d or _NONE
    lines = _ENCODE.encode_lines(every)
    text_type = pa.binary() if len(lines) < 2**31 else pa.large_binary()
    values = pc.split_pattern(pa.array([lines[:-1]], text_type), b"\n").flatten()
    if len(values) != n:  # a value's text spans lines (pretty-printed args)
        values = pa.array([_ENCODE.encode(d) for d in every], text_type)
    return values.cast(pa.string())


def _one(text: bytes) -> msgspec.Struct | None:
    try:
        return _ONE.decode(text)
    except msgspec.DecodeError:
        return None


def with_detail(events: pa.Table) -> pa.Table:
    """`events` (a kind and an args column at least) with their `detail` column, derived from
    the args text (an importer other than Kineto's, or a Run written before the column)."""
    rows = detail_rows(events.column("kind"))
    args = pc.fill_null(events.column("args").cast(pa.string()).take(pa.array(rows)), NO_DETAIL)
    texts = [t.encode() for t in args.to_pylist()]
    column = detail_column(texts, rows, events.num_rows)
    if DETAIL.name in events.column_names:
        return events.set_column(events.column_names.index(DETAIL.name), DETAIL, column)
    return events.append_column(DETAIL, column)
