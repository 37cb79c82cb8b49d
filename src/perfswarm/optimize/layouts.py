"""The parallel layouts (model.parallelism) of a recorded Run: the model read from the trace's
shapes, the compute per step as the Run measured it, and the best layout for a device count.

Parameters: the elements the Run's gradient all-reduces carry per step (data parallel reduces
every gradient once), else the weights of its layers in one step's forward (``aten::linear``,
convolutions, embeddings, norms: their recorded weight shapes; a weight used twice, such as a
tied embedding, counts twice; a bare ``nn.Parameter`` used outside a layer is missed).
A transformer's layers, hidden size, heads, sequence and batch come from the same step: the
hidden size is the commonest input width of its linear layers, a layer is a feed-forward
down-projection (a linear layer from a width above the hidden size back to it), the batch and
sequence are the embedding's index shape (else a linear input's leading dimensions, batch
first), the heads the attention's query shape (``scaled_dot_product_attention``, batch, heads,
sequence, head size), else one head per 64 of the hidden size. Without such layers the model
gets data-parallel layouts only.

Weak scaling, as the projection: on D devices the global batch is D times the Run's batch per
rank, so the step's compute on one device is D times the Run's compute per step (the median
over steps of the slowest rank), and each micro-batch is the Run's batch; the share of it in
memory-bound kernels (optimize.project's MEMORY_BOUND) is what tensor parallelism splits only in
part. The time of a marked
step in which no device work ran (a host-bound Run's input pipeline, Python, launches; the
median over steps of the slowest rank) stays in every layout's step as it is.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from perfswarm.errors import PerfswarmError
from perfswarm.model.opcost import RNN_OPS, Shapes, element_bytes, shapes_from_args
from perfswarm.model.parallelism import Blocks, Estimate, Model, best_layout
from perfswarm.model.topology import Link
from perfswarm.trace.store import Run

HEAD_SIZE: Final = 64  # heads assumed when no attention op shows them (GPT-2, GPT-3, BERT)
_WEIGHTS: Final = {  # op -> index of its weight and of its bias among the inputs
    "aten::linear": (1, 2), "aten::conv1d": (1, 2), "aten::conv2d": (1, 2),
    "aten::conv3d": (1, 2), "aten::embedding": (0, -1), "aten::layer_norm": (2, 3),
    "aten::batch_norm": (1, 2), "aten::group_norm": (2, 3),
    **dict.fromkeys(RNN_OPS, (2, -1)),  # every layer's weights, one list
}
_ATTENTION: Final = "aten::scaled_dot_product_attention"


@dataclass(frozen=True)
class RunModel:
    """What the layouts need of a Run, and where each figure came from."""

    params: int
    params_source: str  # "gradient all-reduce" | "layer shapes"
    value_bytes: int
    blocks: Blocks | None
    blocks_source: str  # how the layers were read, or why there are none
    batch: int  # samples per rank and step in the Run (1: the Run's batch as one unit)

    def model(self, devices: int) -> Model:
        """The model at `devices` devices, weak scaling: each micro-batch is the Run's batch."""
        return Model(self.params, self.batch * devices, self.batch, self.blocks,
                     self.value_bytes)

    def to_dict(self) -> dict[str, Any]:
        b = self.blocks
        return {"params": self.params, "params_source": self.params_source,
                "value_bytes": self.value_bytes, "batch": self.batch,
                "layers": b.layers if b else None, "hidden": b.hidden if b else None,
                "heads": b.heads if b else None, "seq": b.seq if b else None,
                "blocks_source": self.blocks_source}


def _first_step_ops(run: Run, rank: int) -> list[tuple[str, Shapes]]:
    """The shaped weight and attention ops of `rank`'s first step (the whole Run without
    steps), in time order."""
    table = run.table("events", ["ts", "kind", "name", "step", "detail"], rank=rank)
    keep = pc.and_(pc.is_in(table.column("kind"), pa.array(["cpu_op"])),
                   pc.is_in(table.column("name"), pa.array([*_WEIGHTS, _ATTENTION])))
    table = table.filter(keep)
    steps = np.asarray(table.column("step").to_numpy(), np.int64)
    if (steps >= 0).any():
        table = table.filter(pc.equal(table.column("step"), int(steps[steps >= 0].min())))
    table = table.sort_by("ts")
    out = []
    for name, text in zip(pc.cast(table.column("name"), pa.string()).to_pylist(),
                          table.column("detail").to_pylist(), strict=True):
        # a recurrent layer's weight list: the shape parser's rows hold no lists
        shapes = shapes_from_args(text or "") if name not in RNN_OPS else _rnn_weights(text)
        if shapes is not None:
            out.append((str(name), shapes))
    return out


def _rnn_weights(text: str | None) -> Shapes | None:
    """A recurrent layer's weights (its third input, a list of tensors) as one flat input:
    what its parameters count."""
    try:
        dims = orjson.loads(text or "{}").get("Input Dims")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    weights = dims[2] if isinstance(dims, list) and len(dims) > 2 else None
    if not isinstance(weights, list) or not all(
            isinstance(d, list) and all(isinstance(x, int) for x in d) for d in weights):
        return None
    count = sum(int(np.prod(d)) for d in weights)
    return Shapes(((), (), (count,)), ("float", "TensorList", "TensorList"))


def _dim(shapes: Shapes, i: int) -> tuple[int, ...]:
    return shapes.dims[i] if 0 <= i < len(shapes.dims) else ()


def _weights(ops: list[tuple[str, Shapes]]) -> tuple[int, int]:
    """(parameters, bytes per value) of the layers' weights and biases."""
    params, sizes = 0, Counter[int]()
    for name, shapes in ops:
        if name not in _WEIGHTS:
            continue
        w, b = _WEIGHTS[name]
        weight = _dim(shapes, w)
        params += int(np.prod(weight)) + int(np.prod(_dim(shapes, b) or (0,)))
        sizes[element_bytes(shapes)] += 1
    return params, (sizes.most_common(1)[0][0] if sizes else 4)


def _blocks(ops: list[tuple[str, Shapes]]) -> tuple[Blocks | None, int, str]:
    """(the transformer's layers or None, samples per step, how they were read or why not)."""
    linears = [s for name, s in ops if name == "aten::linear" and len(_dim(s, 1)) == 2]
    if not linears:
        return None, 1, "no linear layers with shapes in the Run"
    hidden = Counter(_dim(s, 1)[1] for s in linears).most_common(1)[0][0]
    layers = sum(1 for s in linears if _dim(s, 1)[0] == hidden and _dim(s, 1)[1] > hidden)
    if not layers:
        return None, 1, f"no feed-forward layers back to width {hidden}: not a transformer"
    ids = [_dim(s, 1) for name, s in ops if name == "aten::embedding" and len(_dim(s, 1)) == 2]
    acts = [_dim(s, 0) for s in linears if len(_dim(s, 0)) == 3 and _dim(s, 0)[2] == hidden]
    if not ids and not acts:
        return None, 1, "no batch and sequence shapes (embedding ids or 3-d linear inputs)"
    batch, seq = (ids or acts)[0][:2]
    queries = [_dim(s, 0) for name, s in ops if name == _ATTENTION and len(_dim(s, 0)) == 4]
    heads, how = (queries[0][1], "attention") if queries else (
        max(1, hidden // HEAD_SIZE), f"assumed {HEAD_SIZE} per head")
    source = (f"{layers} feed-forward layers of width {hidden}; batch x sequence from the "
              f"{'embedding ids' if ids else 'linear inputs'}; heads {how}")
    return Blocks(layers, hidden, heads, seq), batch, source


def run_model(run: Run, rank: int) -> RunModel:
    """The Run's model as `rank`'s shapes show it (params 0 when no layer has shapes)."""
    ops = _first_step_ops(run, rank)
    params, value = _weights(ops)
    blocks, batch, how = _blocks(ops)
    return RunModel(params, "layer shapes", value, blocks, how, batch)


@dataclass(frozen=True)
class LayoutChoice:
    """The best layout of the Run's model on a device count, and every layout tried."""

    devices: int
    source: RunModel
    work_s: float  # the step's compute on one device
    memory_s: float  # of it, the memory-bound kernels' time (split in part by tp)
    memory_bytes: float | None  # per device; None: unknown, nothing checked against it
    best: Estimate | None  # the fastest that fits (None: none fits)
    every: tuple[Estimate, ...]  # fastest first

    def to_dict(self) -> dict[str, Any]:
        return {"devices": self.devices, "model": self.source.to_dict(),
                "work_s": self.work_s, "memory_s": self.memory_s,
                "memory_gb": None if self.memory_bytes is None else self.memory_bytes / 1e9,
                "best": self.best.to_dict() if self.best else None,
                "layouts": [e.to_dict() for e in self.every]}


def choose_layout(source: RunModel, compute_s: float, devices: int, *, per_node: int,
                  intra: Link, inter: Link, memory_bytes: float | None,
                  host_s: float = 0.0, memory_share: float = 0.0) -> LayoutChoice:
    """The layouts of the Run's model on `devices` devices; `compute_s` is the Run's compute
    per step on one device at its own batch, `memory_share` the part of it in memory-bound
    kernels, `host_s` the time of its step with no device work (kept in every layout)."""
    model = source.model(devices)
    work = compute_s * devices
    best, every = best_layout(model, devices, per_node=per_node, intra=intra, inter=inter,
                              work_s=work, memory_s=work * memory_share,
                              memory_bytes=memory_bytes or float("inf"), host_s=host_s)
    if not every:
        raise PerfswarmError(f"no layout of {devices} devices divides the Run's model "
                             f"({source.blocks.layers if source.blocks else 1} layers)")
    return LayoutChoice(devices, source, work, work * memory_share, memory_bytes, best,
                        tuple(every))

