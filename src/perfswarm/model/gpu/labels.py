"""The aten ops of a node of NeuSight's whole-model labels (shared/gpu-kernels/labels: a
torch.fx graph of a model, each node with its input and output shapes and measured latencies):
what the benchmarks price of a label and what the dataset reader learns from."""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Mapping, Sequence

from perfswarm.model.opcost import Shapes

Ops = list[tuple[str, Shapes]]
LAYER = re.compile(r"\.(?:layer|h|layers)\.0'")  # a node of the graph's one transformer layer


def node_shapes(text: str) -> list[list[int]]:
    """A node's `input_shapes` or `output_shape` cell as lists of dimensions (an unreadable
    one: none)."""
    try:
        value = ast.literal_eval(text) if text else []
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return []
    if isinstance(value, tuple):
        value = [list(value)]
    if not isinstance(value, list):
        return []
    return [[int(d) for d in v if isinstance(d, int)] if isinstance(v, list | tuple) else []
            for v in value]


def node_ops(row: Mapping[str, str], train_case: bool) -> tuple[Ops, Ops] | None:
    """The aten ops (forward, backward) of one fx node; None when it runs no kernel. Raises
    KeyError for a missing column, ValueError for shapes its op cannot have."""
    op, target, meta = row["op"], row["target"], row["meta"]
    ins = [d for d in node_shapes(row["input_shapes"]) if d]
    out = node_shapes(row["output_shape"])
    out_shape = out[0] if out else []
    module = meta.split("<class '")[-1].split("'")[0] if op == "call_module" else ""

    def s(*dims: Sequence[int]) -> Shapes:
        return Shapes(tuple(tuple(d) for d in dims), ("float",) * len(dims))

    if not ins or not out_shape:
        return None
    x = ins[0]
    if module.endswith("Linear"):
        n, k = out_shape[-1], x[-1]
        m = math.prod(x[:-1])
        return ([("aten::linear", s(x, [n, k], [n]))],
                [("aten::mm", s([m, n], [n, k])), ("aten::mm", s([n, m], [m, k])),
                 ("aten::sum", s([m, n])), ("aten::add_", s([n, k], [n, k]))])
    if "addmm" in target and len(ins) == 3:
        (n,), (m, k) = ins[0], ins[1]
        return ([("aten::addmm", s(ins[0], ins[1], ins[2]))],
                [("aten::mm", s([m, n], [n, k])), ("aten::mm", s([k, m], [m, n])),
                 ("aten::sum", s([m, n])), ("aten::add_", s([k, n], [k, n]))])
    if ("matmul" in target or "bmm" in target) and len(ins) == 2:
        a, b = ins
        if len(a) < 2 or len(b) < 2:
            raise ValueError(f"a matmul of {a} and {b}")
        return ([("aten::matmul", s(a, b))],
                [("aten::matmul", s(out_shape, [*b[:-2], b[-1], b[-2]])),
                 ("aten::matmul", s([*a[:-2], a[-1], a[-2]], out_shape))])
    if module.endswith("LayerNorm"):
        return ([("aten::native_layer_norm", s(x))],
                [("aten::native_layer_norm_backward", s(x, x))])
    if "softmax" in target:
        return [("aten::_softmax", s(x))], [("aten::_softmax_backward_data", s(x, x))]
    if module.endswith("Embedding") or (not module and "embedding" in target):
        table = [1, out_shape[-1]]
        return ([("aten::embedding", s(table, x))],
                [("aten::embedding_dense_backward", s(out_shape, out_shape))])
    if module.endswith("Dropout") or "dropout" in target:
        return ([("aten::mul", s(x, x))], [("aten::mul", s(x, x))]) if train_case else None
    unary = {"gelu": "aten::gelu", "tanh": "aten::tanh", "Tanh": "aten::tanh",
             "ReLU": "aten::relu", "pow": "aten::pow"}
    for key, name in unary.items():
        if key in target or module.endswith(key):
            return [(name, s(x))], [(name + "_backward" if key != "pow" else "aten::mul",
                                     s(out_shape, x))]
    binary = {"add": "aten::add", "sub": "aten::sub", "mul": "aten::mul",
              "truediv": "aten::div", "where": "aten::where", "masked_fill": "aten::masked_fill",
              "max": "aten::maximum"}  # OPT's torch.max(scores, finfo.min): elementwise
    for key, name in binary.items():
        if key in target and math.prod(out_shape) > 1:
            shapes = s(*[d for d in ins if d] + ([out_shape] if len(ins) == 1 else []))
            grads = ([("aten::mul", s(out_shape, out_shape))]
                     if key in ("mul", "truediv", "max") else [])
            return [(name, shapes)], grads
    if target in ("contiguous", "reshape") and row["input_contiguous"].startswith("[False"):
        return [("aten::copy_", s(x, x))], []
    return None
