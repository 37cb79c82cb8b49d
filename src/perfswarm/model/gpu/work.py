"""A GPU kernel's work (FLOPs, bytes, its GEMM view) and the features the learned model reads
of it on a device: the roofline, the wave and tile quantization over the SMs, the ridge point
and the memory class.

The model predicts the log of measured time over a bound (`bound_s`: the roofline, for GEMMs
and convolutions the wave of whole tiles their busiest SM runs where that is longer, for layer
norms and block softmaxes the rows their caches no longer hold read again from DRAM), that is
one over the fraction of the bound the kernel reaches: a quantity that moves little between
GPUs of other sizes, so it carries to GPUs no measurement came from.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal

from perfswarm.model.gpu.hardware import Hardware

Family = Literal["gemm", "conv", "elementwise", "norm", "softmax"]
FAMILIES: Final[tuple[Family, ...]] = ("gemm", "conv", "elementwise", "norm", "softmax")
# sub-kinds the families' measurements tell apart (an elementwise op's arithmetic, a scalar
# operand's 'u' form), coded as one feature
KINDS: Final = ("linear", "bmm", "add", "addu", "mul", "mulu", "div", "divu", "pow", "powu",
                "relu", "gelu", "tanh", "conv", "ln", "softmax")
ELEMENTWISE_BLOCK: Final = 512  # elements a vectorized elementwise block takes (128 threads x 4)
TILES: Final = (128, 64)  # GEMM output tile edges the quantization features assume
# the output tiles cuBLAS's FP32 GEMM kernels come in (shared/gpu-kernels' sweeps: sgemm_128x128
# to sgemm_32x32_sliced1x4 on Maxwell to Ampere), as (columns, rows) of a Work's output, and
# the k a SIMT kernel's main loop steps by (sgemm_128x128x8): what GEMM_BOUND reads
GEMM_TILES: Final = ((128, 128), (128, 64), (128, 32), (64, 64), (64, 32), (32, 128), (32, 32))
K_STEP: Final = 8
# the least reduction a split-K slice keeps (4 steps of a tensor-core tile's 32-deep main
# loop): the H200's recordings (tests/data) ran a split-K reduce after every GEMM whose
# tile_bound_s tile splits a reduction of 384-2,240, none after those of 39-128 (one of 10
# split and reduced); its conv net's split weight gradients reduce over 960-15,744 pixels
SPLIT_SLICE: Final = 128
# the families whose kernels run as tiles of a GEMM's output, bounded by the wave their
# busiest SM runs (tile_bound_s)
TILED: Final = frozenset({"gemm", "conv"})
# the families whose kernels stream their bytes through once (no operand reused from the L2 or
# shared memory, as a GEMM's tiles are): their bytes move at the bandwidth the device's DRAM
# streams at (Hardware.streamed_bandwidth), and under UNDER_RIDGE of the ridge point they are
# bound by their bytes however far under: that feature is clamped there, so that it tells no
# device apart where the hardware does not (unclamped, the P100's large elementwise ops were
# priced by its A100-like ridge point)
STREAMING: Final = frozenset({"elementwise", "norm", "softmax"})
UNDER_RIDGE: Final = 1 / 16
NORM_BLOCK: Final = 128  # threads of PyTorch's layer norm block (dram_bytes)
# PyTorch's softmax over rows of more than WARP_SOFTMAX columns: cunn_SoftMaxForward, a block a
# row (SoftMax_getBlockSize: the power of two at or over half of min(columns / SOFTMAX_ILP,
# SOFTMAX_THREADS); shared/gpu-kernels' grids: 1,267-2,048 columns 256 threads, 2,431 up 512),
# reading its row three times (max, sum of exponentials, then to write); up to WARP_SOFTMAX,
# softmax_warp_forward holds a row in a warp's registers and reads it once
WARP_SOFTMAX: Final = 1024
SOFTMAX_THREADS: Final = 1024
SOFTMAX_ILP: Final = 4
# every family's working set past L2_SPAN L2s comes from DRAM however much larger (between calls
# no reuse is left; a GEMM's or a convolution's tiles then stream their operand panels through
# the L2 a wave at a time, however large the whole): bytes / L2 is clamped there. Unclamped, it
# told the devices apart by their L2 alone (6 MB on a V100, 40 on an A100): the V100's large
# elementwise ops, at more L2s than the A100's training rows reach, were priced like GDDR
# parts', and with the V100 left out its models' GEMMs of over 50 GFLOP (a median 52 of its
# L2s, 8 of the A100's) came out 1.18x their measured time, 1.15x clamped (docs/benchmarks.md,
# twenty-fourth pass)
L2_SPAN: Final = 4.0
# the device enters through the roofline, the waves over its SMs, bytes over its L2, its ridge
# point and its memory class only: no feature names one of the few measured GPUs (SMs, clock,
# bandwidth as such), so an unseen GPU is not priced as the measured GPU nearest in some spec
FEATURES: Final = ("log2 FLOPs", "log2 bytes", "log2 intensity / ridge", "log2 roofline us",
                   "log2 batch", "log2 m", "log2 n", "log2 k", "log2 waves 128",
                   "wave efficiency 128", "log2 waves 64", "wave efficiency 64",
                   "log2 bytes / L2", "kind", "log2 ridge", "memory near peak")
# what a family's trees read beside FEATURES (the others' inputs, and so their fits, stay as
# they were: a constant column more moves the order the splitter tries features in, and with
# it the other families' leave-one-GPU-out whole models by 0.2 points, docs/benchmarks.md)
FAMILY_FEATURES: Final[dict[Family, tuple[str, ...]]] = {"conv": ("log2 pixels a sample",)}
Peak = Literal["fp32", "tf32", "half", "bf16"]


@dataclass(frozen=True)
class Work:
    """One kernel's work. b, m, n, k: its GEMM view (a convolution's implicit GEMM; rows and
    columns of a normalization, softmax or elementwise op, with k = 1)."""

    family: Family
    kind: str
    flops: float
    bytes: float
    b: int
    m: int
    n: int
    k: int
    peak: Peak = "fp32"  # which of the device's peaks bounds it (tensor cores: tf32, half)
    # a convolution's output pixels a sample (its implicit GEMM's m is these times the batch;
    # FAMILY_FEATURES), 1 for the other families: cuDNN runs a convolution by one algorithm or
    # another (Winograd's 2x2 and 4x4 output tiles a sample, FFT, the implicit GEMM) and picks
    # by the sample's size as well, and Winograd pads each sample's side to its tile, which m
    # alone does not tell (the five GPUs' conv sweeps: docs/benchmarks.md, twenty-eighth pass)
    image: int = 1

    def blocks(self, tile: int) -> int:
        """Thread blocks it launches: output tiles of a GEMM, rows of a norm or softmax,
        vectorized chunks of an elementwise op."""
        if self.family in ("gemm", "conv"):
            return self.b * math.ceil(self.m / tile) * math.ceil(self.n / tile)
        if self.family == "elementwise":
            return math.ceil(self.b * self.m * self.n / ELEMENTWISE_BLOCK)
        return self.b * self.m


def peak_of(hw: Hardware, peak: Peak) -> float:
    return {"fp32": hw.fp32, "tf32": hw.tensor_fp32, "half": hw.tensor_half,
            "bf16": hw.tensor_bf16 or hw.tensor_half}[peak]


def roofline_s(work: Work, hw: Hardware) -> float:
    """max(FLOPs at the peak, bytes at the bandwidth; a STREAMING family's at the bandwidth the
    device's DRAM streams at): a time the kernel cannot beat (but from the L2)."""
    bandwidth = hw.streamed_bandwidth if work.family in STREAMING else hw.bandwidth
    return max(work.flops / peak_of(hw, work.peak), work.bytes / bandwidth)


def tile_bound_s(work: Work, hw: Hardware) -> float:
    """The least time a GEMM's (or an implicit-GEMM convolution's) thread blocks can take: the
    SM given the most of them runs ceil(blocks / SMs) whole output tiles, each a tile's FLOPs
    over the reduction at one SM's share of the peak, however much of the tile lies past the
    output's edge; the least of that over GEMM_TILES (the library picks its tile). A single
    GEMM whose tiles leave SMs idle splits its reduction over them (cuBLAS's split-K: the
    sweeps' linears launch 2-144 slices a tile, then splitKreduce), a wave of at most one
    block an SM, a slice no shorter than K_STEP. A batch has no split (its GEMMs fill the
    SMs). A few blocks of a long reduction run at one SM's rate, not the device's: the A100's
    sweep ran 3 GEMMs of 26 x 12 over 1,020 (bmm) in 344 us of kernel time, as 3 blocks of
    its 128x128 tile (185 us at one SM's rate each); the roofline says 0.3 us, this bound
    12 us (3 tiles of 32x32). Over the five GPUs' sweeps (rows of at least 2 floors) the
    kernel time is at least 0.8 of it, and the A100's bmms' 99th-percentile ratio to it is
    22 against 73 to the roofline (docs/benchmarks.md, twenty-fifth pass)."""
    return _tile_choice(work, hw)[0]


def _tile_choice(work: Work, hw: Hardware) -> tuple[float, int]:
    """tile_bound_s's time and the split of the reduction its tile runs at (1: none)."""
    per_sm = peak_of(hw, work.peak) / hw.sms
    best = (math.inf, 1)
    for columns, rows in GEMM_TILES:
        blocks = max(1, work.b * math.ceil(work.n / columns) * math.ceil(work.m / rows))
        split = 1 if work.b > 1 else max(1, min(hw.sms // blocks, math.ceil(work.k / K_STEP)))
        waves = math.ceil(blocks * split / hw.sms)
        best = min(best, (waves * 2.0 * columns * rows * math.ceil(work.k / split) / per_sm,
                          split))
    return best


def split_k_reduce(work: Work, hw: Hardware) -> Work | None:
    """The kernel a convolution whose reduction is split over idle SMs launches after it
    (cutlass's ReduceSplitK in cuDNN; cuBLAS's splitKreduce_kernel): where tile_bound_s's
    tile splits the reduction and each of at least two slices keeps SPLIT_SLICE of it, one
    pass reading the slices' FP32 partial M x N outputs and writing M x N; None otherwise.
    The H200's conv net (tests/data/conv1d_h200) ran it after the two weight gradients this
    splits (128 x 384 over 3,904 and 128 x 80 over 15,744: 10 and 44 slices, 2.1 and 4.7
    us), after none of its 6 other convolutions, of which this splits one (256 x 384 over
    960, which cuDNN ran as 12 whole tiles). A GEMM's is not added: the linear sweeps the
    GEMM model learns from time it inside the op (3-11% of a GPU's rows ran one), and the
    H200's split GEMMs (tests/data's nanoGPT and LSTM) are priced 1.1-2.2x their GEMM kernel
    alone, 0.8-1.5x it and its 1.7-2.2 us reduce together. The conv sweeps' forwards have no
    row this splits (docs/benchmarks.md, twenty-fifth pass)."""
    if work.family != "conv":
        return None
    slices = min(_tile_choice(work, hw)[1], work.k // SPLIT_SLICE)
    if slices <= 1:
        return None
    out = work.m * work.n
    return Work("elementwise", "add", float(slices * out), float((slices + 1) * out * FP32), 1,
                work.m, work.n, 1)


def launched(works: Sequence[Work], hw: Hardware) -> list[Work]:
    """`works` with the kernels the library launches beside them on `hw` (split_k_reduce)."""
    return [w for work in works for w in (work, split_k_reduce(work, hw)) if w is not None]


def bound_s(work: Work, hw: Hardware) -> float:
    """The time the learned model prices a kernel over: its roofline, for a TILED family its
    tile bound where that is longer (the trees then learn the ratio to a bound that already
    knows the device's SMs, not one off by 1x to over 1,000x by the shape: the A100's sweep),
    for a layer norm or a block softmax its bytes to and from DRAM (dram_bytes) at the
    streamed bandwidth."""
    roofline = roofline_s(work, hw)
    if work.family in TILED:
        return max(roofline, tile_bound_s(work, hw))
    if work.family in ("norm", "softmax"):
        return max(roofline, dram_bytes(work, hw) / hw.streamed_bandwidth)
    return roofline


def row_passes(work: Work) -> tuple[int, int]:
    """A layer norm's or softmax's kernel: the threads of its block (one a row) and how many
    times it reads its row (rows_reread)."""
    if work.family == "norm":
        return NORM_BLOCK, 2
    if work.n <= WARP_SOFTMAX:
        return NORM_BLOCK, 1  # the warp softmax: a warp a row (the block's size moot: no re-read)
    half = min(work.n // SOFTMAX_ILP, SOFTMAX_THREADS) // 2
    return max(32, 1 << (half - 1).bit_length()), 3


def dram_bytes(work: Work, hw: Hardware) -> float:
    """The bytes a layer norm's or softmax's kernel moves to and from DRAM on `hw`: its work's,
    and each row read again (row_passes) where no cache still holds it. PyTorch's
    vectorized_layer_norm_kernel (every layer norm of shared/gpu-kernels' five GPUs; a
    backward's kernels are priced alike) runs a NORM_BLOCK-thread block a row, which reads
    its row for the mean and variance, then again to normalize it; the block softmax reads
    its row three times. Between the reads the rows resident at once pass through the
    caches: an SM's (hw.sm_threads / the block's threads of them) through its L1 where that
    holds global loads (Volta and later; Pascal's go to the L2 only), the device's through the
    L2, beside the rows written meanwhile (twice their bytes); a cache smaller than its
    footprint finds a share of its size over that footprint. So the P100 (4 MB L2, no L1 for
    loads) reads 46% of its layer norms' rows again from DRAM at 1,024 columns and 86% at
    4,096, the A100 (192 KB L1, 40 MB L2) 0% and 8%: left out, the P100's layer norms had been
    priced at 0.76x their kernel time, their held-out GMAE 34% -> 14% (docs/benchmarks.md,
    twenty-sixth pass)."""
    threads, reads = row_passes(work)
    rows = work.b * work.m
    # vector_work's bytes: the rows read and written (a norm's 2 weights as 2 rows more)
    row = work.bytes / (2 * (rows + (1 if work.family == "norm" else 0)))
    per_sm = min(rows, hw.sms * max(1, hw.sm_threads // threads)) / hw.sms * row
    missed = (1 - _found(hw.l1_bytes, per_sm)) * (1 - _found(hw.l2_bytes, 2 * hw.sms * per_sm))
    return work.bytes + (reads - 1) * rows * row * missed


def _found(cache: float, footprint: float) -> float:
    """The share of a footprint's re-reads a cache finds."""
    return min(1.0, cache / footprint)


def _log2(x: float) -> float:
    return math.log2(max(x, 1e-30))


def features(work: Work, hw: Hardware) -> list[float]:
    """The model's inputs, in FEATURES order, then the family's FAMILY_FEATURES."""
    peak = peak_of(hw, work.peak)
    ridge = peak / hw.bandwidth
    intensity = work.flops / work.bytes if work.bytes > 0 else ridge
    under, l2s = intensity / ridge, min(work.bytes / hw.l2_bytes, L2_SPAN)
    if work.family in STREAMING:
        under = max(under, UNDER_RIDGE)
    waves = []
    for tile in TILES:
        blocks = max(1, work.blocks(tile))
        rounds = math.ceil(blocks / hw.sms)
        waves += [_log2(blocks / hw.sms), blocks / (rounds * hw.sms)]
    return [_log2(work.flops), _log2(work.bytes), _log2(under),
            _log2(roofline_s(work, hw) * 1e6), _log2(work.b), _log2(work.m), _log2(work.n),
            _log2(work.k), *waves, _log2(l2s),
            float(KINDS.index(work.kind)), _log2(ridge), float(hw.near_peak_memory),
            *([_log2(work.image)] if work.family in FAMILY_FEATURES else [])]


FP32: Final = 4


def gemm_work(kind: str, b: int, m: int, n: int, k: int, bias: bool = False,
              element: int = FP32, peak: Peak = "fp32") -> Work:
    moved = b * (m * k + k * n + m * n) + (n if bias else 0)
    return Work("gemm", kind, 2.0 * b * m * n * k, float(moved * element), b, m, n, k, peak)


def conv_work(batch: int, c_in: int, c_out: int, kernel: int, size: int, stride: int,
              padding: int, groups: int = 1, element: int = FP32, peak: Peak = "fp32") -> Work:
    """A square 2-d convolution (a row of shared/gpu-kernels' sweep)."""
    out = max(1, (size + 2 * padding - kernel) // stride + 1)
    return spatial_conv_work(batch, c_in, c_out, (kernel, kernel), (size, size), (out, out),
                             groups, element, peak)


def spatial_conv_work(batch: int, c_in: int, c_out: int, kernel: Sequence[int],
                      size: Sequence[int], out: Sequence[int], groups: int = 1,
                      element: int = FP32, peak: Peak = "fp32") -> Work:
    """A convolution of any number of spatial dimensions (input `size`, output `out`, filter
    `kernel`, each per dimension) as its implicit GEMM: output pixels x output channels x the
    filter's inputs, and its output pixels a sample (`image`)."""
    pixels = batch * math.prod(out)
    reduce = c_in // groups * math.prod(kernel)
    moved = batch * c_in * math.prod(size) + c_out * reduce + pixels * c_out
    return Work("conv", "conv", 2.0 * pixels * c_out * reduce, float(moved * element), 1,
                pixels, c_out, reduce, peak, math.prod(out))


def vector_work(family: Family, kind: str, rows: int, cols: int, element: int = FP32) -> Work:
    """An elementwise op (binary: two inputs read; the 'u' forms and activations: one), a
    layer norm or a softmax over `cols`, on rows x cols elements."""
    elements = rows * cols
    if family == "elementwise":
        tensors = 3 if kind in ("add", "mul", "div", "pow") else 2
        return Work(family, kind, float(elements), float(tensors * elements * element), 1,
                    rows, cols, 1)
    params = 2 * cols if family == "norm" else 0
    return Work(family, kind, 5.0 * elements, float((2 * elements + params) * element), 1,
                rows, cols, 1)
