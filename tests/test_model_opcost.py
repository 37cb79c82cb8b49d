"""Hardware specs, op cost from recorded shapes, roofline."""

from __future__ import annotations

import gzip
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfswarm.errors import PerfswarmError
from perfswarm.model.gpu.aten import op_kernels
from perfswarm.model.opcost import (
    Shapes,
    batch_scaled,
    data_cost,
    gemm_dims,
    heads_follow,
    joined_shapes,
    op_cost,
    output_bytes,
    roofline,
    shapes_cost,
    shapes_from_args,
)
from perfswarm.model.specs import device_specs, load_spec, spec_for_device

DEVICES = ["P4", "P100-PCIe", "T4", "V100", "V100-SXM2-16GB", "V100-PCIe-32GB", "V100-PCIe-16GB",
           "A10", "A100-40GB", "A100-PCIe-40GB", "A100-80GB", "A100-PCIe-80GB", "H100-SXM",
           "H100-PCIe", "H100-NVL", "H200", "B200", "L4", "L40S", "MI210", "MI250", "MI300X"]


def test_every_issue_device_has_a_cited_spec() -> None:
    assert list(device_specs()) == DEVICES
    for spec in device_specs().values():
        assert spec.source and spec.peak_flops["fp32"] > 0 and spec.memory_bandwidth > 0


def test_spec_values_and_lookup() -> None:
    h200 = load_spec("h200")
    assert h200.memory_bandwidth == 4.8e12
    assert h200.peak_for("bf16") == pytest.approx(989.4e12)
    assert h200.ridge_point("bf16") == pytest.approx(206.125)
    assert load_spec("V100").peak_for("fp8") == pytest.approx(15.7e12)  # no fp8: fp32 rate
    assert load_spec("A100-80GB").to_dict()["memory_bandwidth_gbps"] == 2039.0
    with pytest.raises(PerfswarmError, match="unknown device; closest known: H100-SXM"):
        load_spec("H100 SXM6")


@pytest.mark.parametrize(("name", "key"), [
    ("Tesla V100-PCIE-32GB", "V100-PCIe-32GB"), ("Tesla V100-SXM2-16GB", "V100-SXM2-16GB"),
    ("NVIDIA A100 80GB PCIe", "A100-PCIe-80GB"), ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
    ("NVIDIA A100-PCIE-40GB", "A100-PCIe-40GB"), ("nvidia h100 80gb hbm3", "H100-SXM"),
    ("NVIDIA H100 NVL", "H100-NVL"), ("Tesla T4", "T4"), ("h100", "H100-SXM"),
    ("P100", "P100-PCIe"), ("AMD Instinct MI210", "MI210")])
def test_driver_and_short_names(name: str, key: str) -> None:
    """The exact strings torch.cuda.get_device_name() returns, and short names; PCIe and SXM
    parts are different devices (the PCIe A100 80GB has 1935 GB/s, the SXM one 2039)."""
    assert load_spec(name).name == key
    assert spec_for_device(name) is load_spec(key)
    assert load_spec("A100-PCIe-80GB").memory_bandwidth == 1935e9


def test_gemm_costs() -> None:
    mm = op_cost("aten::mm", [[64, 128], [128, 32]], ["float", "float"])
    assert mm is not None and mm.family == "gemm"
    assert mm.flops == 2 * 64 * 128 * 32
    assert mm.bytes == 4 * (64 * 128 + 128 * 32 + 64 * 32)
    addmm = op_cost("aten::addmm", [[32], [64, 128], [128, 32], [], []],
                    ["c10::Half", "c10::Half", "c10::Half", "Scalar", "Scalar"])
    assert addmm is not None and addmm.dtype == "fp16"
    assert addmm.flops == mm.flops and addmm.bytes == 2 * (64 * 128 + 128 * 32 + 64 * 32 + 32)
    bmm = op_cost("aten::bmm", [[8, 64, 128], [8, 128, 32]], ["float", "float"])
    assert bmm is not None and bmm.flops == 8 * mm.flops
    linear = op_cost("aten::linear", [[4, 16, 128], [32, 128], [32]], ["float"] * 3)
    assert linear is not None and linear.flops == mm.flops
    assert op_cost("aten::mm", [[64, 128], [127, 32]], ["float", "float"]) is None


def test_conv_embedding_sdpa_and_memory_ops() -> None:
    conv = op_cost("aten::conv2d", [[2, 3, 8, 8], [16, 3, 3, 3], [16]], ["float"] * 3)
    assert conv is not None and conv.flops == 2 * 2 * 16 * 64 * 3 * 9
    bag = op_cost("aten::embedding_bag", [[1000, 64], [512], [32]],
                  ["float", "long int", "long int"])
    assert bag is not None and bag.flops == 512 * 64
    sdpa = op_cost("aten::scaled_dot_product_attention",
                   [[2, 4, 128, 64], [2, 4, 128, 64], [2, 4, 128, 64]], ["c10::BFloat16"] * 3)
    assert sdpa is not None and sdpa.flops == 4 * 2 * 4 * 128 * 128 * 64 + 5 * 2 * 4 * 128 * 128
    # the memory-efficient kernel's own op (CUDA traces: nanoGPT on an H200) takes q, k, v as
    # [batch, seq, heads, head_dim]: the same attention
    fused = op_cost("aten::_efficient_attention_forward",
                    [[2, 128, 4, 64], [2, 128, 4, 64], [2, 128, 4, 64]], ["c10::BFloat16"] * 3)
    assert fused is not None and (fused.flops, fused.bytes) == (sdpa.flops, sdpa.bytes)
    grad = data_cost("aten::_efficient_attention_backward", Shapes(
        ((2, 128, 4, 64),) * 5 + ((2, 4, 128),), ("float",) * 6))
    assert grad is not None and grad.family == "sdpa_backward"
    assert grad.flops == 10 * 2 * 4 * 128 * 128 * 64 + 5 * 2 * 4 * 128 * 128
    add = op_cost("aten::add", [[1024, 1024], [1024, 1024], []], ["float", "float", "Scalar"])
    assert add is not None and add.bytes == 3 * 4 * 1024 * 1024 and add.flops == 1024 * 1024
    total = op_cost("aten::sum", [[256, 256]], ["float"])
    assert total is not None and total.bytes == 4 * (256 * 256 + 1)
    copy = op_cost("aten::copy_", [[100], [100], []], ["float", "float", "Scalar"])
    assert copy is not None and copy.flops == 0 and copy.bytes == 800
    assert op_cost("aten::empty", [[], [], []], ["", "", ""]) is None


def test_roofline_bounds() -> None:
    h100 = load_spec("H100-SXM")
    big = op_cost("aten::mm", [[8192, 8192], [8192, 8192]], ["c10::BFloat16"] * 2)
    add = op_cost("aten::add", [[1 << 20], [1 << 20], []], ["float", "float", "Scalar"])
    assert big is not None and add is not None
    assert roofline(big, h100).bound == "compute"
    assert roofline(big, h100).time_s == pytest.approx(2 * 8192**3 / 989.4e12)
    assert roofline(add, h100).bound == "memory"
    assert roofline(add, h100).time_s == pytest.approx(12 * (1 << 20) / 3.35e12)


def test_op_cost_from_events_args() -> None:
    args = orjson.dumps({"Input Dims": [[4, 8], [8, 2]], "Input type": ["float", "float"]}).decode()
    shapes = shapes_from_args(args)
    cost = shapes_cost("aten::mm", shapes) if shapes is not None else None
    assert cost is not None and cost.flops == 128
    assert shapes_from_args("{}") is None
    assert shapes_from_args("not json") is None


def test_index_select_gathers_rows() -> None:
    """index_select of a matrix reads and writes the picked rows, not the whole matrix: its
    work grows with the indices (a batch's), whatever the matrix is."""
    rows = op_cost("aten::index_select", [[20000, 64], [], [1280]], ["float", "Scalar", "long int"],
                   fixed=[True, False, False])
    assert rows is not None and rows.family == "gather"
    assert rows.bytes == 4 * (1280 * 64 * 2 + 2 * 1280) and rows.fixed_bytes == 0.0


def test_gemm_layout_from_recorded_strides() -> None:
    """nn.Linear's addmm gets its weight column-major (Kineto's Input Strides say so)."""
    linear_addmm = shapes_from_args(orjson.dumps({
        "Input Dims": [[512], [32, 3072], [3072, 512], [], []],
        "Input type": ["float", "float", "float", "Scalar", "Scalar"],
        "Input Strides": [[1], [3072, 1], [1, 3072], [], []]}).decode())
    assert linear_addmm is not None and linear_addmm.strides[2] == (1, 3072)
    cost = data_cost("aten::addmm", linear_addmm)
    assert cost is not None and cost.b_transposed
    # a batch change keeps the layout
    wider = data_cost("aten::addmm", linear_addmm.substitute({32: 64}))
    assert wider is not None and wider.b_transposed and wider.flops == 2 * cost.flops
    row_major = op_cost("aten::mm", [[32, 64], [64, 16]], ["float"] * 2,
                        strides=[[64, 1], [16, 1]])
    assert row_major is not None and not row_major.b_transposed
    linear = op_cost("aten::linear", [[4, 16, 128], [32, 128]], ["float"] * 2)
    assert linear is not None and linear.b_transposed
    # a batch of transposed matrices (k^T in attention scores) is column-major per matrix
    scores = op_cost("aten::bmm", [[8, 64, 16], [8, 16, 64]], ["float"] * 2,
                     strides=[[1024, 16, 1], [1024, 1, 16]])
    assert scores is not None and scores.b_transposed
    malformed = shapes_from_args(orjson.dumps({"Input Dims": [[4, 8], [8, 2]],
                                               "Input Strides": [[8, 1]]}).decode())
    assert malformed is not None and malformed.strides == ()
    assert gemm_dims("linear", [[4, 16, 128], [32, 128], [32]]) == (1, 64, 128, 32)
    assert gemm_dims("addmm", [[32], [8, 64], [64, 32], [], []]) == (1, 8, 64, 32)
    assert gemm_dims("bmm", [[8, 64, 128], [8, 128, 32]]) == (8, 64, 128, 32)
    assert gemm_dims("matmul", [[5, 7], [7]]) == (1, 5, 7, 1)


def test_batch_scaled_grows_the_dimension_that_holds_the_batch() -> None:
    def grown(name: str, dims: list[list[int]], fixed: list[bool]) -> list[tuple[int, ...]]:
        shapes = Shapes(tuple(tuple(d) for d in dims), ("float",) * len(dims))
        return list(batch_scaled(name, shapes, fixed, 2.0).dims)

    # forward through a weight: m; input gradient: m; weight gradient: the summed k
    assert grown("aten::addmm", [[512], [32, 3072], [3072, 512], [], []],
                 [True, False, True]) == [(512,), (64, 3072), (3072, 512), (), ()]
    assert grown("aten::mm", [[32, 512], [512, 3072]], [False, True]) == [(64, 512),
                                                                         (512, 3072)]
    assert grown("aten::mm", [[512, 32], [32, 3072]], [False, False]) == [(512, 64),
                                                                          (64, 3072)]
    assert grown("aten::mm", [[10, 512], [512, 32]], [True, False]) == [(10, 512), (512, 64)]
    assert grown("aten::bmm", [[64, 8, 16], [64, 16, 8]], [False, False]) == [(128, 8, 16),
                                                                              (128, 16, 8)]
    # anything else: non-parameter inputs in their leading dimension
    assert grown("aten::add", [[32, 256], [256]], [False, True]) == [(64, 256), (256,)]
    shapes = Shapes(((32, 256),), ("float",))
    assert batch_scaled("aten::relu", shapes, [False], 1.0) is shapes


@given(st.integers(1, 64), st.integers(1, 64), st.integers(1, 64), st.integers(1, 8))
def test_bmm_scales_linearly_in_batch(m: int, k: int, n: int, b: int) -> None:
    one = op_cost("aten::mm", [[m, k], [k, n]], ["float", "float"])
    many = op_cost("aten::bmm", [[b, m, k], [b, k, n]], ["float", "float"])
    assert one is not None and many is not None
    assert many.flops == b * one.flops and many.bytes == b * one.bytes
    spec = load_spec("A100-80GB")
    assert roofline(many, spec).time_s >= roofline(one, spec).time_s


@pytest.mark.parametrize(("name", "memory", "spec"), [
    ("NVIDIA A100-PG509-200", 42_297_524_224, "A100-40GB"),  # the corpus traces' A100s
    ("NVIDIA A100-SXM4-80GB", None, "A100-80GB"),
    ("NVIDIA A100-SXM4-40GB", 85_000_000_000, "A100-40GB"),  # the name's variant wins
    ("NVIDIA H100 PCIe", 85_000_000_000, "H100-PCIe"),
    ("NVIDIA H100 80GB HBM3", 85_000_000_000, "H100-SXM"),  # tie on memory: the first listed
    ("NVIDIA H200", None, "H200"),
    ("NVIDIA L4", 24_000_000_000, "L4"),
    ("Tesla V100-SXM2-32GB", None, "V100"),
    ("AMD Instinct MI250", None, "MI250"),
    ("AMD Instinct MI300X", None, "MI300X"),
    ("AMD Instinct MI250X", None, None),  # another part, not in the specs
    ("NVIDIA L40S", None, "L40S"),  # not an L4
    ("NVIDIA L40", None, None),  # nor is this
    ("AMD Radeon Graphics", 68_702_699_520, "MI250"),  # ROCm's name for a die of the corpus's
    ("AMD Radeon Graphics", None, None),  # without memory: no telling
    ("NVIDIA GeForce RTX 4090", None, None),
])
def test_spec_for_a_device_name(name: str, memory: int | None, spec: str | None) -> None:
    found = spec_for_device(name, memory)
    assert (found.name if found else None) == spec


@pytest.mark.parametrize(("name", "dims", "expected"), [
    ("aten::addmm", [[1000], [1024, 128], [128, 1000], [], []], 1024 * 1000),  # m x n
    ("aten::bmm", [[8, 64, 32], [8, 32, 64]], 8 * 64 * 64),
    ("aten::relu", [[1024, 1024]], 1024 * 1024),
    ("aten::add", [[16, 1, 64], [16, 32, 64]], 16 * 32 * 64),
    ("aten::mkldnn_convolution", [[24, 16, 28, 28], [32, 16, 3, 3], [32]], 24 * 32 * 28 * 28),
    ("aten::embedding_bag", [[1000, 16], [256], [32]], 32 * 16),  # a row per bag
    ("aten::index_select", [[1000, 16], [], [256]], 256 * 16),  # a row per index
    ("aten::_log_softmax_backward_data", [[64, 1000], [64, 1000]], 64 * 1000),
    ("aten::nll_loss_backward", [[], [64, 1000], [64], [], [], [], []], 64 * 1000),
    ("aten::sum", [[1024, 1024]], 0),  # far smaller than its input
    ("aten::max_pool2d_with_indices", [[8, 16, 28, 28]], 0),
    ("aten::add_", [[1024, 1024], [1024, 1024]], 0),  # in place
    ("aten::empty_like", [[1024, 1024]], 0),  # nothing written yet
    ("aten::view", [[1024, 1024], []], 0),
    ("aten::_embedding_bag_backward", [[32, 16], [256]], 0),
])
def test_output_bytes(name: str, dims: list[list[int]], expected: int) -> None:
    """The largest tensor an op allocates for its result, of its first shaped input's dtype
    (float: 4 bytes an element)."""
    shapes = Shapes(tuple(tuple(d) for d in dims), ("float",) * len(dims))
    assert output_bytes(name, shapes) == 4 * expected


def test_a_strided_convolutions_output() -> None:
    """A stride-2 convolution's result at its recorded stride and padding (mkldnn_convolution's
    concrete inputs: padding, stride, dilation): a quarter of the input's plane. Read at
    stride 1 it had been the step's largest result and taken all of a step's page faults."""
    dims = ((8, 32, 28, 28), (64, 32, 3, 3), (64,))
    concrete = ("", "", "", "[1, 1]", "[2, 2]", "[1, 1]", "1")
    shapes = Shapes(dims, ("float",) * 3, (), concrete)
    assert output_bytes("aten::mkldnn_convolution", shapes) == 4 * 8 * 64 * 14 * 14


def test_an_lstm_backwards_result_is_its_gradients_not_its_workspace() -> None:
    """The LSTM LM's layer backward as torch recorded it (nn.LSTM(40, 40), T 35, B 8; the
    inputs' grads, hx and cx, and oneDNN's uint8 workspace last), and at twice the width as
    --dim reads it (the flat workspace stays 757,760): its result is the input's gradient
    [35, 8, 40], then the weights' [320, 80], not the workspace read as 3 MB of floats at both
    widths."""
    lstm = ((35, 8, 40), (160, 40), (160, 40), (160,), (160,), (8, 40), (8, 40))
    grads = ((35, 8, 40), (8, 40), (8, 40), (35, 8, 40), (), ())
    base = Shapes((*lstm, *grads, (757760,)), ("float",) * 11 + ("", "", "unsigned char"))
    wider = base.substitute({40: 80, 160: 320})
    assert wider.dims[-1] == (757760,)
    assert output_bytes("aten::mkldnn_rnn_layer_backward", base) == 4 * 35 * 8 * 40
    assert output_bytes("aten::mkldnn_rnn_layer_backward", wider) == 4 * 320 * 80


@pytest.mark.parametrize("name", ["aten::mkldnn_rnn_layer", "aten::mkldnn_rnn_layer_backward",
                                  "aten::_scaled_dot_product_flash_attention_for_cpu_backward"])
def test_ops_with_matrix_products_inside_are_not_priced_as_copies(name: str) -> None:
    """An LSTM layer's or attention backward's FLOPs are GEMMs the shapes do not show: no
    memory-bound price (predict counts them unmodelled) where an unknown elementwise op gets
    one (each input read once, the largest written: 3 x 4 x 4 bytes)."""
    dims = ((5, 4, 8), (32, 8), (32, 8), (32,))
    assert data_cost(name, Shapes(dims, ("float",) * 4)) is None
    copy = data_cost("aten::lerp", Shapes(((4,), (4,)), ("float", "float")))
    assert copy is not None and copy.bytes == 48


def test_lstm_layer_and_attention_backward_priced_by_their_matrix_products() -> None:
    """Shapes as torch 2.x records them on the CPU (nn.LSTM(32, 64) on [10, 4, 32]; causal SDPA
    on [4, 2, 16, 8]): the gates' GEMMs per time step, twice that backward; attention backward
    five matrix products of L x L x D per head. H comes from hx, so a width change reaches the
    weights' flattened 4H."""
    lstm = ((10, 4, 32), (256, 32), (256, 64), (256,), (256,), (4, 64), (4, 64))
    forward = data_cost("aten::mkldnn_rnn_layer", Shapes(lstm, ("float",) * 7))
    assert forward is not None and forward.family == "rnn"
    assert forward.flops == 10 * 4 * 256 * (2 * (32 + 64) + 10)
    backward = data_cost("aten::mkldnn_rnn_layer_backward",
                         Shapes((*lstm, (10, 4, 64), (4, 64), (4, 64), (10, 4, 64), (180224,)),
                                ("float",) * 12))
    assert backward is not None and backward.flops == 2 * forward.flops
    wider = data_cost("aten::mkldnn_rnn_layer",
                      Shapes(lstm, ("float",) * 7).substitute({64: 128}))
    assert wider is not None and wider.flops == 10 * 4 * 512 * (2 * (32 + 128) + 10)
    q = (4, 2, 16, 8)
    attention = data_cost("aten::_scaled_dot_product_flash_attention_for_cpu_backward",
                          Shapes((q, q, q, q, q, (4, 2, 16)), ("float",) * 6))
    assert attention is not None and attention.family == "sdpa_backward"
    assert attention.flops == 10 * 4 * 2 * 16 * 16 * 8 + 5 * 4 * 2 * 16 * 16


# one op each, as torch recorded them: realworld_models.py's conv1d style on this CPU (mkldnn
# runs the 1-d convolution as a 2-d one of height 1) and its ResNet on an H200 (cuDNN)
MKLDNN_STEM = ('{"Concrete Inputs": ["", "", "", "[0, 0]", "[1, 16]", "[1, 1]", "1"], '
               '"Input type": ["float", "float", "float", "ScalarList", "ScalarList", '
               '"ScalarList", "Scalar"], "Input Dims": [[64, 1, 1, 4000], [128, 1, 1, 80], '
               '[128], [], [], [], []]}')
CUDNN_STRIDED = ('{"Concrete Inputs": ["", "", "[1, 1]", "[2, 2]", "[1, 1]", "1", "False", '
                 '"False", "True"], "Input type": ["float", "float", "ScalarList", "ScalarList", '
                 '"ScalarList", "Scalar", "Scalar", "Scalar", "Scalar"], "Input Dims": '
                 '[[64, 128, 16, 16], [256, 128, 3, 3], [], [], [], [], [], [], []]}')


def test_conv_output_from_the_recorded_stride_and_padding() -> None:
    """The stem of a 1-d audio net: 80-wide filters at stride 16 over 4,000 samples give
    (4000 - 80) // 16 + 1 = 246 outputs (its backward's output gradient is [64, 128, 246]), not
    4,000; a 3x3 cuDNN convolution at stride 2, padding 1 halves 16x16 to 8x8. Without the
    concrete inputs: the input's size (stride 1, 'same')."""
    stem = shapes_from_args(MKLDNN_STEM)
    assert stem is not None and stem.concrete[4] == "[1, 16]"
    cost = data_cost("aten::mkldnn_convolution", stem)
    assert cost is not None and cost.conv_out == (1, 246)
    assert cost.flops == 2.0 * 64 * 128 * 246 * 1 * 80
    strided = shapes_from_args(CUDNN_STRIDED)
    assert strided is not None
    cost = data_cost("aten::cudnn_convolution", strided)
    assert cost is not None and cost.conv_out == (8, 8)
    assert cost.flops == 2.0 * 64 * 256 * 8 * 8 * 128 * 9
    bare = data_cost("aten::cudnn_convolution", Shapes(strided.dims, strided.types))
    assert bare is not None and bare.conv_out == (16, 16) and bare.flops == 4 * cost.flops


def test_a_convolution_backward_prices_the_gradients_its_output_mask_asks_for() -> None:
    """The 1-d conv net on an H200 (tests/data/conv1d_h200.txt): autograd asks its first layer
    ([64, 1, 4000] -> 128, 80 taps at stride 16) for the weight's gradient only (output_mask
    [False, True, True]), so that backward is one convolution's work, 2 x 64 x 128 x 246 x 80
    FLOPs, reading the output's gradient and the input and writing the weight's (4 x (64 x 128
    x 246 + 64 x 4000 + 128 x 80) bytes), where both gradients were 644,874,240 FLOPs and
    10,190,848 bytes; the other layers' ([True, True, True]) two convolutions each. A trace
    without the mask: both. The GPU model launches one convolution kernel for the first
    layer's, two for the others'."""
    trace = Path(__file__).parent / "data" / "conv1d_h200.pt.trace.json.gz"
    events = orjson.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    priced = set()
    for event in events:
        if event.get("name") == "aten::convolution_backward":
            shapes = shapes_from_args(orjson.dumps(event["args"]).decode())
            assert shapes is not None
            cost = data_cost("aten::convolution_backward", shapes)
            assert cost is not None
            kernels = op_kernels("aten::convolution_backward", shapes)
            priced.add((shapes.dims[1], shapes.concrete[10], cost.flops, cost.bytes,
                        len(kernels or ())))
    assert priced == {
        ((64, 1, 4000), "[False, True, True]", 2.0 * 64 * 128 * 246 * 80,
         4.0 * (64 * 128 * 246 + 64 * 4000 + 128 * 80), 1),
        ((64, 128, 61), "[True, True, True]", 2 * 2.0 * 64 * 128 * 61 * 128 * 3,
         4.0 * (64 * 128 * 61 + 2 * 64 * 128 * 61 + 2 * 128 * 128 * 3), 2),
        ((64, 128, 15), "[True, True, True]", 2 * 2.0 * 64 * 256 * 15 * 128 * 3,
         4.0 * (64 * 256 * 15 + 2 * 64 * 128 * 15 + 2 * 256 * 128 * 3), 2)}
    front = ((64, 128, 246), (64, 1, 4000), (128, 1, 80))
    unmasked = op_cost("aten::convolution_backward", front, ("float",) * 3)
    assert unmasked is not None and unmasked.flops == 644_874_240
    assert unmasked.bytes == 10_190_848


def test_conv_output_falls_back_on_what_it_cannot_read() -> None:
    """A transposed convolution (aten::convolution's 7th input True) and a stride of 0 keep the
    input's size; so does a padding recorded as a string ('same')."""
    dims = ((8, 16, 32, 32), (16, 16, 3, 3))
    floats = ("float", "float")
    for concrete in (("", "", "", "[2, 2]", "[1, 1]", "[1, 1]", "True", "[1, 1]", "1"),
                     ("", "", "", "[0, 0]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1"),
                     ("", "", "", "[2, 2]", "same", "[1, 1]", "False", "[0, 0]", "1")):
        cost = op_cost("aten::convolution", dims, floats, concrete=concrete)
        assert cost is not None and cost.conv_out == (32, 32)
    strided = op_cost("aten::convolution", dims, floats,
                      concrete=("", "", "", "[2, 2]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1"))
    assert strided is not None and strided.conv_out == (16, 16)


def test_shapes_keep_int_lists_not_scalar_values() -> None:
    """Two steps' addcdiv_ (a CPU Adam step: its value, the step size, changes every step) are
    one op; a convolution's stride list stays."""
    def args(value: str) -> str:
        return ('{"Concrete Inputs": ["", "", "", "' + value + '"], "Input type": ["float", '
                '"float", "float", "Scalar"], "Input Dims": [[384], [384], [384], []]}')

    assert shapes_from_args(args("-0.0009")) == shapes_from_args(args("-0.0011"))
    strided = shapes_from_args(CUDNN_STRIDED)
    assert strided is not None and strided.concrete[3] == "[2, 2]" and strided.concrete[5] == ""


def test_a_sparse_input_is_not_priced_dense() -> None:
    """nn.Embedding(sparse=True)'s gradient added into its weight: the second input, shaped
    [200000, 64] but without strides (a sparse layout), is a batch's rows, which the trace
    does not count; the same add of dense tensors is priced."""
    text = orjson.dumps({"Input Dims": [[200000, 64], [200000, 64], [], [200000, 64]],
                         "Input Strides": [[64, 1], [], [], [64, 1]],
                         "Input type": ["float", "float", "Scalar", "float"]}).decode()
    sparse = shapes_from_args(text)
    assert sparse is not None
    assert shapes_cost("aten::add", sparse) is None and data_cost("aten::add", sparse) is None
    dense = shapes_from_args(text.replace('[[64,1],[],[],[64,1]]', '[[64,1],[64,1],[],[64,1]]'))
    assert dense is not None and shapes_cost("aten::add", dense) is not None


def test_advanced_indexing_by_unrecorded_indices_is_not_priced() -> None:
    """x[idx] whose index list the profiler records untyped (''): its rows are unknown, not
    the whole of x; index_select, whose index is shaped, is priced."""
    index = shapes_from_args(orjson.dumps({"Input Dims": [[200000, 64], []],
                                           "Input type": ["float", ""]}).decode())
    assert index is not None and data_cost("aten::index", index) is None
    select = shapes_from_args(orjson.dumps({"Input Dims": [[200000, 64], [], [5120]],
                                            "Input type": ["float", "Scalar", "long int"]})
                              .decode())
    assert select is not None and data_cost("aten::index_select", select) is not None


@settings(deadline=None)  # the first example imports torch
@given(st.lists(st.tuples(st.integers(2, 6), st.integers(2, 6)), min_size=2, max_size=4),
       st.data(), st.integers(1, 3))
def test_resized_keeps_the_layout_torch_would_give(sizes: list[tuple[int, int]],
                                                    data: st.DataObject, gap: int) -> None:
    """A view of a dense tensor in any order of its dimensions (a slice `gap` times narrower
    than its innermost storage dimension: nn.MultiheadAttention's q of [L, B, 3E]), resized:
    the strides torch gives the same view at the new sizes."""
    import torch

    old, new = [a for a, _ in sizes], [b for _, b in sizes]
    order = data.draw(st.permutations(range(len(sizes))))  # storage order, outermost first

    def view(dims: list[int]) -> torch.Tensor:
        storage = [dims[i] for i in order]
        storage[-1] *= gap
        base = torch.empty(storage)[..., : dims[order[-1]]]
        return base.permute([order.index(i) for i in range(len(dims))])

    before, after = view(old), view(new)
    shapes = Shapes((tuple(old),), ("float",), (before.stride(),))
    assert shapes.resized([new]).strides == (after.stride(),)
    assert shapes.resized([new]).dims == (tuple(new),)


def test_attention_spread_follows_the_batch() -> None:
    """nn.MultiheadAttention's q, k and v, views of [L, B, E] (rows B x E apart), at twice and
    four times the batch: the strides follow the batch (kept, the rows would stay B x E apart)
    and so does the spread, up to a page."""
    op = "aten::_scaled_dot_product_flash_attention_for_cpu"
    q, st_q = (16, 4, 64, 8), (32, 8, 16 * 32, 1)
    shapes = Shapes((q, q, q, ()), ("float",) * 3 + ("Scalar",), (st_q, st_q, st_q, ()))
    spreads = []
    for factor in (1.0, 2.0, 4.0):
        scaled = batch_scaled(op, shapes, (), factor)
        assert scaled.strides[0] == (32, 8, int(16 * factor) * 32, 1)
        cost = data_cost(op, scaled)
        assert cost is not None
        spreads.append(cost.row_spread)
    assert spreads == [64.0, 128.0, 128.0]  # 2 KB, a page, (a page)
    contiguous = data_cost(op, Shapes((q, q, q), ("float",) * 3))
    assert contiguous is not None and contiguous.row_spread == 1.0
    gemm = data_cost("aten::mm", Shapes(((8, 16), (16, 4)), ("float", "float")))
    assert gemm is not None and gemm.row_spread == 0.0


def test_heads_follow_the_width() -> None:
    """nn.MultiheadAttention's q, k, v ([B, H, L, D] views of [L, B, E], E = H x D) at twice the
    width with the heads kept: each head twice as wide, in the same layout; the log-sum-exp
    [B, H, L] and other ops as substituted; a width the heads do not divide, or a head given
    its own change, as substituted."""
    op = "aten::_scaled_dot_product_flash_attention_for_cpu"
    q, st = (12, 4, 100, 16), (64, 16, 12 * 64, 1)
    shapes = Shapes((q, q, q, ()), ("float",) * 3 + ("Scalar",), (st, st, st, ()))
    wide = heads_follow(op, shapes, shapes.substitute({64: 128}), {64: 128})
    assert wide.dims == ((12, 4, 100, 32),) * 3 + ((),)
    assert wide.strides[0] == (128, 32, 12 * 128, 1)
    backward = op + "_backward"
    lse = (12, 4, 100)
    grads = Shapes((q,) * 5 + (lse,), ("float",) * 6, (st,) * 5 + ((400, 100, 1),))
    assert heads_follow(backward, grads, grads.substitute({64: 128}), {64: 128}).dims == (
        ((12, 4, 100, 32),) * 5 + (lse,))
    for dims in ({64: 130}, {64: 128, 16: 24}, {32: 64}):
        substituted = shapes.substitute(dims)
        assert heads_follow(op, shapes, substituted, dims) == substituted
    gemm = Shapes(((100, 64), (64, 64)), ("float", "float"))
    assert heads_follow("aten::mm", gemm, gemm.substitute({64: 128}), {64: 128}).dims == (
        (100, 128), (128, 128))


def test_heads_follow_with_grouped_query_attention() -> None:
    """Grouped-query attention: k and v hold 2 heads beside q's 8 (each of 16); at twice the
    width every head is 32 wide, and a mask [B, 1, L, L] whose L is the head's size stays."""
    op = "aten::_scaled_dot_product_flash_attention_for_cpu"
    q, kv, mask = (4, 8, 16, 16), (4, 2, 16, 16), (4, 1, 16, 16)
    shapes = Shapes((q, kv, kv, mask), ("float",) * 4)
    wide = heads_follow(op, shapes, shapes.substitute({128: 256}), {128: 256})
    assert wide.dims == ((4, 8, 16, 32), (4, 2, 16, 32), (4, 2, 16, 32), mask)


def test_a_joins_tensor_list_is_priced_as_the_tensor_it_writes() -> None:
    """aten::cat's tensors, recorded as one nested list (a U-Net's skip concatenation, a GRU
    cell's gates), make no shapes of their own; joined along the recorded dimension they are
    the result it writes, priced as a copy of it: read once, written once."""
    cat = orjson.dumps({"Input Dims": [[[8, 48, 32, 32], [8, 24, 32, 32]], []],
                        "Input type": ["TensorList", "Scalar"],
                        "Concrete Inputs": ["", "1"]}).decode()
    assert shapes_from_args(cat) is None
    joined = joined_shapes("aten::cat", cat)
    assert joined is not None and joined.dims == ((8, 72, 32, 32), ())
    cost = data_cost("aten::cat", joined)
    assert cost is not None and cost.family == "copy"
    assert cost.bytes == 2 * 8 * 72 * 32 * 32 * 4
    assert output_bytes("aten::cat", joined) == 8 * 72 * 32 * 32 * 4

    def joined(name: str, dims: object, dim: str) -> tuple[int, ...] | None:
        text = orjson.dumps({"Input Dims": [dims, []], "Concrete Inputs": ["", dim]}).decode()
        found = joined_shapes(name, text)
        return found.dims[0] if found is not None else None

    assert joined("aten::cat", [[16, 48]] * 3, "-1") == (16, 144)
    assert joined("aten::stack", [[4, 5]] * 3, "1") == (4, 3, 5)
    assert joined("aten::cat", [], "0") is None  # an empty list
    assert joined("aten::cat", [[4, 5], [3, 6]], "0") is None  # they do not join
    assert joined("aten::stack", [[4, 5], [4, 6]], "0") is None
    assert joined("aten::cat", [[4, 5]], "2") is None  # no such dimension
    assert joined("aten::cat", [[4, 5]], "") is None  # not recorded
    assert joined("aten::_foreach_mul_", [[4, 5]] * 2, "1") is None  # not a join
