"""The GPU kernels an aten op launches, as Work the learned model prices: from an op's name
and recorded shapes (forward ops and the backward ops of a training step alike)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Final

from perfswarm.model.gpu.hardware import Hardware
from perfswarm.model.gpu.work import Peak, Work, gemm_work, spatial_conv_work, vector_work
from perfswarm.model.opcost import (
    RNN_FAMILIES,
    Dims,
    OpCost,
    Shapes,
    attention_shape,
    data_cost,
    gemm_dims,
    tf32_if_fp32,
)

HALF: Final = frozenset({"fp16", "bf16"})
GROUPS: Final = 32  # a group norm's groups where not recorded (nn.GroupNorm's usual count)
# elementwise ops by the measured op whose arithmetic they resemble
_UNARY: Final = {"relu": "relu", "relu_": "relu", "threshold_backward": "relu", "gelu": "gelu",
                 "gelu_backward": "gelu", "silu": "gelu", "silu_backward": "gelu",
                 "tanh": "tanh", "tanh_backward": "tanh", "sigmoid": "tanh",
                 "sigmoid_backward": "tanh", "exp": "tanh", "log": "tanh", "rsqrt": "tanh",
                 "sqrt": "tanh", "pow": "pow", "pow_": "pow"}
_BINARY: Final = {"add": "add", "add_": "add", "sub": "add", "sub_": "add", "rsub": "add",
                  "mul": "mul", "mul_": "mul", "div": "div", "div_": "div", "pow": "pow",
                  "where": "add", "masked_fill": "add", "masked_fill_": "add",
                  "native_dropout_backward": "mul", "embedding_dense_backward": "add",
                  "index_add_": "add", "addcmul_": "mul", "addcdiv_": "div", "lerp_": "mul"}


def _numel(shape: Sequence[int]) -> int:
    return math.prod(shape) if shape else 1


def _rows_cols(shape: Sequence[int]) -> tuple[int, int]:
    cols = shape[-1] if shape else 1
    return max(1, _numel(shape) // max(cols, 1)), max(cols, 1)


def _norm_rows(op: str, shape: Sequence[int]) -> tuple[int, int]:
    """The rows a normalization's kernels reduce, a block each, and their length: a layer
    (or RMS) norm's rows of its last dimension; a batch norm's channels (dimension 1), each
    over batch x spatial elements (cuDNN's bn_fw_tr_1C11 and bn_bw_1C11 kernels: one block a
    channel, the H200's conv net's grid; ATen's batch_norm_collect_statistics likewise, then
    an elementwise pass); a group norm's samples x groups (ATen's RowwiseMoments), GROUPS
    groups where the channels allow, its group count being a scalar input the kernels are
    not given. An instance norm runs as the batch norm of [1, N x C, ...]."""
    if "batch_norm" in op and len(shape) >= 2:
        return shape[1], _numel(shape) // max(shape[1], 1)
    if "group_norm" in op and len(shape) >= 2:
        groups = shape[0] * math.gcd(shape[1], GROUPS)
        return groups, _numel(shape) // max(groups, 1)
    return _rows_cols(shape)


def op_kernels(name: str, shapes: Shapes, tensor_core: bool = False,
               on: Hardware | None = None) -> list[Work] | None:
    """The kernels `name` (aten::...) launches at `shapes`; None for an op the model cannot
    price (no cost model, or shapes that do not fit). `tensor_core`: its GEMMs run on tensor
    cores (TF32 for FP32 data), as the GPU `on` runs them where given (Hardware.runs). An op
    that moves data without a model of its own (opcost's data_cost: random_, a fill) is one
    elementwise pass."""
    cost = data_cost(name, shapes)
    if cost is None:
        return None
    cost = tf32_if_fp32(cost) if tensor_core else cost
    return kernels(on.runs(cost) if on else cost, shapes.dims, _channels_last(cost, shapes))


def _channels_last(cost: OpCost, shapes: Shapes) -> bool:
    """Whether a convolution's activation (a forward's first input, a backward's second) is
    recorded channels-last: its channels innermost (stride 1) over more than one channel."""
    at = 1 if cost.family == "conv_backward" else 0
    if len(shapes.strides) <= at or len(shapes.dims) <= at:
        return False
    dims, strides = shapes.dims[at], shapes.strides[at]
    return len(dims) >= 3 and len(strides) == len(dims) and dims[1] > 1 and strides[1] == 1


def _layout_passes(*tensors: Sequence[int], element: int) -> list[Work]:
    """One memory pass a tensor (cuDNN's nchwToNhwc / nhwcToNchw kernels): a copy of each."""
    return [vector_work("elementwise", "addu", *_rows_cols(t), element) for t in tensors]


def kernels(cost: OpCost, dims: Dims, channels_last: bool = False) -> list[Work] | None:
    """The kernels of an op of `cost` (dtype tf32: FP32 data on tensor cores) and input
    `dims`; None where the shapes do not fit. `channels_last`: a convolution's activation
    is laid out channels-last (NHWC), else channels-first (NCHW, torch's default)."""
    op = cost.op
    element = 2 if cost.dtype in HALF else 8 if cost.dtype == "fp64" else 4
    peak: Peak = ("bf16" if cost.dtype == "bf16" else "half" if cost.dtype in HALF
                  else "tf32" if cost.dtype == "tf32" else "fp32")
    family = cost.family
    if family == "gemm":
        found = gemm_dims(op, dims)
        if found is None:
            return None
        b, m, k, n = found
        bias = op == "addmm" or (op == "linear" and len(dims) > 2 and bool(dims[2]))
        return [gemm_work("bmm" if b > 1 else "linear", b, m, n, k, bias, element, peak)]
    if family in ("sdpa", "sdpa_backward"):
        # q and k: the forward's first two inputs, the backward's second and third
        qk = dims[:2] if family == "sdpa" else dims[1:3]
        shape = attention_shape(op, *qk) if len(qk) == 2 else None
        if shape is None:
            return None
        batch, heads, lq, lk, d = shape
        bh = batch * heads
        if family == "sdpa":  # QK^T, softmax, PV
            return [gemm_work("bmm", bh, lq, lk, d, False, element, peak),
                    vector_work("softmax", "softmax", bh * lq, lk, element),
                    gemm_work("bmm", bh, lq, d, lk, False, element, peak)]
        # the backward (opcost._composite): QK^T again, then the gradients of P (dO V^T), V
        # (P^T dO), Q (dS K) and K (dS^T Q), and the softmax's gradient between
        return [gemm_work("bmm", bh, lq, lk, d, False, element, peak),
                gemm_work("bmm", bh, lq, lk, d, False, element, peak),
                gemm_work("bmm", bh, lk, d, lq, False, element, peak),
                vector_work("softmax", "softmax", bh * lq, lk, element),
                gemm_work("bmm", bh, lq, d, lk, False, element, peak),
                gemm_work("bmm", bh, lk, d, lq, False, element, peak)]
    if family in RNN_FAMILIES:  # a recurrent layer: cuDNN's kernels, which no measurement covers
        return None
    if family in ("conv", "depthwise_conv", "conv_backward"):
        # 1-d, 2-d (a 1-d one as torch's CPU runs it: [N, C, 1, L]) or 3-d; the output's size
        # is the output gradient's in a backward, else the cost's (opcost.conv_output)
        grad = family == "conv_backward"
        x, w = (dims[1], dims[2]) if grad else (dims[0], dims[1])
        if len(x) < 3 or len(w) != len(x) or (grad and len(dims[0]) != len(x)):
            return None
        groups = max(1, x[1] // max(1, w[1]))
        forward = spatial_conv_work(x[0], x[1], w[0], w[2:], x[2:],
                                    dims[0][2:] if grad else cost.conv_out or x[2:], groups,
                                    element, peak)
        # a backward's input and weight gradients, those its output_mask asks for (a bias's
        # alone: no convolution to price), each the forward's FLOPs as the implicit GEMM
        # cuDNN runs for it: the input's writes output pixels x input channels over the
        # output channels' taps, the weight's output channels x the filter's inputs over the
        # output pixels. The H200's (tests/data/conv1d_h200) launched 60 and 12 tiles of 960
        # x 128 and 256 x 384 (64x32, 128x64) for [64, 256, 15] <- [64, 128, 15]; the
        # forward's view, 960 x 256, has 120 and 32
        data = replace(forward, n=x[1], k=w[0] // groups * math.prod(w[2:]))
        weight = replace(forward, m=w[0], n=forward.k, k=forward.m)
        y = dims[0] if grad else (x[0], w[0], *(cost.conv_out or x[2:]))
        asked = [(forward, (x, w, y))] if not grad else [
            part for part, wanted in zip(((data, (y, w, x)), (weight, (y, x, w))),
                                          cost.gradients, strict=True) if wanted]
        if not asked:
            return None
        # on tensor cores (TF32, FP16, BF16) cuDNN's implicit-GEMM kernels read and write
        # NHWC: a channels-first convolution's operands go through an nchwToNhwc pass each
        # and its result back through nhwcToNchw, every gradient's again (the output's
        # gradient once for each). The H200's 1-D conv net (tests/data/conv1d_h200) ran
        # these 2-3 us kernels around each TF32 convolution: 2-3 of 3-4 kernels a forward,
        # 6 of 8-9 a backward. A grouped one's: not measured here, left as it was
        passes = not (peak == "fp32" or channels_last or groups > 1)
        return [k for conv, tensors in asked
                for k in (conv, *(_layout_passes(*tensors, element=element) if passes else ()))]
    shaped = [d for d in dims if d]
    if not shaped:
        return None
    largest = max(shaped, key=_numel)
    rows, cols = _rows_cols(largest)
    if family == "norm":
        rows, cols = _norm_rows(op, largest)
        work = vector_work("norm", "ln", rows, cols, element)
        return [work, work] if "backward" in op else [work]
    if family == "softmax":
        return [vector_work("softmax", "softmax", rows, cols, element)]
    full = [d for d in shaped if _numel(d) == _numel(largest)]
    if op in _BINARY and len(full) >= 2:
        kind = _BINARY[op]
    elif op in _BINARY or op in _UNARY:
        kind = _UNARY.get(op, _BINARY.get(op, "add")) + ("u" if op in _BINARY else "")
        kind = kind if kind in ("relu", "gelu", "tanh") or kind.endswith("u") else kind + "u"
    else:  # copies, reductions, lookups, the rest: one read and one write per element
        kind = "addu"
        if family in ("embedding_bag", "gather"):  # the rows looked up, not the table
            rows = max(1, round(cost.bytes / element / 2 / cols))
    return [vector_work("elementwise", kind, rows, cols, element)]

