"""FLOPs and bytes of aten ops from recorded shapes (Kineto ``Input Dims`` / ``Input type``),
and the roofline time and bound of an op on a device spec."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import orjson

from perfswarm.model.specs import DeviceSpec

Bound = Literal["compute", "memory"]
Dims = Sequence[Sequence[int]]

# Kineto's ``Input type`` strings -> (bytes per element, dtype key of the spec's peak table).
_DTYPES: dict[str, tuple[int, str]] = {
    "float": (4, "fp32"), "c10::Half": (2, "fp16"), "c10::BFloat16": (2, "bf16"),
    "double": (8, "fp64"), "long int": (8, "fp32"), "int": (4, "fp32"), "bool": (1, "fp32"),
    "signed char": (1, "int8"), "unsigned char": (1, "int8"), "c10::Float8_e4m3fn": (1, "fp8"),
    "c10::Float8_e5m2": (1, "fp8"),
}
_ELEMENTWISE = frozenset({
    "add", "add_", "sub", "sub_", "mul", "mul_", "div", "div_", "relu", "relu_", "gelu", "silu",
    "silu_", "sigmoid", "tanh", "exp", "log", "sqrt", "rsqrt", "pow", "neg", "abs", "clamp",
    "clamp_", "where", "threshold_backward", "gelu_backward", "sigmoid_backward", "dropout",
    "native_dropout", "fill_", "zero_", "addcmul_", "addcdiv_", "lerp_", "maximum", "minimum",
})
_REDUCTIONS = frozenset({"sum", "mean", "amax", "amin", "max", "min", "prod", "norm", "var",
                         "std", "argmax", "argmin", "linalg_vector_norm"})
_NORMS = frozenset({"layer_norm", "native_layer_norm", "batch_norm", "native_batch_norm",
                    "group_norm", "native_group_norm", "rms_norm", "_fused_rms_norm",
                    "cudnn_batch_norm", "native_layer_norm_backward", "native_batch_norm_backward"})
_SOFTMAX = frozenset({"softmax", "_softmax", "log_softmax", "_log_softmax",
                      "_softmax_backward_data", "_log_softmax_backward_data"})
_COPIES = frozenset({"copy_", "to", "_to_copy", "clone", "contiguous", "cat", "stack"})
_SDPA = frozenset({"scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
                   "_scaled_dot_product_efficient_attention", "_flash_attention_forward",
                   "_scaled_dot_product_cudnn_attention"})
# Per-element FLOPs of the families whose cost is a multiple of the largest tensor.
_FLOPS_PER_ELEMENT = {"elementwise": 1.0, "reduction": 1.0, "norm": 5.0, "softmax": 5.0,
                      "copy": 0.0}


@dataclass(frozen=True)
class OpCost:
    """Work of one op: what a roofline needs."""

    op: str          # aten name without the ``aten::`` prefix
    family: str      # gemm, conv, embedding_bag, elementwise, reduction, norm, softmax, sdpa, copy
    flops: float
    bytes: float     # minimum traffic: every input read once, every output written once
    dtype: str       # spec peak key (fp32, fp16, bf16, ...)

    @property
    def intensity(self) -> float:
        """FLOPs per byte moved."""
        return self.flops / self.bytes if self.bytes > 0 else math.inf

    def to_dict(self) -> dict[str, object]:
        return {"op": self.op, "family": self.family, "flops": self.flops, "bytes": self.bytes,
                "dtype": self.dtype, "intensity": self.intensity}


@dataclass(frozen=True)
class Roofline:
    """An op's lower-bound time on a device and which ceiling sets it."""

    time_s: float
    compute_s: float
    memory_s: float
    bound: Bound

    def to_dict(self) -> dict[str, object]:
        return {"time_s": self.time_s, "compute_s": self.compute_s, "memory_s": self.memory_s,
                "bound": self.bound}


def _numel(shape: Sequence[int]) -> int:
    return math.prod(shape) if shape else 1


def _family(op: str) -> str | None:
    if op in {"mm", "matmul", "addmm", "bmm", "baddbmm", "linear"}:
        return "gemm"
    if op in {"conv2d", "conv1d", "conv3d", "convolution", "_convolution", "cudnn_convolution"}:
        return "conv"
    if op in {"embedding_bag", "_embedding_bag", "embedding"}:
        return "embedding_bag"
    if op in _SDPA:
        return "sdpa"
    for family, names in (("elementwise", _ELEMENTWISE), ("reduction", _REDUCTIONS),
                          ("norm", _NORMS), ("softmax", _SOFTMAX), ("copy", _COPIES)):
        if op in names:
            return family
    return None


def _gemm(op: str, dims: Dims) -> tuple[float, float] | None:
    """(flops, elements moved) of a matmul-like op; None when the shapes do not fit."""
    if op == "linear":
        x, w = dims[0], dims[1]
        if len(x) < 1 or len(w) != 2:
            return None
        m, k, n = _numel(x[:-1]), x[-1], w[0]
        bias = n if len(dims) > 2 and dims[2] else 0
        return 2.0 * m * k * n, float(m * k + k * n + m * n + bias)
    a, b = (dims[1], dims[2]) if op in {"addmm", "baddbmm"} else (dims[0], dims[1])
    if len(a) < 2 or len(b) < 2 or a[-1] != b[-2]:
        if op == "matmul" and len(a) >= 1 and len(b) == 1 and a[-1] == b[0]:
            m = _numel(a[:-1])
            return 2.0 * m * b[0], float(_numel(a) + b[0] + m)
        return None
    batch = max(_numel(a[:-2]), _numel(b[:-2]))
    m, k, n = a[-2], a[-1], b[-1]
    moved = batch * (m * k + k * n + m * n)
    if op in {"addmm", "baddbmm"}:
        moved += _numel(dims[0])
    return 2.0 * batch * m * k * n, float(moved)


def _conv(dims: Dims) -> tuple[float, float] | None:
    """Direct convolution cost; output spatial size from the input with stride 1 and 'same' padding
    (Kineto records no stride), the usual case of the recorded shapes."""
    x, w = dims[0], dims[1]
    if len(x) < 3 or len(w) != len(x):
        return None
    n, spatial = x[0], x[2:]
    c_out, c_per_group, kernel = w[0], w[1], w[2:]
    out = n * c_out * _numel(spatial)
    flops = 2.0 * out * c_per_group * _numel(kernel)
    return flops, float(_numel(x) + _numel(w) + out)


def op_cost(name: str, input_dims: Dims, input_types: Sequence[str]) -> OpCost | None:
    """FLOPs and bytes of an aten op from its recorded input shapes and dtypes; None when the op is
    not modelled or its shapes are missing or inconsistent."""
    op = name.removeprefix("aten::")
    family = _family(op)
    shaped = [d for d in input_dims if d]
    if family is None or not shaped:
        return None
    dtype_name = next((t for t, d in zip(input_types, input_dims, strict=False)
                       if d and t in _DTYPES), "float")
    size, dtype = _DTYPES[dtype_name]
    work: tuple[float, float] | None
    if family == "gemm":
        work = _gemm(op, input_dims) if len(input_dims) >= 2 else None
    elif family == "conv":
        work = _conv(input_dims) if len(input_dims) >= 2 else None
    elif family == "embedding_bag":
        work = _embedding(op, input_dims)
    elif family == "sdpa":
        work = _sdpa(input_dims)
    else:
        largest = max(_numel(d) for d in shaped)
        inputs = sum(_numel(d) for d in shaped)
        # copy_'s destination is an input already counted (written, not read); reductions write
        # (at least) one element.
        out = 0 if op == "copy_" else 1 if family == "reduction" else largest
        work = _FLOPS_PER_ELEMENT[family] * largest, float(inputs + out)
    if work is None:
        return None
    flops, elements = work
    return OpCost(op, family, flops, elements * size, dtype)


def _embedding(op: str, dims: Dims) -> tuple[float, float] | None:
    """Lookups read one table row per index (the table itself is not streamed); bags sum rows."""
    if len(dims) < 2 or len(dims[0]) != 2 or not dims[1]:
        return None
    dim, lookups = dims[0][1], _numel(dims[1])
    bags = _numel(dims[2]) if op != "embedding" and len(dims) > 2 and dims[2] else lookups
    # Indices are int64 while rows are of the table's dtype; counted in table elements (x2 for int64
    # at fp32) so the byte count stays in one unit.
    return float(lookups * dim), float(lookups * dim + 2 * lookups + bags * dim)


def _sdpa(dims: Dims) -> tuple[float, float] | None:
    """Attention as QK^T and PV matmuls over [batch, heads, seq, head_dim] q/k/v."""
    if len(dims) < 3 or len(dims[0]) != 4 or len(dims[1]) != 4:
        return None
    b, h, lq, d = dims[0]
    lk = dims[1][2]
    flops = 4.0 * b * h * lq * lk * d + 5.0 * b * h * lq * lk
    return flops, float(2 * b * h * lq * d + 2 * b * h * lk * d)


def roofline(cost: OpCost, spec: DeviceSpec) -> Roofline:
    """max(compute at peak, traffic at peak bandwidth): a time the op cannot beat on the device."""
    compute = cost.flops / spec.peak_for(cost.dtype)
    memory = cost.bytes / spec.memory_bandwidth
    bound: Bound = "compute" if compute >= memory else "memory"
    return Roofline(max(compute, memory), compute, memory, bound)


def op_cost_from_args(name: str, args_json: str) -> OpCost | None:
    """op_cost of an events-table row: its ``args`` JSON carries Kineto's record_shapes fields."""
    try:
        args = orjson.loads(args_json) if args_json else {}
    except orjson.JSONDecodeError:
        return None
    if not isinstance(args, dict):
        return None
    dims, types = args.get("Input Dims"), args.get("Input type")
    if not isinstance(dims, list) or not all(isinstance(d, list) for d in dims):
        return None
    if not all(isinstance(x, int) for d in dims for x in d):
        return None
    type_list = [str(t) for t in types] if isinstance(types, list) else []
    return op_cost(name, dims, type_list)
