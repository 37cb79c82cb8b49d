"""What the advice prices from measurements `perfswarm calibrate` makes on the host, read from
its CPU profile (advise's, report's and board's --profile: cli/profile_option.py): taking a
batch from a DataLoader worker (model/receive.py) and a fused optimizer's step
(model/fusedstep.py); without a profile, the defaults measured on the 2-core VM the project
is built on."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from perfswarm.model.fusedstep import DEFAULT as DEFAULT_FUSED
from perfswarm.model.fusedstep import FusedStepCosts, fused_of
from perfswarm.model.receive import DEFAULT as DEFAULT_RECEIVE
from perfswarm.model.receive import ReceiveCost, receive_of


@dataclass(frozen=True)
class HostCosts:
    receive: ReceiveCost = DEFAULT_RECEIVE  # a batch from a worker, unprofiled
    fused: FusedStepCosts = DEFAULT_FUSED  # a fused optimizer step, unprofiled


DEFAULT = HostCosts()


def host_costs(profile: Path | None) -> HostCosts:
    """The costs a calibrate profile holds (one-line errors naming the file); None: DEFAULT."""
    return DEFAULT if profile is None else HostCosts(receive_of(profile), fused_of(profile))
