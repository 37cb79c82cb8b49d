"""What taking a batch from a DataLoader worker costs the training process, unprofiled: a cost
a batch (the worker queue's get, its structure unpickled) and a cost a tensor of it (each one a
shared-memory file passed to the process and mapped in); the rows hardly matter. Measured by
`perfswarm calibrate` on the host (recorder/bench/loader.py) and kept in its CPU profile
(`loader_receive`); without one, the defaults below, measured on the 2-core VM the project is
built on: 0.61-1.37 ms a batch of 1-4 tensors of 16-256 rows (/tmp/p29/unseen/recv2.py,
twenty-ninth pass), as calibrate measured it there (docs/benchmarks.md, thirtieth pass).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from perfswarm.errors import PerfswarmError
from perfswarm.userfiles import read_json

KEY = "loader_receive"  # the profile's field


class ReceiveDict(TypedDict):
    batch_ns: float
    tensor_ns: float


@dataclass(frozen=True)
class ReceiveCost:
    """CPU ns of the training process to take one batch from a worker's queue."""

    batch_ns: float  # a batch, whatever it holds
    tensor_ns: float  # each tensor of it
    source: str  # where the figures come from, as the advice says it

    def of(self, tensors: float) -> float:
        """A batch of `tensors` tensors."""
        return self.batch_ns + tensors * self.tensor_ns


# where a cost's figures come from, as the advice says it (model/fusedstep.py's too)
DEFAULTS, CALIBRATED = "the defaults measured on the 2-core VM", "calibrated on this host"
DEFAULT = ReceiveCost(350_000.0, 250_000.0, DEFAULTS)


def receive_of(path: Path) -> ReceiveCost:
    """The receive cost a calibrate profile holds; one-line errors naming the file."""
    data = read_json(path)
    entry: Any = data.get(KEY) if isinstance(data, dict) else None
    if entry is None:
        raise PerfswarmError(f"{path}: no DataLoader receive cost ({KEY}) in it: a CPU profile "
                             "of `perfswarm calibrate` holds one (calibrate again)")
    try:
        batch, tensor = float(entry["batch_ns"]), float(entry["tensor_ns"])
    except (KeyError, TypeError, ValueError) as exc:
        raise PerfswarmError(f"{path}: {KEY} is not a receive cost ({exc})") from None
    if not (batch >= 0 and tensor >= 0):  # nan too
        raise PerfswarmError(f"{path}: {KEY} needs non-negative batch_ns and tensor_ns")
    return ReceiveCost(batch, tensor, f"{CALIBRATED} ({path.name})")
