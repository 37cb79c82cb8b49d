"""The copy bandwidth between every pair of the host and the GPUs (SOFA's traffic matrix): host
to device, device to host and device to device, each the best of a few timed copies of one
size. Assembled here from any copier (recorder/bench/bandwidth.py times torch.cuda copies; tests
give a fake); `calibrate --collectives` stores it in the collectives profile and `project
--intra-profile` takes its slowest device pair as the intra-node link's bandwidth (a ring
all-reduce runs at its slowest hop).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from perfswarm.errors import PerfswarmError

HOST: Final = "host"
COPY_BYTES: Final = 64 << 20  # large enough that a copy's launch is noise beside it
REPEATS: Final = 5

Copy = Callable[[str, str, int], float]  # (source, destination, bytes) -> seconds


def nodes_of(devices: int) -> tuple[str, ...]:
    return (HOST, *(f"cuda:{i}" for i in range(devices)))


@dataclass(frozen=True)
class BandwidthMatrix:
    """GB/s of a copy from each row's node to each column's (None: a node to itself)."""

    nodes: tuple[str, ...]
    nbytes: int
    gbps: tuple[tuple[float | None, ...], ...]

    def between_devices(self) -> list[float]:
        return [v for i, row in enumerate(self.gbps) for j, v in enumerate(row)
                if v is not None and HOST not in (self.nodes[i], self.nodes[j])]

    def to_dict(self) -> dict[str, Any]:
        return {"nodes": list(self.nodes), "bytes": self.nbytes,
                "gbps": [list(row) for row in self.gbps]}

    @classmethod
    def from_dict(cls, data: Any, where: str) -> BandwidthMatrix:
        try:
            nodes = tuple(str(n) for n in data["nodes"])
            rows = tuple(tuple(None if v is None else float(v) for v in row)
                         for row in data["gbps"])
            nbytes = int(data["bytes"])
        except (KeyError, TypeError, ValueError) as exc:
            raise PerfswarmError(f"{where}: not a bandwidth matrix ({exc})") from None
        if len(rows) != len(nodes) or any(len(row) != len(nodes) for row in rows) or any(
                v is not None and not v > 0 for row in rows for v in row):
            raise PerfswarmError(f"{where}: the bandwidth matrix is not square with positive "
                                 "entries")
        return cls(nodes, nbytes, rows)


def measure_matrix(copy: Copy, devices: int, nbytes: int = COPY_BYTES,
                   repeats: int = REPEATS) -> BandwidthMatrix:
    """Every ordered pair of the host and `devices` GPUs timed `repeats` times by `copy`; each
    entry is the best of its copies (other load only ever adds time)."""
    if devices < 2:
        raise PerfswarmError(f"bandwidth matrix: needs at least 2 GPUs, found {devices}")
    if nbytes < 1 or repeats < 1:
        raise PerfswarmError("bandwidth matrix: needs nbytes >= 1 and repeats >= 1")
    nodes = nodes_of(devices)
    rows: list[Sequence[float | None]] = []
    for src in nodes:
        row: list[float | None] = []
        for dst in nodes:
            if src == dst:
                row.append(None)
                continue
            best = min(copy(src, dst, nbytes) for _ in range(repeats))
            if not best > 0:
                raise PerfswarmError(f"bandwidth matrix: a copy {src} -> {dst} took {best} s")
            row.append(nbytes / best / 1e9)
        rows.append(row)
    return BandwidthMatrix(nodes, nbytes, tuple(tuple(r) for r in rows))
