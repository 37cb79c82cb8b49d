"""Kernel-model calibration on this machine: time ops over a shape sweep per op family (CPU,
or a CUDA device) and fit the profile's models to them (model/profile.py).

The memory-bound families are swept twice: cold (inputs from a rotation of copies past the
cache) and warm (one set of inputs, reused). Sweeps are deterministic shape designs, ordered so a
cut budget still spans the sizes; budget left after a pass buys further passes.
"""

from __future__ import annotations

import functools
import itertools
import math
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final

import numpy as np

from perfswarm.errors import ParameterError
from perfswarm.model.fusedstep import KEY as FUSED_KEY
from perfswarm.model.fusedstep import on_cpu as fused_on_cpu
from perfswarm.model.opcost import (
    PAGE_BYTES,
    RNN_FAMILIES,
    Shapes,
    column_major,
    conv_geometry,
    conv_gradients,
    conv_output,
    data_cost,
    lstm_shape,
)
from perfswarm.model.profile import (
    CPU_FAMILIES,
    FAMILIES,
    LANES,
    UNUSABLE_GMAE,
    WARM_FAMILIES,
    Point,
    as_predicted,
    fit_family,
    vector_lanes,
)
from perfswarm.model.receive import KEY as RECEIVE_KEY
from perfswarm.recorder.bench.loader import receive_cost
from perfswarm.recorder.bench.optimizer import fused_step_cost
from perfswarm.recorder.inject._perfswarm_heap import reserve_heap

# aten op, input dims, input types, input strides (empty: contiguous), and the values of its int
# list inputs as a trace records them (Kineto's "Concrete Inputs"; empty: none)
Case = tuple[str, list[list[int]], list[str], tuple[tuple[int, ...], ...], tuple[str, ...]]
_F = ["float", "float"]


def _sweep(family: str, scale: int) -> Iterator[Case]:
    """A deterministic shape design per family, from tiny to a few MB (times `scale` on GPUs), so a
    sweep fits in seconds. Orders vary the sizes early, so a cut budget still spans them."""
    sizes = [16, 32, 48, 64, 96, 128, 192, 256]
    if family == "gemm":
        # m, k and n log-uniform between GEMM_RANGE's bounds, in multiples of 8 (a layer's
        # width seldom is a power of two: 40, 120, 768, 3072), and one of three layouts:
        # row-major; B column-major, as nn.Linear passes its weight; A column-major, as a
        # weight gradient takes the output gradient. A scrambled Sobol sequence spreads every
        # prefix of it over the whole range (a cut budget still spans it). A power-of-two
        # grid had taught the model its own points only: on the GEMMs of six real scripts'
        # recordings, 7.6% off (GMAE, those over 20 us) where this design is 4.5% off.
        from scipy.stats import qmc

        low, high = np.log(GEMM_RANGE[0]), np.log(GEMM_RANGE[1])
        for x in qmc.Sobol(4, seed=0).random_base2(GEMM_POINTS_LOG2):
            m, k, n = (int(8 * max(1, round(math.exp(v) / 8)))
                       for v in low + x[:3] * (high - low))
            layout = int(x[3] * 3)
            strides = ((), ((k, 1), (1, k)), ((1, m * scale), (n * scale, 1)))[layout]
            yield "aten::mm", [[m * scale, k], [k, n * scale]], _F, strides, ()
    elif family in ("conv", "conv_backward"):
        yield from _interleaved(list(_conv2d_sweep(family, scale)),
                                list(_conv1d_sweep(family, scale)))
    elif family in ("sdpa", "sdpa_backward"):
        # CPU flash attention, causal (a decoder's training step): its time follows the head
        # size unevenly (vector width: 16 runs faster than 10, 20 faster than 10), which no
        # FLOP count shows; heads 4, a batch of 1 to 32, sequences 32 to 256; q, k and v
        # contiguous, or views of [L, B, E] as nn.MultiheadAttention makes them (rows B x E
        # apart: OpCost.row_spread). Points visited in a coprime stride, so a cut budget still
        # spans every axis.
        grid = [(by_row, seq, head, batch) for by_row, seq, head, batch in itertools.product(
            (False, True), (64, 256, 32, 128), (8, 16, 32, 64, 128, 10, 20, 40, 80, 24, 48, 96),
            (1, 8, 2, 32, 4, 16)) if batch * seq * head <= ATTENTION_WORK]
        for i in range(len(grid)):
            by_row, seq, head, batch = grid[i * 37 % len(grid)]
            qkv = [[batch, 4, seq, head]] * 3
            row = ((4 * head, head, batch * 4 * head, 1) if by_row else
                   (4 * seq * head, seq * head, head, 1))
            if family == "sdpa":
                yield SDPA_CPU, qkv, ["float"] * 3, (row,) * 3, ()
            else:  # grad_out, q, k, v, out, logsumexp
                yield (f"{SDPA_CPU}_backward", [*qkv, *qkv[:2], [batch, 4, seq]],
                       ["float"] * 6, (*(row,) * 5, (4 * seq, seq, 1)), ())
    elif family in RNN_FAMILIES:
        # oneDNN's LSTM layer (torch's CPU nn.LSTM, one layer a call) and its backward, the
        # layer itself: its time per call (descriptors, weights reordered, memory taken and
        # freed) and its per-step GEMMs, oneDNN's own kernels, which the GEMM sweep (ATen's)
        # does not time. T, B, I and H log-uniform between RNN_RANGE's bounds (I and H in
        # multiples of 8), a scrambled Sobol sequence as the GEMM's, those past RNN_WORK left
        # out (a call of tens of ms).
        from scipy.stats import qmc

        op = RNN_CPU if family == "rnn" else f"{RNN_CPU}_backward"
        low, high = np.log(RNN_RANGE[0]), np.log(RNN_RANGE[1])
        for x in qmc.Sobol(4, seed=0).random_base2(RNN_POINTS_LOG2):
            t, b, i, h = (max(1, round(math.exp(v))) for v in low + x * (high - low))
            i, h = 8 * max(1, round(i / 8)), 8 * max(1, round(h / 8))
            if t * b * h * (i + h) <= RNN_WORK:  # a CPU family: no `scale`
                gates = 4 * h
                yield (op, [[t, b, i], [gates, i], [gates, h], [gates], [gates], [b, h], [b, h]],
                       ["float"] * 7, (), ())
    elif family == "embedding_bag":  # tables in cache and far past it, 8 or 32 ids a bag
        for rows in (1000, 100_000, 20_000):
            for dim in (16, 128, 64):
                for bags in (32, 512, 128):
                    for pooling in (8, 32):
                        yield ("aten::embedding_bag", [[rows, dim], [bags * pooling * scale],
                                                       [bags * scale]],
                               ["float", "long int", "long int"], (), ())
    else:  # up to 16 MB a tensor: activations of a batch are that large
        op = {"elementwise": "aten::add", "reduction": "aten::sum", "copy": "aten::clone"}[family]
        for rows in (*sizes, 384, 512, 768, 1024, 1536, 2048, 4096):
            for cols in (64, 256, 1024):
                dims = ([[rows * scale, cols], [rows * scale, cols]] if family == "elementwise"
                        else [[rows * scale, cols]])
                yield op, dims, _F[: len(dims)], (), ()


def _conv2d_sweep(family: str, scale: int) -> Iterator[Case]:
    """2-D 3x3 convolutions ('same' padding), forward or backward: 8-32 pixels square, 3-128
    channels, a batch of 4-64; the backward of the 3-channel layer (an image network's first)
    the weight's gradient only, as autograd asks it (`_backward_case`)."""
    for hw in (8, 16, 32, 24):
        for c_in, c_out in ((3, 16), (16, 32), (32, 64), (64, 64), (64, 128)):
            for batch in (4, 16, 64):
                weight = [c_out, c_in, 3, 3]
                if family == "conv":
                    yield ("aten::conv2d", [[batch * scale, c_in, hw, hw], weight, [c_out]],
                           ["float"] * 3, (), ())
                else:
                    yield _backward_case([batch * scale, c_out, hw, hw],
                                         [batch * scale, c_in, hw, hw], weight,
                                         ("[1, 1]", "[1, 1]", "[1, 1]"))


def _conv1d_sweep(family: str, scale: int) -> Iterator[Case]:
    """1-D convolutions as audio and sequence models have them (`CONV1D_LAYERS`), forward or
    backward, at a batch of 4, 64 and 16 (each batch over every layer first), with their
    stride, padding and dilation recorded as a trace records them (op_cost reads the output
    size from them). The backward computes the gradients autograd asks of the layer
    (`_backward_case`): a first layer's (one input channel) the weight's only (its input's
    gradient, at stride 16, is 5-7x the weight's: the [8, 1, 4000] -> 40 front end's backward
    took 2.3 ms with it, 0.34 ms without)."""
    for batch in (4, 64, 16):
        for c_in, c_out, length, kernel, stride, pad in CONV1D_LAYERS:
            x, weight = [batch * scale, c_in, length], [c_out, c_in, kernel]
            geometry = (f"[{stride}]", f"[{pad}]", "[1]")
            if family == "conv":  # conv1d(input, weight, bias, stride, padding, dilation, groups)
                yield ("aten::conv1d", [x, weight, [c_out], [], [], [], []],
                       ["float"] * 3 + ["int[]"] * 3 + ["int"], (), ("", "", "", *geometry, "1"))
            else:  # its output size from the forward's geometry
                (out,) = conv_output("conv1d", [x, weight], ("", "", "", *geometry))
                yield _backward_case([batch * scale, c_out, out], x, weight, geometry)


def _backward_case(grad: list[int], x: list[int], weight: list[int],
                   geometry: tuple[str, str, str]) -> Case:
    """A convolution's backward as autograd records it: convolution_backward(grad_output,
    input, weight, bias_sizes, stride, padding, dilation, transposed, output_padding, groups,
    output_mask), at the forward's `geometry` (stride, padding, dilation as a trace records
    them). It computes the gradients autograd asks of the layer, its output_mask recorded too:
    the input's and the weight's, but a network's first layer's (an input of up to
    `FIRST_LAYER_CHANNELS`) the weight's only, since its input needs none."""
    mask = f"[{x[1] > FIRST_LAYER_CHANNELS}, True, False]"
    return (CONV_BACKWARD, [grad, x, weight, *[[]] * 8],
            ["float"] * 3 + ["int[]"] * 4 + ["bool", "int[]", "int", "bool[]"], (),
            ("", "", "", "", *geometry, "False", str([0] * (len(x) - 2)), "1", mask))


def _interleaved(*designs: Sequence[Case]) -> Iterator[Case]:
    """The designs' points merged in proportion, each design's in its order: any prefix holds
    about its share of each (a cut budget still spans all of them)."""
    keyed = sorted(((i + 0.5) / len(design), j, i) for j, design in enumerate(designs)
                   for i in range(len(design)))
    for _, j, i in keyed:
        yield designs[j][i]


# the GEMM sweep's (m, k, n) bounds (m up to 2048: a transformer's GEMMs take batch x sequence
# rows), and its size: 2 ** GEMM_POINTS_LOG2 points, budget allowing
GEMM_RANGE = ((8, 16, 16), (2048, 4096, 2048))
GEMM_POINTS_LOG2 = 8
SDPA_CPU = "aten::_scaled_dot_product_flash_attention_for_cpu"
# the LSTM sweep: (T, B, I, H) bounds, its size (2 ** RNN_POINTS_LOG2 candidates) and its
# largest T x B x H x (I + H) (a language model's T 35, B 32, H 128 at I = H: 10-20 ms a call
# here, its backward twice that)
RNN_CPU = "aten::mkldnn_rnn_layer"
RNN_RANGE = ((4, 1, 16, 16), (128, 64, 512, 512))
RNN_POINTS_LOG2 = 7
RNN_WORK = 1 << 25
# the attention sweep's largest batch x sequence x head dimension (its batch of 32 at a short
# sequence or a small head: where a strided layout's rows lie 4 KB apart and more)
ATTENTION_WORK = 32 * 64 * 32
CONV_BACKWARD = "aten::convolution_backward"
# the most channels the conv sweeps' first layers take (an image's 3, raw audio's 1): autograd
# asks a first layer's backward for the weight's gradient only (a network's input needs none)
FIRST_LAYER_CHANNELS = 3
# (C_in, C_out, length, kernel, stride, padding) of the 1-D conv sweep's layers: a raw-audio
# front end (80 taps, stride 16, as M5 has it), short sequences of 15-61 steps at 40-128
# channels, longer ones of 256-2000 at 8-64 channels, kernels of 3 to 9, strides of 2 and 4.
# A 1-D convolution costs a fixed time per call the 2-D sweep does not teach: [B, 40, 15] -> 80
# and [B, 40, 61] -> 40 took about 75 us + 3.9 and 8.8 us a sample here, where a model learned
# on 2-D points alone said 34-35 us + 3.4 and 8.6.
CONV1D_LAYERS = ((1, 32, 4000, 80, 16, 0), (40, 40, 61, 3, 1, 1), (16, 32, 256, 5, 1, 2),
                 (40, 80, 15, 3, 1, 1), (64, 64, 500, 3, 1, 1), (32, 64, 128, 9, 2, 4),
                 (128, 128, 32, 3, 1, 1), (8, 16, 2000, 9, 4, 4))
PASSES = 3  # over a sweep, budget allowing
ROTATE_BYTES = 16 << 20  # inputs cycle through copies this large in all: past the L2 cache
# outputs of up to 32 MiB are recycled heap memory, as in a step (on new heap, a fresh process's
# first conv sweep ran its batch-64 points 1.3-2.3x slower than a second sweep did)
RESERVE_MIB = 256


def _runner(op: str, dims: list[list[int]], device: str,
            strides: Sequence[Sequence[int]] = (), warm: bool = False,
            concrete: Sequence[str] = ()) -> Callable[[], object]:
    """A call of the op on fresh inputs each time: it cycles through enough copies that they
    no longer fit a per-core cache, as in a training step, where an op's inputs were written
    by other ops in between (timing one tensor over and over measures a hot cache). `warm`:
    one copy, reused, the other extreme. An input with strides is made with them (a
    column-major matrix is a transposed row-major one); a convolution, of the geometry
    `concrete` holds (_convolution)."""
    import torch

    gen = torch.Generator().manual_seed(0)
    size = 4 * sum(math.prod(d) for d in dims)
    copies = 1 if warm else max(1, min(16, ROTATE_BYTES // max(size, 1)))
    calls: list[Callable[[], object]]
    if op == "aten::embedding_bag":  # other ids each call too, as each step brings
        (rows, dim), (lookups,), (bags,) = dims
        offsets = torch.arange(0, lookups, lookups // bags).to(device)
        lookup = functools.partial(torch.nn.functional.embedding_bag, mode="sum")
        tables = [torch.rand(rows, dim, generator=gen).to(device) for _ in range(copies)]
        calls = [functools.partial(lookup, torch.randint(0, rows, (lookups,), generator=gen)
                                   .to(device), table, offsets)
                 for table in tables for _ in range(4)]
    elif op.startswith(SDPA_CPU):
        calls = [_attention(op, dims, strides, gen) for _ in range(copies)]
    elif op in _CONV_CALLS:
        calls = [_convolution(op, dims, concrete, gen, device) for _ in range(copies)]
    elif op.startswith(RNN_CPU):
        calls = [_lstm(op, dims, gen) for _ in range(copies)]
    else:
        def tensor(i: int) -> Any:
            d = dims[i]
            if column_major(dims, strides, i):
                return torch.rand(d[1], d[0], generator=gen).to(device).t()
            return torch.rand(*d, generator=gen).to(device)

        fns: dict[str, Callable[..., object]] = {
            "aten::mm": torch.mm, "aten::add": torch.add, "aten::sum": torch.sum,
            "aten::clone": torch.clone}
        # a GEMM writes into an output of its own, kept: in a step, a result takes memory
        # the allocator recycles (a new 16 MB one each call page-faulted at times, 5x slower)
        out = ({"out": torch.empty(dims[0][0], dims[1][1], device=device)}
               if op == "aten::mm" else {})
        calls = [functools.partial(fns[op], *(tensor(i) for i in range(len(dims))), **out)
                 for _ in range(copies)]
    turn = itertools.cycle(calls)

    def call() -> object:
        return next(turn)()

    return call


# the swept convolution ops -> how a call of each is made: the functional forward, as a script
# calls it, or the backward as autograd calls it (the input's and the weight's gradients)
_CONV_CALLS: Final = {"aten::conv1d": "conv1d", "aten::conv2d": "conv2d",
                      CONV_BACKWARD: "convolution_backward"}


def _convolution(op: str, dims: Sequence[Sequence[int]], concrete: Sequence[str], gen: Any,
                 device: str) -> Callable[[], object]:
    """One convolution call on fresh tensors of the shaped `dims`, at the stride, padding and
    dilation that `concrete` holds as a trace records them; without them, stride 1 and 'same'
    padding (the output size op_cost assumes then)."""
    import torch

    backward = op == CONV_BACKWARD
    tensors = [torch.rand(*d, generator=gen).to(device) for d in dims if d]
    kernel = tensors[1 + backward].shape[2:]
    rank = len(kernel)
    stride, pad, dilation = (conv_geometry(op, concrete, rank) if concrete else
                             ((1,) * rank, tuple((k - 1) // 2 for k in kernel), (1,) * rank))
    assert stride is not None and pad is not None and dilation is not None
    if backward:  # the gradients its recorded output_mask asks for, else the input's and
        # the weight's (autograd's for a layer without bias inside a network)
        return functools.partial(torch.ops.aten.convolution_backward, *tensors, [0], stride,
                                 pad, dilation, False, [0] * rank, 1,
                                 [*conv_gradients(op, concrete), False])
    forward = getattr(torch.nn.functional, _CONV_CALLS[op])
    return functools.partial(forward, *tensors, stride, pad, dilation)


def _attention(op: str, dims: list[list[int]], strides: Sequence[Sequence[int]], gen: Any
               ) -> Callable[[], object]:
    """One causal CPU flash-attention call, forward or backward (on the forward's own output
    and log-sum-exp), on q, k and v of the shape of `dims[0]` (q's, or the output gradient's,
    which is q's), laid out as `strides[0]` says (views of [L, B, E] where rows are not a
    head dimension apart)."""
    import torch

    batch, heads, seq, head = dims[0]
    by_row = bool(strides) and strides[0][2] != head

    def tensor() -> Any:
        if by_row:
            return (torch.rand(seq, batch, heads * head, generator=gen)
                    .view(seq, batch, heads, head).permute(1, 2, 0, 3))
        return torch.rand(*dims[0], generator=gen)

    forward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    q, k, v, grad = (tensor() for _ in range(4))
    if op == SDPA_CPU:
        return functools.partial(forward, q, k, v, 0.0, True)
    out, lse = forward(q, k, v, 0.0, True)
    return functools.partial(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward,
                             grad, q, k, v, out, lse, 0.0, True)


def _lstm(op: str, dims: Sequence[Sequence[int]], gen: Any) -> Callable[[], object]:
    """One call of oneDNN's LSTM layer as torch's CPU nn.LSTM makes it (one layer, biases,
    training: it keeps its workspace), forward or backward (on the forward's own output, hidden
    states and workspace, and an output gradient only, as a language model's loss gives it: the
    last hidden states' gradients undefined), on fresh inputs of `dims` ((T, B, I, H):
    opcost.lstm_shape)."""
    import torch

    found = lstm_shape(op.removeprefix("aten::"), dims)
    assert found is not None  # the sweep makes only LSTM shapes
    steps, batch, inputs, hidden = found
    x = torch.rand(steps, batch, inputs, generator=gen)
    weights = [(torch.rand(*d, generator=gen) - 0.5) / hidden for d in dims[1:5]]
    hx, cx = torch.zeros(batch, hidden), torch.zeros(batch, hidden)
    # reverse, batch_sizes, mode (oneDNN's LSTM), hidden_size, num_layers, has_biases,
    # bidirectional, batch_first, train
    forward = functools.partial(torch.ops.aten.mkldnn_rnn_layer, x, *weights, hx, cx, False, [],
                                2, hidden, 1, True, False, False, True)
    if op == RNN_CPU:
        return forward
    out, hy, cy, workspace = forward()
    # ..., reverse, mode, hidden_size, num_layers, has_biases, train, bidirectional,
    # batch_sizes, batch_first, workspace
    return functools.partial(torch.ops.aten.mkldnn_rnn_layer_backward, x, *weights, hx, cx, out,
                             hy, cy, torch.rand_like(out), None, None, False, 2, hidden, 1, True,
                             True, False, [], False, workspace)


def time_op(run: Callable[[], object], min_s: float = 2e-3,
            sync: Callable[[], None] = lambda: None) -> float:
    """Fastest of five timings, each of enough repetitions to last ``min_s`` (the minimum: load
    from other processes only ever adds time). `sync` waits for an asynchronous device."""
    run()
    sync()
    start = time.perf_counter()
    run()
    sync()
    once = max(time.perf_counter() - start, 1e-7)
    reps = max(1, math.ceil(min_s / once))
    samples = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(reps):
            run()
        sync()
        samples.append((time.perf_counter() - start) / reps)
    return min(samples)


def measure(family: str, budget_s: float, device: str = "cpu", warm: bool = False
            ) -> list[Point]:
    """Time the family's sweep until the budget runs out (at least eight points); `warm`:
    on inputs that stay in cache (_runner). Budget left after a pass goes to further passes
    over the points timed (up to PASSES), each point keeping its fastest: a burst of other
    load on a shared machine spoils the points of one pass, not a point."""
    sync: Callable[[], None] = lambda: None  # noqa: E731
    scale = 1
    if device.startswith("cuda"):
        import torch

        def sync() -> None:
            torch.cuda.synchronize(device)

        scale = 8  # GPU kernels need more work before launch overhead stops dominating
    cases: list[Case] = []
    seconds: list[float] = []
    deadline = time.perf_counter() + budget_s
    sweep = iter(_sweep(family, scale))
    for first in [True] + [False] * (PASSES - 1):
        for i, case in enumerate(sweep if first else cases):
            if time.perf_counter() > deadline and (not first or len(cases) >= 8):
                break
            op, dims, _types, strides, concrete = case
            t = time_op(_runner(op, dims, device, strides, warm, concrete), sync=sync)
            if first:
                cases.append(case)
                seconds.append(t)
            else:
                seconds[i] = min(seconds[i], t)
    points = []
    for (op, dims, types, strides, concrete), t in zip(cases, seconds, strict=True):
        cost = data_cost(op, Shapes(tuple(map(tuple, dims)), tuple(types), strides, concrete))
        assert cost is not None  # the sweep only holds modelled ops
        points.append(Point(cost, t, tuple(tuple(d) for d in dims), strides, concrete))
    return points


def first_touch_s(sizes_mb: Sequence[int] = (1, 4, 16), repeats: int = 5) -> float:
    """Seconds the host spends on one 4 KiB page of fresh anonymous memory the first time it is
    written (the kernel's page fault and zeroing), beyond writing it again: what an op pays per
    page of an output the allocator takes from new memory. The median over sizes of the least
    disturbed first write of `repeats` trials less the least disturbed second one (each its
    own fastest: the least of the trials' differences had taken one disturbed second write
    for a free fault, 0.00 us under load)."""
    import mmap

    import torch

    per_page = []
    for mb in sizes_mb:
        size = mb << 20
        fresh_s, warm_s = math.inf, math.inf
        for _ in range(repeats):
            with mmap.mmap(-1, size) as memory:
                tensor = torch.frombuffer(memory, dtype=torch.float32)
                start = time.perf_counter()
                tensor.fill_(1.0)
                fresh = time.perf_counter()
                tensor.fill_(2.0)
                warm = time.perf_counter()
                del tensor  # before the map closes
            fresh_s, warm_s = min(fresh_s, fresh - start), min(warm_s, warm - fresh)
        per_page.append(max(fresh_s - warm_s, 0.0) / (size / PAGE_BYTES))
    return float(np.median(per_page))


def _device(device: str) -> tuple[str, str]:
    """(torch device, its name) after checking it exists."""
    import torch

    if device == "cpu":
        return "cpu", "cpu"
    if device.startswith("cuda"):
        index = device.partition(":")[2] or "0"
        if not index.isdigit():
            raise ParameterError("device", "expected cpu or cuda:N", value=device)
        if not torch.cuda.is_available() or int(index) >= torch.cuda.device_count():
            found = torch.cuda.device_count() if torch.cuda.is_available() else 0
            raise ParameterError("device", f"no such CUDA device here ({found} found)",
                                 value=device)
        return f"cuda:{index}", str(torch.cuda.get_device_name(int(index)))
    raise ParameterError("device", "expected cpu or cuda:N", value=device)


def swept_families(where: str) -> list[str]:
    """The families `calibrate` sweeps on `where` (a torch device): the CPU-only ones on the CPU
    alone, the LSTM layer's only where torch runs nn.LSTM by oneDNN (a build without it runs
    its own kernels: no mkldnn_rnn_layer op to time, nor in a trace to price)."""
    import torch

    return [f for f in FAMILIES if f not in CPU_FAMILIES or (where == "cpu" and (
        f not in RNN_FAMILIES or torch.backends.mkldnn.is_available()))]  # type: ignore[no-untyped-call]


def calibrate(budget_s: float, threads: int = 1, device: str = "cpu",
              on_family: Callable[[str], None] = lambda _f: None) -> dict[str, Any]:
    """The device profile: per family, the fitted models, their held-out GMAE and the sweep;
    on the CPU also what taking a batch from a DataLoader worker costs (bench/loader.py: about
    a second beside the budget) and what a fused optimizer step costs (bench/optimizer.py:
    a few seconds beside it). On the CPU, timed with ``threads`` intra-op threads: on a
    shared machine torch's parallel-for above its grain size waits on busy cores (a fixed ~8
    ms step), not on the op; record the workload with the same count (the bundled workloads'
    --threads)."""
    import torch

    where, name = _device(device)
    extra: dict[str, Any] = {}
    if where == "cpu":
        # before the heap's reserve, which each worker process would start with
        on_family("taking a batch from a DataLoader worker")
        extra[RECEIVE_KEY] = receive_cost()
        reserve_heap(RESERVE_MIB)  # each larger output would grow the heap: page faults
    # the memory-bound sweeps first: what they leave of their share goes to the GEMM sweep
    families = swept_families(where)
    sweeps = [*((f, True) for f in WARM_FAMILIES), *((f, False) for f in reversed(families))]
    swept: dict[tuple[str, bool], list[Point]] = {}
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        # at the threads the sweeps time ops with, beside the budget (a torch older than 2.4
        # has no fused step on the CPU: its profile has none, and the advice gives none)
        if where == "cpu" and fused_on_cpu(torch.__version__):
            on_family("a fused optimizer step")
            extra[FUSED_KEY] = fused_step_cost(ROTATE_BYTES)
        start = time.perf_counter()
        for i, (family, warm) in enumerate(sweeps):
            on_family(f"{family} (warm)" if warm else family)
            share = start + budget_s * (i + 1) / len(sweeps) - time.perf_counter()
            swept[family, warm] = measure(family, share, where, warm)
        page_s = first_touch_s()
    finally:
        torch.set_num_threads(saved)
    # fitted once every sweep is done: a learned model's fit (seconds, on a busy machine) had
    # taken the next family's share (the forward attention's: 8 points at the default budget)
    on_family("fitting the models")
    lanes = vector_lanes(torch.backends.cpu.get_cpu_capability()) if where == "cpu" else LANES
    fitted = {key: fit_family(as_predicted(points, lanes) if where == "cpu" else points, lanes)
              for key, points in swept.items()}
    cold = {f: fitted[f, False] for f in families}
    reused = {f: fitted[f, True] for f in WARM_FAMILIES}
    return {"device": where, "device_name": name, "threads": threads, "families": cold,
            "warm": reused, "page_s": page_s, "lanes": lanes, **extra,
            "unusable": sorted([f for f, e in cold.items() if e["gmae_held_out"] > UNUSABLE_GMAE]
                               + [f"{f} (warm)" for f, e in reused.items()
                                  if e["gmae_held_out"] > UNUSABLE_GMAE])}
