"""The generated kernels (numba, fp32, NCHW): one generic fused-pair kernel whose schedule is
given at run time, and the same stages run alone as the separately tuned baseline.

A pair runs tile by tile over the second op's output (tile_rows x tile_cols pixels): the first
op computes just the intermediate region that tile needs (its halo included) into a buffer the
thread owns, the second op reads it from there, so the intermediate map is never written out.
Each op is one of two stages:
- depthwise: a per-channel stencil, its inner loop over output columns branch-free (the
  padding is cut out of the column range), so LLVM vectorizes it;
- dense (pointwise or k x k conv): the tile's input region unrolled into columns (im2col; a
  pointwise conv over a whole contiguous region reads it in place) times the weight matrix,
  either by BLAS (np.dot) or by a loop nest LLVM vectorizes ('gemm' of the schedule);
- depthwise channels-last ('channels_last' of the schedule, for a depthwise op alone, dw -> pw
  and pw/conv -> dw): the tile's intermediate (or input) held as [pixels, channels], each tap
  one vector pass over all the channels. The planar stage's passes run along a tile's rows,
  a few pixels long on the 7x7-28x28 maps of the wide expansions (144-1152 channels), where
  oneDNN won; here the dense stage writes the intermediate transposed (BLAS on transposed
  operands) and the pointwise stage reads it so.
The parallel split hands each thread its own share of the tiles: 'blocked' (contiguous runs),
'interleaved' (round robin) or 'serial' (one thread). The kernels are compiled serial and release
the GIL; Python threads run the shares (numba's parallel build took a minute to compile here, and
its OpenMP layer calls BLAS inside OpenMP regions, which a pthreads OpenBLAS warns may hang).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import scipy.linalg.cython_blas  # noqa: F401  (the BLAS numba's np.dot calls: loaded now, see below)
from numba import njit, uintp

# scipy's OpenBLAS, which numba's np.dot calls, is loaded above at import rather than at the
# first call, so that a thread limit set after importing this module (threadpoolctl limits only
# the libraries loaded when it is entered) holds for it: with its own two threads on the shared
# VM a 480x80x196 GEMM took 20 ms instead of 0.17.

# stage codes of the kernel's arguments
DEPTHWISE, DENSE = 0, 1


@njit(fastmath=True, cache=True)
def _depthwise(src: Any, src_r0: int, src_c0: int, full_h: int, full_w: int, w: Any,
               k: int, s: int, r0: int, r1: int, c0: int, c1: int, dst: Any) -> None:
    """dst[c, r - r0, j - c0] for output rows [r0, r1), cols [c0, c1): src holds rows from
    src_r0 and cols from src_c0 of a full_h x full_w map (zeros outside it).

    Per channel, the input the tile reads is gathered once into s x s phase planes (row and
    column phase of the stride, padding zeros included), each plane row as wide as the output
    row plus the taps' reach. Every tap is then one unit-stride pass over the whole tile, rows
    laid end to end (the few columns past each row's end are computed and dropped), so LLVM
    vectorizes long loops whatever the stride and however small the map. Indexes computed from
    more than the loop variable are cast to unsigned: numba checks a signed one for a negative
    (wrap-around) value, which keeps LLVM from vectorizing (5x slower here), and a slice (a
    view) per row costs more than a 7x7 map's work."""
    p = k // 2
    th, tw = r1 - r0, c1 - c0
    reach = (k - 1) // s
    ph_h, ph_w = th + reach, tw + reach
    planes = np.empty((s * s, ph_h * ph_w + reach), np.float32)
    planes[:, ph_h * ph_w:] = 0.0
    wide = np.empty(th * ph_w, np.float32)
    edge = min(full_w, src_c0 + src.shape[2])  # columns src holds
    last_row = min(full_h, src_r0 + src.shape[1])
    for ch in range(dst.shape[0]):
        for a in range(s):
            for u in range(ph_h):
                iy = (r0 + u) * s + a - p
                inside = src_r0 <= iy < last_row and iy >= 0
                for b in range(s):
                    plane, base = a * s + b, u * ph_w
                    lo = max(0, (p - b + s - 1) // s - c0) if inside else ph_w
                    hi = max(lo, min(ph_w, (edge - 1 - b + p) // s - c0 + 1))
                    for v in range(lo):
                        planes[plane, uintp(base + v)] = 0.0
                    for v in range(lo, hi):
                        planes[plane, uintp(base + v)] = src[
                            ch, uintp(iy - src_r0), uintp((c0 + v) * s + b - p - src_c0)]
                    for v in range(hi, ph_w):
                        planes[plane, uintp(base + v)] = 0.0
        wide[:] = 0.0
        for dy in range(k):
            for dx in range(k):
                wv = w[ch, 0, dy, dx]
                plane = (dy % s) * s + dx % s
                off = (dy // s) * ph_w + dx // s
                for q in range(th * ph_w):
                    wide[q] += wv * planes[plane, uintp(q + off)]
        for u in range(th):
            for v in range(tw):
                dst[ch, u, v] = wide[uintp(u * ph_w + v)]


@njit(fastmath=True, cache=True)
def _im2col(src: Any, src_r0: int, src_c0: int, full_h: int, full_w: int, k: int, s: int,
            r0: int, r1: int, c0: int, c1: int, col: Any) -> Any:
    """The [C*k*k, (r1-r0)*(c1-c0)] columns a k x k conv reads for output rows [r0, r1), cols
    [c0, c1), in the scratch col (src holds rows from src_r0 and cols from src_c0)."""
    p = k // 2
    th, tw = r1 - r0, c1 - c0
    cols = col[:src.shape[0] * k * k * th * tw].reshape(src.shape[0] * k * k, th * tw)
    for ch in range(src.shape[0]):
        for dy in range(k):
            for dx in range(k):
                row_of = (ch * k + dy) * k + dx
                lo = max(c0, (p - dx + s - 1) // s)
                hi = min(c1, (full_w - 1 - dx + p) // s + 1)
                off = dx - p - src_c0
                for r in range(r0, r1):
                    base = (r - r0) * tw - c0
                    iy = r * s + dy - p
                    if iy < 0 or iy >= full_h or lo >= hi:
                        cols[row_of, base + c0:base + c1] = 0.0
                        continue
                    cols[row_of, base + c0:base + lo] = 0.0
                    cols[row_of, base + hi:base + c1] = 0.0
                    start = lo * s + off
                    cols[row_of, base + lo:base + hi] = \
                        src[ch, iy - src_r0, start:start + (hi - lo - 1) * s + 1:s]
    return cols


@njit(fastmath=True, cache=True)
def _dense(src: Any, src_r0: int, src_c0: int, full_h: int, full_w: int, w2: Any,
           k: int, s: int, r0: int, r1: int, c0: int, c1: int, col: Any, dst: Any,
           blas: bool) -> None:
    """dst[K, (r1-r0)*(c1-c0)] = w2 [K, C*k*k] @ im2col(src region); col is scratch."""
    _gemm(w2, _im2col(src, src_r0, src_c0, full_h, full_w, k, s, r0, r1, c0, c1, col), dst,
          blas)


@njit(fastmath=True, cache=True)
def _depthwise_cl(src: Any, src_r0: int, src_c0: int, full_h: int, full_w: int, wt: Any,
                  k: int, s: int, r0: int, r1: int, c0: int, c1: int, dst: Any) -> None:
    """The depthwise stage channels-last: dst[(r - r0) * (c1 - c0) + j - c0, c] for output rows
    [r0, r1), cols [c0, c1) from src [rows, cols, C] (rows from src_r0, cols from src_c0 of a
    full_h x full_w map, zeros outside it) and wt [k, k, C]. Every tap is one pass over the
    channels, contiguous in src, wt and dst alike, so LLVM vectorizes across channels: the
    wide expansions (96-1152 channels) on small maps, where the planar stage's per-channel
    passes are a few pixels long."""
    p = k // 2
    tw = c1 - c0
    channels = dst.shape[1]
    for u in range(r1 - r0):
        for v in range(tw):
            q = uintp(u * tw + v)
            for c in range(channels):
                dst[q, c] = 0.0
            for dy in range(k):
                iy = (r0 + u) * s + dy - p
                if iy < 0 or iy >= full_h:
                    continue
                for dx in range(k):
                    ix = (c0 + v) * s + dx - p
                    if ix < 0 or ix >= full_w:
                        continue
                    a, b = uintp(iy - src_r0), uintp(ix - src_c0)
                    for c in range(channels):
                        dst[q, c] += wt[dy, dx, c] * src[a, b, c]


@njit(cache=True)
def _to_channels_last(src: Any, r0: int, r1: int, c0: int, c1: int, dst: Any) -> Any:
    """src[:, r0:r1, c0:c1] (planar) as a [r1-r0, c1-c0, C] view of the scratch dst."""
    out = dst[:(r1 - r0) * (c1 - c0) * src.shape[0]].reshape(r1 - r0, c1 - c0, src.shape[0])
    for ch in range(src.shape[0]):
        for r in range(r0, r1):
            for j in range(c0, c1):
                out[uintp(r - r0), uintp(j - c0), ch] = src[ch, r, j]
    return out


@njit(cache=True)
def _from_channels_last(tile: Any, out: Any, r0: int, r1: int, c0: int, c1: int) -> None:
    """out[:, r0:r1, c0:c1] (planar) = tile [(r1-r0)*(c1-c0), C]."""
    tw = c1 - c0
    for ch in range(tile.shape[1]):
        for r in range(r0, r1):
            for j in range(c0, c1):
                out[ch, r, j] = tile[uintp((r - r0) * tw + j - c0), ch]


@njit(fastmath=True, cache=True)
def _depthwise_cl_of_planar(src: Any, wt: Any, k: int, s: int, r0: int, r1: int, c0: int,
                            c1: int, scratch: Any, dst: Any) -> None:
    """The channels-last depthwise stage over a whole planar map src [C, H, W] (a depthwise op
    alone, or the first of dw -> pw): the input region output rows [r0, r1), cols [c0, c1)
    read, made channels-last in scratch, into dst [(r1-r0)*(c1-c0), C]."""
    h, wd = src.shape[1], src.shape[2]
    i_r0, i_r1 = _span(r0, r1, k, s, h)
    i_c0, i_c1 = _span(c0, c1, k, s, wd)
    _depthwise_cl(_to_channels_last(src, i_r0, i_r1, i_c0, i_c1, scratch), i_r0, i_c0, h, wd,
                  wt, k, s, r0, r1, c0, c1, dst)


@njit(fastmath=True, cache=True)
def _gemm(w2: Any, cols: Any, dst: Any, blas: bool) -> None:
    """dst = w2 @ cols: BLAS, or a loop nest over output rows LLVM vectorizes."""
    if blas:
        np.dot(w2, cols, dst)
        return
    for kk in range(w2.shape[0]):
        out = dst[kk]
        out[:] = 0.0
        for c in range(w2.shape[1]):
            wv = w2[kk, c]
            for q in range(cols.shape[1]):
                out[q] += wv * cols[c, q]


@njit(fastmath=True, cache=True)
def _stage(kind: int, src: Any, src_r0: int, src_c0: int, full_h: int, full_w: int, w: Any,
           k: int, s: int, r0: int, r1: int, c0: int, c1: int, col: Any, dst: Any,
           blas: bool) -> None:
    """One op over an output region into dst [K, r1-r0, c1-c0] (contiguous)."""
    if kind == DEPTHWISE:
        _depthwise(src, src_r0, src_c0, full_h, full_w, w, k, s, r0, r1, c0, c1, dst)
    else:
        _dense(src, src_r0, src_c0, full_h, full_w, w.reshape(w.shape[0], -1), k, s, r0, r1,
               c0, c1, col, dst.reshape(dst.shape[0], -1), blas)


@njit(fastmath=True, cache=True)
def _span(lo: int, hi: int, k: int, s: int, size: int) -> tuple[int, int]:
    """The input rows (or cols) [a, b) that outputs [lo, hi) of a k-wide, s-strided,
    'same'-padded op read, clipped to the map."""
    p = k // 2
    return max(0, lo * s - p), min(size, (hi - 1) * s - p + k)


@njit(cache=True)
def _share(shape: Any, tile_rows: int, tile_cols: int, t: int, workers: int,
           interleaved: bool) -> range:
    """Worker t's tiles of an output of `shape`: every workers-th from t (interleaved), else
    its contiguous run."""
    tiles = (shape[0] * ((shape[2] + tile_rows - 1) // tile_rows)
             * ((shape[3] + tile_cols - 1) // tile_cols))
    if interleaved:
        return range(t, tiles, workers)
    per = (tiles + workers - 1) // workers
    return range(t * per, min(tiles, (t + 1) * per))


@njit(cache=True)
def _tile(tile: int, shape: Any, tile_rows: int, tile_cols: int
          ) -> tuple[int, int, int, int, int]:
    """(image, row start, row end, col start, col end) of tile number `tile` of an output of
    `shape` (N, K, H, W), tiles ordered by image, then row, then column."""
    rows_t = (shape[2] + tile_rows - 1) // tile_rows
    cols_t = (shape[3] + tile_cols - 1) // tile_cols
    r0 = tile // cols_t % rows_t * tile_rows
    c0 = tile % cols_t * tile_cols
    return (tile // (rows_t * cols_t), r0, min(shape[2], r0 + tile_rows), c0,
            min(shape[3], c0 + tile_cols))


@njit(fastmath=True, cache=True, nogil=True)
def _pair_share(x: Any, w1: Any, w2: Any, wt1: Any, wt2: Any, out: Any, kind1: int, k1: int,
                s1: int, kind2: int, k2: int, s2: int, tile_rows: int, tile_cols: int, t: int,
                workers: int, interleaved: bool, blas: bool, channels_last: bool) -> None:
    """Worker t's share of the tiles of the fused pair. channels_last (a dw -> pw or a
    conv -> dw pair): the depthwise stage and the intermediate run channels-last (wt1, wt2:
    the depthwise weights as [k, k, C])."""
    c_in, h, wd = x.shape[1], x.shape[2], x.shape[3]
    c_mid, h_mid, w_mid = w1.shape[0], (h + 2 * (k1 // 2) - k1) // s1 + 1, \
        (wd + 2 * (k1 // 2) - k1) // s1 + 1
    c_out = out.shape[1]
    # the largest intermediate region a tile needs
    mid_rows = min(h_mid, (tile_rows - 1) * s2 + k2)
    mid_cols = min(w_mid, (tile_cols - 1) * s2 + k2)
    col_rows = max(c_in * k1 * k1, c_mid * k2 * k2)
    col_cols = max(mid_rows * mid_cols, tile_rows * tile_cols)
    mid = np.empty(c_mid * mid_rows * mid_cols, np.float32)
    res = np.empty(c_out * tile_rows * tile_cols, np.float32)
    col = np.empty(col_rows * col_cols, np.float32)
    dw_pw = channels_last and kind1 == DEPTHWISE and kind2 == DENSE and k2 == 1 and s2 == 1
    dense_dw = channels_last and kind1 == DENSE and kind2 == DEPTHWISE
    if dw_pw:  # the input region a tile's intermediate reads, channels-last
        col = np.empty(c_in * min(h, (mid_rows - 1) * s1 + k1)
                       * min(wd, (mid_cols - 1) * s1 + k1), np.float32)
    for tile in _share(out.shape, tile_rows, tile_cols, t, workers, interleaved):
        n, r0, r1, c0, c1 = _tile(tile, out.shape, tile_rows, tile_cols)
        m_r0, m_r1 = _span(r0, r1, k2, s2, h_mid)
        m_c0, m_c1 = _span(c0, c1, k2, s2, w_mid)
        pixels = (m_r1 - m_r0) * (m_c1 - m_c0)
        tile_out = res[:c_out * (r1 - r0) * (c1 - c0)].reshape(c_out, r1 - r0, c1 - c0)
        if dw_pw:
            region_cl = mid[:pixels * c_mid].reshape(pixels, c_mid)
            _depthwise_cl_of_planar(x[n], wt1, k1, s1, m_r0, m_r1, m_c0, m_c1, col, region_cl)
            _gemm(w2.reshape(c_out, c_mid), region_cl.T, tile_out.reshape(c_out, -1), blas)
        elif dense_dw:
            cols = _im2col(x[n], 0, 0, h, wd, k1, s1, m_r0, m_r1, m_c0, m_c1, col)
            region_cl = mid[:pixels * c_mid].reshape(pixels, c_mid)
            np.dot(cols.T, w1.reshape(c_mid, -1).T, region_cl)
            tile_cl = res[:(r1 - r0) * (c1 - c0) * c_out].reshape((r1 - r0) * (c1 - c0), c_out)
            _depthwise_cl(region_cl.reshape(m_r1 - m_r0, m_c1 - m_c0, c_mid), m_r0, m_c0,
                          h_mid, w_mid, wt2, k2, s2, r0, r1, c0, c1, tile_cl)
            _from_channels_last(tile_cl, out[n], r0, r1, c0, c1)
            continue
        else:
            region = mid[:c_mid * pixels].reshape(c_mid, m_r1 - m_r0, m_c1 - m_c0)
            _stage(kind1, x[n], 0, 0, h, wd, w1, k1, s1, m_r0, m_r1, m_c0, m_c1, col, region,
                   blas)
            if kind2 == DENSE and k2 == 1 and s2 == 1:  # pointwise: the region is its input
                _gemm(w2.reshape(c_out, c_mid), region.reshape(c_mid, -1),
                      tile_out.reshape(c_out, -1), blas)
            else:
                _stage(kind2, region, m_r0, m_c0, h_mid, w_mid, w2, k2, s2, r0, r1, c0, c1,
                       col, tile_out, blas)
        out[n, :, r0:r1, c0:c1] = tile_out


@njit(fastmath=True, cache=True, nogil=True)
def _single_share(x: Any, w: Any, wt: Any, out: Any, kind: int, k: int, s: int,
                  tile_rows: int, tile_cols: int, t: int, workers: int, interleaved: bool,
                  blas: bool, channels_last: bool) -> None:
    """Worker t's share of the tiles of one op alone (a depthwise op channels-last with
    channels_last, wt its weights as [k, k, C])."""
    c_in, h, wd = x.shape[1], x.shape[2], x.shape[3]
    c_out = out.shape[1]
    res = np.empty(c_out * tile_rows * tile_cols, np.float32)
    col = np.empty(c_in * k * k * tile_rows * tile_cols, np.float32)
    for tile in _share(out.shape, tile_rows, tile_cols, t, workers, interleaved):
        n, r0, r1, c0, c1 = _tile(tile, out.shape, tile_rows, tile_cols)
        if channels_last and kind == DEPTHWISE:
            tile_cl = res[:(r1 - r0) * (c1 - c0) * c_out].reshape((r1 - r0) * (c1 - c0), c_out)
            _depthwise_cl_of_planar(x[n], wt, k, s, r0, r1, c0, c1, col, tile_cl)
            _from_channels_last(tile_cl, out[n], r0, r1, c0, c1)
            continue
        tile_out = res[:c_out * (r1 - r0) * (c1 - c0)].reshape(c_out, r1 - r0, c1 - c0)
        if kind == DENSE and k == 1 and s == 1 and r1 - r0 == h and c1 - c0 == wd:
            # a pointwise conv over the whole image reads it in place, straight into out
            _gemm(w.reshape(c_out, c_in), x[n].reshape(c_in, h * wd),
                  out[n].reshape(c_out, h * wd), blas)
            continue
        _stage(kind, x[n], 0, 0, h, wd, w, k, s, r0, r1, c0, c1, col, tile_out, blas)
        out[n, :, r0:r1, c0:c1] = tile_out


_POOLS: dict[int, ThreadPoolExecutor] = {}  # by size, kept: a call must not start threads


def _split(share: Callable[[int], None], workers: int) -> None:
    """share(t) for t in range(workers), on as many threads (the kernels release the GIL)."""
    if workers == 1:
        share(0)
        return
    pool = _POOLS.get(workers)
    if pool is None:
        pool = _POOLS[workers] = ThreadPoolExecutor(workers, thread_name_prefix="perfswarm-fuse")
    for done in [pool.submit(share, t) for t in range(workers)]:
        done.result()


_NO_TAPS = np.zeros((1, 1, 1), np.float32)  # a dense op's: the kernels take one type


def taps_last(w: np.ndarray, kind: int) -> np.ndarray:
    """Depthwise weights [C, 1, k, k] as [k, k, C] (the channels-last stage's)."""
    return np.ascontiguousarray(w[:, 0].transpose(1, 2, 0)) if kind == DEPTHWISE else _NO_TAPS


def run_pair(x: np.ndarray, w1: np.ndarray, w2: np.ndarray, out: np.ndarray, kind1: int,
             k1: int, s1: int, kind2: int, k2: int, s2: int, tile_rows: int, tile_cols: int,
             workers: int, interleaved: bool, blas: bool, channels_last: bool = False) -> None:
    """The fused pair into out (all fp32, C-contiguous NCHW; weights OIHW)."""
    wt1, wt2 = taps_last(w1, kind1), taps_last(w2, kind2)
    _split(lambda t: _pair_share(x, w1, w2, wt1, wt2, out, kind1, k1, s1, kind2, k2, s2,
                                 tile_rows, tile_cols, t, workers, interleaved, blas,
                                 channels_last), workers)


def run_single(x: np.ndarray, w: np.ndarray, out: np.ndarray, kind: int, k: int, s: int,
               tile_rows: int, tile_cols: int, workers: int, interleaved: bool,
               blas: bool, channels_last: bool = False) -> None:
    """One op alone into out, with the same stages and split."""
    wt = taps_last(w, kind)
    _split(lambda t: _single_share(x, w, wt, out, kind, k, s, tile_rows, tile_cols, t, workers,
                                   interleaved, blas, channels_last), workers)
