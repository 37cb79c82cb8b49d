"""The GPU kernel model: per op family, gradient-boosted trees that read a kernel's work and
its device's specs and predict the log of its time over its bound (work.bound_s: the roofline,
or for GEMMs and convolutions the wave of whole tiles their busiest SM runs where that is
longer, for layer norms and block softmaxes their bytes with the re-reads the caches miss;
one over the fraction of the bound it reaches), trained on measurements of several GPUs.

Why boosted trees: a few hundred thousand rows of a dozen-odd features whose effects are
steps (a wave of thread blocks more, a tile that no longer fits, a kernel the library picks
past some size), which trees follow and a smooth model blurs; they need no scaling of the
features, fit in seconds on a CPU, and their output stays inside the range the training
targets span, so a GPU none of the measurements came from gets an efficiency the measured
GPUs reached, times its own bound: bounded, never a wild extrapolation. They are fitted
with scikit-learn and saved as arrays (model/gpu/trees.py).

Measured op latencies include a fixed host and launch time (25 to 60 us in the dataset, set by
the measuring machine's CPU rather than by its GPU); the model learns the rest: per GPU, the
latency over its 1st-percentile latency (`floor`), from the rows where that rest is at least
half the latency (a smaller rest is mostly the host's jitter). A kernel in a trace is priced
without that floor: the trace times the kernel alone. Held-out GPUs are scored both ways: the
whole latency (the others' median floor added) and the kernel time alone (the latency less the
GPU's own floor, on its rows of at least two floors).

Whole models' nodes (the dataset's labels) train the trees beside the sweeps: the sweeps ran
large GEMMs 5-38% slower than the models ran them (in sample, docs/benchmarks.md; random data
against ones-filled token ids: plausibly a power-limited card clocks higher on data that
switches less), and `predict` prices kernels of models. A label's floor is its GPU's fastest
kernel node's latency over its labels (a sweep's, the GPU's 1st-percentile latency); per GPU
and family its rows weigh LABEL_SHARE of the training (a few dozen nodes against a thousand
sweep rows would move the trees little; chosen by leave-one-GPU-out over the whole models and
the kernel tables, docs/benchmarks.md). Held-out GPUs are scored on their sweeps and test
shapes only, as before labels were read.
"""

from __future__ import annotations

import io
import math
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Final

import numpy as np
import numpy.typing as npt

from perfswarm.errors import PerfswarmError
from perfswarm.model.accuracy import gmae
from perfswarm.model.gpu.dataset import Dataset, Measurement, Split
from perfswarm.model.gpu.hardware import Hardware, bundled_hardware
from perfswarm.model.gpu.trees import F64, Ensemble, fit
from perfswarm.model.gpu.work import FAMILIES, Family, Work, bound_s, features, roofline_s
from perfswarm.trace.store import write_output

MODEL_FILE: Final = "gpu_kernels.npz"
ROWS_PER_GPU: Final = 1000  # training rows per family and GPU (_spaced)
EVAL_ROWS: Final = 1500  # held-out rows scored per family and GPU
FLOOR_PERCENTILE: Final = 1.0
TRAINED_FLOORS: Final = 2.0  # a row trains the model when its latency is at least this many floors
SCORED_FLOORS: Final = 2.0  # and is scored for its kernel time alone from this many
MIN_ROWS: Final = 50  # fewer such rows: every row trains it, its rest at least MIN_WORK_SHARE
MIN_WORK_SHARE: Final = 0.1
LABEL_SHARE: Final = 0.5  # of a GPU's training weight in a family: its labels'
# a GPU's sweep of an op trains no model where its large kernels (a roofline time of at least
# LARGE_S) reach, at the median, under OFF_PATH of the fraction of the roofline that the same
# GPU's test set of the op reaches: it ran another kernel path than the same op's other work on
# that GPU, and its rows would price GPUs near it in the trees' features by that path (the
# P4's linear sweep, cuBLAS's maxwell_sgemm 64x64 and 32x128 tiles, reaches 0.26 of the
# roofline, 0.34 of its test set's sgemm_128x128x8 at 0.77; its whole models' GEMMs of 10
# GFLOP or more reach 0.51 of the FP32 peak, its sweep's 0.21; every other sweep of the five
# GPUs reaches 0.64-1.05 of its test set's: docs/benchmarks.md, twenty-third pass)
OFF_PATH: Final = 0.5
LARGE_S: Final = 1e-4
Progress = Callable[[str], None]


@dataclass(frozen=True)
class FamilyModel:
    trees: Ensemble
    floor_s: float  # the fixed part of a measured op's latency, typical over the GPUs

    def work_s(self, works: Sequence[Work], hw: Hardware) -> F64:
        """Kernel time without the floor: the bound (work.bound_s) x the learned ratio."""
        x = np.array([features(w, hw) for w in works], np.float64)
        bound = np.array([bound_s(w, hw) for w in works])
        return bound * np.exp(self.trees.predict(x))


@dataclass(frozen=True)
class KernelModel:
    families: Mapping[Family, FamilyModel]
    gpus: tuple[str, ...]  # trained on

    def seconds(self, works: Sequence[Work], hw: Hardware) -> F64:
        """Each kernel's predicted time on `hw` (no launch floor), grouped per family, at most
        its time on any bundled device `hw` has at least as much of everything as
        (Hardware.dominates): what the trees read of a device, its ridge point, orders no GPUs,
        and the H100 had come out slower than a T4 on a ViT's GEMMs, the H200 than the H100."""
        out = self._seconds(works, hw)
        for other in bundled_hardware():
            if hw.dominates(other):
                out = np.minimum(out, self._seconds(works, other))
        return out

    def _seconds(self, works: Sequence[Work], hw: Hardware) -> F64:
        out = np.zeros(len(works))
        for family, model in self.families.items():
            idx = [i for i, w in enumerate(works) if w.family == family]
            if idx:
                out[idx] = model.work_s([works[i] for i in idx], hw)
        return out

    def save(self, path: Path) -> None:
        arrays: dict[str, npt.NDArray[np.generic]] = {}
        for family, model in self.families.items():
            arrays |= model.trees.arrays(family)
            arrays[f"{family}.floor"] = np.array([model.floor_s])
        arrays["gpus"] = np.array(self.gpus)
        data = io.BytesIO()
        np.savez_compressed(data, **arrays)  # type: ignore[arg-type]
        write_output(path, data.getvalue())

    @classmethod
    def load(cls, source: Path | str) -> KernelModel:
        try:
            with np.load(source, allow_pickle=False) as data:
                arrays = dict(data)
            families = {f: FamilyModel(Ensemble.of_arrays(arrays, f),
                                       float(arrays[f"{f}.floor"][0]))
                        for f in FAMILIES if f"{f}.base" in arrays}
            gpus = tuple(str(g) for g in arrays["gpus"])
        except EOFError:  # an empty file (left alone, the CLI would take it for Ctrl-D)
            raise PerfswarmError(f"{source}: not a GPU kernel model (empty)") from None
        except (OSError, ValueError, KeyError, zipfile.BadZipFile) as exc:
            raise PerfswarmError(f"{source}: not a GPU kernel model ({exc})") from None
        if not families:
            raise PerfswarmError(f"{source}: not a GPU kernel model (no op family in it)")
        return cls(families, gpus)


@cache
def bundled() -> KernelModel:
    """The model shipped in the package, fitted on shared/gpu-kernels (NeuSight's measurements,
    MIT: see GPU_KERNELS_LICENSE beside it); loaded on first use."""
    with resources.as_file(resources.files("perfswarm.model.gpu").joinpath(MODEL_FILE)) as p:
        return KernelModel.load(p)


@dataclass(frozen=True)
class _Rows:
    """Measurements of one family with their features, computed once for every fold."""

    gpu: npt.NDArray[np.str_]
    x: F64
    roof: F64  # the plain roofline (scored beside the model)
    bound: F64  # what the trees' ratio multiplies (work.bound_s)
    seconds: F64
    label: npt.NDArray[np.bool_]  # a whole model's node, not a sweep's row
    label_floor: F64  # a label's known floor (Measurement.floor_s; nan for a sweep's row)

    @classmethod
    def of(cls, rows: Sequence[Measurement], hardware: Mapping[str, Hardware]) -> _Rows:
        return cls(np.array([r.gpu for r in rows]),
                   np.array([features(r.work, hardware[r.gpu]) for r in rows], np.float64),
                   np.array([roofline_s(r.work, hardware[r.gpu]) for r in rows]),
                   np.array([bound_s(r.work, hardware[r.gpu]) for r in rows]),
                   np.array([r.seconds for r in rows]),
                   np.array([r.split == "label" for r in rows], np.bool_),
                   np.array([math.nan if r.floor_s is None else r.floor_s for r in rows]))

    def floors(self, keep: npt.NDArray[np.bool_]) -> dict[str, float]:
        """Each GPU's floor over the sweep rows `keep` marks: its 1st-percentile latency."""
        sweep = keep & ~self.label
        return {g: float(np.percentile(self.seconds[sweep & (self.gpu == g)], FLOOR_PERCENTILE))
                for g in set(self.gpu[sweep])}

    def fit(self, keep: npt.NDArray[np.bool_], seed: int) -> FamilyModel:
        """The family's model on the rows `keep` marks: the floor per GPU (a label's its own),
        the trees on the rest of the latencies of at least TRAINED_FLOORS floors (of all, where
        few are), the labels of a GPU weighing LABEL_SHARE of its rows."""
        floors = self.floors(keep)
        floor = np.where(self.label, self.label_floor,
                         np.array([floors.get(g, np.inf) for g in self.gpu]))
        rows = keep & (self.seconds >= TRAINED_FLOORS * floor)
        if rows.sum() < MIN_ROWS:  # sweeps of small kernels only: every row, the rest clamped
            rows = keep
        work = np.maximum(self.seconds[rows] - floor[rows], MIN_WORK_SHARE * self.seconds[rows])
        weight = np.ones(len(self.gpu))
        for g in set(self.gpu[rows & self.label]):
            mine = rows & (self.gpu == g)
            labels, sweeps = (mine & self.label).sum(), (mine & ~self.label).sum()
            if sweeps:
                weight[mine & self.label] = LABEL_SHARE / (1 - LABEL_SHARE) * sweeps / labels
        typical = list(floors.values()) or list(self.label_floor[keep & self.label])
        return FamilyModel(fit(self.x[rows], np.log(work / self.bound[rows]), weight[rows], seed),
                           float(np.median(typical)))

    def kernel(self, model: FamilyModel, keep: npt.NDArray[np.bool_]) -> F64:
        """The kernel time of the rows `keep` marks, without the floor."""
        return self.bound[keep] * np.exp(model.trees.predict(self.x[keep]))


def off_path(rows: Sequence[Measurement], hardware: Mapping[str, Hardware]
             ) -> set[tuple[str, str]]:
    """The (GPU, op kind) sweeps that ran another kernel path than their GPU's test set of
    the op (OFF_PATH): their large kernels' median fraction of the roofline against the
    test set's."""
    reached: dict[tuple[str, str, Split], list[float]] = {}
    for r in rows:
        roof = roofline_s(r.work, hardware[r.gpu])
        if r.split != "label" and roof >= LARGE_S:
            reached.setdefault((r.gpu, r.work.kind, r.split), []).append(roof / r.seconds)
    return {(gpu, kind) for (gpu, kind, split), swept in reached.items()
            if split == "train" and (tested := reached.get((gpu, kind, "test")))
            and np.median(swept) < OFF_PATH * np.median(tested)}


def _spaced(rows: Sequence[Measurement], most: int, splits: tuple[Split, ...],
            whole: bool = True) -> list[Measurement]:
    """At most `most` rows of `splits` per GPU: with `whole`, evenly spaced over all of them
    (the scored rows: a GPU's sweeps, then its test shapes); without, a stride of len // most
    cut at `most` (the training rows: of a sweep under twice `most` rows, its first `most`,
    the layer norm's and softmax's smaller batches). Trained on 1,000 rows spread over the
    whole sweep, evenly or at random, the held-out layer norms scored 18.9-19.5% against
    15.2%; on up to 2,000 rows the GEMMs 34.3% against 31.3% (seed 0; docs/benchmarks.md,
    twenty-seventh pass)."""
    out = []
    for gpu in sorted({r.gpu for r in rows}):
        mine = [r for r in rows if r.gpu == gpu and r.split in splits]
        count = min(most, len(mine))
        out += ([mine[i * len(mine) // count] for i in range(count)] if whole
                else mine[::max(1, len(mine) // most)][:most])
    return out


@dataclass(frozen=True)
class Holdout:
    """Leave-one-GPU-out: the model fitted without `gpu`, scored on `gpu`'s measurements."""

    family: Family
    gpu: str
    rows: int
    gmae: float            # of the whole latency: the others' median floor plus the kernel
    gmae_roofline: float
    kernel_rows: int       # rows of at least SCORED_FLOORS of the GPU's own floor
    gmae_kernel: float     # of their kernel time: the latency less that floor
    gmae_kernel_roofline: float
    model: FamilyModel = field(compare=False, repr=False)  # fitted without `gpu`

    def to_dict(self) -> dict[str, object]:
        return {"family": self.family, "gpu": self.gpu, "rows": self.rows, "gmae": self.gmae,
                "gmae_roofline": self.gmae_roofline, "kernel_rows": self.kernel_rows,
                "gmae_kernel": self.gmae_kernel,
                "gmae_kernel_roofline": self.gmae_kernel_roofline}


def _families(dataset: Dataset) -> dict[Family, list[Measurement]]:
    """Each family's measurements, of the families measured on two GPUs or more."""
    by_family: dict[Family, list[Measurement]] = {f: [] for f in FAMILIES}
    for r in dataset.rows:
        by_family[r.work.family].append(r)
    return {f: rows for f, rows in by_family.items() if len({r.gpu for r in rows}) >= 2}


def steps(dataset: Dataset, holdout: bool = True) -> int:
    """How many fits `train` makes: the progress bar's total."""
    return sum(1 + (len({r.gpu for r in rows}) if holdout else 0)
               for rows in _families(dataset).values())


def train(dataset: Dataset, progress: Progress = lambda _: None, holdout: bool = True,
          seed: int = 0) -> tuple[KernelModel, list[Holdout]]:
    """The model on every GPU of the dataset (no sweep that `off_path` finds), and (with
    `holdout`) each family's leave-one-GPU-out errors (`progress` is told of each fit as it
    starts): fitted on the other GPUs' training rows, scored on up to EVAL_ROWS of the one left
    out (its sweeps and test shapes). `seed` seeds every fit (trees.fit)."""
    holdouts = []
    families = {}
    measured = _families(dataset)
    if not measured:
        raise PerfswarmError(f"{dataset.path}: no op family measured on two GPUs or more "
                             "(a model learns from one GPU to another)")
    apart = off_path(dataset.rows, dataset.hardware)
    for family, rows in measured.items():
        gpus = sorted({r.gpu for r in rows})
        swept = [r for r in rows if (r.gpu, r.work.kind) not in apart]
        train_rows = (_spaced(swept, ROWS_PER_GPU, ("train",), whole=False)
                      + [r for r in rows if r.split == "label"])
        held_rows = _spaced(rows, EVAL_ROWS, ("train", "test")) if holdout else []
        table = _Rows.of(train_rows + held_rows, dataset.hardware)
        fitting = np.arange(len(table.gpu)) < len(train_rows)
        for gpu in gpus if holdout else []:
            progress(f"{family}: leaving out {gpu}")
            model = table.fit(fitting & (table.gpu != gpu), seed)
            held = ~fitting & (table.gpu == gpu)
            measured = table.seconds[held]
            own = table.floors(fitting & (table.gpu == gpu))[gpu]
            kernel = held & (table.seconds >= SCORED_FLOORS * own)
            alone = table.seconds[kernel] - own
            holdouts.append(Holdout(
                family, gpu, int(held.sum()),
                gmae(model.floor_s + table.kernel(model, held), measured, empty=math.nan),
                gmae(table.roof[held], measured, empty=math.nan), int(kernel.sum()),
                gmae(table.kernel(model, kernel), alone, empty=math.nan),
                gmae(table.roof[kernel], alone, empty=math.nan),
                model))
        progress(f"{family}: all {len(gpus)} GPUs")
        families[family] = table.fit(fitting, seed)
    return KernelModel(families, tuple(dataset.gpus())), holdouts
