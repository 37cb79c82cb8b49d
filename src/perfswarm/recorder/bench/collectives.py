"""Measure collectives with real torch.distributed across local processes.

`sweep()` spawns `world_size` processes (gloo on CPU, NCCL when every rank has its own GPU) and
makes `passes` passes over the sizes, each in its own shuffled order; in a pass, each (op, size)
gets `iters` timed samples of back-to-back calls (as many as fill BATCH_S, at least two). A
sample's figure is its median call (the first call absorbs the ranks' skew out of the barrier
and is left out) on its slowest rank, and a point keeps its fastest sample over all passes: on a
shared machine other load only ever adds time, a preemption spoils a call but not a median, and a
burst of load that lasts seconds spoils a pass, not every sample of a point. The models fitted
to a sweep are model/collective_fit.py's.
"""

from __future__ import annotations

import importlib
import itertools
import math
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Literal

from perfswarm.defaults import SWEEP_PASSES
from perfswarm.errors import ParameterError, PerfswarmError
from perfswarm.model.collective_fit import Measurement, Sweep
from perfswarm.model.collectives import Op

Backend = Literal["auto", "gloo", "nccl"]
SWEEP_OPS: tuple[Op, ...] = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                             "broadcast")
ELEMENT_BYTES = 4  # float32
BATCH_S = 2e-3     # one timed sample of a small message: this long ...
MAX_REPS = 64      # ... or this many back-to-back calls


def default_sizes(low: int = 1 << 10, high: int = 64 << 20) -> tuple[int, ...]:
    """Powers of two from `low` to `high` bytes (1 KB..64 MB)."""
    if low < ELEMENT_BYTES or high < low:
        raise PerfswarmError(f"sizes: need {ELEMENT_BYTES} <= low <= high, got {low}..{high}")
    return tuple(1 << k for k in range(low.bit_length() - 1, high.bit_length()))



def _resolve_backend(backend: Backend, world_size: int) -> str:
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if backend == "nccl" and gpus < world_size:
        raise ParameterError("backend", f"needs {world_size} GPUs, found {gpus}", value="nccl")
    if backend == "auto":
        return "nccl" if gpus >= world_size else "gloo"
    return backend


def _worker(rank: int, world_size: int, backend: str, init: str, ops: tuple[Op, ...],
            sizes: tuple[int, ...], iters: int, warmup: int, passes: int, out: str) -> None:
    import orjson
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=init, rank=rank, world_size=world_size)
    all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

    def call_seconds(step: Callable[[], object], reps: int) -> list[float]:
        """Seconds of each of `reps` back-to-back calls but the first, which absorbs the skew
        with which the ranks left the barrier (on the GPU: between events on the stream)."""
        if backend == "nccl":
            marks = [torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
                     for _ in range(reps)]
            for mark in marks:
                step()
                mark.record()
            torch.cuda.synchronize(device)
            return [a.elapsed_time(b) * 1e-3 for a, b in itertools.pairwise(marks)]
        ends = []
        for _ in range(reps):
            step()
            ends.append(time.perf_counter())
        return [b - a for a, b in itertools.pairwise(ends)]

    def fastest(step: Callable[[], object], best: float) -> float:
        """Per-call seconds of `step`: over samples, the fastest median call of a sample, on
        the sample's slowest rank (a preemption spoils a call, not the sample's median), or
        `best` (of an earlier pass) if that was faster."""
        guess = best
        # A first sample of two calls tells how many make BATCH_S (small messages are cheap).
        # Every rank takes the same decisions, since all see the same reduced times.
        for i in range(warmup + iters + math.isinf(best)):
            reps = 2 if math.isinf(guess) else 1 + max(1, min(MAX_REPS, int(BATCH_S / guess)))
            dist.barrier()
            median = torch.tensor([statistics.median(call_seconds(step, reps))],
                                  dtype=torch.float64, device=device)   # (NCCL: no CPU)
            dist.all_reduce(median, op=dist.ReduceOp.MAX)
            guess = min(guess, float(median.item()))
            if i >= warmup:
                best = min(best, float(median.item()))
        return best

    best: dict[tuple[Op, int], float] = {}
    order = list(sizes)
    # Several passes over the sizes, each in its own shuffled order (the same on every rank):
    # on a shared machine a burst of other work lasts from milliseconds to seconds, and spread
    # over passes it spoils one pass of a few points instead of every sample of one point.
    for k in range(passes):
        random.Random(k).shuffle(order)
        for nbytes in order:
            n = max(world_size, nbytes // ELEMENT_BYTES) // world_size * world_size
            full = torch.zeros(n, device=device)   # (sums of zeros stay finite)
            part = torch.zeros(n // world_size, device=device)
            spare = torch.empty(n, device=device)
            calls: dict[str, Callable[[], object]] = {
                "all_reduce": partial(dist.all_reduce, full),
                "all_gather": partial(all_gather, full, part),
                "reduce_scatter": partial(reduce_scatter, part, full),
                "all_to_all": partial(dist.all_to_all_single, spare, full),
                "broadcast": partial(dist.broadcast, full, 0)}
            for op in ops:
                key = (op, n * ELEMENT_BYTES)
                best[key] = fastest(calls[op], best.get(key, math.inf))
    if rank == 0:
        rows = [{"op": op, "nbytes": nb, "seconds": t}
                for (op, nb), t in sorted(best.items(), key=lambda kv: (ops.index(kv[0][0]),
                                                                        kv[0][1]))]
        Path(out).write_bytes(orjson.dumps(rows))
    dist.destroy_process_group()


def sweep(ops: tuple[Op, ...] = SWEEP_OPS, sizes: tuple[int, ...] | None = None,
          world_size: int = 2, backend: Backend = "auto", iters: int = 2,
          warmup: int = 0, passes: int = SWEEP_PASSES) -> Sweep:
    """Time each op at each size among `world_size` local processes; see the module docstring."""
    try:
        mp = importlib.import_module("torch.multiprocessing")
    except ImportError:
        raise PerfswarmError("collective sweep: needs torch (pip install 'perfswarm[torch]')") \
            from None
    for op in ops:
        if op not in SWEEP_OPS:
            raise PerfswarmError(f"collective sweep: cannot measure {op!r}; "
                                 f"choose from {', '.join(SWEEP_OPS)}")
    if world_size < 2 or iters < 1 or warmup < 0 or passes < 1:
        raise PerfswarmError("collective sweep: needs world_size >= 2, iters >= 1, warmup >= 0, "
                             "passes >= 1")
    sizes = sizes or default_sizes()
    chosen = _resolve_backend(backend, world_size)
    with tempfile.TemporaryDirectory(prefix="perfswarm-sweep-") as tmp:
        out = Path(tmp) / "result.json"
        init = f"file://{Path(tmp) / 'rendezvous'}"
        try:
            mp.spawn(_worker, args=(world_size, chosen, init, tuple(ops), tuple(sizes), iters,
                                    warmup, passes, str(out)), nprocs=world_size, join=True)
        except Exception as exc:  # a rank died: report it as one line, not a child's traceback
            raise PerfswarmError(f"collective sweep ({chosen}): a rank failed: "
                                 f"{str(exc).strip().splitlines()[-1]}") from None
        import orjson

        rows = orjson.loads(out.read_bytes())
    return Sweep(chosen, world_size, iters,
                 tuple(Measurement(r["op"], int(r["nbytes"]), float(r["seconds"])) for r in rows))
