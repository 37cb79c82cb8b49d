"""The Dask options `import` and `analyze` share: --workers, --scheduler, --worker-memory."""

from __future__ import annotations

import os
from typing import Annotated

import typer

from perfswarm.errors import PerfswarmError
from perfswarm.trace.cluster import PARALLEL_CORES, PARALLEL_RANKS, ClusterOptions

Workers = Annotated[int | None, typer.Option(
    "--workers", min=0, help=f"Dask workers of a local cluster, one rank per task (default: one "
    f"per rank up to the cores, from {PARALLEL_RANKS} ranks up on {PARALLEL_CORES} cores or "
    f"more; 0: single process).")]
Scheduler = Annotated[str | None, typer.Option(
    "--scheduler", metavar="ADDRESS", help="A running Dask scheduler (tcp://host:8786) to work "
    "on instead; its workers must see the Run at the same path.")]
WorkerMemory = Annotated[str, typer.Option(
    "--worker-memory", help="Memory limit of each local worker, e.g. 4GB (auto: RAM / workers).")]


# More local workers than this many per core only queue; each needs this much to start.
WORKERS_PER_CORE = 4
MIN_WORKER_MEMORY = 256 << 20


def cluster_options(workers: int | None, scheduler: str | None,
                    worker_memory: str) -> ClusterOptions:
    """The options, their ranges checked before any worker starts."""
    cores = os.cpu_count() or 1
    if workers is not None and workers > WORKERS_PER_CORE * cores:
        raise PerfswarmError(f"--workers {workers}: over {WORKERS_PER_CORE} per core "
                             f"({WORKERS_PER_CORE * cores})")
    if worker_memory != "auto":
        from dask.utils import parse_bytes

        try:
            size = parse_bytes(worker_memory)
        except ValueError as exc:
            raise PerfswarmError(f"--worker-memory {worker_memory}: {exc}") from None
        if size < MIN_WORKER_MEMORY:
            raise PerfswarmError(f"--worker-memory {worker_memory}: under "
                                 f"{MIN_WORKER_MEMORY >> 20} MiB, too little for a worker to start")
    return ClusterOptions(workers=workers, scheduler=scheduler, worker_memory=worker_memory)
