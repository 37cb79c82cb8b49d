"""Stragglers: how far apart ranks enter the same collective, and who arrives last.

The n-th occurrence of a collective's name in a process group on one rank is matched with
the n-th occurrence of that name in that group on every other rank of the group (a group's
collectives run in the same order on its ranks, or the job would hang): a device's collective
kernels, and a CPU process group's collectives on its host threads (frame.HOST_COLLECTIVE:
gloo's ranges, from when its worker thread takes the collective up). Where the trace names no
group (analyze.groups), or the group holds every rank, the group is every rank. The rank that
starts an instance last holds the group's other ranks back for the difference.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from perfswarm.analyze.frame import I64, Events
from perfswarm.analyze.groups import NO_GROUP, NO_GROUPS, UNTOLD, Group, Groups
from perfswarm.analyze.intervals import Coverage, union

TOP = 20
STRAGGLER_DOMINANCE: Final = 2.0
# a rank last at its share of the collectives or more this likely by chance: no straggler
STRAGGLER_CHANCE: Final = 0.05


def last_by_chance(k: int, n: int, ranks: int) -> float:
    """The chance that one of `ranks` equally quick ranks is last at `k` or more of `n`
    collectives (the binomial tail at 1 / ranks)."""
    p = 1 / ranks
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1))


@dataclass(frozen=True)
class CollectiveSkew:
    name: str
    occurrence: int  # n-th of this name in its group, from 0
    starts: dict[int, int]  # rank -> start ns, over the group's ranks
    last_rank: int
    skew_ns: int  # last start - first start
    group: Group = NO_GROUP

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "group": self.group.name or None,
                "occurrence": self.occurrence,
                "starts": {str(r): t for r, t in self.starts.items()},
                "last_rank": self.last_rank, "skew_ns": self.skew_ns}


@dataclass(frozen=True)
class RankLateness:
    rank: int
    last_count: int  # instances this rank started last (with skew > 0)
    held_back_ns: int  # over those instances, each other rank's wait for it (union), summed
    waited_ns: int = 0  # over every instance, its own wait for the last rank (union)

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "last_count": self.last_count,
                "held_back_ns": self.held_back_ns, "waited_ns": self.waited_ns}


@dataclass(frozen=True)
class Stragglers:
    instances: int  # collective instances seen on every rank of their group
    total_skew_ns: int
    max_skew_ns: int
    worst: tuple[CollectiveSkew, ...]  # largest skew first
    ranks: tuple[RankLateness, ...]

    @property
    def straggler(self) -> int | None:
        """The rank that holds the others back the most, if it does so at least
        STRAGGLER_DOMINANCE times as long as any other rank, and is last at every collective
        or at more of them than chance makes likely (ranks taking turns at being last, as load
        moves on a shared host, have none: two symmetric ranks with their threads over the
        cores had made one, last at 13 of 20, the straggler)."""
        late = sorted(self.ranks, key=lambda r: (-r.held_back_ns, r.rank))
        if not late or late[0].held_back_ns <= 0 or (
                len(late) > 1 and late[0].held_back_ns < STRAGGLER_DOMINANCE
                * late[1].held_back_ns):
            return None
        lasts = sum(r.last_count for r in late)
        if late[0].last_count < lasts and last_by_chance(
                late[0].last_count, lasts, len(late)) > STRAGGLER_CHANCE:
            return None
        return late[0].rank

    def to_dict(self) -> dict[str, Any]:
        return {"instances": self.instances, "total_skew_ns": self.total_skew_ns,
                "max_skew_ns": self.max_skew_ns, "straggler": self.straggler,
                "worst": [w.to_dict() for w in self.worst],
                "ranks": [r.to_dict() for r in self.ranks]}


def occurrences(keys: I64) -> I64:
    """For time-sorted rows' `keys`, the index of each row among the rows with its key."""
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    first = np.searchsorted(sorted_keys, sorted_keys, side="left")
    occ = np.empty(len(keys), np.int64)
    occ[order] = np.arange(len(keys)) - first
    return occ


# a collective: its kernel name, which occurrence of that name in its group it is, and its
# group (NO_GROUP: every rank's)
Instance = tuple[str, int, Group]


def collective_starts(ev: Events, rank: int,
                      groups: Groups = NO_GROUPS) -> dict[Instance, tuple[int, int]]:
    """Each collective instance of one rank: (row, start ns); `groups`: the named groups of
    `ev`'s collectives (analyze.groups.process_groups)."""
    rows = np.arange(len(ev))[ev.rank_slice(rank)]
    rows = rows[ev.collectives[rows]]
    rows = rows[np.argsort(ev.ts[rows], kind="stable")]
    names = [ev.names[n] for n in ev.name[rows].tolist()]
    of = groups.at(rows)
    code = {g: i for i, g in enumerate(dict.fromkeys(of))}
    keys = np.array([code[g] for g in of], np.int64) * len(ev.names) + ev.name[rows]
    return {(name, occ, group): (row, ts) for name, occ, group, row, ts in zip(
        names, occurrences(keys).tolist(), of, rows.tolist(), ev.ts[rows].tolist(),
        strict=True)}


def members(group: Group, ranks: Iterable[int]) -> list[int]:
    """Of `ranks`, those a group's collectives run on: every one for NO_GROUP, none for
    UNTOLD (they pair with none)."""
    if group == UNTOLD:
        return []
    return sorted(r for r in ranks if not group.ranks or r in group.ranks)


def paired(per_rank: Mapping[int, Iterable[Instance]]) -> set[tuple[str, Group]]:
    """The collective names and groups that every rank of the group ran equally often: their
    n-th occurrences pair across its ranks. Where the trace names no group, a name the ranks
    ran a different number of times does not (process subgroups it does not tell apart: ranks
    0 and 1 all-reducing twice a step in theirs, ranks 2 and 3 once in another)."""
    counts = {rank: Counter((name, group) for name, _, group in keys)
              for rank, keys in per_rank.items()}
    return {(name, group) for name, group in set().union(*counts.values())
            if len({counts[r][name, group] for r in members(group, counts)}) == 1}


Peer = tuple[int, int, int]  # rank, row (in the events holding that rank), start ns


def instances_of(ev: Events, groups: Groups = NO_GROUPS) -> dict[Instance, list[Peer]]:
    """Each collective instance of `ev` whose name pairs across its group's ranks (`paired`):
    where every rank of its group ran it."""
    return instances({rank: collective_starts(ev, rank, groups) for rank in ev.ranks})


def instances(starts: Mapping[int, Mapping[Instance, tuple[int, int]]]
              ) -> dict[Instance, list[Peer]]:
    """`instances_of` from each rank's `collective_starts`."""
    names = paired(starts)
    found: dict[Instance, list[Peer]] = defaultdict(list)
    for rank, mine in starts.items():
        for key, (row, ts) in mine.items():
            if (key[0], key[2]) in names:
                found[key].append((rank, row, ts))
    return found


def skews(per_rank: Mapping[int, Mapping[Instance, int]], top: int = TOP,
          working: Mapping[int, tuple[I64, I64]] | None = None) -> Stragglers:
    """Stragglers from each rank's collective start times (every rank of the Run present),
    each instance over the ranks of its group. Instances of a name that the group's ranks ran
    a different number of times are left out: their occurrences do not pair (process subgroups
    the trace does not tell apart: ranks 0 and 1 all-reducing twice a step in theirs, ranks 2
    and 3 once in another). A rank's wait, and the wait it holds the others
    to, are time: the union of its waits (DDP's buckets all-reduce several at once, each
    waiting for the same late rank), less the time it worked meanwhile (`working`: each
    rank's frame.Events.working; a bucket taken up while the backward goes on waits under
    it)."""
    ranks = sorted(per_rank)
    names = paired(per_rank)
    keys: set[Instance] = set().union(*(set(k) for k in per_rank.values()))
    ranks_of = {g: members(g, ranks) for g in {k[2] for k in keys}}
    common = sorted(k for k in keys if (k[0], k[2]) in names and len(ranks_of[k[2]]) > 1
                    and all(k in per_rank[r] for r in ranks_of[k[2]]))
    found = []
    last = dict.fromkeys(ranks, 0)
    waits: dict[int, list[tuple[int, int]]] = {r: [] for r in ranks}  # r's, for the late
    holds: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)  # (late, r)
    for key in common:
        group = ranks_of[key[2]]
        starts = {r: per_rank[r][key] for r in group}
        latest = max(group, key=lambda r: (starts[r], -r))
        skew = starts[latest] - min(starts.values())
        found.append(CollectiveSkew(key[0], key[1], starts, latest, skew, key[2]))
        if skew > 0:
            last[latest] += 1
            for r in group:
                if starts[r] < starts[latest]:
                    waits[r].append((starts[r], starts[latest]))
                    holds[latest, r].append((starts[r], starts[latest]))
    busy = {r: Coverage(*working[r]) for r in ranks if working and r in working}
    held = {r: sum(_idle(v, busy.get(w)) for (late, w), v in holds.items() if late == r)
            for r in ranks}
    worst = sorted(found, key=lambda s: (-s.skew_ns, s.name, s.group, s.occurrence))[:top]
    return Stragglers(len(found), sum(s.skew_ns for s in found),
                      max((s.skew_ns for s in found), default=0), tuple(worst),
                      tuple(RankLateness(r, last[r], held[r], _idle(waits[r], busy.get(r)))
                            for r in ranks))


def _idle(intervals: list[tuple[int, int]], busy: Coverage | None) -> int:
    """The time a list of [start, end) intervals covers, less what `busy` covers of it."""
    if not intervals:
        return 0
    starts, ends = union(np.array([s for s, _ in intervals], np.int64),
                         np.array([e for _, e in intervals], np.int64))
    worked = int(busy.between(starts, ends).sum()) if busy is not None else 0
    return int((ends - starts).sum()) - worked


def stragglers(ev: Events, top: int = TOP, groups: Groups = NO_GROUPS) -> Stragglers:
    """Stragglers of `ev`'s ranks; `groups`: the named groups of its collectives
    (analyze.groups.process_groups)."""
    return skews({rank: {key: ts for key, (_, ts) in collective_starts(ev, rank, groups).items()}
                  for rank in ev.ranks}, top, {rank: ev.working(rank) for rank in ev.ranks})
