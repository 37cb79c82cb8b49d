"""Steps detected from optimizer calls told apart by their ops (analyze.optimizer_kinds), on
recordings with no step markers: tests/data/eval_every2.py (one Adam, an evaluation forward
after every second step), tests/data/gan_adam.py (a GAN's two Adams, of models of different
sizes and of twin models; twins whose discriminator steps twice a generator step, by Adam or
SGD) and tests/data/heads_steplr.py (one optimizer whose calls differ; one whose layer is frozen
every other step, recorded without shapes). Each expected boundary is read from the raw JSON
alone."""

from __future__ import annotations

import gzip
import itertools
import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from perfswarm.analyze.frame import Events
from perfswarm.analyze.iterations import iterations
from perfswarm.analyze.optimizer_kinds import (
    CallKinds,
    call_kinds,
    count_cycle,
    id_cycle,
    identified_cycle,
    skips_frozen,
)
from perfswarm.analyze.phases import step_calls
from perfswarm.trace.ingest import ImportOptions, import_traces

DATA = Path(__file__).parent / "data"


def _raw(name: str) -> dict[str, Any]:
    return dict(json.loads(gzip.decompress((DATA / name).read_bytes())))


def _calls(raw: dict[str, Any]) -> list[dict[str, Any]]:
    """The optimizer step() calls of a raw trace, by their end."""
    return sorted((e for e in raw["traceEvents"] if e.get("ph") == "X"
                   and e["name"].startswith("Optimizer.step#")), key=lambda e: e["ts"] + e["dur"])


def _ns(raw: dict[str, Any], us: float, dur: float = 0.0) -> int:
    """Kineto's us as the run's ns: its start's and its duration's, each rounded."""
    return int(raw.get("baseTimeNanoseconds", 0)) + round(us * 1000) + round(dur * 1000)


def _expected(raw: dict[str, Any], per_step: int) -> list[tuple[int, int]]:
    """The steps of a raw trace with `per_step` optimizer calls a step: each ends where its
    last call ends, the first starts at the loop thread's first event (the profiler's own
    span, on a thread named by a string, starts earlier: nothing is traced until then)."""
    first = min(_ns(raw, e["ts"]) for e in raw["traceEvents"]
                if e.get("ph") == "X" and isinstance(e.get("tid"), int))
    ends = [_ns(raw, e["ts"], e["dur"]) for e in _calls(raw)][per_step - 1::per_step]
    return list(zip([first, *ends[:-1]], ends, strict=True))


def _updated(raw: dict[str, Any], call: dict[str, Any]) -> frozenset[str]:
    """The shapes the ops inside a raw optimizer call read (record_shapes' Input Dims)."""
    lo, hi = call["ts"], call["ts"] + call["dur"]
    return frozenset(json.dumps(d) for e in raw["traceEvents"]
                     if e.get("ph") == "X" and e.get("cat") == "cpu_op"
                     and e.get("tid") == call["tid"] and lo <= e["ts"] and e["ts"] + e["dur"] <= hi
                     for d in e["args"].get("Input Dims", []) if d)


def _steps(tmp_path: Path, raw: dict[str, Any], name: str) -> list[tuple[int, int]]:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(raw))
    run = import_traces([path], tmp_path / f"{name}.run", ImportOptions(), ["t"])
    return [(w.start, w.end) for w in iterations(run, Events.load(run)).steps[0]]


def _without(raw: dict[str, Any], *keys: str) -> dict[str, Any]:
    """The raw trace with `keys` dropped from every event's args (record_shapes=False leaves
    out Input Dims and Concrete Inputs; torch before 2.1 recorded no Concrete Inputs)."""
    return dict(raw, traceEvents=[
        dict(e, args={k: v for k, v in e["args"].items() if k not in keys}) if "args" in e
        else e for e in raw["traceEvents"]])


def test_one_optimizer_with_an_evaluation_every_second_step(tmp_path: Path) -> None:
    """tests/data/eval_every2.py: 12 Adam steps, an evaluation forward after every second.
    The calls come in twos of unequal stretches, as a GAN's do, but every call updates the
    same shapes: one optimizer, 12 steps each ending at its call's end (6 of two steps each
    had been found). Without the scalars (older torch) the shapes alone still say it; without
    shapes (record_shapes=False) the backward passes before the calls, all alike, say it: a
    GAN's two optimizers each step after a backward of their own (6 had been found)."""
    raw = _raw("eval_every2_cpu.pt.trace.json.gz")
    calls = _calls(raw)
    assert len(calls) == 12 and len({_updated(raw, c) for c in calls}) == 1
    expected = _expected(raw, 1)
    assert _steps(tmp_path, raw, "shaped") == expected
    assert _steps(tmp_path, _without(raw, "Concrete Inputs"), "unscaled") == expected
    assert _steps(tmp_path, _without(raw, "Input Dims", "Concrete Inputs"), "unshaped") == expected


@pytest.mark.parametrize(("name", "alike"), [("gan_adam_cpu.pt.trace.json.gz", False),
                                             ("twin_gan_cpu.pt.trace.json.gz", True)])
def test_a_gans_two_optimizers_make_one_step(tmp_path: Path, name: str, alike: bool) -> None:
    """tests/data/gan_adam.py: 10 GAN steps, each a discriminator's Adam call and then a
    generator's. Their models differ in size (the calls alternate between two sets of
    shapes), or are twins (one set: the calls come in pairs of alike Adam step sizes, and
    without those, the backward passes before them alternate): 10 steps, each ending at its
    generator's call."""
    raw = _raw(name)
    calls = _calls(raw)
    updated = [_updated(raw, c) for c in calls]
    assert len(calls) == 20
    assert (len(set(updated)) == 1) is alike
    assert all(d != g for d, g in zip(updated[::2], updated[1::2], strict=True)) is not alike
    expected = _expected(raw, 2)
    assert _steps(tmp_path, raw, "shaped") == expected
    assert _steps(tmp_path, _without(raw, "Concrete Inputs"), "unscaled") == expected
    # without shapes: the backward passes alternate, and so do the forwards (no layer frozen)
    assert _steps(tmp_path, _without(raw, "Input Dims", "Concrete Inputs"), "unshaped") == expected
    path = DATA / name
    run = import_traces([path], tmp_path / "kinds.run", ImportOptions(), ["t"])
    ev = Events.load(run)
    rows = step_calls(ev)
    kinds = call_kinds(run, ev, rows[np.argsort(ev.end[rows], kind="stable")])
    assert kinds.kind.tolist() == kinds.own.tolist() == ([0] * 20 if alike else [0, 1] * 10)
    assert count_cycle(kinds.scalars) == 2  # two Adams at one count of steps


@pytest.mark.parametrize("name", ["twin_gan_d2_cpu.pt.trace.json.gz",
                                  "twin_gan_d2_sgd_cpu.pt.trace.json.gz"])
def test_twin_models_whose_discriminator_steps_twice(tmp_path: Path, name: str) -> None:
    """tests/data/gan_adam.py `twins d2` (Adam) and `twins d2 sgd`: 10 steps, each two
    discriminator calls, on fakes of their own, and a generator call, every call updating the
    same shapes. The ops between the calls come as two alike stretches and one other, as one
    optimizer's with extra work every third step, and the Adams' scalars in no runs of one
    length: 30 steps had been found. The backward passes before the calls cycle at three (the
    generator's backpropagates through both models), which no evaluation makes: 10 steps, each
    ending at its generator's call, with the scalars and without them."""
    raw = _raw(name)
    calls = _calls(raw)
    assert len(calls) == 30 and len({_updated(raw, c) for c in calls}) == 1
    expected = _expected(raw, 3)
    assert _steps(tmp_path, raw, "shaped") == expected
    assert _steps(tmp_path, _without(raw, "Concrete Inputs"), "unscaled") == expected
    assert _steps(tmp_path, _without(raw, "Input Dims", "Concrete Inputs"), "unshaped") == expected


def _kinds(kind: list[int], scalars: list[int] | None = None,
           own: list[int] | None = None) -> CallKinds:
    return CallKinds(np.array(kind, np.int64), np.array(own if own is not None else kind, np.int64),
                     np.array(scalars if scalars is not None else [-1] * len(kind), np.int64))


def test_the_cycle_of_told_apart_optimizers() -> None:
    """The kinds of the calls first, then their scalars, then their backward passes; the cycle
    from the ops between the calls (`structural`) where the calls say nothing."""
    n = 12
    apart, same = np.ones(n - 1, np.int64), np.zeros(n - 1, np.int64)
    alternating = np.array([0, 1] * 6, np.int64)[:n - 1]
    # two kinds in turn (a GAN), three (a discriminator stepped twice a generator's step)
    assert identified_cycle(_kinds([0, 1] * 6), apart, same, False, 1) == 2
    assert identified_cycle(_kinds([0, 0, 1] * 4), apart, same, False, 1) == 3
    # a WGAN's critic stepped 5 times, then its generator: 6 (past MAX_CYCLE, 4)
    assert identified_cycle(_kinds(([0] * 5 + [1]) * 2), np.ones(11, np.int64),
                            np.zeros(11, np.int64), False, 1) == 6
    # one kind, its step size new at every call, one backward: one optimizer
    assert identified_cycle(_kinds([0] * n, list(range(n))), apart, same, False, 2) == 1
    # one kind, scalars in pairs with backward passes alternating: twin models' Adams; in pairs
    # with one backward throughout, one optimizer whose rate holds for two steps (StepLR)
    pairs = [i // 2 for i in range(n)]
    assert identified_cycle(_kinds([0] * n, pairs), apart, alternating, False, 1) == 2
    assert identified_cycle(_kinds([0] * n, pairs), apart, same, False, 1) == 1
    # one kind, scalars that never change (SGD): the backward passes cycle (twin models), at
    # their cycle whatever the structural one (a discriminator stepped twice), or do not (one
    # optimizer); they cycle with calls that leave shapes out (a layer frozen every other
    # step): one optimizer
    assert identified_cycle(_kinds([0] * n, [0] * n), apart, alternating, False, 2) == 2
    thirds = np.array([0, 0, 1] * 4, np.int64)[:n - 1]
    assert identified_cycle(_kinds([0] * n, [0] * n), apart, thirds, False, 1) == 3
    assert identified_cycle(_kinds([0] * n, [0] * n), apart, same, False, 2) == 1
    assert identified_cycle(_kinds([0] * n, [0] * n, [0, 1] * 6), apart, alternating, False,
                            2) == 1
    # nothing between two calls: one step's (two optimizers of one kind back to back)
    assert identified_cycle(_kinds([0] * n, [0] * n), np.array([5, 0] * 5 + [5]), same, False,
                            2) == 2
    # no shapes (the class alone): the backward passes still say it, and where the stretches
    # say a layer is frozen in some steps (skips_frozen), one optimizer; kinds told apart (a
    # GAN's two models by their shapes) stay whatever the stretches say
    assert identified_cycle(_kinds([0] * n), apart, same, False, 2) == 1
    assert identified_cycle(_kinds([0] * n), apart, alternating, False, 2) == 2
    assert identified_cycle(_kinds([0] * n), apart, alternating, True, 2) == 1
    assert identified_cycle(_kinds([0, 1] * 6), apart, alternating, True, 1) == 2
    # kinds that vary with no cycle: the structural cycle stays
    assert identified_cycle(_kinds([0, 1, 1, 0, 0, 0, 1, 0, 1, 1, 1, 0]), apart, same, False,
                            1) == 1
    assert id_cycle(np.array([0, 1, 1, 0, 0, 0, 1, 0, 1, 1, 1, 0])) == 0


@pytest.mark.parametrize(("scalars", "cycle"), [
    ([0, 0, 1, 1, 2, 2, 3, 3], 2),
    ([0, 1, 1, 2, 2, 3, 3, 4], 2),  # a window opened and closed between the twins' calls
    ([0, 0, 0, 1, 1, 1, 2, 2, 2], 3),
    (list(range(8)), 0),  # one optimizer's step size, new at every call
    ([0] * 8, 0),  # never changing: SGD's learning rate
    ([0, 0, 1, 1, 1, 2, 2], 0),  # one whole run
    ([0, 0, 1, 1, 1, 2, 2, 3, 3, 3], 0),  # runs of unequal length
    ([0, 0, 1, 1], 0),  # too few runs
    ([-1] * 8, 0),  # none recorded
])
def test_count_cycle(scalars: list[int], cycle: int) -> None:
    assert count_cycle(np.array(scalars, np.int64)) == cycle


def test_an_optimizer_skipping_parameters_without_gradients(tmp_path: Path) -> None:
    """A call that updates a subset of another's shapes is of that one's kind: an optimizer
    leaves out the parameters that have no gradient (a head used every third step: its
    shapes in one call of three had read as a cycle of three optimizers, 4 steps of 12). Made
    from eval_every2's trace by taking the last layer's bias (shape [10]) out of the shapes
    of the first two calls of every three; their ops stay, so the ops between the calls still
    repeat at two calls."""
    raw = _raw("eval_every2_cpu.pt.trace.json.gz")
    calls = _calls(raw)
    events = []
    for e in raw["traceEvents"]:
        inside = next((i for i, c in enumerate(calls) if e.get("ph") == "X"
                       and e.get("tid") == c["tid"] and c["ts"] <= e["ts"]
                       and e["ts"] + e.get("dur", 0) <= c["ts"] + c["dur"] and e is not c), None)
        dims = e.get("args", {}).get("Input Dims", [])
        skipped = inside is not None and inside % 3 != 2 and [10] in dims
        events.append(dict(e, args=dict(e["args"], **{"Input Dims": [
            [] if d == [10] else d for d in dims]})) if skipped else e)
    changed = dict(raw, traceEvents=events)
    assert len({_updated(changed, c) for c in _calls(changed)}) == 2
    assert _steps(tmp_path, changed, "skipping") == _expected(raw, 1)


@pytest.mark.parametrize("name", ["heads_cpu.pt.trace.json.gz", "steplr_cpu.pt.trace.json.gz",
                                  "frozen_cpu.pt.trace.json.gz"])
def test_one_optimizer_whose_calls_differ(tmp_path: Path, name: str) -> None:
    """tests/data/heads_steplr.py: one Adam over a trunk and two heads of other shapes used in
    turn (each call updates the trunk and one head: shape sets that share most of themselves),
    and one SGD whose StepLR holds its rate for 3 steps (its scalars in runs of 3, one backward
    throughout), and one SGD whose trunk is frozen every other step (those calls update a
    subset of the others' shapes, after a backward of fewer nodes: the backward passes
    alternate, as twin models' do). Each call is a step: they had read as two optimizers (6
    steps of 12), as three twins (4) and as twins (6)."""
    raw = _raw(name)
    calls = _calls(raw)
    assert len(calls) == 12
    if name.startswith("heads"):  # two sets of shapes, each mostly the other's
        a, b = {_updated(raw, c) for c in calls}
        assert not a <= b and not b <= a and len(a & b) >= len(a) / 2
    if name.startswith("frozen"):  # every other call updates a part of the others' shapes
        updated = [_updated(raw, c) for c in calls]
        assert len(set(updated[::2])) == len(set(updated[1::2])) == 1
        assert updated[1] < updated[0]
    assert _steps(tmp_path, raw, "r") == _expected(raw, 1)


def test_a_layer_frozen_or_twin_models() -> None:
    """Between the calls (each a multiset of names): the same forward every step and each
    backward a part of the largest, a layer frozen; forwards of their own, or backward passes
    that each hold nodes the other lacks, twin models (a GAN's loss nodes differ)."""
    alike = [(1, 2, 3)] * 11
    frozen = [(7, 8, 9, 9), (7, 9)] * 5 + [(7, 8, 9, 9)]
    assert skips_frozen(frozen, alike)
    assert not skips_frozen(frozen, [(1, 2, 3), (1, 1, 2, 2, 3, 3)] * 5 + [(1, 2, 3)])
    assert not skips_frozen([(7, 8, 9), (7, 9, 10)] * 5 + [(7, 8, 9)], alike)
    assert skips_frozen(frozen, [(1, 2), *alike[1:]])  # one stretch of 11 unlike: 10 of 11 alike
    assert not skips_frozen(frozen, [(1, 2)] * 2 + alike[2:])
    assert not skips_frozen([], [])


def test_a_layer_frozen_every_other_step_without_shapes(tmp_path: Path) -> None:
    """tests/data/heads_steplr.py `frozen unshaped`: the SGD whose trunk is frozen every other
    step, recorded without record_shapes: a call is its class alone, and the backward passes
    before the calls alternate (the trunk's nodes left out), as twin models' do: 6 steps had
    been found of 12. The ops between the calls outside the backward (the forward, its loss)
    are the same every step, and a frozen step's backward nodes are a part of the others': one
    optimizer, each call a step."""
    raw = _raw("frozen_unshaped_cpu.pt.trace.json.gz")
    calls = _calls(raw)
    assert len(calls) == 12
    assert not any("Input Dims" in e.get("args", {}) for e in raw["traceEvents"])
    nodes = [Counter(e["name"] for e in raw["traceEvents"] if e.get("ph") == "X"
                     and e["name"].startswith("autograd::engine::evaluate_function: ")
                     and a["ts"] + a["dur"] <= e["ts"] < b["ts"])
             for a, b in itertools.pairwise(calls)]
    assert nodes[1::2] == [nodes[1]] * 5 and nodes[::2] == [nodes[0]] * 6
    assert nodes[0] < nodes[1]  # the frozen steps' nodes, a part of the others'
    assert _steps(tmp_path, raw, "frozen") == _expected(raw, 1)
