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
from typing import Any, Final

import pyarrow as pa

from perfswarm.analyze.step_threads import history, latest, step_threads
from perfswarm.optimize.rules.facts import Facts

TIMED: Final = "every timed step"  # cpu_contention's `over` when it judged every timed step
ENVIRONMENT: Final = "environment"  # RanWith.source of OMP_NUM_THREADS / MKL_NUM_THREADS


@dataclass(frozen=True)
class RanWith:
    """The intra-op threads the run's processes ran with."""

    processes: int
    threads: int  # of a process (the most any ran with; at the later steps, where they changed)
    source: str  # where `threads` comes from
    total: int  # over the processes (the later steps' count of each)
    history: str = ""  # how the steps' counts changed ("2 then 1 from step 10"), if they did


@dataclass(frozen=True)
class FewerThreads:
    """What the run's processes ran with against the cores other processes left free."""

    ran: RanWith
    free_cores: float  # the host's cores less those other processes held
    advised: int  # threads a process: the free cores over the processes, at least one

    @property
    def threads(self) -> int:
        return self.ran.threads

    def evidence(self) -> dict[str, Any]:
        changed = {"threads_by_step": self.ran.history} if self.ran.history else {}
        return {"threads": self.threads, "threads_source": self.ran.source, **changed,
                "free_cores": round(self.free_cores, 2), "advised_threads": self.advised}

    def change(self) -> str:
        n = self.advised
        each = " in each process" if self.ran.processes > 1 else ""
        where = (f" where the program sets its threads (its steps ran {self.ran.history})"
                 if self.ran.history else f"{each} before the loop (or OMP_NUM_THREADS={n} "
                 f"MKL_NUM_THREADS={n} in its environment)")
        return (f"torch.set_num_threads({n}){where}: other processes left "
                f"{self.free_cores:.2f} of the cores free, and its {self.threads} intra-op "
                "threads meet at a barrier in every parallel op, where the others wait for the "
                "one descheduled: they lose far more than the cores they lack")


def judged_steps(facts: Facts, contention: Mapping[str, Any]) -> pa.Table:
    """The steps cpu_contention's evidence is of: every timed step, else the profiled ones."""
    return facts.run_steps if contention.get("over") == TIMED else facts.steps


def ran_with(facts: Facts, steps: pa.Table | None = None) -> RanWith | None:
    """The intra-op threads of `steps` (default the profiled ones): torch.get_num_threads() at
    each step's hook (step_threads), the count of each rank's last step (the most of them:
    what the program runs at from then on); in a Run recorded before that counter, each
    stepping process's as the recorder's window opened; else OMP_NUM_THREADS /
    MKL_NUM_THREADS of the recorded environment; None where the run does not say (an
    imported trace)."""
    seen = [t for t in facts.recorded.get("threads", [])
            if isinstance(t, int) and not isinstance(t, bool)]
    counted = step_threads(facts.counters, facts.steps if steps is None else steps)
    last = latest(counted)
    if last is not None:
        ranks = {r for r, _ in counted}
        each = [n for r in ranks if (n := latest({k: v for k, v in counted.items()
                                                  if k[0] == r})) is not None]
        return RanWith(max(len(seen), len(ranks)), last, "torch.get_num_threads() at each step",
                       sum(each), history(counted))
    if seen:
        return RanWith(len(seen), max(seen), "torch.get_num_threads() in each process",
                       sum(seen))
    env = facts.manifest.get("extra", {}).get("env", {})
    declared = [int(env[k]) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
                if str(env.get(k, "")).isdigit()]
    if declared:
        processes = max(1, len(facts.manifest["ranks"]))
        return RanWith(processes, max(declared), ENVIRONMENT, processes * max(declared))
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
    own tools') in the steps that evidence is of, the threads a process should run with;
    None where they ran no more (a program that lowered its threads inside them: at its
    later steps), or the run does not say what they ran with."""
    found = ran_with(facts, judged_steps(facts, contention))
    if found is None:
        return None
    free = free_cores(contention)
    advised = max(1, math.floor(free / found.processes))
    if found.threads <= advised:
        return None
    return FewerThreads(found, free, advised)
