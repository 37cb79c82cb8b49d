"""The Dask options `import` and `analyze` share: --workers, --scheduler, --worker-memory."""

from __future__ import annotations

from typing import Annotated

import typer

from perfswarm.trace.cluster import PARALLEL_RANKS, ClusterOptions

Workers = Annotated[int | None, typer.Option(
    "--workers", min=0, help=f"Dask workers of a local cluster, one rank per task (default: one "
    f"per rank up to the cores, from {PARALLEL_RANKS} ranks up; 0: single process).")]
Scheduler = Annotated[str | None, typer.Option(
    "--scheduler", metavar="ADDRESS", help="A running Dask scheduler (tcp://host:8786) to work "
    "on instead; its workers must see the Run at the same path.")]
WorkerMemory = Annotated[str, typer.Option(
    "--worker-memory", help="Memory limit of each local worker, e.g. 4GB (auto: RAM / workers).")]


def cluster_options(workers: int | None, scheduler: str | None,
                    worker_memory: str) -> ClusterOptions:
    return ClusterOptions(workers=workers, scheduler=scheduler, worker_memory=worker_memory)
