"""What the DataLoaders handed each step: its batches, their tensors and their samples, as the
recorder counted them in the running program at every step hook (trace.schema.LOADED). No
trace tells them: a collate of its own stacks nothing per field (torch_geometric's `Batch`
pickles 11 tensors), and a model's first layer reads the rows it is given (a graph network's
nodes, not the loader's graphs). A Run recorded without the counters (before them, imported,
or a program that took no batch) reads NaN and None, not 0."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from perfswarm.analyze.iterations import hook_deltas
from perfswarm.trace.schema import (
    LOADER_BATCHES,
    LOADER_GRAD_SAMPLES,
    LOADER_SAMPLES,
    LOADER_TENSORS,
)

F64 = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Loaded:
    """Per row of a steps table (rank, start, end), what the loaders handed the step; NaN
    where the recorder read none on it."""

    batches: F64
    tensors: F64  # the batches' tensors (each batch's distinct storages)
    samples: F64  # their samples, of loaders that batch by a batch sampler
    grad_samples: F64  # those of batches taken with autograd on

    @classmethod
    def of(cls, counters: pa.Table, steps: pa.Table) -> Loaded:
        return cls(*(hook_deltas(counters, steps, name) for name in (
            LOADER_BATCHES, LOADER_TENSORS, LOADER_SAMPLES, LOADER_GRAD_SAMPLES)))

    def tensors_a_batch(self) -> float | None:
        """The tensors of a batch, over the steps' batches (what handing them all over takes
        at a cost a tensor); None where the steps took no batch the recorder counted."""
        took = self.batches > 0  # (NaN: not read)
        total = float(self.batches[took].sum())
        return float(self.tensors[took].sum()) / total if total else None

    def step_samples(self) -> F64:
        """Per step, the samples of its batches taken with autograd on, where it took any (an
        evaluation's batches under no_grad in the same step are not the step's training),
        else of all its batches (an inference loop's); NaN where none was counted."""
        found = np.where(self.grad_samples > 0, self.grad_samples, self.samples)
        return np.where(found > 0, found, np.nan)
