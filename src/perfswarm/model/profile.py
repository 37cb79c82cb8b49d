"""A calibrated device profile: per op family, two fitted kernel models and the better one.

- roofline: t = a + b * bytes + c * FLOPs, non-negative, fitted on relative error: a fixed
  cost plus traffic at an effective bandwidth plus work at an effective FLOP rate, so the
  achieved rate rises with size and saturates (the efficiency curve), and the model stays
  monotone and linear beyond the sweep, where predictions at other shapes land;
- learned: that roofline times a correction learned by Gaussian-process regression on
  log-shape features (every input dimension, FLOPs and bytes, in log space): smooth between
  sweep points (a cache cliff bends the curve instead of stepping it) and back to the
  sweep's mean correction far from them, where the roofline's trend is all there is to go on.

Every fourth sweep point is held out; GMAE (geometric-mean absolute error) on those picks the
model. The sweeps themselves (recorder/bench/kernels.py, `perfswarm calibrate`) time ops on this
machine; the profile keeps them, so a reader refits the chosen models exactly, and the host's
first-write time of a fresh page (`first_touch_s`). Memory-bound families come swept cold and
warm, the two extremes of a step's ops; predict prices them between the two (model/kernels.py).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Final, Literal

import numpy as np

from perfswarm.errors import PerfswarmError
from perfswarm.model.accuracy import gmae
from perfswarm.model.nnls import nnls
from perfswarm.model.opcost import (
    RNN_FAMILIES,
    OpCost,
    Shapes,
    channel_blocked,
    data_cost,
    gemm_dims,
    lstm_shape,
)
from perfswarm.userfiles import read_json

Choice = Literal["roofline", "learned"]
FAMILIES = ("gemm", "conv", "conv_backward", "embedding_bag", "elementwise", "reduction", "copy",
            "sdpa", "sdpa_backward", "rnn", "rnn_backward")
# swept on the CPU only: the sweep calls the CPU's flash-attention and oneDNN LSTM ops by name
# (a GPU prices attention by the GEMM family's roofline, as a profile without them does)
CPU_FAMILIES = ("sdpa", "sdpa_backward", "rnn", "rnn_backward")
# the convolution families (op_cost's), whose tensors are [N, C, spatial...]
CONV_FAMILIES = ("conv", "depthwise_conv", "conv_backward")
# memory-bound families, swept a second time warm: inputs reused, so they stay in cache where
# they fit (a step's op often reads what the op before it just wrote)
WARM_FAMILIES = ("elementwise", "reduction", "copy")
# the one dtype calibrate sweeps (recorder/bench/kernels.py: every tensor torch.rand's, every
# input typed "float"), as opcost's spec peak key: an op of another dtype priced by the profile
# is priced as float32 work
SWEPT_DTYPE: Final = "fp32"
SHAPE_FEATURES = 8  # input dimensions the learned model sees (padded with ones)
# FP32 elements of a vector register (AVX-512; a 64-byte cache line): a GEMM's feature of how
# much of its last vector along n is padding (the sweep teaches how much that costs here), and
# the channel block of oneDNN's convolutions (opcost.channel_blocked). A profile holds its
# host's (`vector_lanes`); one written before profiles held it was fitted with this.
LANES = 16
# torch's CPU capability -> FP32 elements of its vector registers (512, 256 or 128 bits: oneDNN
# blocks convolution channels by 16 on AVX-512 (nChw16c), by 8 on AVX2 (nChw8c))
_LANES_OF: Final = {"AVX512": 16, "AVX512_BF16": 16, "AMX": 16, "AVX2": 8, "SVE256": 8}
# A held-out error past this says the sweep measured the machine's other load more than the
# ops (a busy shared machine at a small budget: 3,832% seen): not a profile to predict with.
UNUSABLE_GMAE = 0.5


@dataclass(frozen=True)
class Point:
    cost: OpCost
    seconds: float
    dims: tuple[tuple[int, ...], ...] = ()
    strides: tuple[tuple[int, ...], ...] = ()
    concrete: tuple[str, ...] = ()  # a convolution's geometry, as a trace records it


def vector_lanes(capability: str) -> int:
    """FP32 elements of a vector register on a CPU of torch's `capability`
    (torch.backends.cpu.get_cpu_capability(): AVX512, AVX2, DEFAULT, NEON...): 128-bit
    registers (SSE, NEON: 4) where it names no wider one."""
    return _LANES_OF.get(capability.upper(), 4)


def shape_features(cost: OpCost, dims: Sequence[Sequence[int]], lanes: int) -> list[float]:
    """Log dimensions, log FLOPs and log bytes, and attention's log spread (OpCost.row_spread:
    the layout its kernel reads). A GEMM's dimensions are read as (batch, m, k,
    n) and its operand layout, whatever op carried it (mm, addmm, linear, bmm), so the sweep's
    mm points speak for nn.Linear's addmm; and the share of its last vector of n that is
    padding (`lanes`): a row-major product is the BLAS's column-major one of the transposes,
    whose vectorized dimension is n, and a partly filled vector costs a whole one (nn.Linear
    at m = 512 on an AVX-512 core, k 32 to 320: n = 40 at 67-79 GFLOP/s, n = 48 at 75-91).
    An LSTM layer's are its (T, B, I, H) (lstm_shape), whatever else its call records (the
    backward's outputs, gradients and oneDNN's flat workspace): each a factor the sweep
    spans, so a query past the sweep is held at its edge in each."""
    canonical = gemm_dims(cost.op, dims) if cost.family == "gemm" else None
    lstm = lstm_shape(cost.op, dims) if cost.family in RNN_FAMILIES else None
    dims = _feature_dims(cost, dims)
    flat = ([*(math.log(max(x, 1)) for x in canonical), float(cost.b_transposed),
             float(cost.a_transposed), _lane_padding(canonical[3], lanes)]
            if canonical is not None else [math.log(max(x, 1)) for x in lstm] if lstm else
            [math.log(max(x, 1)) for d in dims for x in d][:SHAPE_FEATURES])
    layout = [math.log(cost.row_spread)] if cost.row_spread > 0 else []
    return flat + [0.0] * (SHAPE_FEATURES - len(flat)) + [math.log(max(cost.flops, 1.0)),
                                                          math.log(cost.bytes), *layout]


def _feature_dims(cost: OpCost, dims: Sequence[Sequence[int]]) -> Sequence[Sequence[int]]:
    """The dimensions the learned features read: a 1-D convolution's tensors ([N, C, L], its
    weight [C_out, C_in, K]) as the 2-D convolution over one row that oneDNN computes
    ([N, C, 1, L], [C_out, C_in, 1, K]), so its channels, length and kernel stand where a 2-D
    sweep point's do, at a height of one; read as they come, its length stood where the 2-D
    points have their heights and its output channels where they have their widths."""
    if cost.family not in CONV_FAMILIES or not dims or len(dims[0]) != 3:
        return dims
    return [(*d[:2], 1, *d[2:]) if len(d) == 3 else d for d in dims]


def _lane_padding(n: int, lanes: int) -> float:
    """Log of n rounded up to whole vectors of `lanes`, over n."""
    n = max(n, 1)
    return math.log(math.ceil(n / lanes) * lanes / n)


@dataclass(frozen=True)
class FamilyModel:
    """The roofline with fitted efficiencies: t = coef . (1, bytes, FLOPs), coef >= 0."""

    coef: tuple[float, ...]

    def predict(self, cost: OpCost, dims: Sequence[Sequence[int]] = ()) -> float:
        return float(np.dot(self.coef, (1.0, cost.bytes, cost.flops)))


def fit(points: Sequence[Point]) -> FamilyModel:
    """Non-negative least squares on relative error (each row divided by its time), so tiny and
    huge ops weigh alike; a family whose ops all move as many bytes per FLOP gets its work
    split between the two terms, which predicts the same."""
    t = np.array([p.seconds for p in points])
    design = np.array([(1.0, p.cost.bytes, p.cost.flops) for p in points]) / t[:, None]
    scale = np.maximum(design.max(axis=0), 1e-300)  # columns of similar size for the solver
    coef, _ = nnls(design / scale, np.ones_like(t))
    return FamilyModel(tuple(float(c) for c in coef / scale))


def _layout(cost: OpCost, dims: Sequence[Sequence[int]]) -> tuple[int, ...] | None:
    """The input ranks the learned features are read in: None for a GEMM (its features are its
    canonical (batch, m, k, n), whatever op carried it), else the rank of each tensor input
    whose dimensions are among the features (`_feature_dims`: a 1-D convolution's as a 2-D
    one's over one row, so the conv sweep's 1-D and 2-D points share one layout). A scalar argument
    (recorded as an input without dimensions: attention's is_causal, add's alpha) and what
    lies past the features (a convolution's bias) are no part of it: counted, they made every
    recorded attention and most recorded ops another layout than their sweep's, so they took
    the sweep's mean correction (attention x1.84 for a doubled head of 10, measured x0.66).
    None too for an LSTM layer, read as its (T, B, I, H) (shape_features)."""
    if ((cost.family == "gemm" and gemm_dims(cost.op, dims) is not None)
            or (cost.family in RNN_FAMILIES and lstm_shape(cost.op, dims) is not None)):
        return None
    ranks: list[int] = []
    for d in _feature_dims(cost, dims):
        if d and sum(ranks) < SHAPE_FEATURES:
            ranks.append(len(d))
    return tuple(ranks)


@dataclass(frozen=True, eq=False)
class LearnedModel:
    """The roofline times exp(gp(log-shape features)), the GP fitted to its log residual.

    The correction is learned where the sweep was: a query past the sweep's range in some
    feature is read at the range's edge (its correction held there, so beyond the sweep the
    time scales as the roofline does: a correction learned on 3x3 convolutions up to 128
    channels had doubled channels past them cost 7.2-7.6x where the roofline says 3.7x), and
    a query in another layout than every sweep point (`_layout`) takes the sweep's mean
    correction."""

    roofline: FamilyModel
    points: tuple[Point, ...]
    lanes: int = LANES  # the host's (vector_lanes)

    @cached_property
    def _features(self) -> np.ndarray[Any, np.dtype[np.float64]]:
        return np.array([shape_features(p.cost, p.dims, self.lanes) for p in self.points])

    @cached_property
    def _residual(self) -> np.ndarray[Any, np.dtype[np.float64]]:
        return np.log([p.seconds / self.roofline.predict(p.cost) for p in self.points])

    @cached_property
    def _layouts(self) -> frozenset[tuple[int, ...] | None]:
        return frozenset(_layout(p.cost, p.dims) for p in self.points)

    @cached_property
    def _gp(self) -> Any:
        from sklearn.exceptions import ConvergenceWarning
        from sklearn.gaussian_process import GaussianProcessRegressor
        from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel

        x = self._features
        kernel = (ConstantKernel(0.1, (1e-4, 10.0)) * RBF(np.full(x.shape[1], 2.0), (0.3, 1e3))
                  + WhiteKernel(0.01, (1e-5, 1.0)))
        # normalize_y: far from the sweep the correction returns to its mean over the sweep, not
        # to none (embedding_bag's roofline cannot see the table's size: 60-80% off alone)
        gp = GaussianProcessRegressor(kernel, n_restarts_optimizer=2, random_state=0,
                                      normalize_y=True)
        with warnings.catch_warnings():  # a length scale at its bound: that feature is unused
            warnings.simplefilter("ignore", ConvergenceWarning)
            return gp.fit(x, self._residual)

    def correction(self, cost: OpCost, dims: Sequence[Sequence[int]] = ()) -> float:
        """The learned log correction of the roofline at this op (see the class)."""
        if _layout(cost, dims) not in self._layouts:
            return float(np.mean(self._residual))
        x = np.clip(np.array(shape_features(cost, dims, self.lanes)), self._features.min(axis=0),
                    self._features.max(axis=0))
        return float(self._gp.predict(x[None, :])[0])

    def predict(self, cost: OpCost, dims: Sequence[Sequence[int]] = ()) -> float:
        return self.roofline.predict(cost) * math.exp(self.correction(cost, dims))


KernelModel = FamilyModel | LearnedModel


def model_gmae(model: KernelModel, points: Sequence[Point]) -> float:
    """The model's GMAE (model/accuracy.py) over sweep points."""
    return gmae([model.predict(p.cost, p.dims) for p in points], [p.seconds for p in points])


def as_predicted(points: Sequence[Point], lanes: int) -> list[Point]:
    """A CPU sweep's points at the cost `predict` prices their ops at (ProfileScaler.model_time):
    a convolution at the channels oneDNN computes in blocks of `lanes` (channel_blocked), so the
    models learn the time of that work. Fitted on the channels as given, the 1-D sweep's
    [B, 40, 61] -> 40 layer taught a correction that already held its blocks, and the trace's
    mkldnn_convolution of the same shape, priced at 48 channels in and out, read 1.17-1.33x its
    own sweep time, more at a larger batch (predicted x2.99 from batch 8 to 32, run x2.70)."""
    return [replace(p, cost=channel_blocked(p.cost, p.dims, lanes)) for p in points]


def split(points: Sequence[Point]) -> tuple[list[Point], list[Point]]:
    """(fit, held out): every fourth point is held out."""
    return ([p for i, p in enumerate(points) if i % 4 != 3], list(points[3::4]))


def fit_family(points: Sequence[Point], lanes: int = LANES) -> dict[str, Any]:
    """Both models on the fit points, scored on the held-out ones; the better one is chosen
    (`lanes`: the host's, vector_lanes)."""
    train, held = split(points)
    roofline = fit(train)
    learned = LearnedModel(roofline, tuple(train), lanes)
    scores = {"roofline": model_gmae(roofline, held), "learned": model_gmae(learned, held)}
    chosen: Choice = "learned" if scores["learned"] < scores["roofline"] else "roofline"
    return {"coef": list(roofline.coef), "points": len(points),
            "gmae_held_out": scores[chosen], "gmae_roofline_held_out": scores["roofline"],
            "gmae_learned_held_out": scores["learned"], "chosen": chosen,
            "sweep": [{"op": p.cost.op, "dims": [list(d) for d in p.dims], "seconds": p.seconds,
                       **({"strides": [list(d) for d in p.strides]} if p.strides else {}),
                       **({"concrete": list(p.concrete)} if p.concrete else {})}
                      for p in points]}


@dataclass(frozen=True)
class Profile:
    """A calibrated device profile, read back: the chosen model of each family, and of each
    memory-bound family swept warm (none in a profile from before warm sweeps)."""

    device: str
    threads: int
    models: Mapping[str, KernelModel]
    gmae: Mapping[str, float]
    page_s: float = 0.0  # first_touch_s on the host; 0 when unknown (an older profile)
    warm: Mapping[str, KernelModel] = field(default_factory=dict)
    # the best rates its sweeps reached: FLOP/s (GEMM, conv), bytes/s cold and warm (copy)
    ceilings: Mapping[str, float] = field(default_factory=dict)
    lanes: int = LANES  # FP32 elements of the host's vector registers (vector_lanes)

    def unusable(self) -> list[str]:
        """Families whose held-out error says their sweep measured other load (UNUSABLE_GMAE)."""
        return sorted(f for f, e in self.gmae.items() if e > UNUSABLE_GMAE)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "profile") -> Profile:
        try:
            lanes = int(data.get("lanes", LANES))
            if lanes not in (4, 8, 16):
                raise ValueError("lanes must be 4, 8 or 16")
            cpu = str(data["device"]) == "cpu"
            models, errors = _models(data["families"], lanes, cpu)
            warm, _ = _models(data.get("warm", {}), lanes, cpu)
            page_s = float(data.get("page_s", 0.0))
            if not page_s >= 0:
                raise ValueError("page_s must be a non-negative time")
            return cls(str(data["device"]), int(data.get("threads", 1)), models, errors, page_s,
                       warm, _ceilings(data), lanes)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise PerfswarmError(f"{where}: not a kernel-model profile ({exc})") from None


def read_profile(path: Path) -> Profile:
    """A calibrate profile from its JSON file; one-line errors naming it."""
    data = read_json(path)
    if not isinstance(data, dict):
        raise PerfswarmError(f"{path}: not a kernel-model profile (expected an object)")
    return Profile.from_dict(data, str(path))


def _best(entries: Mapping[str, Any], families: Sequence[str], rate: Callable[[Point], float]
          ) -> float:
    """The highest rate of any sweep point of `families` (0 when none was swept)."""
    return max((rate(_sweep_point(p)) for f in families if f in entries
                for p in entries[f]["sweep"]), default=0.0)


def _ceilings(data: Mapping[str, Any]) -> dict[str, float]:
    """The roofline's ceilings as the profile's sweeps measured them."""
    def flops(p: Point) -> float:
        return p.cost.flops / p.seconds

    def moved(p: Point) -> float:
        return p.cost.bytes / p.seconds

    return {"flops": _best(data["families"], ("gemm", "conv"), flops),
            "memory_bandwidth": _best(data["families"], ("copy",), moved),
            "cache_bandwidth": _best(data.get("warm", {}), ("copy",), moved)}


def _models(entries: Mapping[str, Any], lanes: int, cpu: bool
            ) -> tuple[dict[str, KernelModel], dict[str, float]]:
    """Per family of fit_family entries: the chosen model, refitted on its sweep (a CPU's at
    the cost predict prices it at, `as_predicted`), and its held-out GMAE."""
    models: dict[str, KernelModel] = {}
    errors: dict[str, float] = {}
    for family, entry in dict(entries).items():
        points = [_sweep_point(p) for p in entry["sweep"]]
        if cpu:
            points = as_predicted(points, lanes)
        roofline = FamilyModel(tuple(float(c) for c in entry["coef"]))
        if len(roofline.coef) != 3 or min(roofline.coef) < 0:
            raise ValueError("coef needs 3 non-negative values")
        models[str(family)] = (LearnedModel(roofline, tuple(split(points)[0]), lanes)
                               if entry["chosen"] == "learned" else roofline)
        errors[str(family)] = float(entry["gmae_held_out"])
    return models, errors


def _sweep_point(entry: Mapping[str, Any]) -> Point:
    dims = [[int(x) for x in d] for d in entry["dims"]]
    op = str(entry["op"])
    types = ["float"] * len(dims)
    if op == "embedding_bag":
        types = ["float", "long int", "long int"]
    strides = tuple(tuple(int(x) for x in d) for d in entry.get("strides", ()))
    concrete = tuple(str(x) for x in entry.get("concrete", ()))
    # data_cost: an attention backward is priced by the matrix products inside it
    cost = data_cost(f"aten::{op.removeprefix('aten::')}",
                     Shapes(tuple(map(tuple, dims)), tuple(types), strides, concrete))
    seconds = float(entry["seconds"])
    if cost is None or not seconds > 0:
        raise ValueError(f"sweep point {op} {dims} has no cost or time")
    return Point(cost, seconds, tuple(tuple(d) for d in dims), strides, concrete)
