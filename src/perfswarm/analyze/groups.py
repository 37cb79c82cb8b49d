"""Process groups: the torch.distributed group each collective ran in, where the trace says it.

With subgroups (new_group([0, 1]) and new_group([2, 3]) beside the world) the ranks run
collectives of one name in different groups: ranks 0 and 1's n-th all-reduce is not ranks 2
and 3's, and stragglers pairs instances within a group (stragglers.Instance).

- A device collective names its group in its args: NCCL's kernels carry "Process Group Name"
  and "Process Group Ranks" (torch's record_param_comms fields).
- gloo's ranges (frame.HOST_COLLECTIVE) name none: no args, no record_param_comms (torch
  2.13), every worker thread called pt_gloo_runloop. But each ProcessGroupGloo runs its
  collectives on worker threads of its own, GLOO_THREADS of them unless told otherwise,
  started when the group is created, and the trace's distributedInfo lists the rank's groups
  in the order they were created (pg_config: name, ranks, backends). So where a rank shows
  GLOO_THREADS threads with gloo ranges for each of its gloo groups, its threads in the order
  of their ids (thread ids rise as threads start) are its groups' in that order, the world's
  first. Elsewhere (a group that ran nothing in the window, or on one of its threads; another
  thread count; TORCH_DISTRIBUTED_DEBUG's helper groups) its gloo collectives name no group.

A group that holds every rank of the Run is no group: its collectives pair by name and
occurrence over every rank, as a trace that names no group pairs them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

import msgspec
import numpy as np

from perfswarm.analyze.frame import I64, Events, detail_of
from perfswarm.trace.store import Run

# ProcessGroupGloo::Options::threads' default: the worker threads each gloo group starts
GLOO_THREADS: Final = 2


class Group(NamedTuple):
    """A process group: its name (torch's pg_name) and its ranks of the Run."""

    name: str
    ranks: tuple[int, ...]


NO_GROUP: Final = Group("", ())  # none named, or every rank's
# a collective of a rank with subgroups whose threads do not say which group it ran in: it
# pairs with none (by name over every rank, a subgroup's would pair with another's)
UNTOLD: Final = Group("?", ())


@dataclass(frozen=True)
class Groups:
    """The collectives of some events that ran in a named group (not every rank's)."""

    rows: I64  # sorted rows of the events
    code: I64  # each one's group, an index into `groups`
    groups: tuple[Group, ...]

    def at(self, rows: I64) -> list[Group]:
        """The group of each of `rows` (NO_GROUP where none is named)."""
        if not len(self.rows):
            return [NO_GROUP] * len(rows)
        i = np.minimum(np.searchsorted(self.rows, rows), len(self.rows) - 1)
        codes = np.where(self.rows[i] == rows, self.code[i], -1)
        return [self.groups[c] if c >= 0 else NO_GROUP for c in codes.tolist()]


NO_GROUPS: Final = Groups(np.zeros(0, np.int64), np.zeros(0, np.int64), ())


class _Named(msgspec.Struct):
    name: str | None = msgspec.field(default=None, name="Process Group Name")
    ranks: str | list[int] | None = msgspec.field(default=None, name="Process Group Ranks")


_NAMED: Final = msgspec.json.Decoder(_Named)


def group_of(name: object, ranks: object, rank: int, run_ranks: frozenset[int]) -> Group:
    """The group a collective's args or a pg_config entry name on `rank`: NO_GROUP without a
    name or ranks (an empty list: the default group's, in some torch versions), for a group
    that holds every rank of the Run, and for one without `rank` (a trace given another rank
    at import than torch's)."""
    if isinstance(ranks, str):
        try:
            ranks = msgspec.json.decode(ranks)
        except msgspec.DecodeError:
            return NO_GROUP
    if not isinstance(name, str) or not name or not isinstance(ranks, list) or not ranks \
            or not all(isinstance(r, int) and not isinstance(r, bool) for r in ranks):
        return NO_GROUP
    if run_ranks <= set(ranks) or rank not in ranks:
        return NO_GROUP
    return Group(name, tuple(sorted(run_ranks.intersection(ranks))))


def process_groups(run: Run, ev: Events, run_ranks: Sequence[int]) -> Groups:
    """The named groups of `ev`'s collectives (`ev`: the Run's events, or one rank's;
    `run_ranks`: every rank of the Run)."""
    everyone = frozenset(run_ranks)
    found: dict[int, Group] = {}
    device = np.flatnonzero(ev.of_kind("collective"))
    if len(device):
        texts = detail_of(run, device, ev.ranks[0] if len(ev.ranks) == 1 else None)
        named: dict[tuple[str, int], Group] = {}
        for row, rank, text in zip(device.tolist(), ev.rank[device].tolist(), texts,
                                   strict=True):
            if (text, rank) not in named:
                try:
                    args = _NAMED.decode(text)
                    named[text, rank] = group_of(args.name, args.ranks, rank, everyone)
                except msgspec.DecodeError:
                    named[text, rank] = NO_GROUP
            if named[text, rank] != NO_GROUP:
                found[row] = named[text, rank]
    host = np.flatnonzero(ev.host_collective)
    configs = gloo_groups(run, everyone) if len(host) else {}
    for rank in np.unique(ev.rank[host]).tolist():
        mine = host[ev.rank[host] == rank]
        for tid, group in thread_groups(np.unique(ev.tid[mine]), configs.get(rank, [])).items():
            found.update(dict.fromkeys(mine[ev.tid[mine] == tid].tolist(), group))
    if not found:
        return NO_GROUPS
    rows = np.array(sorted(found), np.int64)
    groups = tuple(sorted(set(found.values())))
    index = {g: i for i, g in enumerate(groups)}
    return Groups(rows, np.array([index[found[r]] for r in rows.tolist()], np.int64), groups)


def thread_groups(tids: I64, groups: Sequence[Group]) -> dict[int, Group]:
    """A rank's gloo threads (`tids`, sorted) -> their named group, from its gloo groups in the
    order they were created: every thread the one group's where all are one group; else
    GLOO_THREADS threads each, in order, where that is how many there are; else, the rank
    having subgroups, UNTOLD (a group idle in the window, or that ran on one of its threads:
    four groups' all-reduces on three groups' threads had paired two subgroups' by name)."""
    if not groups or all(g == NO_GROUP for g in groups):
        return {}
    if len(set(groups)) == 1:
        return dict.fromkeys(tids.tolist(), groups[0])
    if len(tids) != GLOO_THREADS * len(groups):
        return dict.fromkeys(tids.tolist(), UNTOLD)
    return {tid: groups[i // GLOO_THREADS] for i, tid in enumerate(tids.tolist())
            if groups[i // GLOO_THREADS] != NO_GROUP}


def gloo_groups(run: Run, everyone: frozenset[int]) -> dict[int, list[Group]]:
    """Each rank's gloo groups in the order they were created, from its traces' distributedInfo
    (the longest list where a rank has several traces, each list the start of it; none where
    they disagree)."""
    lists: dict[int, list[list[dict[str, Any]]]] = {}
    for source in run.manifest()["sources"]:
        info = source.get("distributed")
        configs = info.get("pg_config") if isinstance(info, dict) else None
        if isinstance(source.get("rank"), int) and isinstance(configs, list):
            lists.setdefault(source["rank"], []).append(
                [c for c in configs if isinstance(c, dict)])
    out = {}
    for rank, seen in lists.items():
        longest = max(seen, key=len)
        if all(s == longest[:len(s)] for s in seen):
            out[rank] = [group_of(str(c.get("pg_name", "")), c.get("ranks"), rank, everyone)
                         for c in longest if "gloo" in str(c.get("backend_config", ""))]
    return out
