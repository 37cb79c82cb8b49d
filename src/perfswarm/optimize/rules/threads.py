"""Intra-op threads for the cores other processes leave free: cpu_contention's change where the
run's processes ran more intra-op threads than that.

An intra-op parallel region (an OpenMP team: a GEMM, a convolution, an elementwise op split over
threads) ends at a barrier when its last thread does its share; on a host whose other processes
hold the cores, one of the team is descheduled now and then, and the rest wait for it at every
region, spinning through their own time slices. A team as large as the free cores has no
member waiting on a runqueue for a core; one thread needs no barrier at all. nanoGPT (4
layers, batch 8) with its two default threads on 2 cores that other jobs kept busy took
113-367 ms an iteration, with one thread 47-76 ms (four interleaved pairs: 2.4-4.8x), far more
than the one core it lacked.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from perfswarm.optimize.rules.facts import Facts


@dataclass(frozen=True)
class FewerThreads:
    """What the run's processes ran with against the cores other processes left free."""

    processes: int
    threads: int  # intra-op threads of a process (the most any ran with)
    source: str  # where `threads` comes from
    free_cores: float  # the host's cores less those other processes held
    advised: int  # threads a process: the free cores over the processes, at least one

    def evidence(self) -> dict[str, Any]:
        return {"threads": self.threads, "threads_source": self.source,
                "free_cores": round(self.free_cores, 2), "advised_threads": self.advised}

    def change(self) -> str:
        n = self.advised
        each = " in each process" if self.processes > 1 else ""
        return (f"torch.set_num_threads({n}){each} before the loop (or OMP_NUM_THREADS={n} "
                f"MKL_NUM_THREADS={n} in its environment): other processes left "
                f"{self.free_cores:.2f} of the cores free, and its {self.threads} intra-op "
                "threads meet at a barrier in every parallel op, where the others wait for the "
                "one descheduled: they lose far more than the cores they lack")


def ran_with(facts: Facts) -> tuple[int, int, str] | None:
    """(processes, intra-op threads of the one that ran most, source): each stepping process's
    torch.get_num_threads() as the recorder saw it, else OMP_NUM_THREADS / MKL_NUM_THREADS of
    the recorded environment; None where the run does not say (an imported trace)."""
    seen = [t for t in facts.recorded.get("threads", [])
            if isinstance(t, int) and not isinstance(t, bool)]
    if seen:
        return len(seen), max(seen), "torch.get_num_threads() in each process"
    env = facts.manifest.get("extra", {}).get("env", {})
    declared = [int(env[k]) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
                if str(env.get(k, "")).isdigit()]
    if declared:
        return max(1, len(facts.manifest["ranks"])), max(declared), "environment"
    return None


def free_cores(contention: Mapping[str, Any]) -> float:
    """The host's cores less those other processes held (cpu_contention's evidence: the busy
    cores less the run's and the recorder's own tools')."""
    cores = float(contention["cores"])
    others = (float(contention["host_busy_cores"]) - float(contention["process_cores"])
              - float(contention["recorder_cores"]))
    return min(cores, max(0.0, cores - others))


def fewer_threads(facts: Facts, contention: Mapping[str, Any]) -> FewerThreads | None:
    """Where the run's processes ran more intra-op threads than the cores other processes left
    free (cpu_contention's evidence: the host's busy cores less the run's and the recorder's
    own tools'), the threads a process should run with; None where they ran no more, or the
    run does not say what they ran with."""
    found = ran_with(facts)
    if found is None:
        return None
    processes, threads, source = found
    free = free_cores(contention)
    advised = max(1, math.floor(free / processes))
    if threads <= advised:
        return None
    return FewerThreads(processes, threads, source, free, advised)
