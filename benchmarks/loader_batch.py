"""What the recorder adds to each batch a DataLoader hands the loop, where it counts the batch's
tensors and samples (inject/_perfswarm_batch.py, sitecustomize._count_batches).

(1) The walk alone (`batch_tensors`), CPU ns a call (thread clock, the median of --calls calls,
best of --repeats): a default_collate batch of (image, label) samples, a dict of three tensors
(a tokenizer's batch), and a batch shaped as torch_geometric's `Batch` (its 11 tensors in the
dicts of a store inside the object, beside two classes and a weak reference), or the real one
where torch_geometric imports. (2) The whole cost a batch: `next()` of a DataLoader of no
workers over a TensorDataset, from torch's iterator and from one with the recorder's wrappers
of its methods (`_count_batches` of the injected sitecustomize, loaded in this process), one
batch of each in turn, --batches pairs: each one's median CPU ns (thread clock), and the median
of the pairs' differences.

    python benchmarks/loader_batch.py [--calls 2000] [--repeats 5] [--batches 20000]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import time
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset, default_collate

from perfswarm.recorder.inject._perfswarm_batch import batch_tensors
from perfswarm.recorder.torch_profiler import INJECT, PATIENCE, SETTLE


class _Store:
    """torch_geometric's GlobalStorage's attributes: its fields, the slices and increments a
    Batch keeps per field, a weak reference to its Batch."""

    def __init__(self, parent: object) -> None:
        nodes = 1_600
        self._mapping = {"x": torch.randn(nodes, 7), "edge_index": torch.randint(
            0, nodes, (2, 4 * nodes)), "y": torch.randint(0, 2, (64,)),
            "batch": torch.zeros(nodes, dtype=torch.long), "ptr": torch.arange(65)}
        self._parent = weakref.ref(parent)
        self._num_graphs = 64
        self._slice_dict = {k: torch.arange(65) for k in ("x", "edge_index", "y")}
        self._inc_dict = {k: torch.zeros(64, dtype=torch.long) for k in ("x", "edge_index", "y")}


class _Batch:
    """torch_geometric's Batch's attributes: two classes and its store."""

    def __init__(self) -> None:
        self._edge_attr_cls = type
        self._tensor_attr_cls = type
        self._store = _Store(self)


def _pyg_batch() -> tuple[str, object]:
    """torch_geometric's own Batch of 64 graphs where it imports, else the lookalike."""
    try:
        from torch_geometric.data import Data
        from torch_geometric.loader import DataLoader as GraphLoader
    except ImportError:
        return "torch_geometric-shaped Batch (64 graphs)", _Batch()
    gen = torch.Generator().manual_seed(0)
    graphs = [Data(x=torch.randn(n, 7), edge_index=torch.randint(0, n, (2, 4 * n)),
                   y=torch.tensor([n % 2]))
              for n in torch.randint(12, 40, (64,), generator=gen).tolist()]
    return "torch_geometric's Batch (64 graphs)", next(iter(GraphLoader(graphs, batch_size=64)))


def _per_call(walk: Callable[[], int], calls: int, repeats: int) -> float:
    """The CPU ns of one call: the median of `calls`, the best of `repeats`."""
    best = float("inf")
    for _ in range(repeats):
        times = []
        for _ in range(calls):
            t0 = time.thread_time_ns()
            walk()
            times.append(time.thread_time_ns() - t0)
        best = min(best, statistics.median(times))
    return best


def _iterators() -> tuple[type, type]:
    """torch's iterator of a loader of no workers, and the same with the recorder's wrappers
    of its methods, which count each batch (`_count_batches` of the injected sitecustomize,
    loaded here without a recording: it opens no window, and counts for a window of this
    process)."""
    from torch.utils.data import dataloader

    sys.path.insert(0, str(INJECT))  # where it imports its helpers from
    spec = importlib.util.spec_from_file_location("_recorder_site", INJECT / "sitecustomize.py")
    assert spec is not None and spec.loader is not None
    site = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(site)
    base: type = dataloader._BaseDataLoaderIter
    names = ("__next__", "_next_index", "_reset")
    bare = {n: vars(base)[n] for n in names}
    with tempfile.TemporaryDirectory() as out:
        site._count_batches(site._Window(out, 5, 10, False, 0, PATIENCE, SETTLE), base)
    counted = {n: vars(base)[n] for n in names}
    for name, method in bare.items():  # torch's own again, the wrappers on a subclass
        setattr(base, name, method)
    plain: type = dataloader._SingleProcessDataLoaderIter
    return plain, type("Counted", (plain,), counted)


def _next_pairs(loader: DataLoader[Any], kinds: tuple[type, type], batches: int
                ) -> list[tuple[int, int]]:
    """CPU ns (thread clock) of `batches` pairs of `next()`, one of each iterator kind in turn
    (which goes first alternating): the host's drift falls on both alike."""
    its = [iter(()), iter(())]
    pairs = []
    for i in range(batches):
        pair = [0, 0]
        for k in ((0, 1) if i % 2 == 0 else (1, 0)):
            while True:
                t0 = time.thread_time_ns()
                try:
                    next(its[k])
                    pair[k] = time.thread_time_ns() - t0
                    break
                except StopIteration:
                    its[k] = kinds[k](loader)
        pairs.append((pair[0], pair[1]))
    return pairs


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--batches", type=int, default=20000)
    ns = p.parse_args()
    torch.set_num_threads(1)
    images = default_collate([(torch.randn(3, 32, 32), i % 10) for i in range(64)])
    tokens = {k: torch.ones(64, 128, dtype=torch.long)
              for k in ("input_ids", "attention_mask", "labels")}
    pyg_name, pyg = _pyg_batch()
    for name, batch in (("default_collate (image, label) x 64", images),
                        ("dict of 3 tensors (a tokenizer's batch)", tokens), (pyg_name, pyg)):
        count = batch_tensors(batch, torch.Tensor)
        ns_call = _per_call(lambda b=batch: batch_tensors(b, torch.Tensor), ns.calls,
                            ns.repeats)
        print(f"walk: {name}: {count} tensors, {ns_call / 1e3:.2f} us CPU a batch")
    loader = DataLoader(TensorDataset(torch.randn(64, 3, 8, 8), torch.randint(0, 10, (64,))),
                        batch_size=8)
    pairs = _next_pairs(loader, _iterators(), ns.batches)
    plain, counted = (statistics.median(p[k] for p in pairs) for k in (0, 1))
    extra = statistics.median(c - p for p, c in pairs)
    print(f"next() of a DataLoader of no workers (default_collate of 8 (3x8x8, label) "
          f"samples), {ns.batches} pairs: torch's {plain / 1e3:.2f} us CPU, counted "
          f"{counted / 1e3:.2f} us CPU (medians), the pairs' median difference "
          f"{extra / 1e3:+.2f} us a batch")
    return 0


if __name__ == "__main__":
    sys.exit(main())
