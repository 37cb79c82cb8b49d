"""What the DataLoader hands the loop, counted by the recorder in the running program at every
step hook (trace.schema.LOADED): the batches' tensors, which a collate of its own leaves out
of the trace (torch_geometric's `Batch`: 11 tensors, priced as 1), and their samples, where a
graph network's first layer reads nodes (docs/benchmarks.md, the thirty-second pass's
torch_geometric run: "1,674 a step" where the loader gave 64 graphs)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from perfswarm.analyze.loaded import Loaded
from perfswarm.optimize.rules import loader
from perfswarm.optimize.rules.facts import Facts
from perfswarm.recorder.build import Hooks, hook_counters
from perfswarm.recorder.inject._perfswarm_batch import WALK_LIMIT, batch_tensors
from perfswarm.recorder.session import RecordOptions, record
from perfswarm.report.data import report_data
from perfswarm.trace.schema import LOADED
from perfswarm.trace.store import Run


class _Store:
    def __init__(self, **fields: object) -> None:
        self.mapping = fields


def test_batch_tensors_counts_each_storage_once() -> None:
    """The storages a worker's pickler would hand over: a view of a tensor is its storage, a
    tensor of no bytes goes without one; found through tuples, lists, dicts and objects'
    attributes (a store inside an object, as torch_geometric's Batch keeps its tensors), not
    through a class or a module."""
    x = torch.randn(6, 4)
    batch = (_Store(x=x, first=x[0], y=torch.zeros(6), meta={"ptr": torch.arange(7),
                                                             "name": "b", "empty": torch.empty(0)}),
             [x.t(), 3, None], {"cls": torch.Tensor, "mod": torch})
    assert batch_tensors(batch, torch.Tensor) == 3
    assert batch_tensors(x, torch.Tensor) == 1
    # a batch of more objects than the walk looks at: what it found by then (none here: the
    # list's numbers come first)
    assert batch_tensors([x, *range(WALK_LIMIT)], torch.Tensor) == 0


def test_a_process_that_took_no_batch_has_no_loader_counters() -> None:
    """A program without a DataLoader reads null, as a Run recorded before the counters, not
    0 batches of 0 tensors."""
    none = Hooks(0, [10, 20, 30], [], {}, loaded=[[0, 0, 0, 0]] * 3)
    took = Hooks(0, [10, 20, 30], [], {}, loaded=[[0, 0, 0, 0], [1, 2, 8, 8], [2, 4, 16, 8]])
    assert not set(hook_counters([none]).column("name").to_pylist()) & set(LOADED)
    table = hook_counters([took])
    assert sorted(n for n in table.column("name").to_pylist() if n in LOADED) == \
        sorted(LOADED * 3)


def _record(tmp: Path, name: str, script: str) -> Run:
    path = tmp / f"{name}.py"
    path.write_text(script)
    result = record([sys.executable, str(path)], tmp / f"{name}.run",
                    RecordOptions(collectors=("torch",), skip=3, steps=5))
    assert result.exit_code == 0
    return result.run


def _per_step(run: Run, expected: range) -> dict[str, dict[int, float]]:
    """What the loaders handed each step the run timed (steps 1 on), of the steps a pair of
    readings fell on: every one of `expected` but, at most, the window's first (step 3), which
    begins once the profiler has started, maybe past the middle of its hooks
    (iterations.hook_readings)."""
    steps = run.table("steps").sort_by("step")
    found = Loaded.of(run.table("counters"), steps)
    numbers = steps.column("step").to_pylist()
    read = {n for n, b in zip(numbers, np.isnan(found.batches).tolist(), strict=True) if not b}
    assert set(expected) - {3} <= read <= set(expected), sorted(read)
    return {name: {n: v for n, v in zip(numbers, values.tolist(), strict=True) if n in read}
            for name, values in (("batches", found.batches), ("tensors", found.tensors),
                                 ("samples", found.samples), ("grad", found.grad_samples),
                                 ("step", found.step_samples()))}


def _of(read: dict[int, float], values: dict[int, float]) -> dict[int, float]:
    """`values` of the steps `read` holds."""
    return {s: v for s, v in values.items() if s in read}


# A collate of its own, as torch_geometric's: each batch an object holding its tensors in its
# attributes and a dict (x; a view of x's first row; y; ptr: 3 storages), 3 rows of x a
# sample (a graph's nodes: the first layer reads 24 rows a batch of 8), and slow (15 ms: the
# loop waits for it)
CUSTOM = """
import time
import torch
from torch import nn
from torch.utils.data import DataLoader

torch.set_num_threads(1)
torch.manual_seed(0)


class Packed:
    def __init__(self, items):
        time.sleep(0.015)
        self.x = torch.cat([x for x, _ in items])
        self.y = torch.tensor([y for _, y in items])
        self.meta = {"ptr": torch.arange(0, 3 * len(items) + 1, 3), "first": self.x[0],
                     "graphs": len(items)}


data = [(torch.randn(3, 16), i % 2) for i in range(40)]
loader = DataLoader(data, batch_size=8, collate_fn=Packed)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU())
head = nn.Linear(32, 2)
opt = torch.optim.SGD([*model.parameters(), *head.parameters()], lr=0.1)
for epoch in range(3):
    for b in loader:
        pooled = model(b.x).view(-1, 3, 32).sum(1)
        opt.zero_grad()
        nn.functional.cross_entropy(head(pooled), b.y).backward()
        opt.step()
"""


def test_a_collate_of_its_own_is_counted(tmp_path: Path) -> None:
    """Each step took one batch of 3 storages and 8 samples (its graphs; the first layer
    reads their 24 nodes). data_loading prices handing such a batch over from a worker at 3
    tensors (the trace has no default_collate stack: 1, the least, before), and the samples
    card reads 8 a step, saying where from and what the first layer read."""
    run = _record(tmp_path, "custom", CUSTOM)
    counted = _per_step(run, range(1, 15))
    read = counted["batches"]
    assert read == dict.fromkeys(read, 1.0)
    assert counted["tensors"] == dict.fromkeys(read, 3.0)
    assert counted["samples"] == counted["grad"] == counted["step"] == dict.fromkeys(read, 8.0)

    facts = Facts.of(run)
    plan = loader.loader_plan(facts)
    assert plan is not None and plan.tensors == 3.0 and plan.counted
    assert plan.receive_ns == pytest.approx(facts.costs.receive.of(3) * plan.slowdown)
    a = loader.data_loading(facts)
    assert a is not None and a.evidence["tensors_per_batch"] == 3.0
    assert ("3 tensors a batch (the recorder's count of the batches the DataLoader handed the "
            "profiled steps, each storage once)") in a.gain_basis

    rates = report_data(run)["throughput"]
    assert rates["samples_per_step"] == 8 and rates["same_batch"]
    assert rates["source"].startswith(
        "the samples of the batches the DataLoader handed each step (the length of each "
        "batch's index list from its batch sampler, as the recorder counted them), in 5 of "
        "5 steps; the model's own count (the samples the first layer's weight gradient ")
    assert ") reads 24 a step; per the median of the " in rates["source"]


# default_collate of (tensor, label) samples: 2 storages a batch, 36 samples in batches of
# 8, 8, 8, 8, 4; after the optimizer step of every epoch's third batch, an evaluation under
# no_grad of a loader of 2 batches of 6 (in the next step: a step runs from one hook to the
# next)
EVALUATED = """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.set_num_threads(1)
torch.manual_seed(0)
train = DataLoader(TensorDataset(torch.randn(36, 16), torch.randint(0, 2, (36,))), batch_size=8)
val = DataLoader(TensorDataset(torch.randn(12, 16), torch.randint(0, 2, (12,))), batch_size=6)
model = nn.Linear(16, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(3):
    for i, (x, y) in enumerate(train):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if i == 2:
            with torch.no_grad():
                for vx, vy in val:
                    model(vx)
"""


def test_default_collate_batches_and_an_evaluation_are_counted(tmp_path: Path) -> None:
    """Step s took batch s (the first, before the first hook, is no step's): 4 samples at each
    epoch's last; the steps after each epoch's third batch took the evaluation's 2 batches of
    6 besides, under no_grad: the step's samples are its training batch's."""
    run = _record(tmp_path, "evaluated", EVALUATED)
    steps = range(1, 15)
    counted = _per_step(run, steps)
    read = counted["batches"]
    last = {4, 9, 14}
    evaluated = {3, 8, 13}
    assert read == _of(read, {s: 3.0 if s in evaluated else 1.0 for s in steps})
    assert counted["tensors"] == _of(read, {s: 6.0 if s in evaluated else 2.0 for s in steps})
    train = _of(read, {s: 4.0 if s in last else 8.0 for s in steps})
    assert counted["samples"] == {s: n + (12 if s in evaluated else 0) for s, n in train.items()}
    assert counted["grad"] == counted["step"] == train
    # over the profiled steps (3-7): 7 batches, the evaluation's 2 among them, of 2 each
    steps = run.table("steps")
    profiled = steps.filter(np.isin(steps.column("step").to_numpy(), [3, 4, 5, 6, 7]))
    assert Loaded.of(run.table("counters"), profiled).tensors_a_batch() == 14 / 7


# A loader of chunks (batch_size=1: one chunk of 64 rows, as a [1, 64, 16] batch) that the
# loop splits into 4 optimizer steps of 16 rows: 3 steps of every 4 take no batch
CHUNKED = """
import torch
from torch import nn
from torch.utils.data import DataLoader

torch.set_num_threads(1)
torch.manual_seed(0)
chunks = DataLoader([torch.randn(64, 16) for _ in range(6)], batch_size=1)
model = nn.Linear(16, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for (chunk,) in chunks:
    for rows in chunk.split(16):
        opt.zero_grad()
        model(rows).square().mean().backward()
        opt.step()
"""


def test_a_loader_of_chunks_split_into_steps_is_not_the_steps_batch(tmp_path: Path) -> None:
    """The recorder counts a chunk's 1 sample in one step of every 4: the samples card reads
    the first layer's 16 rows a step, not "1 a step" of the steps that took a chunk."""
    run = _record(tmp_path, "chunked", CHUNKED)
    samples = _per_step(run, range(1, 24))["samples"]
    assert samples == _of(samples, {s: 1.0 if s % 4 == 0 else 0.0 for s in range(1, 24)})
    rates = report_data(run)["throughput"]
    assert rates["samples_per_step"] == 16
    assert rates["source"].startswith("the samples the first layer's weight gradient summed")
