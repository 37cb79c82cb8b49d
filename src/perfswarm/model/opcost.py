"""FLOPs and bytes of aten ops from recorded shapes (Kineto ``Input Dims`` / ``Input type``),
and the roofline time and bound of an op on a device spec."""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Final, Literal, NamedTuple

import msgspec
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
# the reduced-precision floating-point ones, by their spec peak key: half a float32's bytes, a
# speedup only where the hardware has units for them (a CPU's avx512_bf16, AMX; a GPU's tensor
# cores)
REDUCED_DTYPES: frozenset[str] = frozenset({"bf16", "fp16"})
# the families whose work a CPU's bf16/fp16 units speed up (matrix products, convolutions):
# elementwise math in them converts to float32 and back on any CPU
MATRIX_FAMILIES: frozenset[str] = frozenset({"gemm", "conv", "conv_backward"})
# the floating-point ones (an activation's, a parameter's: not indices or masks)
FLOAT_TYPES: frozenset[str] = frozenset({"float", "double", "c10::Half", "c10::BFloat16",
                                          "c10::Float8_e4m3fn", "c10::Float8_e5m2"})
_ELEMENTWISE = frozenset({
    "add", "add_", "sub", "sub_", "mul", "mul_", "div", "div_", "relu", "relu_", "gelu", "silu",
    "silu_", "sigmoid", "tanh", "exp", "log", "sqrt", "rsqrt", "pow", "neg", "abs", "clamp",
    "clamp_", "clamp_min", "clamp_min_", "clamp_max", "clamp_max_", "where", "threshold_backward",
    "gelu_backward", "sigmoid_backward", "tanh_backward", "silu_backward", "dropout",
    "native_dropout", "native_dropout_backward", "bernoulli_", "uniform_", "normal_", "fill_",
    "zero_", "addcmul_", "addcdiv_", "lerp_", "maximum", "minimum", "lt", "le", "gt", "ge", "eq",
    "ne", "masked_fill", "masked_fill_", "isneginf", "isinf", "isnan", "logical_not",
    "logical_and", "logical_or", "log_sigmoid_forward", "log_sigmoid_backward", "index",
    "index_select", "index_add_", "_index_put_impl_", "index_put_", "gather", "scatter",
    "scatter_", "scatter_add_",
})
_REDUCTIONS = frozenset({"sum", "mean", "amax", "amin", "max", "min", "prod", "norm", "var",
                         "std", "argmax", "argmin", "linalg_vector_norm", "all", "any", "cumsum",
                         "sort", "topk", "nll_loss", "nll_loss_forward", "nll_loss_nd",
                         "nll_loss_backward", "nll_loss2d_forward", "mse_loss",
                         "binary_cross_entropy_with_logits", "cross_entropy_loss"})
_POOLS = frozenset({"max_pool2d", "max_pool2d_with_indices", "max_pool2d_with_indices_backward",
                    "avg_pool2d", "avg_pool2d_backward", "adaptive_avg_pool2d",
                    "_adaptive_avg_pool2d", "_adaptive_avg_pool2d_backward",
                    "adaptive_max_pool2d", "max_pool1d", "avg_pool1d"})
_CONVS = frozenset({"conv2d", "conv1d", "conv3d", "convolution", "_convolution",
                    "cudnn_convolution", "mkldnn_convolution", "miopen_convolution",
                    "_slow_conv2d_forward", "thnn_conv2d", "slow_conv3d"})
_CONV_BACKWARDS = frozenset({"convolution_backward", "mkldnn_convolution_backward",
                             "cudnn_convolution_backward", "miopen_convolution_backward",
                             "_slow_conv2d_backward"})
_EMBEDDINGS = frozenset({"embedding_bag", "_embedding_bag", "_embedding_bag_forward_only",
                         "embedding", "_embedding_bag_backward", "_embedding_bag_dense_backward",
                         "_embedding_bag_sparse_backward", "embedding_backward",
                         "embedding_dense_backward"})
_NORMS = frozenset({"layer_norm", "native_layer_norm", "batch_norm", "native_batch_norm",
                    "group_norm", "native_group_norm", "rms_norm", "_fused_rms_norm",
                    "cudnn_batch_norm", "native_layer_norm_backward", "native_batch_norm_backward",
                    "cudnn_batch_norm_backward", "native_group_norm_backward"})
_SOFTMAX = frozenset({"softmax", "_softmax", "log_softmax", "_log_softmax", "_safe_softmax",
                      "_softmax_backward_data", "_log_softmax_backward_data"})
_COPIES = frozenset({"copy_", "to", "_to_copy", "clone", "contiguous", "cat", "stack"})
# Rows picked by index from a matrix: an embedding lookup without bags, priced as a copy.
_GATHERS = frozenset({"index_select"})
_LOOKUPS = ("embedding_bag", "gather")  # families whose first input is looked up, not streamed
_SDPA = frozenset({"scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
                   "_scaled_dot_product_efficient_attention", "_flash_attention_forward",
                   "_efficient_attention_forward",
                   "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_attention_math",
                   "_scaled_dot_product_flash_attention_for_cpu"})
# The fused attention kernels' own ops take q, k and v as [batch, seq, heads, head_dim]; the
# scaled_dot_product_* ops (and the CPU's) as [batch, heads, seq, head_dim]
_SEQ_SECOND = frozenset({"_efficient_attention_forward", "_flash_attention_forward",
                         "_efficient_attention_backward", "_flash_attention_backward"})
PAGE_BYTES: Final = 4096
# Per-element FLOPs of the families whose cost is a multiple of the largest tensor.
_FLOPS_PER_ELEMENT = {"elementwise": 1.0, "reduction": 1.0, "norm": 5.0, "softmax": 5.0,
                      "pool": 1.0, "copy": 0.0}


@dataclass(frozen=True)
class OpCost:
    """Work of one op: what a roofline needs."""

    op: str          # aten name without the ``aten::`` prefix
    family: str      # one of FAMILIES
    flops: float
    bytes: float     # minimum traffic: every input read once, every output written once
    dtype: str       # spec peak key (fp32, fp16, bf16, ...)
    fixed_bytes: float = 0.0  # of `bytes`, what parameters move (no batch dimension)
    batched: bool = True      # some input has a batch dimension (not all are parameters)
    input_bytes: float = 0.0  # the first input's bytes (what a fused producer would not write)
    b_transposed: bool = False  # a GEMM's second operand column-major (nn.Linear's weight)
    a_transposed: bool = False  # its first operand column-major (a weight gradient's)
    conv_out: tuple[int, ...] = ()  # a convolution's output size per spatial dimension
    # attention's spread (0 for other ops): how far apart a head's consecutive rows lie (q's
    # sequence stride, up to a page) over a row's own bytes, 1 where they are contiguous.
    # nn.MultiheadAttention hands q, k and v over as views of [L, B, E], rows B x E apart: the
    # CPU's flash kernel took 1.05x, 1.33x and 2.1-2.3x the contiguous time at spreads 32, 64
    # and 128 (a head of 8, rows 1, 2 and 4+ KB apart), 1.1x at 32 (a head of 32, 4+ KB), which
    # no count of FLOPs or bytes shows: each row read touches its own lines and pages
    row_spread: float = 0.0
    # a oneDNN convolution run as GEMMs over all its pixels (`pointwise_parts`)
    pointwise: bool = False
    # a convolution backward's: whether it computes the input's gradient and the weight's
    # (`conv_gradients`); () for any other op
    gradients: tuple[bool, ...] = ()

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


FAMILIES = ("gemm", "conv", "depthwise_conv", "conv_backward", "embedding_bag", "gather", "sdpa",
            "elementwise", "reduction", "norm", "softmax", "pool", "copy")


def _element(types: Sequence[str], dims: Dims) -> tuple[int, str]:
    """(bytes, spec peak key) of an op's data: its first shaped input's dtype, else float."""
    return next((_DTYPES[t] for t, d in zip(types, dims, strict=False) if d and t in _DTYPES),
                _DTYPES["float"])


def element_bytes(shapes: Shapes) -> int:
    """Bytes of one value of an op's data (its first shaped input's dtype, else float)."""
    return _element(shapes.types, shapes.dims)[0]


def _family(op: str) -> str | None:
    if op in {"mm", "matmul", "addmm", "bmm", "baddbmm", "linear"}:
        return "gemm"
    for family, names in (("conv", _CONVS), ("conv_backward", _CONV_BACKWARDS),
                          ("embedding_bag", _EMBEDDINGS), ("gather", _GATHERS), ("sdpa", _SDPA),
                          ("elementwise", _ELEMENTWISE), ("reduction", _REDUCTIONS),
                          ("norm", _NORMS), ("softmax", _SOFTMAX), ("pool", _POOLS),
                          ("copy", _COPIES)):
        if op in names:
            return family
    return None


def has_cost_model(name: str) -> bool:
    """Whether op_cost models ops of this name (given consistent shapes)."""
    return _family(name.removeprefix("aten::")) is not None


def _operands(op: str) -> tuple[int, int]:
    """Which inputs a matmul-like op multiplies (addmm and baddbmm add their first)."""
    return (1, 2) if op in {"addmm", "baddbmm"} else (0, 1)


def gemm_dims(op: str, dims: Dims) -> tuple[int, int, int, int] | None:
    """(batch, m, k, n) of a matmul-like op (`op` without ``aten::``); None when the shapes do
    not fit. nn.Linear's weight is [n, k]; a matrix-vector product has n = 1."""
    if op == "linear":
        if len(dims) < 2 or len(dims[0]) < 1 or len(dims[1]) != 2:
            return None
        return 1, _numel(dims[0][:-1]), dims[0][-1], dims[1][0]
    i, j = _operands(op)
    if len(dims) <= j:
        return None
    a, b = dims[i], dims[j]
    if op == "matmul" and len(a) >= 1 and len(b) == 1 and a[-1] == b[0]:
        return 1, _numel(a[:-1]), b[0], 1
    if len(a) < 2 or len(b) < 2 or a[-1] != b[-2]:
        return None
    return max(_numel(a[:-2]), _numel(b[:-2])), a[-2], a[-1], b[-1]


def column_major(dims: Dims, strides: Dims, i: int) -> bool:
    """Whether input `i` is column-major in its last two dimensions (a transposed row-major
    matrix, or a batch of them: its columns contiguous), as its recorded strides say; False
    where none were recorded."""
    if (len(strides) <= i or len(dims) <= i or len(dims[i]) < 2
            or len(strides[i]) != len(dims[i])):
        return False
    rows, cols = dims[i][-2:]
    return strides[i][-2] == 1 and strides[i][-1] >= rows > 1 and cols > 1


def b_transposed(op: str, dims: Dims, strides: Dims) -> bool:
    """Whether a matmul-like op's second operand is column-major: how nn.Linear passes its
    weight. CPU GEMM libraries pack such an operand first, a cost of its size that a small
    batch does not amortize."""
    return op == "linear" or column_major(dims, strides, _operands(op)[1])


def _gemm(op: str, dims: Dims) -> tuple[float, float] | None:
    """(flops, elements moved) of a matmul-like op; None when the shapes do not fit."""
    found = gemm_dims(op, dims)
    if found is None:
        return None
    batch, m, k, n = found
    moved = batch * (m * k + k * n + m * n)
    if op in {"addmm", "baddbmm"}:
        moved += _numel(dims[0])
    elif op == "linear" and len(dims) > 2 and dims[2]:
        moved += n
    return 2.0 * batch * m * k * n, float(moved)


# where a convolution op's stride, padding and dilation stand among its inputs (Kineto's
# "Concrete Inputs", recorded with the shapes since torch 2.1); None: it takes none (ATen's own
# 2-D convolution runs undilated ones only)
_CONV_GEOMETRY: Final[dict[str, tuple[int, int, int | None]]] = {
    **dict.fromkeys(("convolution", "_convolution", "conv1d", "conv2d", "conv3d"), (3, 4, 5)),
    "mkldnn_convolution": (4, 3, 5), "cudnn_convolution": (3, 2, 4),
    "miopen_convolution": (4, 3, 5), "_slow_conv2d_forward": (4, 5, None),
    "convolution_backward": (4, 5, 6), "_slow_conv2d_backward": (4, 5, None)}


def _int_list(text: str, rank: int) -> tuple[int, ...] | None:
    """A recorded int list ("[2, 2]"; one value stands for every dimension) of `rank` values."""
    try:
        values = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    if (not isinstance(values, list) or not values
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in values)):
        return None
    if len(values) == 1:
        values = values * rank
    return tuple(values) if len(values) == rank else None


def _geometry(where: tuple[int, int, int | None], concrete: Sequence[str], rank: int
              ) -> tuple[tuple[int, ...] | None, ...]:
    """(stride, padding, dilation) of a convolution recorded with them at `where`."""
    return tuple(_int_list(concrete[i] if i is not None else "[1]", rank) for i in where)


def conv_geometry(op: str, concrete: Sequence[str], rank: int
                  ) -> tuple[tuple[int, ...] | None, ...]:
    """(stride, padding, dilation) of the convolution op `op` from its recorded `concrete`
    inputs, `rank` values each (None where one is not an int list of that many)."""
    return _geometry(_CONV_GEOMETRY[op.removeprefix("aten::")], concrete, rank)


def conv_output(op: str, dims: Dims, concrete: Sequence[str]) -> tuple[int, ...]:
    """A convolution's output size per spatial dimension: from its recorded stride, padding and
    dilation where the trace holds them, else the input's ('same' padding, stride 1; also for
    a transposed convolution, which aten::convolution marks in its 7th input)."""
    x, w = dims[0], dims[1]
    spatial, kernel = x[2:], w[2:]
    where = _CONV_GEOMETRY.get(op)
    transposed = op in ("convolution", "_convolution") and len(concrete) > 6 and \
        concrete[6] != "False"
    if where is not None and len(concrete) > max(i or 0 for i in where) and not transposed:
        stride, pad, dilation = _geometry(where, concrete, len(spatial))
        if (stride is not None and pad is not None and dilation is not None
                and min(stride) > 0 and min(dilation) > 0):
            return tuple(max(1, (n + 2 * p - d * (k - 1) - 1) // s + 1) for n, k, s, p, d
                         in zip(spatial, kernel, stride, pad, dilation, strict=True))
    return tuple(spatial)


def _conv(dims: Dims, out_spatial: Sequence[int]) -> tuple[float, float]:
    """Direct convolution cost at the output size `out_spatial`."""
    x, w = dims[0], dims[1]
    n, c_out, c_per_group, kernel = x[0], w[0], w[1], w[2:]
    out = n * c_out * _numel(out_spatial)
    flops = 2.0 * out * c_per_group * _numel(kernel)
    return flops, float(_numel(x) + _numel(w) + out)


def _depthwise(dims: Dims) -> bool:
    """One filter per channel (groups = channels): weight [C, 1, k...] on C input channels."""
    x, w = dims[0], dims[1]
    return len(x) >= 2 and len(w) >= 2 and w[1] == 1 and w[0] == x[1] > 1


def _conv_backward(dims: Dims, gradients: tuple[bool, bool]) -> tuple[float, float] | None:
    """The input's and the weight's gradients from (grad_output, input, weight), those of
    `gradients` (`conv_gradients`): each a convolution of the forward's work, the output
    gradient's shape giving the output size exactly. The input's gradient reads the output's
    and the weight and writes an input; the weight's reads the output's and the input and
    writes a weight."""
    if len(dims) < 3:
        return None
    grad, x, w = dims[0], dims[1], dims[2]
    if len(x) < 3 or len(w) != len(x) or len(grad) != len(x):
        return None
    parts = sum(gradients)
    flops = parts * 2.0 * _numel(grad) * w[1] * _numel(w[2:])
    return flops, float(_numel(grad) + parts * (_numel(x) + _numel(w)))


def conv_gradients(op: str, concrete: Sequence[str]) -> tuple[bool, bool]:
    """Whether a convolution's backward `op` computes the input's gradient and the weight's,
    from its recorded output_mask (`_OUTPUT_MASK`): autograd does not ask a network's first
    layer, whose input needs none, for the input's gradient (on the 1-D conv net's [8, 1,
    4000] -> 40 front end, 80 taps at stride 16, it would take 5-7x the weight's). Both
    where the trace does not record the mask."""
    mask = _output_mask(op, concrete)
    return (mask[0], mask[1]) if mask else (True, True)


def _output_mask(op: str, concrete: Sequence[str]) -> tuple[bool, ...]:
    """A convolution backward's recorded output_mask (input, weight, bias); () where the op
    takes none or the trace does not hold it."""
    at = _OUTPUT_MASK.get("aten::" + op.removeprefix("aten::"))
    mask = _bools(concrete[at]) if at is not None and len(concrete) > at else ()
    return mask if len(mask) == 3 else ()


def op_cost(name: str, input_dims: Dims, input_types: Sequence[str],
            fixed: Sequence[bool] = (), strides: Dims = (),
            concrete: Sequence[str] = ()) -> OpCost | None:
    """FLOPs and bytes of an aten op from its recorded input shapes and dtypes; None when the op is
    not modelled or its shapes are missing or inconsistent. `fixed` marks the inputs that are
    parameters (they keep their size when the batch grows); `strides` (where recorded) tell a
    GEMM's operand layout, `concrete` (Kineto's "Concrete Inputs") a convolution's stride,
    padding and dilation."""
    op = name.removeprefix("aten::")
    family = _family(op)
    shaped = [d for d in input_dims if d]
    if family is None or not shaped:
        return None
    size, dtype = _element(input_types, input_dims)
    work: tuple[float, float] | None
    conv_out: tuple[int, ...] = ()
    gradients: tuple[bool, ...] = ()
    rows = 0.0
    if family == "gemm":
        work = _gemm(op, input_dims) if len(input_dims) >= 2 else None
    elif family == "conv":
        if len(input_dims) < 2 or len(input_dims[0]) < 3 or len(input_dims[1]) != len(
                input_dims[0]):
            return None
        conv_out = conv_output(op, input_dims, concrete)
        work = _conv(input_dims, conv_out)
        if _depthwise(input_dims):
            family = "depthwise_conv"
    elif family == "conv_backward":
        gradients = conv_gradients(op, concrete)
        work = _conv_backward(input_dims, gradients)
    elif family in _LOOKUPS:
        work = _embedding(op, input_dims)
    elif family == "sdpa":
        work = _sdpa(op, input_dims)
        rows = _row_spread(name, input_dims, strides, size)
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
    marks = [bool(f) for f in fixed] + [False] * (len(input_dims) - len(fixed))
    # An embedding table is looked up, not streamed: it moves no bytes of its own.
    streamed = [i for i, d in enumerate(input_dims) if d and not (family in _LOOKUPS and i == 0)]
    fixed_elements = sum(_numel(input_dims[i]) for i in streamed if marks[i])
    batched = any(not marks[i] for i, d in enumerate(input_dims) if d)
    return OpCost(op, family, flops, elements * size, dtype,
                  min(float(fixed_elements), elements) * size, batched,
                  float(_numel(input_dims[0]) * size) if input_dims[0] else 0.0,
                  family == "gemm" and b_transposed(op, input_dims, strides),
                  family == "gemm" and column_major(input_dims, strides, _operands(op)[0]),
                  conv_out, rows, _pointwise(op, input_dims, concrete), gradients)


def _pointwise(op: str, dims: Dims, concrete: Sequence[str]) -> bool:
    """`OpCost.pointwise` of an op at its recorded inputs: a oneDNN convolution (forward or
    backward, `_BLOCKED_CONVS`; 1-D or 2-D) with a 1x1 kernel, unstrided, unpadded, undilated
    and groups 1, where the trace records its geometry (and a backward its output_mask).
    (A transposed one's backward, whose weight is [C_in, C_out], is the same GEMMs where it
    passes for one.)"""
    if op not in _BLOCKED_CONVS:
        return False
    backward = op == "convolution_backward"
    if len(dims) < 2 + backward or len(concrete) != len(dims):
        return False
    x, w = dims[backward], dims[1 + backward]
    rank = len(x) - 2
    if (rank not in (1, 2) or len(w) != len(x) or x[1] != w[1] or _numel(w[2:]) != 1
            or (backward and (len(dims[0]) != len(x) or dims[0][1] != w[0]))
            or conv_geometry(op, concrete, rank)
            != ((1,) * rank, (0,) * rank, (1,) * rank)):
        return False
    return not backward or bool(_output_mask(op, concrete))


def _bools(text: str) -> tuple[bool, ...]:
    """A recorded bool list ("[True, False, True]"); () where it is none."""
    values = [v.strip() for v in text.strip("[]").split(",")]
    return tuple(v == "True" for v in values) if all(
        v in ("True", "False") for v in values) else ()


# the convolutions oneDNN computes in channel blocks on a CPU, forward and backward, and the
# functional forms the calibration sweep calls, which ATen runs as mkldnn_convolution there; not
# ATen's own per-sample GEMMs over unfolded input (_slow_conv2d_*), nor a transposed convolution,
# whose innermost recorded op is aten::_convolution with its weight as [C_in, C_out, ...]
_BLOCKED_CONVS = frozenset({"mkldnn_convolution", "convolution_backward", "conv1d", "conv2d"})


def channel_blocked(cost: OpCost, dims: Dims, lanes: int) -> OpCost:
    """A CPU convolution's cost at the channels oneDNN computes: its kernels hold channels in
    blocks of a vector register's `lanes` (nChw16c on AVX-512), so a layer of 24 output
    channels computes 32 and one of 48 computes 48: doubling the width from 24 does 1.5x the
    blocks, not 2x (a U-Net's [72 -> 24] 3x3 convolution ran x2.41 at twice the width, its
    FLOPs x4). An input of fewer channels than a block (an image's 3) is read in its plain
    layout, unpadded; a depthwise one has one block count for both. Other ops (`_BLOCKED_CONVS`)
    as they are."""
    if cost.op not in _BLOCKED_CONVS or len(dims) < 2 or len(dims[0]) < 3:
        return cost
    if cost.family in ("conv", "depthwise_conv"):
        inputs, outputs = dims[0][1], dims[1][0]
    elif cost.family == "conv_backward" and len(dims) >= 3 and len(dims[1]) >= 3:
        inputs, outputs = dims[1][1], dims[0][1]
    else:
        return cost

    def padded(channels: int) -> float:
        return math.ceil(channels / lanes) * lanes / channels if channels >= 1 else 1.0

    factor = padded(outputs)
    if cost.family != "depthwise_conv" and inputs >= lanes:
        factor *= padded(inputs)
    return cost if factor == 1.0 else replace(cost, flops=cost.flops * factor)


def tf32_if_fp32(cost: OpCost) -> OpCost:
    """An FP32 op's cost as TF32 work (its kernels ran on tensor cores: cutlass tensorop,
    s1688, sm90 xmma tf32...): bounded by the TF32 peak; other precisions as they are."""
    return replace(cost, dtype="tf32") if cost.dtype == "fp32" else cost


def scale_batch(cost: OpCost, factor: float) -> OpCost:
    """The cost at `factor` times the batch: batch-dependent bytes and FLOPs scale, parameters'
    bytes do not (every FLOP of a batched op touches one sample, so all of them scale)."""
    if not cost.batched:
        return cost
    return replace(cost, flops=cost.flops * factor,
                   bytes=cost.fixed_bytes + (cost.bytes - cost.fixed_bytes) * factor,
                   fixed_bytes=cost.fixed_bytes)


def _embedding(op: str, dims: Dims) -> tuple[float, float] | None:
    """Lookups read one table row per index (the table itself is not streamed); bags sum rows.
    index_select (self, dim, index) of a matrix gathers rows alike."""
    if op == "index_select":
        dims = [dims[0], dims[2] if len(dims) > 2 else []]
    if op in ("embedding_dense_backward", "embedding_backward"):
        # (grad_output [..., dim], indices, num_weights, ...): each looked-up row's gradient read
        # and added into its row of the table's gradient
        if len(dims) < 2 or not dims[0] or not dims[1]:
            return None
        dim, lookups = dims[0][-1], _numel(dims[1])
        return float(lookups * dim), float(2 * lookups * dim + 2 * lookups)
    if len(dims) < 2 or len(dims[0]) != 2 or not dims[1]:
        return None
    dim, lookups = dims[0][1], _numel(dims[1])
    bagged = op not in ("embedding", "index_select") and len(dims) > 2 and dims[2]
    bags = _numel(dims[2]) if bagged else lookups
    # Indices are int64 while rows are of the table's dtype; counted in table elements (x2 for int64
    # at fp32) so the byte count stays in one unit.
    return float(lookups * dim), float(lookups * dim + 2 * lookups + bags * dim)


def attention_shape(op: str, q: Sequence[int], k: Sequence[int]
                    ) -> tuple[int, int, int, int, int] | None:
    """(batch, heads, query length, key length, head dim) of an attention op (`op` without
    ``aten::``) from its q and k; None unless both are 4-d."""
    if len(q) != 4 or len(k) != 4:
        return None
    if op in _SEQ_SECOND:
        b, lq, h, d = q
        return b, h, lq, k[1], d
    b, h, lq, d = q
    return b, h, lq, k[2], d


def attention_q(name: str, dims: Dims) -> tuple[int, tuple[int, int, int, int, int]] | None:
    """Which input is an attention op's q (0 for a forward; 1 for a backward, after the
    output's gradient) and its `attention_shape`; None for other ops or shapes that do not
    fit."""
    op = name.removeprefix("aten::")
    q = 0 if op in _SDPA else 1 if _HIDDEN_GEMMS.search(op) and "attention" in op else None
    if q is None or len(dims) <= q + 1:
        return None
    found = attention_shape(op, dims[q], dims[q + 1])
    return (q, found) if found is not None else None


def _row_spread(name: str, dims: Dims, strides: Dims, size: int) -> float:
    """OpCost.row_spread of an attention op (of `size`-byte elements), from its q's recorded
    stride along the sequence (1 without strides: contiguous); 0 for other ops."""
    found = attention_q(name, dims)
    if found is None:
        return 0.0
    q, (*_, head) = found
    head = max(head, 1)
    recorded = strides[q] if len(strides) > q and len(strides[q]) == 4 else ()
    op = name.removeprefix("aten::")
    row = recorded[1 if op in _SEQ_SECOND else 2] if recorded else head
    return max(1.0, min(row * size, PAGE_BYTES) / (head * size))


def row_spread(name: str, shapes: Shapes) -> float:
    """OpCost.row_spread of an op at these shapes (0 unless it is attention)."""
    return _row_spread(name, shapes.dims, shapes.strides, element_bytes(shapes))


def heads_follow(name: str, recorded: Shapes, changed: Shapes, dims: Mapping[int, int]
                 ) -> Shapes:
    """An attention op's `changed` shapes (`recorded` with `dims` substituted) with its head
    dimension following the model's width: q, k and v are [B, H, L, D] (or [B, L, H, D]) with
    H x D the width, so a change of the width with the heads kept makes D that much larger. A
    head's D is a divisor of the width, which derived_dims does not derive for every tensor
    (it is as likely another size of its own), but the attention op says which it is: kept,
    a width x2 priced its attention x1.00 where it ran x1.5-1.95. Other ops, a width that
    does not change, or a change the heads do not divide, as `changed`."""
    found = attention_q(name, recorded.dims)
    if found is None:
        return changed
    q, (_, heads, _, _, head) = found
    width = heads * head
    if width not in dims or head in dims or dims[width] % heads:
        return changed
    # q, k and v (and a backward's output gradient and output before them and after): k and v
    # may hold fewer heads (grouped-query attention); a mask's last dimension is no head
    heads_at = range(2 * q + 3)
    return recorded.resized([
        (*new[:3], dims[width] // heads) if i in heads_at and len(old) == 4 and old[3] == head
        else new for i, (old, new) in enumerate(zip(recorded.dims, changed.dims, strict=True))])


def kernels_kept(name: str, recorded: Shapes, changed: Shapes) -> Shapes:
    """A convolution's `changed` shapes (`recorded` with a width change substituted) with its
    weight's kernel extents as recorded: a width is a count of channels, and a model made wider
    keeps its filters' taps, whatever number they share with a width (the 1-D conv net's front
    end, 80 taps in [40, 1, 80] at widths 40 and 80, had its kernel made 160 at twice the width,
    and its forward priced x2.23 where it ran x1.75). The weight is [C_out, C_in, k...], a
    convolution's second input, its backward's third. Other ops as `changed`."""
    family = _family(name.removeprefix("aten::"))
    weight = {"conv": 1, "conv_backward": 2}.get(family or "")
    if weight is None or len(recorded.dims) <= weight or len(recorded.dims[weight]) < 3:
        return changed
    old, new = recorded.dims[weight], changed.dims[weight]
    if new[2:] == old[2:]:
        return changed
    return recorded.resized([(*new[:2], *old[2:]) if i == weight else d
                             for i, d in enumerate(changed.dims)])


def _sdpa(op: str, dims: Dims) -> tuple[float, float] | None:
    """Attention as QK^T and PV matmuls over q, k and v (`attention_shape`)."""
    found = attention_shape(op, dims[0], dims[1]) if len(dims) >= 3 else None
    if found is None:
        return None
    b, h, lq, lk, d = found
    flops = 4.0 * b * h * lq * lk * d + 5.0 * b * h * lq * lk
    return flops, float(2 * b * h * lq * d + 2 * b * h * lk * d)


def roofline(cost: OpCost, spec: DeviceSpec) -> Roofline:
    """max(compute at peak, traffic at peak bandwidth): a time the op cannot beat on the device."""
    compute = cost.flops / spec.peak_for(cost.dtype)
    memory = cost.bytes / spec.memory_bandwidth
    bound: Bound = "compute" if compute >= memory else "memory"
    return Roofline(max(compute, memory), compute, memory, bound)


@dataclass(frozen=True)
class Shapes:
    """An op's recorded inputs: one dimension list per input ([] for scalars) and dtype names."""

    dims: tuple[tuple[int, ...], ...]
    types: tuple[str, ...]
    strides: tuple[tuple[int, ...], ...] = ()  # per input, where recorded: the layout
    concrete: tuple[str, ...] = ()  # per input, where recorded: an int list's value ('' else)

    def substitute(self, dims: Mapping[int, int], keep: Sequence[bool] = ()) -> Shapes:
        """Every dimension equal to a key replaced by its value, except in inputs marked `keep`
        (`resized`: the layout is kept)."""
        marks = list(keep) + [False] * (len(self.dims) - len(keep))
        return self.resized(tuple(d if marks[i] else tuple(dims.get(x, x) for x in d)
                                  for i, d in enumerate(self.dims)))

    def resized(self, dims: Sequence[Sequence[int]]) -> Shapes:
        """These inputs at new dimensions, in the same layout: each input's dimensions taken in
        the order of their recorded strides (innermost first), each stride the one inside it
        times that one's new size, times the gap the recording had between them (q of
        nn.MultiheadAttention's in-projection is a slice of [L, B, 3E]). Kept strides would
        have kept a row B x E apart at another B, and a column-major [m, k] of stride m row-major
        at twice m. A broadcast (stride 0) and a dimension of one keep theirs."""
        new = tuple(tuple(d) for d in dims)
        return Shapes(new, self.types, tuple(
            _restrided(old, st, d) for old, st, d in zip(self.dims, self.strides, new,
                                                         strict=True)) if self.strides else (),
            self.concrete)


def _restrided(old: tuple[int, ...], strides: tuple[int, ...], new: tuple[int, ...]
               ) -> tuple[int, ...]:
    """Shapes.resized's strides of one input."""
    if old == new or len(strides) != len(old) or len(new) != len(old):
        return strides
    out = list(strides)
    inner: int | None = None
    for i in sorted((i for i in range(len(old)) if strides[i] > 0 and old[i] > 1),
                    key=lambda i: (strides[i], -i)):
        if inner is not None:
            gap = strides[i] / (strides[inner] * old[inner])
            out[i] = max(1, round(out[inner] * (new[inner] * gap if gap >= 1
                                                else strides[i] / strides[inner])))
        inner = i
    return tuple(out)


def token_input(shapes: Shapes) -> tuple[int, ...] | None:
    """The first integer input of two dimensions or more: the token indices [batch,
    sequence] a compiled graph takes (torch.compile's CompiledFunction, whose other inputs
    are the parameters), None without one."""
    for dims, kind in zip(shapes.dims, shapes.types, strict=False):
        if len(dims) >= 2 and kind.endswith("int"):
            return dims
    return None


class _ShapeFields(msgspec.Struct):
    """The record_shapes fields of a row's args, as their JSON text (the rest is skipped)."""

    dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(b"null"), name="Input Dims")
    types: msgspec.Raw = msgspec.field(default=msgspec.Raw(b"null"), name="Input type")
    strides: msgspec.Raw = msgspec.field(default=msgspec.Raw(b"null"), name="Input Strides")
    concrete: msgspec.Raw = msgspec.field(default=msgspec.Raw(b"null"),
                                          name="Concrete Inputs")


_SHAPE_FIELDS: Final = msgspec.json.Decoder(_ShapeFields)


def shapes_from_args(args_json: str) -> Shapes | None:
    """The ``Input Dims``, ``Input type`` and (when well formed) ``Input Strides`` and
    ``Concrete Inputs`` of an events-table row's args or detail (Kineto's record_shapes), or
    None when absent or malformed. Tensor lists (recorded as nested lists by some versions)
    are not shapes of one input and make the row unshaped."""
    try:
        found = _SHAPE_FIELDS.decode(args_json or "{}")
    except msgspec.DecodeError:  # not JSON, or not an object
        return None
    # Every iteration records the same shapes again (only the ids differ): the fields are
    # checked and built once per distinct text of the four, as the args hold it.
    return _shapes(b"[%b,%b,%b,%b]" % (found.dims, found.types, found.strides, found.concrete))


# ops that join a list of tensors along a dimension, recorded as one TensorList input
JOINS: Final = frozenset({"aten::cat", "aten::concat", "aten::concatenate", "aten::stack"})


def joined_shapes(name: str, args_json: str) -> Shapes | None:
    """A join's (`JOINS`) recorded shapes with its tensor list as the tensor it writes (the
    list joined along the recorded dimension: [8, 48, 32, 32] and [8, 24, 32, 32] concatenated
    on 1 are [8, 72, 32, 32]), so it is priced as a copy of it: every input read once, the
    result written once. `shapes_from_args` leaves tensor lists out (a U-Net's skip
    concatenation was never priced: 0.95 ms a step held where it ran 2.25 at twice the width).
    None where the list is empty, its tensors do not join, or the dimension is not recorded."""
    if name not in JOINS:
        return None
    try:
        args = orjson.loads(args_json or "{}")
    except orjson.JSONDecodeError:
        return None
    if not isinstance(args, dict):
        return None
    dims, concrete = args.get("Input Dims"), args.get("Concrete Inputs")
    if not isinstance(dims, list) or not isinstance(concrete, list) or len(dims) != 2 \
            or len(concrete) != 2 or not isinstance(concrete[1], str):
        return None
    tensors = _int_lists(dims[0])
    stack = name == "aten::stack"
    if not tensors or not concrete[1].lstrip("-").isdigit() \
            or any(len(t) != len(tensors[0]) or not t for t in tensors):
        return None
    rank = len(tensors[0]) + stack
    axis = int(concrete[1]) % rank if -rank <= int(concrete[1]) < rank else -1
    if axis < 0:
        return None
    if stack:
        if any(t != tensors[0] for t in tensors):
            return None
        joined = (*tensors[0][:axis], len(tensors), *tensors[0][axis:])
    else:
        if any(t[:axis] + t[axis + 1:] != tensors[0][:axis] + tensors[0][axis + 1:]
               for t in tensors):
            return None
        joined = (*tensors[0][:axis], sum(t[axis] for t in tensors), *tensors[0][axis + 1:])
    return Shapes((joined, ()), ("float", "Scalar"))


@functools.lru_cache(maxsize=1 << 16)
def _shapes(fields: bytes) -> Shapes | None:
    dims_value, types, strides_value, concrete = orjson.loads(fields)
    dims = _int_lists(dims_value)
    if dims is None:
        return None
    type_list = tuple(str(t) for t in types) if isinstance(types, list) else ()
    strides = _int_lists(strides_value)
    # int lists only (a convolution's stride, a view's size: what the op is); a scalar's value
    # (an optimizer's step size, new each step) would make each step's call another op
    values = (tuple(str(v) if t == "ScalarList" else "" for v, t in zip(concrete, type_list,
                                                                           strict=True))
              if isinstance(concrete, list) and len(concrete) == len(dims) == len(type_list)
              else ())
    return Shapes(dims, type_list, strides if strides and len(strides) == len(dims) else (),
                  values)


# Recurrent layers (nn.LSTM, nn.GRU, nn.RNN): each takes its input, its hidden state and every
# layer's weights as one list (its third input); batch_first=False (the default) runs them on
# [sequence, batch, features]
RNN_OPS: Final = ("aten::lstm", "aten::gru", "aten::rnn_tanh", "aten::rnn_relu")
# Advanced indexing (x[idx], x[idx] = y): its work is the indexed rows, which its list of
# index tensors (recorded untyped, '') says and the trace does not: reading all of `x` priced a
# SparseAdam step's gather of 5k rows of [200000, 64] at 79 GB/s on a CPU that streams 30
_INDEXED: Final = frozenset({"index", "index_put", "index_put_", "_index_put_impl_"})


def unknown_work(name: str, shapes: Shapes) -> bool:
    """Whether the recorded shapes cannot say an op's work: a sparse input (shaped, but with
    no strides where the op records them: a sparse layout has none), whose work is its
    nonzeros (an nn.Embedding(sparse=True)'s gradient [200000, 64] added into the weight
    touches a batch's rows, not 200,000: priced dense, 331 GB/s on a CPU that streams 30); or
    advanced indexing by an index list recorded untyped (_INDEXED)."""
    sparse = bool(shapes.strides) and any(d and not st for d, st in zip(
        shapes.dims, shapes.strides, strict=False))
    return sparse or (name.removeprefix("aten::") in _INDEXED and "" in shapes.types)


@functools.lru_cache(maxsize=1 << 16)
def shapes_cost(name: str, shapes: Shapes) -> OpCost | None:
    """op_cost of an op's recorded shapes, computed once per distinct (name, shapes); None
    where they cannot say its work (unknown_work)."""
    if unknown_work(name, shapes):
        return None
    return op_cost(name, shapes.dims, shapes.types, concrete=shapes.concrete)


def _int_lists(value: object) -> tuple[tuple[int, ...], ...] | None:
    """A list of lists of integers (one per input) as tuples; None for anything else."""
    if not isinstance(value, list) or not all(
            isinstance(d, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in d)
            for d in value):
        return None
    return tuple(tuple(d) for d in value)


def batch_scaled(name: str, shapes: Shapes, fixed: Sequence[bool], factor: float) -> Shapes:
    """The shapes at `factor` times the batch, as a kernel model reads them (scale_batch scales
    the cost; this says which dimension grew). A GEMM's batch is its m when the second operand
    is a parameter, its n when the first is, its k when neither is (a weight's gradient sums
    over the batch), and its leading batch when both are 3-d; any other op's non-parameter
    inputs grow in their leading dimension, but an LSTM layer's input [T, B, I] in its B."""
    if factor == 1.0:
        return shapes
    dims = [list(d) for d in shapes.dims]
    marks = [bool(f) for f in fixed] + [False] * (len(dims) - len(fixed))

    def grow(i: int, axis: int) -> None:
        if -len(dims[i]) <= axis < len(dims[i]) and not marks[i]:
            dims[i][axis] = max(1, round(dims[i][axis] * factor))

    op = name.removeprefix("aten::")
    if _family(op) == "gemm" and op not in ("linear", "matmul") and gemm_dims(op, shapes.dims):
        i, j = _operands(op)
        if len(dims[i]) == 3 and len(dims[j]) == 3 and not marks[i] and not marks[j]:
            grow(i, 0)
            grow(j, 0)
        elif marks[j]:
            grow(i, -2)
        elif marks[i]:
            grow(j, -1)
        else:
            grow(i, -1)
            grow(j, -2)
    else:
        for i in range(len(dims)):
            grow(i, 1 if i == 0 and lstm_shape(op, shapes.dims) else 0)
    return shapes.resized(dims)


# Composite ops whose work is matrix products inside (recurrent layers, attention backward):
# a memory-bound price would call them modelled while missing their FLOPs, so those without a
# cost model of their own (`_composite`) stay unmodelled (kept at their measured time, and
# counted so).
_HIDDEN_GEMMS = re.compile(r"rnn|lstm|gru|attention.*backward")
_LSTM_GATES = 4  # mkldnn_rnn_layer runs LSTM layers (torch's CPU LSTM): four gates per unit
RNN_FAMILIES: Final = ("rnn", "rnn_backward")  # an LSTM layer and its backward (`_composite`)


def lstm_shape(op: str, dims: Dims) -> tuple[int, int, int, int] | None:
    """(T, B, I, H) of an LSTM layer or its backward (`_composite`'s shapes); None otherwise."""
    if (op not in ("mkldnn_rnn_layer", "mkldnn_rnn_layer_backward") or len(dims) < 7
            or len(dims[0]) != 3 or len(dims[5]) != 2):
        return None
    steps, batch, inputs = dims[0]
    return steps, batch, inputs, dims[5][1]


def _composite(op: str, dims: Dims) -> tuple[str, float, float] | None:
    """(family, FLOPs, elements moved) of the composite ops priced by the matrix products
    inside them; None for others or shapes that do not fit.

    - mkldnn_rnn_layer (input [T, B, I], w_ih [4H, I], w_hh [4H, H], b_ih, b_hh, hx [B, H],
      cx [B, H]): per time step the gates' two GEMMs, 2 * B * 4H * (I + H) FLOPs, and a few
      elementwise ones per gate; H is read off hx, so a changed width follows (the weights'
      4H is a flattened dimension --dim does not see); its backward (the same inputs first,
      family rnn_backward, swept apart as attention's is) twice that: the input's and the
      weights' gradients;
    - attention backward (grad_out, q, k, v, out, ... with q [B, heads, L, D]): recomputing
      QK^T and the gradients of P, V, Q and K, five matrix products of the forward's two."""
    lstm = lstm_shape(op, dims)
    if lstm is not None:
        steps, batch, inputs, hidden = lstm
        gates = _LSTM_GATES * hidden
        flops = steps * batch * gates * (2.0 * (inputs + hidden) + 10.0)
        moved = (steps * batch * (inputs + hidden) + gates * (inputs + hidden + 2)
                 + 4 * batch * hidden)
        if op.endswith("backward"):
            return "rnn_backward", 2.0 * flops, 2.0 * moved
        return "rnn", flops, float(moved)
    if _HIDDEN_GEMMS.search(op) and "attention" in op:
        found = attention_shape(op, dims[1], dims[2]) if len(dims) >= 5 else None
        if found is None or any(len(d) != 4 for d in dims[:4]):
            return None
        b, h, lq, lk, d = found
        flops = 10.0 * b * h * lq * lk * d + 5.0 * b * h * lq * lk
        return "sdpa_backward", flops, float(5 * b * h * lq * d + 3 * b * h * lk * d)
    return None

def lstm_parts(op: str, dims: Dims) -> list[tuple[int, OpCost, Dims]] | None:
    """(count, cost, dims) of the ops an LSTM layer (mkldnn_rnn_layer, `_composite`'s shapes)
    runs inside, as oneDNN's RNN primitive runs it on a CPU without brgemm (its `ref` RNN on
    an AVX2 host: rnn_utils' init_conf merges the layer's GEMM across time steps, and an
    LSTM backward's weight GEMMs too, `merge_gemm_layer` and `merge_gemm_iter`): the input's
    GEMM over all T time steps at once, then per time step the hidden state's small GEMM
    [B, H] x [H, 4H] and one fused elementwise pass over the gates [B, 4H]; its backward per
    time step the gates' elementwise gradient and the hidden state's gradient [B, 4H] x
    [4H, H], then over all T x B rows at once the input's gradient and both weights'
    [I or H, T x B] x [T x B, 4H]. T small GEMMs cost a fixed time each that one [T x B, 4H]
    matrix product's FLOPs do not show: at B = 8, H = 40 doubling H is x2.2, not the x4 of the
    FLOPs. Against the layer alone (H 40-160, B 4-32 at T 35), the backward's ratio
    between cases differing in B missed by 0.23 (mean |log|) with the weights' gradients per
    time step, 0.07 merged (docs/benchmarks.md, twenty-seventh pass). The per-time-step bias
    gradient (a reduction of the gates) is left out: priced as an ATen reduction, its fixed
    cost a call made the backward's ratios worse. None for other ops or shapes that do not
    fit."""
    found = lstm_shape(op, dims)
    if found is None:
        return None
    steps, batch, inputs, hidden = found
    gates = _LSTM_GATES * hidden
    rows = steps * batch
    if op.endswith("backward"):
        gemms = [(steps, batch, gates, hidden), (1, rows, gates, inputs),
                 (1, inputs, rows, gates), (1, hidden, rows, gates)]
    else:
        gemms = [(1, rows, inputs, gates), (steps, batch, hidden, gates)]
    parts: list[tuple[int, OpCost | None, Dims]] = [
        (steps, op_cost("sigmoid", ((batch, gates),), ("float",)), ((batch, gates),)),
        *((n, op_cost("mm", ((m, k), (k, c)), ("float", "float")), ((m, k), (k, c)))
          for n, m, k, c in gemms)]
    return [(n, cost, d) for n, cost, d in parts if cost is not None]


def _asked(cost: OpCost, input_grad: Dims, weight_grad: Dims) -> list[Dims]:
    """Of a convolution backward's GEMMs, the input's gradient's and the weight's, those its
    output_mask asks for (`OpCost.gradients`)."""
    return [d for d, wanted in zip((input_grad, weight_grad), cost.gradients, strict=True)
            if wanted]


def slow_conv_parts(cost: OpCost, dims: Dims) -> list[tuple[int, OpCost, Dims]] | None:
    """(count, cost, dims) of the ops ATen's own 2-D convolution (_slow_conv2d: a 1x1 one at a
    batch under 16 on one thread, where oneDNN is slower) runs inside: per sample, one GEMM of
    the weight [C_out, C_in x k] with the unfolded input [C_in x k, H_out x W_out]; its
    backward per sample the input's gradient [C_in x k, C_out] x [C_out, H_out x W_out] and the
    weight's [C_out, H_out x W_out] x [H_out x W_out, C_in x k], those its output_mask asks
    for (`_asked`); each with a copy of the unfolded input where the kernel is not 1x1
    (im2col). A MobileNet's pointwise convolutions at twice the width ran x3.2-3.4 where a
    direct convolution's model said x2.4-2.9: small GEMMs, whose sweep knows their shapes.
    None for other ops or shapes that do not fit."""
    if cost.op not in ("_slow_conv2d_forward", "_slow_conv2d_backward"):
        return None
    backward = cost.op == "_slow_conv2d_backward"
    if len(dims) < 2 + backward:
        return None
    x, w = dims[backward], dims[1 + backward]
    if len(x) != 4 or len(w) != 4 or (backward and len(dims[0]) != 4):
        return None
    spatial = _numel(dims[0][2:]) if backward else _numel(cost.conv_out)
    batch, c_out, unfolded = x[0], w[0], _numel(w[1:])
    gemms = (_asked(cost, ((unfolded, c_out), (c_out, spatial)),
                    ((c_out, spatial), (spatial, unfolded)))
             if backward else [((c_out, unfolded), (unfolded, spatial))])
    parts: list[tuple[int, OpCost | None, Dims]] = [
        (batch, op_cost("mm", d, ("float", "float")), d) for d in gemms]
    if _numel(w[2:]) > 1:
        columns = ((unfolded, spatial), (unfolded, spatial))
        parts.append((batch, op_cost("copy_", columns, ("float", "float")), columns))
    return [(n, c, d) for n, c, d in parts if c is not None]


# ATen's CPU convolution ops (the innermost, which a trace times), forward and backward, by
# backend: oneDNN's (its backward runs inside convolution_backward itself) or ATen's own
# per-sample GEMMs; each with its count of inputs and where it takes a bias or a kernel size
_CPU_CONVS: Final = {"aten::mkldnn_convolution": ("conv", True, 7, 2),
                     "aten::convolution_backward": ("conv_backward", True, 11, None),
                     "aten::_slow_conv2d_forward": ("conv", False, 6, 3),
                     "aten::_slow_conv2d_backward": ("conv_backward", False, 7, None)}
_KERNEL_SIZE: Final = {"aten::_slow_conv2d_forward": 2, "aten::_slow_conv2d_backward": 3}
# where a backward takes its output_mask (which gradients it computes)
_OUTPUT_MASK: Final = {"aten::convolution_backward": 10, "aten::_slow_conv2d_backward": 6}
_SMALL_INPUT: Final = 20480  # use_mkldnn: a batch of one of at most this many elements is ATen's


class _CpuConv(NamedTuple):
    """One of ATen's CPU convolution ops (`_CPU_CONVS`) as ATen selects its backend: 2-D (a
    1-D one viewed as [N, C, 1, L], as view1d_as_2d does)."""

    family: str
    onednn: bool
    tensors: tuple[tuple[tuple[int, ...], str], ...]  # input, weight, bias; output grad first
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]


def _as_2d(d: tuple[int, ...]) -> tuple[int, ...]:
    return (*d[:2], 1, d[2]) if len(d) == 3 else d


def _cpu_conv(name: str, shapes: Shapes) -> _CpuConv | None:
    """`_CpuConv` of an op at its recorded shapes; None for other ops, a dtype other than
    float, or shapes or geometry not recorded."""
    found = _CPU_CONVS.get(name)
    if found is None:
        return None
    family, onednn, _, bias = found
    dims, types = shapes.dims, shapes.types
    where = _CONV_GEOMETRY[name.removeprefix("aten::")]
    first = family == "conv_backward"
    if (len(shapes.concrete) != len(dims) or len(dims) <= max(i or 0 for i in where)
            or types[:2 + first] != ("float",) * (2 + first)
            or len({len(d) for d in dims[:2 + first]}) != 1 or len(dims[0]) not in (3, 4)):
        return None
    stride, pad, dilation = _geometry(where, shapes.concrete, len(dims[0]) - 2)
    if stride is None or pad is None or dilation is None:
        return None
    tensors = [(_as_2d(d), t) for d, t in zip(dims[:2 + first], types, strict=False)]
    if bias is not None:
        tensors.append((dims[bias], types[bias]))
    if len(dims[0]) == 3:
        stride, pad, dilation = (1, *stride), (0, *pad), (1, *dilation)
    return _CpuConv(family, onednn, tuple(tensors), stride, pad, dilation)


def _uses_mkldnn(conv: _CpuConv, threads: int) -> bool:
    """ATen's `use_mkldnn` for a float, untransposed 2-D convolution on `threads` intra-op
    threads (aten/src/ATen/native/Convolution.cpp): a 1x1, unstrided, undilated one at a batch
    under 16 on one thread, and a batch of one of a small input (groups 1, kernels up to 3),
    run ATen's own code (seen so on torch 2.13 under the profiler)."""
    first = conv.family == "conv_backward"
    x, w = conv.tensors[first][0], conv.tensors[1 + first][0]
    groups = x[1] // max(w[1], 1)
    return ((max(conv.stride) > 1 or max(conv.dilation) > 1 or x[0] >= 16 or w[2:] != (1, 1)
             or threads > 1)
            and (groups > 1 or min(w[2:]) > 3 or x[0] > 1 or math.prod(x) > _SMALL_INPUT))


def cpu_conv_at(name: str, recorded: Shapes, target: Shapes, threads: int) -> str | None:
    """The op ATen runs a CPU convolution as at `target` (its shapes at a new configuration)
    where it is the other backend's (`_CPU_CONVS`) than `name`, its op at `recorded`: a 1x1
    convolution recorded at batch 8 on one thread (_slow_conv2d_forward) runs on oneDNN at
    batch 16 (mkldnn_convolution), and back. None where the backend stays, where the rule does
    not explain the recorded op (oneDNN turned off; a transposed convolution's backward, which
    convolution_backward runs for both backends), or for a dilated convolution leaving oneDNN
    (ATen runs it as another op)."""
    before, after = _cpu_conv(name, recorded), _cpu_conv(name, target)
    if before is None or after is None:
        return None
    grad, x, w = ((d for d, _ in after.tensors) if after.family == "conv_backward"
                  else ((), after.tensors[0][0], after.tensors[1][0]))
    if (_uses_mkldnn(before, threads) != before.onednn
            or _uses_mkldnn(after, threads) == before.onednn
            or x[1] % max(w[1], 1) or (grad and grad[1] != w[0])
            or (before.onednn and max(after.dilation) > 1)):
        return None
    return next(op for op, (family, onednn, *_) in _CPU_CONVS.items()
                if family == before.family and onednn != before.onednn)


def as_cpu_conv(name: str, shapes: Shapes, op: str) -> Shapes:
    """A CPU convolution's recorded inputs (op `name` of `_CPU_CONVS`) as the other backend's
    op `op` takes them, as a trace records that op: its tensors (input, weight and bias; a
    backward's output gradient, input and weight), 4-d but for convolution_backward's of a
    1-D one (taken to be one where the input and the kernel are one high), and its stride,
    padding, dilation and kernel size in their places, a backward's output_mask too. `shapes`
    as `cpu_conv_at` read them."""
    conv = _cpu_conv(name, shapes)
    assert conv is not None, name
    _, _, size, bias = _CPU_CONVS[op]
    dims: list[tuple[int, ...]] = [()] * size
    types, concrete = ["Scalar"] * size, [""] * size
    places = [0, 1, 2 if bias is None else bias]
    tensors, geometry = conv.tensors, (conv.stride, conv.padding, conv.dilation)
    if op == "aten::convolution_backward" and tensors[1][0][2] == tensors[2][0][2] == 1:
        tensors = tuple((d[:2] + d[3:], t) for d, t in tensors)
        geometry = (conv.stride[1:], conv.padding[1:], conv.dilation[1:])
    for i, (d, t) in zip(places, tensors, strict=True):
        dims[i], types[i] = d, t
    values = (*geometry, tensors[1 + (bias is None)][0][2:])
    for at, value in zip((*_CONV_GEOMETRY[op.removeprefix("aten::")], _KERNEL_SIZE.get(op)),
                         values, strict=True):
        if at is not None:
            types[at], concrete[at] = "ScalarList", str(list(value))
    if op in _OUTPUT_MASK:
        types[_OUTPUT_MASK[op]], concrete[_OUTPUT_MASK[op]] = \
            "ScalarList", shapes.concrete[_OUTPUT_MASK[name]]
    return Shapes(tuple(dims), tuple(types), (), tuple(concrete))


def pointwise_parts(cost: OpCost, dims: Dims) -> list[tuple[int, OpCost, Dims]] | None:
    """(count, cost, dims) of the GEMMs oneDNN runs a 1x1 unstrided convolution as
    (`OpCost.pointwise`; its 1x1 kernels, jit_1x1 on AVX-512, over all N x H x W pixels at
    once): the input [N x H x W, C_in] times the weight [C_in, C_out]; its backward the
    input's gradient [N x H x W, C_out] x [C_out, C_in] and the weight's [C_in, N x H x W] x
    [N x H x W, C_out], each where its output_mask asks for it. The calibration sweeps
    convolutions of 3x3 kernels and 1-D ones of 3 to 80 taps (recorder/bench/kernels.py), none
    of one, whose efficiency a 1x1 one's does not share: a MobileNet's pointwise convolutions
    at four times the batch were priced x8.0-9.4 where they ran x4.5-5.05. None for other ops."""
    if not cost.pointwise:
        return None
    backward = cost.family == "conv_backward"
    x, w = dims[backward], dims[1 + backward]
    rows, c_out, c_in = x[0] * _numel(x[2:]), w[0], w[1]
    gemms = (_asked(cost, ((rows, c_out), (c_out, c_in)), ((c_in, rows), (rows, c_out)))
             if backward else [((rows, c_in), (c_in, c_out))])
    parts = [(1, op_cost("mm", d, ("float", "float")), d) for d in gemms]
    return [(n, c, d) for n, c, d in parts if c is not None]


def inner_parts(cost: OpCost, dims: Dims) -> list[tuple[int, OpCost, Dims]] | None:
    """The ops a composite op runs inside, where its time is theirs: an LSTM layer's
    (`lstm_parts`), ATen's own convolution's (`slow_conv_parts`), oneDNN's 1x1 convolution's
    (`pointwise_parts`); None for other ops."""
    if cost.family in RNN_FAMILIES:
        return lstm_parts(cost.op, dims)
    return slow_conv_parts(cost, dims) or pointwise_parts(cost, dims)


# Ops that never move data: views of their input, and allocations left uninitialised. Their
# time is the dispatch every op pays.
VIEW_OPS = frozenset({
    "view", "as_strided", "as_strided_", "empty", "empty_strided", "empty_like", "new_empty",
    "new_empty_strided", "resize_", "detach", "detach_", "t", "transpose", "transpose_",
    "expand", "expand_as", "select", "slice", "unsqueeze", "unsqueeze_", "squeeze", "squeeze_",
    "_reshape_alias", "_unsafe_view", "alias", "permute", "lift_fresh", "narrow", "split",
    "split_with_sizes", "chunk", "unbind", "view_as", "numpy_T", "set_",
})
# Ops that only make views, allocate or read metadata, or whose work the cost model leaves to
# the ops they call (reshape, contiguous, to: a copy when one is needed, else a view): their
# time does not grow with the data.
METADATA_OPS = VIEW_OPS | {
    "reshape", "resolve_conj", "resolve_neg", "result_type", "flatten", "unflatten", "item",
    "_local_scalar_dense", "is_nonzero", "size", "stride", "contiguous", "to", "_to_copy",
    "type_as", "scalar_tensor", "arange", "zeros", "ones", "zeros_like", "ones_like", "full",
    "full_like", "new_zeros", "new_ones", "rand", "randn", "randint", "randperm",
    "tril_indices", "triu_indices",
}


def data_cost(name: str, shapes: Shapes, fixed: Sequence[bool] = ()) -> OpCost | None:
    """op_cost where there is one; else a composite op's by the matrix products inside it
    (`_composite`); else, for an op that moves data (not a view, allocation or metadata read)
    with shaped inputs, a memory-bound cost: each input read once, the largest written once.
    None where the shapes cannot say its work (unknown_work)."""
    if unknown_work(name, shapes):
        return None
    cost = op_cost(name, shapes.dims, shapes.types, fixed, shapes.strides, shapes.concrete)
    op = name.removeprefix("aten::")
    if cost is not None or op in METADATA_OPS or not name.startswith("aten::"):
        return cost
    shaped = [d for d in shapes.dims if d]
    if not shaped:
        return None
    size, dtype = _element(shapes.types, shapes.dims)
    marks = list(fixed) + [False] * (len(shapes.dims) - len(fixed))
    if _HIDDEN_GEMMS.search(op):
        found = _composite(op, shapes.dims)
        if found is None:
            return None
        family, flops, moved = found
        fixed_elements = sum(_numel(d) for i, d in enumerate(shapes.dims) if d and marks[i])
        rows = _row_spread(name, shapes.dims, shapes.strides, size)
        return OpCost(op, family, flops, moved * size, dtype,
                      min(float(fixed_elements), moved) * size,
                      any(not marks[i] for i, d in enumerate(shapes.dims) if d), row_spread=rows)
    elements = sum(_numel(d) for d in shaped) + max(_numel(d) for d in shaped)
    fixed_elements = sum(_numel(d) for i, d in enumerate(shapes.dims) if d and marks[i])
    return OpCost(op, "copy", 0.0, float(elements * size), dtype, float(fixed_elements * size),
                  any(not marks[i] for i, d in enumerate(shapes.dims) if d))


def output_bytes(name: str, shapes: Shapes) -> float:
    """Bytes of the largest tensor an op allocates for its result, from its input shapes: what
    the allocator must find room for. 0 for an op that writes in place or allocates nothing
    it writes (a view, an empty tensor), for results far smaller than the inputs (reductions,
    pooling), and for embedding gradients (sparse ones are as small as the lookups). A
    backward op's result is its largest input's size (the gradient of the forward's input),
    but an LSTM layer's backward's: its gradients (the input's [T, B, I], the weights' [4H, I]
    and [4H, H], hx's and cx's [B, H]), not its largest input, oneDNN's uint8 workspace, flat,
    so that a width change does not reach it (read as its result, that had held the op's
    first touch fixed at twice the width, and made it the LSTM LM's largest result)."""
    op = name.removeprefix("aten::")
    dims = shapes.dims
    shaped = [d for d in dims if d]
    if not shaped or op.endswith("_") or op in METADATA_OPS or not name.startswith("aten::"):
        return 0.0
    family = _family(op)
    elements = max(_numel(d) for d in shaped)  # elementwise, norms, softmax, copies, backwards
    lstm = lstm_shape(op, dims) if op.endswith("backward") else None
    if lstm is not None:
        steps, batch, inputs, hidden = lstm
        elements = max(steps * batch * inputs, _LSTM_GATES * hidden * max(inputs, hidden))
    elif family == "gemm":
        found = gemm_dims(op, dims)
        elements = found[0] * found[1] * found[3] if found else 0
    elif family == "conv":  # at its recorded stride, padding and dilation, as _conv
        ok = len(dims) >= 2 and len(dims[0]) >= 3 and len(dims[1]) == len(dims[0])
        elements = dims[0][0] * dims[1][0] * _numel(conv_output(op, dims, shapes.concrete)) \
            if ok else 0
    elif family in _LOOKUPS:  # a row per lookup (index_select, embedding) or per bag
        lookups = 2 if op == "index_select" else 1  # index_select(self, dim, index)
        looked = dims[lookups] if len(dims) > lookups else ()
        bags = dims[2] if op not in ("embedding", "index_select") and len(dims) > 2 else ()
        ok = "backward" not in op and len(dims[0]) == 2 and bool(looked)
        elements = dims[0][1] * _numel(bags or looked) if ok else 0
    elif family == "sdpa":
        elements = _numel(dims[0])
    elif family in ("reduction", "pool") and "backward" not in op:
        elements = 0
    return float(elements * _element(shapes.types, dims)[0])
