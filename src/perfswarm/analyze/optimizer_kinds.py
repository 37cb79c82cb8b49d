"""Which optimizer each step() call is, as far as a trace says, and how many make a step.

A trace names an optimizer's call by its class (`Optimizer.step#Adam.step`), and with
record_shapes its update's ops carry the shapes of the tensors it updates: one optimizer's
calls update the same parameters every call, two models' optimizers (a GAN's generator and
discriminator) different ones. Their ops' scalar arguments (`Concrete Inputs`) say more: Adam's
step size is corrected for its own count of steps (lr / (1 - beta1^t)), new at every call of
one optimizer, and the same in two optimizers of one kind stepped in turn (a GAN whose two
models have one architecture). Without shapes (record_shapes=False) a call is its class alone.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import msgspec
import numpy as np

from perfswarm.analyze.frame import Events, detail_of, lane_key
from perfswarm.analyze.intervals import I64, sorted_unique
from perfswarm.analyze.phases import own_starts
from perfswarm.trace.store import Run

MAX_CYCLE: Final = 4  # optimizers a training step steps in turn, at most (a GAN's two)
# calls of optimizers told apart (their kinds) that make a step, at most: a WGAN's critic
# stepped 5 times, then its generator, is 6
MAX_KIND_CYCLE: Final = 12
CYCLE_MATCH: Final = 0.9  # the share of calls that must repeat at the cycle
SHARED: Final = 0.5  # calls of one class sharing this much of their shapes: one optimizer's


@dataclass(frozen=True)
class CallKinds:
    """Of each of a thread's optimizer calls, in call order: `kind`, an id of its class and the
    set of tensor shapes its update's ops read, a call whose shapes are mostly another's taking
    that one's (_kinds); `own`, an id of its class and its very shapes (ids in order of first
    appearance; the class alone where they carry no shapes); `scalars`, an id of its update's
    ops' scalar arguments in order (-1: none recorded)."""

    kind: I64
    own: I64
    scalars: I64

    def uniform(self) -> bool:
        """Whether every call of a kind updated the same shapes (none left parameters out)."""
        return len(np.unique(self.own)) == len(np.unique(self.kind))


class _Fields(msgspec.Struct):
    dims: Any = msgspec.field(default=None, name="Input Dims")
    concrete: Any = msgspec.field(default=None, name="Concrete Inputs")


_FIELDS: Final = msgspec.json.Decoder(_Fields)


def _shapes(dims: Any) -> set[tuple[int, ...]]:
    """The tensor shapes (of one dimension or more) in an op's `Input Dims`: a tensor's, or
    each of a tensor list's (the `_foreach_*` and fused optimizers' one op over all of them)."""
    out: set[tuple[int, ...]] = set()
    for d in dims if isinstance(dims, list) else ():
        if isinstance(d, list) and d and all(isinstance(x, int) for x in d):
            out.add(tuple(d))
        elif isinstance(d, list):
            out |= _shapes(d)
    return out


def _update_ops(ev: Events, calls: I64) -> list[I64]:
    """The host ops of each call's own work (after the closure it ran: own_starts) on its
    thread."""
    ops = np.flatnonzero(ev.of_kind("cpu_op"))
    keys = lane_key(ev.rank[ops], ev.tid[ops])
    ops = ops[np.lexsort((ev.ts[ops], keys))]
    keys, ts = lane_key(ev.rank[ops], ev.tid[ops]), ev.ts[ops]
    begin = own_starts(ev, calls)
    out = []
    for call, lo in zip(calls.tolist(), begin.tolist(), strict=True):
        key = int(lane_key(ev.rank[call], ev.tid[call]))
        a = int(np.searchsorted(keys, key, side="left"))
        b = int(np.searchsorted(keys, key, side="right"))
        i = a + int(np.searchsorted(ts[a:b], lo, side="left"))
        j = a + int(np.searchsorted(ts[a:b], ev.end[call], side="left"))
        mine = ops[i:j]
        out.append(mine[ev.end[mine] <= ev.end[call]])
    return out


def call_kinds(run: Run, ev: Events, calls: I64) -> CallKinds:
    """The kinds of the optimizer calls at `calls` (rows of `ev`: the Run's events, or one
    rank's), read from the ops' shapes and scalars the Run's events carry."""
    inside = _update_ops(ev, calls)
    rows = sorted_unique(np.concatenate([np.zeros(0, np.int64), *inside]))
    texts = dict(zip(rows.tolist(), detail_of(run, rows, ev.ranks[0] if len(ev.ranks) == 1
                                               else None), strict=True))
    decoded: dict[str, _Fields] = {}
    scalar_ids: dict[tuple[str, ...], int] = {}
    keys: list[tuple[str, frozenset[tuple[int, ...]]]] = []
    scalars = []
    for call, mine in zip(calls.tolist(), inside, strict=True):
        shapes: set[tuple[int, ...]] = set()
        values: list[str] = []
        for row in mine.tolist():
            text = texts[row]
            if text not in decoded:
                try:
                    decoded[text] = _FIELDS.decode(text)
                except msgspec.DecodeError:
                    decoded[text] = _Fields()
            fields = decoded[text]
            shapes |= _shapes(fields.dims)
            if isinstance(fields.concrete, list):
                values.append(",".join(map(str, fields.concrete)))
        keys.append((ev.name_of(call), frozenset(shapes)))
        scalars.append(scalar_ids.setdefault(tuple(values), len(scalar_ids)) if values else -1)
    own: dict[tuple[str, frozenset[tuple[int, ...]]], int] = {}
    return CallKinds(_kinds(keys), np.array([own.setdefault(k, len(own)) for k in keys], np.int64),
                     np.array(scalars, np.int64))


def _kinds(keys: list[tuple[str, frozenset[tuple[int, ...]]]]) -> I64:
    """An id of each call's (class, shapes), a call whose shapes are mostly another's of its
    class (SHARED of the smaller set, or all of it) taking that one's: an optimizer skips
    the parameters that have no gradient, so one optimizer over a shared trunk and task
    heads used in turn updates the trunk and one head a call (two heads of other shapes had
    read as a cycle of two optimizers, 12 steps as 6; a head used every third step left out of
    two calls in three, as three); two models' optimizers (a GAN's) share a shape or two by
    chance. The largest sets first, each joining the first that holds most of it."""
    roots: list[tuple[str, frozenset[tuple[int, ...]]]] = []
    of: dict[tuple[str, frozenset[tuple[int, ...]]], int] = {}
    for name, shapes in sorted(set(keys), key=lambda k: (-len(k[1]), k[0], sorted(k[1]))):
        found = next((i for i, (n, s) in enumerate(roots) if n == name and (
            shapes <= s or len(shapes & s) >= SHARED * min(len(shapes), len(s)))), None)
        if found is None:
            roots.append((name, shapes))
            found = len(roots) - 1
        of[name, shapes] = found
    return np.array([of[k] for k in keys], np.int64)


def id_cycle(ids: I64, most: int = MAX_CYCLE) -> int:
    """The shortest cycle (up to `most`) at which a sequence of ids repeats, in CYCLE_MATCH
    of it: of the calls' kinds, 1 for one optimizer's calls, 2 for a GAN's discriminator's and
    generator's in turn, 6 for a WGAN's critic's 5 and its generator's; 0 where none does
    (kinds that vary without a cycle)."""
    for k in range(1, most + 1):
        if len(ids) >= 2 * k and np.mean(ids[k:] == ids[:-k]) >= CYCLE_MATCH:
            return k
    return 0


def count_cycle(scalars: I64) -> int:
    """How many optimizers of one kind step in turn, from their calls' scalars: where the
    calls come in runs of alike scalars, three runs or more, every one of the same length m
    (2 to MAX_CYCLE; the first and the last may be shorter, a window opened or closed between
    them, but two are whole), m optimizers at one count of steps; 0 where they do not (one
    optimizer's step size new at each call, or scalars that never change: SGD's learning
    rate)."""
    if len(scalars) == 0 or (scalars < 0).any():
        return 0
    runs = [len(list(group)) for _, group in itertools.groupby(scalars.tolist())]
    m = max(runs)
    if len(runs) < 3 or not 2 <= m <= MAX_CYCLE or any(r != m for r in runs[1:-1]):
        return 0
    return m if runs.count(m) >= 2 else 0


def multiset_ids(sets: Sequence[tuple[int, ...]]) -> I64:
    """An id of each multiset (sorted codes), in order of first appearance."""
    ids: dict[tuple[int, ...], int] = {}
    return np.array([ids.setdefault(s, len(ids)) for s in sets], np.int64)


def skips_frozen(backward: Sequence[tuple[int, ...]], others: Sequence[tuple[int, ...]]) -> bool:
    """Whether the stretches between optimizer calls (each a multiset of names: `backward`, its
    autograd nodes; `others`, the thread's other ops outside the calls) are one optimizer's
    steps with a layer frozen in some of them: the other work, the forward and its loss, alike
    in CYCLE_MATCH of the stretches, and every backward's nodes a part of the largest one's
    (the frozen layer's left out). Twin models' optimizers each step after a forward of their
    own (a GAN's discriminator reads real and generated samples, its generator the
    discriminator's score of its own), and two models' backward passes each hold nodes the
    other lacks."""
    if not others:
        return False
    common = Counter(others).most_common(1)[0][1]
    whole: tuple[int, ...] = max(backward, key=len)  # a step with nothing frozen
    held = Counter(whole)
    return common >= CYCLE_MATCH * len(others) and all(
        not Counter(nodes) - held for nodes in backward)


def identified_cycle(kinds: CallKinds, apart: I64, backward: I64, frozen: bool,
                     structural: int) -> int:
    """How many optimizer calls make one step, the kinds of the calls told first: calls that
    cycle through several kinds, that cycle (a GAN's discriminator and generator, two
    optimizers stepped back to back); calls of one kind that come in runs of alike scalars,
    where the backward passes between them cycle at that length too, that run's length (a GAN
    of twin models stepped by Adam; one SGD whose StepLR holds its rate for k steps runs one
    backward throughout, and had read as k twin optimizers). Kinds that vary without a cycle,
    or two calls with nothing between them (`apart`: ops outside the optimizers' calls), which
    are one step's: `structural` (iterations.call_cycle, from the ops between the calls).
    Otherwise the calls are one optimizer's, a cycle of 1 (an evaluation after every second
    step had read as a GAN's two optimizers), unless the backward passes between them
    (`backward`: an id of each stretch's autograd nodes) cycle while every call of the kind
    updates the same shapes: twin models' optimizers, each stepped after a backward of its own
    (a GAN's generator step backpropagates through both models, its discriminator's through
    one), at the backward's cycle whatever the ops between the calls say (a discriminator
    stepped twice a generator's step had read as one optimizer with extra work every third
    step, which adds no backward: 36 steps of 12). One optimizer's calls that leave out
    parameters with no gradient (a layer frozen every other step: its backward passes
    alternate too) stay a cycle of 1: by their shapes, or without shapes (record_shapes=False)
    where the stretches between the calls say so (`frozen`: skips_frozen; 6 steps of 12 had
    been found); and so do calls without shapes whose backward passes are alike (an
    evaluation every second step: it had kept the cycle of the ops between the calls, 2). Twin
    models each stepped after a backward alike (two seeds in lockstep) read as one optimizer:
    by SGD their trace is the same, event for event, as one optimizer's stepping each batch
    twice (data echoing), each call of which is a step."""
    k = id_cycle(kinds.kind, MAX_KIND_CYCLE)
    if k >= 2:
        return k
    if k == 0:
        return structural
    b = id_cycle(backward)
    if (m := count_cycle(kinds.scalars)) >= 2 and b == m:
        return m  # (runs of alike scalars with one backward throughout: StepLR's rate)
    if not (apart > 0).all():
        return structural
    return b if b >= 2 and kinds.uniform() and not frozen else 1
