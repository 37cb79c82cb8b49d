"""System counters against the device: what dominates each window, and what tracks utilization.

Counter names follow the Run store's convention: `cpu.<core>.usr|sys|iowait`,
`gpu<N>.sm_util` (or `.util`), `disk.read|write_bytes`, `net.<...>` (not the per-flow `net.flow.`).
Utilizations are fractions or percents (a series whose values exceed 1.5 is read as
percent). Disk and network series that never decrease are cumulative counters and are
turned into rates. Host-wide counters (rank -1, as a recorder's samplers write them) count
for every rank.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import pyarrow as pa

from perfswarm.analyze.frame import I64
from perfswarm.analyze.iterations import StepWindow
from perfswarm.trace.schema import NONE

F64 = np.ndarray[Any, np.dtype[np.float64]]
GROUPS: Final = ("usr", "sys", "iowait", "gpu")
PATTERNS: Final = {
    "usr": re.compile(r"^cpu\.[^.]+\.usr$"),
    "sys": re.compile(r"^cpu\.[^.]+\.sys$"),
    "iowait": re.compile(r"^cpu\.[^.]+\.iowait$"),
    "gpu": re.compile(r"^gpu\d+\.(sm_)?util$"),
    "disk": re.compile(r"^disk\.(read|write)_bytes$"),  # not the per-disk latency and queue
    "net": re.compile(r"^net\.(?!flow\.)"),  # host totals; per-flow counters would count twice
}


@dataclass(frozen=True)
class WindowLoad:
    step: int
    mean: Mapping[str, float]  # group -> mean utilization (fraction) in the window
    dominator: str | None
    # usr, sys, iowait -> the busiest core's share, at each reading, averaged over the window
    busiest: Mapping[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "mean": dict(self.mean), "busiest": dict(self.busiest),
                "dominator": self.dominator}


@dataclass(frozen=True)
class SystemLoad:
    rank: int
    windows: tuple[WindowLoad, ...]
    gpu_correlation: Mapping[str, float]  # cpu/disk/net -> Pearson r with device utilization

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "windows": [w.to_dict() for w in self.windows],
                "gpu_correlation": dict(self.gpu_correlation)}


def _series(ts: I64, values: F64) -> tuple[I64, F64]:
    """One counter on a strictly increasing time axis (repeated timestamps averaged)."""
    order = np.argsort(ts, kind="stable")
    ts, values = ts[order], values[order]
    uniq, start = np.unique(ts, return_index=True)
    sums = np.add.reduceat(values, start) if len(values) else values
    return uniq, sums / np.diff(np.append(start, len(values)))


def _as_rate(ts: I64, values: F64) -> tuple[I64, F64]:
    if len(values) > 1 and np.all(np.diff(values) >= 0):
        return ts[1:], np.diff(values) / (np.diff(ts) / 1e9)
    return ts, values


def _groups(counters: pa.Table, rank: int) -> dict[str, list[tuple[I64, F64]]]:
    rows = np.flatnonzero(np.asarray(counters.column("rank").to_numpy()) == rank)
    names = counters.column("name").cast(pa.string()).to_numpy(zero_copy_only=False)[rows]
    ts = np.asarray(counters.column("ts").to_numpy(), np.int64)[rows]
    values = np.asarray(counters.column("value").to_numpy(), np.float64)[rows]
    out: dict[str, list[tuple[I64, F64]]] = {g: [] for g in PATTERNS}
    for name in sorted(set(names.tolist())):
        group = next((g for g, p in PATTERNS.items() if p.match(name)), None)
        if group is None:
            continue
        mine = names == name
        s_ts, s_val = _series(ts[mine], values[mine])
        if group in ("disk", "net"):
            s_ts, s_val = _as_rate(s_ts, s_val)
        elif len(s_val) and s_val.max() > 1.5:
            s_val = s_val / 100.0
        if len(s_ts):
            out[group].append((s_ts, s_val))
    return out


def _on(axis: I64, series: Sequence[tuple[I64, F64]]) -> F64 | None:
    """The mean of several series, each interpolated onto `axis`."""
    if not series:
        return None
    return np.asarray(np.mean([np.interp(axis, s_ts, s_val) for s_ts, s_val in series], axis=0),
                      np.float64)


def _busiest(series: Sequence[tuple[I64, F64]], start: int, end: int) -> float:
    """The mean over the readings in [start, end) of the largest of the cores' values at each
    (every core's series interpolated onto those readings' times)."""
    axis = np.unique(np.concatenate([t[(t >= start) & (t < end)] for t, _ in series]))
    return float(np.mean(np.max([np.interp(axis, t, v) for t, v in series], axis=0)))


def _pearson(a: F64, b: F64) -> float | None:
    if len(a) < 3 or a.std() == 0 or b.std() == 0:
        return None
    return float(np.corrcoef(a, b)[0, 1])


def system_load(counters: pa.Table,
                steps: Mapping[int, Sequence[StepWindow]]) -> tuple[SystemLoad, ...]:
    """Per rank: its own counters and the host's (rank -1: a recorder's system and GPU
    samplers), against that rank's iterations."""
    ranks = {int(r) for r in counters.column("rank").to_pylist()}
    host = _groups(counters, NONE) if NONE in ranks else None
    ranks.discard(NONE)
    if host is not None:
        ranks |= set(steps) or {NONE}  # host counters alone: analyzed as the host
    out = []
    for rank in sorted(ranks):
        groups = _groups(counters, rank) if rank != NONE else {g: [] for g in PATTERNS}
        if host is not None:
            groups = {g: groups[g] + host[g] for g in PATTERNS}
        windows = []
        for w in steps.get(rank, ()):
            mean, busiest = {}, {}
            for g in GROUPS:
                vals = [v[(t >= w.start) & (t < w.end)] for t, v in groups[g]]
                vals = [v for v in vals if len(v)]
                if vals:
                    mean[g] = float(np.mean(np.concatenate(vals)))
                if vals and g != "gpu":
                    busiest[g] = _busiest(groups[g], w.start, w.end)
            # a CPU group's load is its busiest core's: a training loop's Python holds one
            # core (the GIL), a 16th of the host's however hard it works; a device its own
            load = {g: busiest.get(g, v) for g, v in mean.items()}
            dominator = max(load, key=lambda g: (load[g], g)) if load else None
            windows.append(WindowLoad(w.step, mean, dominator, busiest))
        corr: dict[str, float] = {}
        gpu = groups["gpu"]
        if gpu:
            axis = np.unique(np.concatenate([t for t, _ in gpu]))
            util = _on(axis, gpu)
            others = {"cpu": groups["usr"] + groups["sys"], "disk": groups["disk"],
                      "net": groups["net"]}
            for name, series in others.items():
                other = _on(axis, series)
                r = _pearson(util, other) if util is not None and other is not None else None
                if r is not None:
                    corr[name] = r
        if windows or corr:
            out.append(SystemLoad(rank, tuple(windows), corr))
    return tuple(out)


def others_delay(got: float, waited: float, cores: int) -> float:
    """Of a process tree's run delay (`waited`, cores' worth of its threads runnable on a
    runqueue, beside the `got` cores they ran on), the part other processes caused: its
    threads beyond the machine's cores wait for each other (more DataLoader workers than
    cores), the rest for the others."""
    return max(0.0, min(got + waited, float(cores)) - got)
