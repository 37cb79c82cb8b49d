"""`advise`: run every rule over a Run and rank what they found by estimated gain."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

from perfswarm.model.hostcosts import DEFAULT as DEFAULT_COSTS
from perfswarm.model.hostcosts import HostCosts
from perfswarm.optimize.rules import (
    conv_fusion,
    device,
    distributed,
    host,
    loader,
    optimizer,
    precision,
    recompute,
    samples,
)
from perfswarm.optimize.rules.base import Advice, AdviceDict, Rule
from perfswarm.optimize.rules.facts import Facts
from perfswarm.trace.store import Run

RULES: tuple[Rule, ...] = (
    loader.data_loading,
    host.pageable_h2d,
    device.launch_bound,
    host.host_syncs,
    device.low_utilization,
    device.fp32_gemm,
    precision.float64_ops,
    precision.reduced_precision_ops,
    recompute.activation_checkpointing,
    device.fusion,
    conv_fusion.conv_fusion,
    optimizer.single_tensor_optimizer,
    optimizer.zero_grad_fill,
    host.thread_oversubscription,
    host.cpu_contention,
    host.outlier_steps,
    host.untraced_python,
    samples.per_sample_ops,
    host.untraced_wait,
    loader.loader_oversubscription,
    loader.pin_memory_unused,
    distributed.communication_bound,
    distributed.stragglers,
    distributed.ring_order,
    device.memory_capacity,
    device.memory_breakdown,
    device.memory_growth,
    device.allocator_cache,
)


class ReportDict(TypedDict):
    path: str
    measured_ns: int
    ranks: list[int]
    advice: list[AdviceDict]


@dataclass(frozen=True)
class AdviceReport:
    path: str
    measured_ns: int  # steps (else event span) summed over ranks: what gains are shares of
    ranks: tuple[int, ...]
    advice: tuple[Advice, ...]

    def to_dict(self) -> ReportDict:
        return ReportDict(path=self.path, measured_ns=self.measured_ns, ranks=list(self.ranks),
                          advice=[a.to_dict() for a in self.advice])


def advise(run: Run, rules: tuple[Rule, ...] | None = None,
           costs: HostCosts = DEFAULT_COSTS) -> AdviceReport:
    """Every rule's advice for `run` (default: RULES, as they stand at the call), largest
    estimated gain first (ties by rule name); `costs`: what taking a batch from a DataLoader
    worker and a fused optimizer step cost on the host (a calibrate profile's,
    model/hostcosts.py)."""
    facts = Facts.of(run, costs)
    found = [a for rule in (RULES if rules is None else rules) if (a := rule(facts)) is not None]
    found.sort(key=lambda a: (-(a.gain_ns if a.gain_ns is not None else -1), a.rule))
    return AdviceReport(str(run.path), facts.wall_ns, tuple(facts.ranks), tuple(found))
