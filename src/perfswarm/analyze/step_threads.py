"""The intra-op threads each step ran with: torch.get_num_threads() as the recorder read it at
the hook ending the step (the counter HOOK_THREADS). A program may change them inside the
profiling window (torch.set_num_threads(1) at its 10th step); the manifest's
extra.record.threads holds the count as the window opened, all that a Run recorded before the
counter has."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

import numpy as np
import pyarrow as pa

from perfswarm.analyze.iterations import StepKey, hook_readings, profiled
from perfswarm.trace.schema import HOOK_THREADS
from perfswarm.trace.store import Run


def step_threads(counters: pa.Table, steps: pa.Table) -> dict[StepKey, int]:
    """(rank, step) -> intra-op threads, of the rows of `steps` (rank, step, start, end) a
    reading falls on (`hook_readings`: the hook ending the step); empty for a Run recorded
    without the counter."""
    _, at = hook_readings(counters, steps, HOOK_THREADS)
    known = np.flatnonzero(~np.isnan(at))
    ranks, numbers = (np.asarray(steps.column(c).to_numpy(), np.int64)[known].tolist()
                      for c in ("rank", "step"))
    return {(r, s): int(n) for r, s, n in zip(ranks, numbers, at[known].tolist(), strict=True)}


def profiled_threads(run: Run) -> dict[StepKey, int]:
    """`step_threads` of the Run's profiled steps."""
    return step_threads(run.table("counters", columns=["rank", "ts", "name", "value"]),
                        profiled(run.table("steps", columns=["rank", "step", "start", "end",
                                                             "source"])))


def prevailing(threads: Mapping[StepKey, int]) -> int | None:
    """The count most of the steps ran with, on a tie the one of the latest step among them
    (what the program runs at from then on); None for no steps."""
    if not threads:
        return None
    counts = Counter(threads.values())
    most = max(counts.values())
    return next(n for _, n in sorted(threads.items(), key=lambda kv: kv[0][1], reverse=True)
                if counts[n] == most)


def latest(threads: Mapping[StepKey, int]) -> int | None:
    """The count the later steps run at: each rank's last step's, the most of them; None for
    no steps."""
    last: dict[int, tuple[int, int]] = {}
    for (rank, step), n in threads.items():
        if rank not in last or step > last[rank][0]:
            last[rank] = (step, n)
    return max((n for _, n in last.values()), default=None)


def history(threads: Mapping[StepKey, int]) -> str:
    """How the counts changed over the steps, in words ("2 then 1 from step 10", rank by rank
    where several ranks ran: "rank 1: 4 then 2 from step 7"); empty where each rank ran one."""
    ranks = sorted({r for r, _ in threads})
    told = []
    for rank in ranks:
        runs: list[tuple[int, int]] = []  # (count, first step)
        for (_, step), n in sorted((k, v) for k, v in threads.items() if k[0] == rank):
            if not runs or runs[-1][0] != n:
                runs.append((n, step))
        if len(runs) > 1:
            said = " then ".join([str(runs[0][0]), *(f"{n} from step {s}" for n, s in runs[1:])])
            told.append(f"rank {rank}: {said}" if len(ranks) > 1 else said)
    return "; ".join(told)
