"""The Analysis: every analysis of a Run in one frozen result (analyze.summary computes it,
analyze.parallel the same per rank on Dask)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from perfswarm.analyze.annotations import Scopes
from perfswarm.analyze.bandwidth import RankBandwidth
from perfswarm.analyze.concurrency import Concurrency
from perfswarm.analyze.critical_path import CriticalPath
from perfswarm.analyze.cupti import CuptiCounters
from perfswarm.analyze.iterations import Iterations, StepWindow
from perfswarm.analyze.kernels import RankKernels
from perfswarm.analyze.launch import LaunchStats
from perfswarm.analyze.memory import RankMemory
from perfswarm.analyze.ops import OpBreakdown
from perfswarm.analyze.sequences import Sequence_
from perfswarm.analyze.stragglers import Stragglers
from perfswarm.analyze.swarms import Swarms
from perfswarm.analyze.system import SystemLoad


@dataclass(frozen=True)
class Analysis:
    path: str
    events: int
    ranks: tuple[int, ...]
    iterations: Iterations
    concurrency: Concurrency
    ops: OpBreakdown
    launch: tuple[LaunchStats, ...]
    stragglers: Stragglers
    critical_path: CriticalPath | None
    swarms: Swarms
    system: tuple[SystemLoad, ...]
    kernels: tuple[RankKernels, ...]
    bandwidth: tuple[RankBandwidth, ...]
    sequences: tuple[Sequence_, ...]
    scopes: Scopes
    cupti: CuptiCounters | None
    memory: tuple[RankMemory, ...]
    # time windows the concurrency and system load are given per when no iterations are found
    windows: Mapping[int, Sequence[StepWindow]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "events": self.events, "ranks": list(self.ranks),
                "iterations": self.iterations.to_dict(),
                "concurrency": self.concurrency.to_dict(), "ops": self.ops.to_dict(),
                "launch": [s.to_dict() for s in self.launch],
                "stragglers": self.stragglers.to_dict(),
                "critical_path": self.critical_path.to_dict() if self.critical_path else None,
                "swarms": self.swarms.to_dict(),
                "system": [s.to_dict() for s in self.system],
                "kernels": [k.to_dict() for k in self.kernels],
                "bandwidth": [b.to_dict() for b in self.bandwidth],
                "sequences": [s.to_dict() for s in self.sequences],
                "scopes": self.scopes.to_dict(),
                "cupti": self.cupti.to_dict() if self.cupti else None,
                "memory": [m.to_dict() for m in self.memory],
                "windows": {str(r): [w.to_dict() for w in ws] for r, ws in self.windows.items()}}
