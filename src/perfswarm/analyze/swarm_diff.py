"""Swarm diff: which function swarms grew or shrank between two runs, in samples and time.

The two runs' stacks are clustered together (one k-means over the union, as `swarms`
does for one run), so a swarm is the same code on both sides; each side's samples are
then counted per swarm. Time is samples times the sampling period of their source (perf at
the recording's `perf_hz`, py-spy at `pystacks_hz`, both in the manifest of a recorded
Run); a Run that does not say (an imported one) gets no times, samples only. One source is
counted, perf where both runs have it, else py-spy: both sample the same time, and summed
they had counted it twice. Each change has a noise band: sampled counts are Poisson, twice
the standard deviation of the difference of two such sums. A side with no samples (recorded
without perf and py-spy: `record -c torch`) is no side to compare: every swarm of the other
had read as gone or new, beyond its noise.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from perfswarm.analyze.swarms import describe, label_stacks, run_samples
from perfswarm.trace.store import Run

PERIOD_KEYS = {"perf": "perf_hz", "py-spy": "pystacks_hz"}


@dataclass(frozen=True)
class SwarmDelta:
    caption: str
    functions: tuple[str, ...]
    samples: tuple[int, int]  # A, B
    weight: tuple[int, int]
    ns: tuple[int, int] | None  # None: a side's sampling period is not known
    noise_ns: int | None = None  # twice the sampling's standard deviation of delta_ns

    @property
    def delta_ns(self) -> int | None:
        return None if self.ns is None else self.ns[1] - self.ns[0]

    @property
    def beyond_noise(self) -> bool | None:
        if self.delta_ns is None or self.noise_ns is None:
            return None
        return abs(self.delta_ns) > self.noise_ns

    def to_dict(self) -> dict[str, Any]:
        return {"caption": self.caption, "functions": list(self.functions),
                "a_samples": self.samples[0], "b_samples": self.samples[1],
                "a_weight": self.weight[0], "b_weight": self.weight[1],
                "a_ns": self.ns[0] if self.ns else None, "b_ns": self.ns[1] if self.ns else None,
                "delta_ns": self.delta_ns, "noise_ns": self.noise_ns,
                "beyond_noise": self.beyond_noise,
                "delta_weight": self.weight[1] - self.weight[0]}


@dataclass(frozen=True)
class SwarmDiff:
    k: int
    swarms: tuple[SwarmDelta, ...]  # largest change first
    source: str | None = None  # the one sample source counted on both sides
    unsampled: tuple[Literal["A", "B"], ...] = ()  # the sides without samples: no swarms

    def to_dict(self) -> dict[str, Any]:
        return {"k": self.k, "source": self.source, "unsampled": list(self.unsampled),
                "swarms": [s.to_dict() for s in self.swarms]}


def periods(run: Run) -> dict[str, int | None]:
    """ns per sample weight of each sample source, from a recorded Run's manifest."""
    record = run.manifest().get("extra", {}).get("record", {})
    return {src: round(1e9 / record[key]) if record.get(key) else None
            for src, key in PERIOD_KEYS.items()}


def _side(run: Run, offset: int) -> tuple[pa.Table, pa.Table]:
    samples = run_samples(run, ["stack_id", "weight", "ts", "rank", "source"])
    stacks = run.table("stacks")
    cast = {"function": pa.string(), "module": pa.string()}
    stacks = pa.table({c: (stacks.column(c).cast(cast[c]) if c in cast else stacks.column(c))
                       for c in stacks.column_names})
    samples = samples.set_column(0, "stack_id", pa.array(
        np.asarray(samples.column("stack_id").to_numpy(), np.int64) + offset))
    samples = samples.set_column(4, "source", samples.column("source").cast(pa.string()))
    return samples, stacks.set_column(0, "stack_id", pa.array(
        np.asarray(stacks.column("stack_id").to_numpy(), np.int64) + offset))


def swarm_diff(a: Run, b: Run) -> SwarmDiff:
    """The swarms of A and B clustered together, each side's share of each."""
    sa, ta = _side(a, 0)
    offset = int(np.max(ta.column("stack_id").to_numpy(), initial=-1)) + 1
    sb, tb = _side(b, offset)
    sides: tuple[tuple[Literal["A", "B"], pa.Table], ...] = (("A", sa), ("B", sb))
    unsampled = tuple(name for name, side in sides if side.num_rows == 0)
    if unsampled:
        return SwarmDiff(0, (), unsampled=unsampled)
    both = set(sa.column("source").to_pylist()) & set(sb.column("source").to_pylist())
    chosen = next((src for src in PERIOD_KEYS if src in both), None)
    if chosen is not None:
        sa, sb = (t.filter(pc.equal(t.column("source"), chosen)) for t in (sa, sb))
    samples, stacks = pa.concat_tables([sa, sb]), pa.concat_tables([ta, tb])
    lab = label_stacks(samples, stacks)
    weight = np.asarray(samples.column("weight").to_numpy(), np.int64)
    side = np.r_[np.zeros(sa.num_rows, np.int64), np.ones(sb.num_rows, np.int64)]
    source = np.asarray(samples.column("source").to_pylist())
    per = [periods(a), periods(b)]
    period = _period_of(source, side, per)
    sample_label = lab.labels[lab.inv]
    out = []
    for label, swarm in zip(np.unique(lab.labels).tolist(),
                            describe(samples, stacks, lab, weight, {}), strict=True):
        mine = sample_label == label
        a_rows, b_rows = mine & (side == 0), mine & (side == 1)
        ns = noise = None
        if period is not None:
            ns = (int((weight * period)[a_rows].sum()), int((weight * period)[b_rows].sum()))
            # a sum of Poisson counts, each `weight * period` long: variance sum of squares
            noise = round(2 * float(np.sqrt(((weight * period)[mine].astype(np.float64) ** 2)
                                            .sum())))
        out.append(SwarmDelta(swarm.caption, swarm.functions,
                              (int(a_rows.sum()), int(b_rows.sum())),
                              (int(weight[a_rows].sum()), int(weight[b_rows].sum())), ns, noise))
    return SwarmDiff(lab.k, tuple(sorted(out, key=lambda d: (
        -abs(d.delta_ns if d.delta_ns is not None else d.weight[1] - d.weight[0]), d.caption))),
        chosen)


def _period_of(source: np.ndarray[Any, Any], side: np.ndarray[Any, Any],
               per: Sequence[Mapping[str, int | None]]) -> np.ndarray[Any, Any] | None:
    """ns per unit of weight for every sample; None when a side's period is unknown."""
    out = np.zeros(len(source), np.int64)
    for s, known in enumerate(per):
        for src in np.unique(source[side == s]).tolist():
            ns = known.get(src)
            if ns is None:
                return None
            out[(side == s) & (source == src)] = ns
    return out
