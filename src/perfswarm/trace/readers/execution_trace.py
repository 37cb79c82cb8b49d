"""Reader for PyTorch execution traces (ExecutionTraceObserver / Chakra JSON).

Nodes become `graph_nodes` (the op tree, with inputs/outputs as JSON text);
edges are the tree's parent->child links plus tensor producer->consumer links.
Nodes join to events by `rf_id` (the Record function id Kineto writes); traces
too old to write it carry the same number as `External id`.

torch's ExecutionTraceObserver writes an op's name into the JSON as it is (torch 2.13 does): a
record_function name with a quote, a backslash or a control character makes the whole file
invalid JSON, though the damage is that one string. Such a file is read leniently (`_decode`):
each name sits in a line of the writer's fixed shape, so it is found and escaped without
reading the rest, and any other string's raw control characters are read as text; what was
mended is a warning in the manifest. A file that is not an execution trace, or JSON broken
anywhere else, stays a one-line error.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import orjson
import pyarrow as pa

from perfswarm.errors import TraceFormatError
from perfswarm.trace.kineto import TOO_DEEP, read_bytes
from perfswarm.trace.readers.fields import Placement, SideTables
from perfswarm.trace.schema import GRAPH_EDGES, GRAPH_NODES, NONE

# An op's name where the observer writes it: after its id (schema 1.1: `"id": 16, "name": "...",
# "ctrl_deps": 3,`) or first in its node (1.0: `{"name": "...", "id": 5,`); a name is read up
# to 4 KiB, so a search that finds no end stops there.
_NAMES = (re.compile(rb'("id": -?[0-9]+, "name": ")(.{0,4096}?)(", "ctrl_deps": -?[0-9]+,)',
                     re.DOTALL),
          re.compile(rb'(\{\s*"name": ")(.{0,4096}?)(", "id": -?[0-9]+,)', re.DOTALL))
_UNSAFE = re.compile(rb'[\x00-\x1f"\\]')  # what a JSON string holds only escaped
ESCAPED_NAMES = ("read leniently: op names torch wrote unescaped (a quote, a backslash or a "
                 "control character), escaped")
RAW_CONTROLS = "read leniently: control characters in its strings read as text"


class ETNode(msgspec.Struct):
    name: str
    id: int
    parent: int = NONE
    rf_id: int | None = None
    tid: int = NONE
    op_schema: str = ""
    ctrl_deps: int | None = None  # schema 1.1 (Chakra): the parent; rf_id, tid in `attrs`
    # schema 1.0.x: parallel lists; 1.1 (Chakra): {"values": [...], "shapes": ..., "types": ...}
    inputs: Any = []
    outputs: Any = []
    input_shapes: Any = None
    input_types: Any = None
    output_shapes: Any = None
    output_types: Any = None
    attrs: Any = None


class ETrace(msgspec.Struct):
    nodes: list[ETNode]
    schema: str = ""
    pid: int | None = None


def _io(values: Any, shapes: Any, types: Any) -> dict[str, Any]:
    if isinstance(values, dict):
        return {k: values.get(k) for k in ("values", "shapes", "types")}
    return {"values": values, "shapes": shapes, "types": types}


def _tensors(io: dict[str, Any]) -> list[str]:
    """Tensor keys 'id:storage' among values whose type says Tensor (lists of tensors too)."""
    keys: list[str] = []
    types = io.get("types") or []
    for value, typ in zip(io.get("values") or [], types, strict=False):
        if not isinstance(typ, str) or "Tensor" not in typ:
            continue
        items = value if typ.startswith(("GenericList", "TensorList")) else [value]
        for t in items:
            if isinstance(t, list) and len(t) >= 2 and all(isinstance(x, int) for x in t[:2]):
                keys.append(f"{t[0]}:{t[1]}")
    return keys


def _escaped_names(data: bytes | bytearray) -> tuple[bytes, int]:
    """`data` with every op name the observer wrote unescaped escaped, and how many."""
    count = 0

    def escape(m: re.Match[bytes]) -> bytes:
        nonlocal count
        name = m.group(2)
        if _UNSAFE.search(name):
            try:
                orjson.loads(b'"' + name + b'"')  # escaped as JSON already
            except orjson.JSONDecodeError:
                count += 1
                name = orjson.dumps(name.decode("utf-8", "replace"))[1:-1]
        return m.group(1) + name + m.group(3)

    pattern = _NAMES[0] if b'"ctrl_deps": ' in data else _NAMES[1]
    return pattern.sub(escape, data), count


def _decode(path: Path, data: bytes | bytearray) -> tuple[ETrace, Counter[str]]:
    """The trace, and what reading it leniently mended (what -> count)."""
    mended: Counter[str] = Counter()
    try:
        try:
            return msgspec.json.decode(data, type=ETrace), mended
        except msgspec.DecodeError as exc:
            broken = exc
        data, mended[ESCAPED_NAMES] = _escaped_names(data)
        try:
            return msgspec.json.decode(data, type=ETrace), mended
        except msgspec.DecodeError:
            pass
        try:
            loose = json.loads(data.decode("utf-8"), strict=False)
        except (UnicodeDecodeError, ValueError):
            raise TraceFormatError(path, "json", f"invalid JSON: {broken}") from None
        mended[RAW_CONTROLS] += 1
        return msgspec.convert(loose, type=ETrace), mended
    except msgspec.ValidationError as exc:
        raise TraceFormatError(path, "json", f"not an execution trace: {exc}") from None
    except RecursionError:
        raise TraceFormatError(path, "json", TOO_DEEP) from None


def read(path: Path, at: Placement) -> SideTables:
    """graph_nodes and graph_edges of one execution trace, on its rank; what reading it
    leniently mended, its warnings."""
    rank = at.rank
    trace, mended = _decode(path, read_bytes(path))
    nodes = sorted(map(_of_schema_1_0, trace.nodes), key=lambda n: n.id)
    parents = {n.id: n.parent for n in nodes}
    ios = [(_io(n.inputs, n.input_shapes, n.input_types),
            _io(n.outputs, n.output_shapes, n.output_types)) for n in nodes]

    src: list[int] = []
    dst: list[int] = []
    kind: list[str] = []
    tensor: list[str | None] = []
    for n in nodes:
        if n.parent in parents and n.parent != n.id:  # the root is its own parent
            src.append(n.parent)
            dst.append(n.id)
            kind.append("parent")
            tensor.append(None)
    producer: dict[str, int] = {}
    for n, (ins, outs) in zip(nodes, ios, strict=True):
        ancestors = _ancestors(n.id, parents)
        for key in dict.fromkeys(_tensors(ins)):
            p = producer.get(key)
            if p is not None and p not in ancestors and p != n.id:
                src.append(p)
                dst.append(n.id)
                kind.append("data")
                tensor.append(key)
        for key in _tensors(outs):
            producer[key] = n.id

    node_table = pa.table(
        {
            "rank": pa.array(np.full(len(nodes), rank, np.int32)),
            "node_id": pa.array([n.id for n in nodes], pa.int64()),
            "parent": pa.array([n.parent for n in nodes], pa.int64()),
            "name": pa.array([n.name for n in nodes]).dictionary_encode(),
            "op_schema": pa.array([n.op_schema for n in nodes], pa.string()),
            "rf_id": pa.array([NONE if n.rf_id is None else n.rf_id for n in nodes], pa.int64()),
            "tid": pa.array([n.tid for n in nodes], pa.int64()),
            "inputs": pa.array([orjson.dumps(i).decode() for i, _ in ios], pa.string()),
            "outputs": pa.array([orjson.dumps(o).decode() for _, o in ios], pa.string()),
            "attrs": pa.array([orjson.dumps(n.attrs).decode() for n in nodes], pa.string()),
        }
    ).cast(GRAPH_NODES)
    edge_table = pa.table(
        {
            "rank": pa.array(np.full(len(src), rank, np.int32)),
            "src": pa.array(src, pa.int64()),
            "dst": pa.array(dst, pa.int64()),
            "kind": pa.array(kind, pa.string()).dictionary_encode(),
            "tensor": pa.array(tensor, pa.string()),
        }
    ).cast(GRAPH_EDGES)
    return SideTables("execution_trace", graph_nodes=node_table, graph_edges=edge_table,
                      warnings={f"execution trace {w}": n for w, n in mended.items() if n})


def _of_schema_1_0(node: ETNode) -> ETNode:
    """A node with its parent, record function id, thread and schema where schema 1.0 puts
    them: schema 1.1 (torch 2.2 on) writes the parent as `ctrl_deps` and the rest as `attrs`,
    a list of {name, type, value} (read as 1.0, every node of a torch 2.13 trace had no parent
    and no rf_id, so none joined its event)."""
    if node.ctrl_deps is None:
        return node
    attrs = {a["name"]: a.get("value") for a in node.attrs or ()
             if isinstance(a, dict) and isinstance(a.get("name"), str)}

    def whole(key: str, default: int | None) -> int | None:
        value = attrs.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else default

    schema = attrs.get("op_schema")
    return msgspec.structs.replace(
        node, parent=node.ctrl_deps if node.parent == NONE else node.parent,
        rf_id=whole("rf_id", node.rf_id), tid=whole("tid", node.tid),
        op_schema=schema if isinstance(schema, str) and not node.op_schema else node.op_schema)


def _ancestors(node: int, parents: dict[int, int]) -> set[int]:
    seen: set[int] = set()
    while node in parents and node not in seen:
        seen.add(node)
        node = parents[node]
    return seen


def join_key(events: pa.Table) -> str:
    """The events column that carries ET rf_ids: `rf_id`, or `external_id` for old traces."""
    rf = events.column("rf_id").to_numpy()
    return "rf_id" if (rf != NONE).any() else "external_id"


def join_warnings(nodes: pa.Table, events: pa.Table, rank: int) -> Counter[str]:
    """What joining a rank's graph nodes to the Run's events (rank, rf_id, external_id, name)
    found amiss: nodes no event has, and events inside the trace's span (between its first
    and last joined node's id: ids count up as ops begin, on every thread) no node has, the
    ops the observer failed on (it logs and drops an op whose tensor will not give its sizes:
    every op on a nested tensor, torch 2.13), named."""
    counts: Counter[str] = Counter()
    if events.num_rows == 0:
        counts["execution trace without a Kineto trace to join"] += 1
        return counts
    mine = events.filter(pa.compute.equal(events.column("rank"), rank))
    key = join_key(mine)
    if key == "external_id":
        counts["no Record function id in the trace: ET joined by External id"] += 1
    ids = mine.column(key).to_numpy()
    have = set(ids.tolist())
    rf = nodes.column("rf_id").to_numpy()
    unmatched = int(sum(1 for r in rf.tolist() if r != NONE and r not in have))
    if unmatched:
        counts["execution-trace nodes with no matching event"] += unmatched
    joined = np.intersect1d(rf[rf != NONE], ids)
    if len(joined):
        inside = (ids >= joined[0]) & (ids <= joined[-1]) & ~np.isin(ids, rf)
        names = Counter(mine.column("name").filter(pa.array(inside)).to_pylist())
        if names:
            most = sorted(names.items(), key=lambda kv: (-kv[1], kv[0]))
            listed = ", ".join(f"{name} x{n}" for name, n in most[:5])
            counts["ops inside the execution trace's span with no node (its observer failed on "
                   f"them): {listed}{', ...' if len(names) > 5 else ''}"] += names.total()
    return counts
