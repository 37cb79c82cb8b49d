"""Dask distributed for per-rank work: a LocalCluster by default, a running scheduler if given.

Import and analyze go parallel for runs of PARALLEL_RANKS ranks or more on a machine of
PARALLEL_CORES cores or more (each rank is independent work until the last, small, combining
step), when --workers asks for it, or when --scheduler names a cluster. On fewer cores, the at
most two or three times of parallel work does not repay a local cluster's start-up: on 2 cores,
8 ranks of 250k events, analyze took 16.7 s on two workers against 7.7 s in one process, and
2.3 times the CPU (docs/benchmarks.md). Local workers are processes with one thread each and
a memory limit (the nanny restarts a worker that goes past it); per-rank tasks read only their
rank's rows. Workers of a real cluster must see the Run's directory at the same path.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from perfswarm.errors import ParameterError

PARALLEL_RANKS = 8
PARALLEL_CORES = 4
T = TypeVar("T")


@dataclass(frozen=True)
class ClusterOptions:
    workers: int | None = None  # None: from PARALLEL_RANKS ranks and PARALLEL_CORES cores; 0: never
    scheduler: str | None = None  # address of a running dask scheduler (tcp://host:8786)
    worker_memory: str = "auto"  # memory limit per local worker ("4GB"; auto: RAM / workers)

    def parallel(self, ranks: int, cores: int | None = None) -> bool:
        """Whether `ranks` ranks go to Dask (`cores`: this machine's, by default)."""
        if self.scheduler:
            return True
        if self.workers is not None:
            return self.workers > 0
        return ranks >= PARALLEL_RANKS and (cores or os.cpu_count() or 1) >= PARALLEL_CORES


@contextlib.contextmanager
def connect(options: ClusterOptions, ranks: int) -> Iterator[Any]:
    """A distributed.Client: on `options.scheduler`, or on a LocalCluster of `options.workers`
    (default: one per rank, at most one per core) listening on 127.0.0.1 only, on free ports
    (its HTTP status routes too: never the fixed 8787 another cluster may hold)."""
    from distributed import Client, LocalCluster

    if options.scheduler:
        try:
            client = Client(options.scheduler, timeout="10s")
        except (OSError, TimeoutError, ValueError) as exc:
            raise ParameterError("scheduler", "cannot connect", value=options.scheduler,
                                 note=f"({exc})") from None
        with client:
            yield client
        return
    workers = options.workers or max(1, min(ranks, os.cpu_count() or 1))
    try:
        cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                               memory_limit=options.worker_memory, host="127.0.0.1",
                               dashboard_address="127.0.0.1:0", silence_logs=logging.ERROR)
    except ValueError as exc:  # an unparsable --worker-memory
        raise ParameterError("worker_memory", "", value=options.worker_memory,
                             detail=str(exc)) from None
    with cluster, Client(cluster) as client:
        yield client


def results(futures: Sequence[Any], progress: Callable[[int], None] | None = None) -> list[Any]:
    """The futures' results in order. A worker that died (past its memory limit) is one
    PerfswarmError; errors raised by a task come back as raised."""
    from distributed import as_completed
    from distributed.scheduler import KilledWorker

    try:
        for done, _ in enumerate(as_completed(futures), 1):
            if progress:
                progress(done)
        return [f.result() for f in futures]
    except KilledWorker as exc:
        raise ParameterError(None, "raise {worker_memory} or use fewer {workers}",
                             detail=f"a Dask worker died ({exc})") from None


def run_all(client: Any, fn: Callable[..., T], calls: Sequence[tuple[Any, ...]],
            progress: Callable[[int], None] | None = None) -> list[T]:
    """fn(*args) for each args on the cluster; the results in order (see `results`)."""
    futures = [client.submit(fn, *args, pure=False) for args in calls]
    try:
        return results(futures, progress)
    finally:
        for f in futures:
            f.release()
