"""Memory bandwidth over time, from the copies and sets the device ran.

Each memcpy/memset carries its byte count (Kineto's `bytes` arg). Per rank and
direction (h2d, d2h, d2d, p2p, memset, from the op's name): the bytes moved, the time
some op of that direction ran (the union of their spans), the bandwidth achieved over
that time, and the bandwidth over the rank's device span in equal time bins (each op's
bytes spread evenly over its duration), so the busiest stretch shows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

import msgspec
import numpy as np

from perfswarm.analyze.frame import DEVICE_OPS, I64, Events, detail_of
from perfswarm.analyze.intervals import sorted_unique, total
from perfswarm.trace.store import Run

BINS: Final = 100
DIRECTIONS: Final = ("h2d", "d2h", "d2d", "p2p", "memset", "other")
_DIRECTION: Final = ((re.compile(r"HtoD|H2D"), "h2d"), (re.compile(r"DtoH|D2H"), "d2h"),
                     (re.compile(r"DtoD|D2D"), "d2d"), (re.compile(r"PtoP|P2P|Peer"), "p2p"),
                     (re.compile(r"(?i)memset"), "memset"))


class _Bytes(msgspec.Struct):
    bytes: int = -1


def direction(name: str) -> str:
    return next((d for pattern, d in _DIRECTION if pattern.search(name)), "other")


@dataclass(frozen=True)
class Flow:
    """One direction's traffic on one rank."""

    direction: str
    ops: int
    bytes: int  # of the ops whose byte count the trace gives
    busy_ns: int  # union of the ops' spans
    bins_gbps: tuple[float, ...]  # GB/s in each of the rank's BINS time bins
    unknown_bytes: int = 0  # ops without a byte count (ROCm's copies say only their kind)
    known_busy_ns: int = 0  # union of the spans of the ops with one

    @property
    def achieved_gbps(self) -> float | None:
        """bytes/ns = GB/s over the ops with a byte count; None without any."""
        return self.bytes / self.known_busy_ns if self.known_busy_ns else None

    def to_dict(self) -> dict[str, Any]:
        return {"direction": self.direction, "ops": self.ops, "bytes": self.bytes,
                "unknown_bytes": self.unknown_bytes, "busy_ns": self.busy_ns,
                "achieved_gbps": self.achieved_gbps,
                "max_bin_gbps": max(self.bins_gbps, default=0.0),
                "bins_gbps": list(self.bins_gbps)}


@dataclass(frozen=True)
class RankBandwidth:
    rank: int
    start: int
    bin_ns: int
    flows: tuple[Flow, ...]  # directions with traffic, in DIRECTIONS order

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "start": self.start, "bin_ns": self.bin_ns,
                "flows": [f.to_dict() for f in self.flows]}


def copy_bytes(run: Run, rows: I64, rank: int | None = None) -> I64:
    """The `bytes` arg of each of `rows` of the Run's events (or of `rank`'s), -1 where the
    trace has none."""
    if len(rows) == 0:
        return np.zeros(0, np.int64)
    return np.array([msgspec.json.decode(a, type=_Bytes).bytes for a in detail_of(run, rows, rank)],
                    np.int64)


def _bins(ts: I64, end: I64, nbytes: I64, start: int, bin_ns: int) -> np.ndarray[Any, Any]:
    """Bytes per bin, each op's bytes spread evenly over [ts, end)."""
    edges = start + bin_ns * np.arange(BINS + 1)
    out = np.zeros(BINS)
    for lo, hi, b in zip(ts.tolist(), end.tolist(), nbytes.tolist(), strict=True):
        if hi <= lo:
            out[min(max((lo - start) // bin_ns, 0), BINS - 1)] += b
            continue
        first, last = (lo - start) // bin_ns, min((hi - 1 - start) // bin_ns, BINS - 1)
        overlap = np.minimum(edges[first + 1:last + 2], hi) - np.maximum(edges[first:last + 1], lo)
        out[first:last + 1] += b * overlap / (hi - lo)
    return out


def bandwidth(run: Run, ev: Events, rank: int | None = None) -> tuple[RankBandwidth, ...]:
    """Per rank of `ev` (the Run's events, or those of `rank`)."""
    copies = np.flatnonzero(ev.of_kind("memcpy", "memset"))
    nbytes = copy_bytes(run, copies, rank)
    code = {int(n): DIRECTIONS.index(direction(ev.names[int(n)]))
            for n in sorted_unique(ev.name[copies])}
    directions = np.array([code[int(n)] for n in ev.name[copies]], np.int64)
    out = []
    for r in ev.ranks:
        rows = np.arange(len(ev))[ev.rank_slice(r)]
        dev = rows[ev.of_kind(*DEVICE_OPS)[rows]]
        mine = ev.rank[copies] == r
        if not mine.any():
            continue
        start, stop = int(ev.ts[dev].min()), int(ev.end[dev].max())
        bin_ns = max(-(-(stop - start) // BINS), 1)
        flows = []
        for i, d in enumerate(DIRECTIONS):
            sel = mine & (directions == i)
            if not sel.any():
                continue
            known = sel & (nbytes >= 0)
            ops, b = copies[known], nbytes[known]
            per_bin = _bins(ev.ts[ops], ev.end[ops], b, start, bin_ns)
            every = copies[sel]
            flows.append(Flow(d, len(every), int(b.sum()), total(ev.ts[every], ev.end[every]),
                              tuple(float(x) for x in per_bin / bin_ns),
                              int((sel & (nbytes < 0)).sum()), total(ev.ts[ops], ev.end[ops])))
        out.append(RankBandwidth(r, start, bin_ns, tuple(flows)))
    return tuple(out)
