"""Kernel-model calibration: time ops on a local device over a shape sweep per op type, fit two
models per type and keep the one that predicts held-out sweep points better.

- roofline: t = a + b * bytes + c * FLOPs, non-negative, fitted on relative error: a fixed
  cost plus traffic at an effective bandwidth plus work at an effective FLOP rate, so the
  achieved rate rises with size and saturates (the efficiency curve), and the model stays
  monotone and linear beyond the sweep, where predictions at other shapes land;
- learned: that roofline times a correction learned by Gaussian-process regression on
  log-shape features (every input dimension, FLOPs and bytes, in log space): smooth between
  sweep points (a cache cliff bends the curve instead of stepping it) and back to the
  sweep's mean correction far from them, where the roofline's trend is all there is to go on.

Every fourth sweep point is held out; GMAE (geometric-mean absolute error) on those picks the
model. The memory-bound families are swept twice: cold (inputs from a rotation of copies past
the cache) and warm (one set of inputs, reused), the two extremes of a step's ops; predict
prices them between the two (model/kernels.py). The profile keeps the sweeps themselves, so a
reader refits the chosen models exactly, and the host's first-write time of a fresh page
(`first_touch_s`).
"""

from __future__ import annotations

import functools
import itertools
import math
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import numpy as np

from perfswarm.errors import PerfswarmError
from perfswarm.model.opcost import OpCost, column_major, gemm_dims, op_cost
from perfswarm.record.inject._perfswarm_heap import reserve_heap
from perfswarm.userfiles import read_json

# aten op, input dims, input types, input strides (empty: contiguous)
Case = tuple[str, list[list[int]], list[str], tuple[tuple[int, ...], ...]]
Choice = Literal["roofline", "learned"]
FAMILIES = ("gemm", "conv", "embedding_bag", "elementwise", "reduction", "copy")
# memory-bound families, swept a second time warm: inputs reused, so they stay in cache where
# they fit (a step's op often reads what the op before it just wrote)
WARM_FAMILIES = ("elementwise", "reduction", "copy")
SHAPE_FEATURES = 8  # input dimensions the learned model sees (padded with ones)
_F = ["float", "float"]


def _sweep(family: str, scale: int) -> Iterator[Case]:
    """A deterministic shape grid per family, from tiny to a few MB (times `scale` on GPUs), so a
    sweep fits in seconds. Orders vary the sizes early, so a cut budget still spans them."""
    sizes = [16, 32, 48, 64, 96, 128, 192, 256]
    if family == "gemm":  # skinny (a small batch through a wide layer) to square
        # m up to 1024: a transformer's GEMMs take batch x sequence rows
        shapes = [(m, k, n) for k in (64, 1024, 256, 4096)
                  for m in (8, 64, 1024, 16, 128, 32, 256) for n in (64, 1024, 256)]
        for i, (m, k, n) in enumerate(shapes):
            # row-major; B column-major, as nn.Linear passes its weight; A column-major, as a
            # weight gradient takes the output gradient, whose rows are the batch: the small
            # dimension is k there. Every fourth point (held out) falls on each layout alike
            # (four and three share no factor).
            layouts: list[tuple[list[list[int]], tuple[tuple[int, ...], ...]]] = [
                ([[m * scale, k], [k, n * scale]], ()),
                ([[m * scale, k], [k, n * scale]], ((k, 1), (1, k))),
                ([[k, m * scale], [m * scale, n * scale]], ((1, k), (n * scale, 1)))]
            for dims, strides in layouts[i % 3:] + layouts[:i % 3]:
                yield "aten::mm", dims, _F, strides
    elif family == "conv":
        for hw in (8, 16, 32, 24):
            for c_in, c_out in ((3, 16), (16, 32), (32, 64), (64, 64), (64, 128)):
                for batch in (4, 16, 64):
                    yield ("aten::conv2d", [[batch * scale, c_in, hw, hw], [c_out, c_in, 3, 3],
                                            [c_out]], ["float"] * 3, ())
    elif family == "embedding_bag":  # tables in cache and far past it, 8 or 32 ids a bag
        for rows in (1000, 100_000, 20_000):
            for dim in (16, 128, 64):
                for bags in (32, 512, 128):
                    for pooling in (8, 32):
                        yield ("aten::embedding_bag", [[rows, dim], [bags * pooling * scale],
                                                       [bags * scale]],
                               ["float", "long int", "long int"], ())
    else:  # up to 16 MB a tensor: activations of a batch are that large
        op = {"elementwise": "aten::add", "reduction": "aten::sum", "copy": "aten::clone"}[family]
        for rows in (*sizes, 384, 512, 768, 1024, 1536, 2048, 4096):
            for cols in (64, 256, 1024):
                dims = ([[rows * scale, cols], [rows * scale, cols]] if family == "elementwise"
                        else [[rows * scale, cols]])
                yield op, dims, _F[: len(dims)], ()


PASSES = 3  # over a sweep, budget allowing
ROTATE_BYTES = 16 << 20  # inputs cycle through copies this large in all: past the L2 cache
# outputs of up to 32 MiB are recycled heap memory, as in a step (on new heap, a fresh process's
# first conv sweep ran its batch-64 points 1.3-2.3x slower than a second sweep did)
RESERVE_MIB = 256


def _runner(op: str, dims: list[list[int]], device: str,
            strides: Sequence[Sequence[int]] = (), warm: bool = False) -> Callable[[], object]:
    """A call of the op on fresh inputs each time: it cycles through enough copies that they
    no longer fit a per-core cache, as in a training step, where an op's inputs were written
    by other ops in between (timing one tensor over and over measures a hot cache). `warm`:
    one copy, reused, the other extreme. An input with strides is made with them (a
    column-major matrix is a transposed row-major one)."""
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
    else:
        def tensor(i: int) -> Any:
            d = dims[i]
            if column_major(dims, strides, i):
                return torch.rand(d[1], d[0], generator=gen).to(device).t()
            return torch.rand(*d, generator=gen).to(device)

        fns: dict[str, Callable[..., object]] = {
            "aten::mm": torch.mm, "aten::add": torch.add, "aten::sum": torch.sum,
            "aten::clone": torch.clone,
            # 'same' padding: the output size op_cost assumes
            "aten::conv2d": functools.partial(torch.nn.functional.conv2d, padding=1)}
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


@dataclass(frozen=True)
class Point:
    cost: OpCost
    seconds: float
    dims: tuple[tuple[int, ...], ...] = ()
    strides: tuple[tuple[int, ...], ...] = ()


def shape_features(cost: OpCost, dims: Sequence[Sequence[int]]) -> list[float]:
    """Log dimensions, log FLOPs and log bytes. A GEMM's dimensions are read as (batch, m, k,
    n) and its operand layout, whatever op carried it (mm, addmm, linear, bmm), so the sweep's
    mm points speak for nn.Linear's addmm."""
    canonical = gemm_dims(cost.op, dims) if cost.family == "gemm" else None
    flat = ([*(math.log(max(x, 1)) for x in canonical), float(cost.b_transposed),
             float(cost.a_transposed)]
            if canonical is not None else
            [math.log(max(x, 1)) for d in dims for x in d][:SHAPE_FEATURES])
    return flat + [0.0] * (SHAPE_FEATURES - len(flat)) + [math.log(max(cost.flops, 1.0)),
                                                          math.log(cost.bytes)]


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
    from scipy.optimize import nnls

    t = np.array([p.seconds for p in points])
    design = np.array([(1.0, p.cost.bytes, p.cost.flops) for p in points]) / t[:, None]
    scale = np.maximum(design.max(axis=0), 1e-300)  # columns of similar size for the solver
    coef, _ = nnls(design / scale, np.ones_like(t))
    return FamilyModel(tuple(float(c) for c in coef / scale))


@dataclass(frozen=True, eq=False)
class LearnedModel:
    """The roofline times exp(gp(log-shape features)), the GP fitted to its log residual."""

    roofline: FamilyModel
    points: tuple[Point, ...]

    @cached_property
    def _gp(self) -> Any:
        from sklearn.exceptions import ConvergenceWarning
        from sklearn.gaussian_process import GaussianProcessRegressor
        from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel

        x = np.array([shape_features(p.cost, p.dims) for p in self.points])
        residual = np.log([p.seconds / self.roofline.predict(p.cost) for p in self.points])
        kernel = (ConstantKernel(0.1, (1e-4, 10.0)) * RBF(np.full(x.shape[1], 2.0), (0.3, 1e3))
                  + WhiteKernel(0.01, (1e-5, 1.0)))
        # normalize_y: far from the sweep the correction returns to its mean over the sweep, not
        # to none (embedding_bag's roofline cannot see the table's size: 60-80% off alone)
        gp = GaussianProcessRegressor(kernel, n_restarts_optimizer=2, random_state=0,
                                      normalize_y=True)
        with warnings.catch_warnings():  # a length scale at its bound: that feature is unused
            warnings.simplefilter("ignore", ConvergenceWarning)
            return gp.fit(x, residual)

    def predict(self, cost: OpCost, dims: Sequence[Sequence[int]] = ()) -> float:
        correction = float(self._gp.predict(np.array([shape_features(cost, dims)]))[0])
        return self.roofline.predict(cost) * math.exp(correction)


KernelModel = FamilyModel | LearnedModel


def gmae(model: KernelModel, points: Sequence[Point]) -> float:
    """Geometric-mean absolute error: exp(mean |log(predicted / measured)|) - 1."""
    logs = [abs(math.log(model.predict(p.cost, p.dims) / p.seconds)) for p in points]
    return math.expm1(sum(logs) / len(logs))


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
            op, dims, _types, strides = case
            t = time_op(_runner(op, dims, device, strides, warm), sync=sync)
            if first:
                cases.append(case)
                seconds.append(t)
            else:
                seconds[i] = min(seconds[i], t)
    points = []
    for (op, dims, types, strides), t in zip(cases, seconds, strict=True):
        cost = op_cost(op, dims, types, strides=strides)
        assert cost is not None  # the sweep only holds modelled ops
        points.append(Point(cost, t, tuple(tuple(d) for d in dims), strides))
    return points


def split(points: Sequence[Point]) -> tuple[list[Point], list[Point]]:
    """(fit, held out): every fourth point is held out."""
    return ([p for i, p in enumerate(points) if i % 4 != 3], list(points[3::4]))


def fit_family(points: Sequence[Point]) -> dict[str, Any]:
    """Both models on the fit points, scored on the held-out ones; the better one is chosen."""
    train, held = split(points)
    roofline = fit(train)
    learned = LearnedModel(roofline, tuple(train))
    scores = {"roofline": gmae(roofline, held), "learned": gmae(learned, held)}
    chosen: Choice = "learned" if scores["learned"] < scores["roofline"] else "roofline"
    return {"coef": list(roofline.coef), "points": len(points),
            "gmae_held_out": scores[chosen], "gmae_roofline_held_out": scores["roofline"],
            "gmae_learned_held_out": scores["learned"], "chosen": chosen,
            "sweep": [{"op": p.cost.op, "dims": [list(d) for d in p.dims], "seconds": p.seconds,
                       **({"strides": [list(d) for d in p.strides]} if p.strides else {})}
                      for p in points]}


PAGE_BYTES = 4096


def first_touch_s(sizes_mb: Sequence[int] = (1, 4, 16), repeats: int = 5) -> float:
    """Seconds the host spends on one 4 KiB page of fresh anonymous memory the first time it is
    written (the kernel's page fault and zeroing), beyond writing it again: what an op pays per
    page of an output the allocator takes from new memory. The median over sizes of the
    least disturbed of `repeats` trials."""
    import mmap

    import torch

    per_page = []
    for mb in sizes_mb:
        size = mb << 20
        best = math.inf
        for _ in range(repeats):
            with mmap.mmap(-1, size) as memory:
                tensor = torch.frombuffer(memory, dtype=torch.float32)
                start = time.perf_counter()
                tensor.fill_(1.0)
                fresh = time.perf_counter()
                tensor.fill_(2.0)
                warm = time.perf_counter()
                del tensor  # before the map closes
            best = min(best, ((fresh - start) - (warm - fresh)) / (size / PAGE_BYTES))
        per_page.append(max(best, 0.0))
    return float(np.median(per_page))


def _device(device: str) -> tuple[str, str]:
    """(torch device, its name) after checking it exists."""
    import torch

    if device == "cpu":
        return "cpu", "cpu"
    if device.startswith("cuda"):
        index = device.partition(":")[2] or "0"
        if not index.isdigit():
            raise PerfswarmError(f"calibrate: --device {device}: expected cpu or cuda:N")
        if not torch.cuda.is_available() or int(index) >= torch.cuda.device_count():
            raise PerfswarmError(f"calibrate: --device {device}: no such CUDA device here "
                                 f"({torch.cuda.device_count() if torch.cuda.is_available() else 0}"
                                 " found)")
        return f"cuda:{index}", str(torch.cuda.get_device_name(int(index)))
    raise PerfswarmError(f"calibrate: --device {device}: expected cpu or cuda:N")


def calibrate(budget_s: float, threads: int = 1, device: str = "cpu",
              on_family: Callable[[str], None] = lambda _f: None) -> dict[str, Any]:
    """The device profile: per family, the fitted models, their held-out GMAE and the sweep.
    On the CPU, timed with ``threads`` intra-op threads: on a shared machine torch's
    parallel-for above its grain size waits on busy cores (a fixed ~8 ms step), not on the op;
    record the workload with the same count (the bundled workloads' --threads)."""
    import torch

    where, name = _device(device)
    if where == "cpu":  # each larger output would grow the heap: page faults, not the op
        reserve_heap(RESERVE_MIB)
    # the memory-bound sweeps first: what they leave of their share goes to the GEMM sweep
    sweeps = [*((f, True) for f in WARM_FAMILIES), *((f, False) for f in reversed(FAMILIES))]
    fitted: dict[tuple[str, bool], Any] = {}
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    start = time.perf_counter()
    try:
        for i, (family, warm) in enumerate(sweeps):
            on_family(f"{family} (warm)" if warm else family)
            share = start + budget_s * (i + 1) / len(sweeps) - time.perf_counter()
            fitted[family, warm] = fit_family(measure(family, share, where, warm))
        page_s = first_touch_s()
    finally:
        torch.set_num_threads(saved)
    return {"device": where, "device_name": name, "threads": threads,
            "families": {f: fitted[f, False] for f in FAMILIES},
            "warm": {f: fitted[f, True] for f in WARM_FAMILIES}, "page_s": page_s}


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

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "profile") -> Profile:
        try:
            models, errors = _models(data["families"])
            warm, _ = _models(data.get("warm", {}))
            page_s = float(data.get("page_s", 0.0))
            if not page_s >= 0:
                raise ValueError("page_s must be a non-negative time")
            return cls(str(data["device"]), int(data.get("threads", 1)), models, errors, page_s,
                       warm, _ceilings(data))
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


def _models(entries: Mapping[str, Any]) -> tuple[dict[str, KernelModel], dict[str, float]]:
    """Per family of fit_family entries: the chosen model, refitted on its sweep, and its
    held-out GMAE."""
    models: dict[str, KernelModel] = {}
    errors: dict[str, float] = {}
    for family, entry in dict(entries).items():
        points = [_sweep_point(p) for p in entry["sweep"]]
        roofline = FamilyModel(tuple(float(c) for c in entry["coef"]))
        if len(roofline.coef) != 3 or min(roofline.coef) < 0:
            raise ValueError("coef needs 3 non-negative values")
        models[str(family)] = (LearnedModel(roofline, tuple(split(points)[0]))
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
    cost = op_cost(op, dims, types, strides=strides)
    seconds = float(entry["seconds"])
    if cost is None or not seconds > 0:
        raise ValueError(f"sweep point {op} {dims} has no cost or time")
    return Point(cost, seconds, tuple(tuple(d) for d in dims), strides)
