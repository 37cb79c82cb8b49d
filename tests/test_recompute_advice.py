"""Activation checkpointing recorded for real (docs/benchmarks.md, the thirty-first pass's
checkpointing section): torch.utils.checkpoint around each of three small blocks (--ckpt the
non-reentrant default, --reentrant use_reentrant=True); --plain calls them directly; --double
takes a gradient penalty's double backward (create_graph=True) and no checkpoint. advise's
activation_checkpointing finds the recomputed forward ops inside the backward nodes (their
`Sequence number`: ops run with grad mode on) and prices them."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pytest

from perfswarm.optimize.advise import RULES, advise
from perfswarm.optimize.rules import recompute
from perfswarm.optimize.rules.facts import Facts
from perfswarm.recorder.session import RecordOptions, record
from perfswarm.trace.schema import HOST_AVAILABLE
from perfswarm.trace.store import Run

LOOP = """
import sys
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

torch.set_num_threads(1)
torch.manual_seed(0)
blocks = nn.ModuleList(nn.Sequential(nn.Linear(128, 512), nn.GELU(), nn.Linear(512, 128),
                                     nn.LayerNorm(128)) for _ in range(3))
opt = torch.optim.SGD(blocks.parameters(), lr=0.01)
mode = sys.argv[1]
for step in range(10):
    h = torch.randn(64, 128, requires_grad=mode in ("--double", "--reentrant"))
    x = h
    for b in blocks:
        h = (checkpoint(b, h, use_reentrant=mode == "--reentrant")
             if mode in ("--ckpt", "--reentrant") else b(h))
    loss = h.square().mean()
    if mode == "--double":
        (g,) = torch.autograd.grad(loss, x, create_graph=True)
        loss = loss + g.square().sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def _recorded(folder: Path, mode: str) -> Run:
    script = folder / "loop.py"
    script.write_text(LOOP)
    result = record([sys.executable, str(script), mode], folder / f"{mode[2:]}.run",
                    RecordOptions(collectors=("torch", "system"), skip=3, steps=4))
    assert result.exit_code == 0
    return result.run


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    folder = tmp_path_factory.mktemp("ckpt")
    modes = ("ckpt", "reentrant", "plain", "double")
    return {mode: _recorded(folder, f"--{mode}") for mode in modes}


@pytest.mark.parametrize("mode", ["ckpt", "reentrant"])
def test_recomputation_is_found_priced_and_advised(runs: dict[str, Run], mode: str) -> None:
    """Three checkpointed blocks: each profiled step recomputes three segments' forward (the
    linears, GELU, layer norm) in three backward nodes (the reentrant variant's
    CheckpointFunctionBackward, the default's node that first unpacks a saved tensor); the
    gain is that time and the nodes' own (the recomputation's Python), within the measured
    time; the blocks' activations fit in the host's free memory the system sampler saw, and
    the change drops checkpointing."""
    facts = Facts.of(runs[mode])
    found = recompute.recomputed(facts)
    assert found is not None
    ops, nodes = found
    assert nodes.num_rows == 3 * facts.step_count()
    names = set(facts.name_texts(ops))
    assert {"aten::linear", "aten::gelu", "aten::layer_norm"} <= names
    a = recompute.activation_checkpointing(facts)
    assert a is not None and a.rule == "activation_checkpointing"
    ev = a.evidence
    assert ev["segments"] == nodes.num_rows and ev["recomputed_ops"] == ops.num_rows
    assert a.gain_ns == ev["recompute_ns"] + ev["recompute_python_ns"] > 0
    assert 0 < ev["recompute_ns"] < a.gain_of_ns and a.gain_pct is not None
    assert 0 < a.gain_pct < 100
    # each step's recomputed first inputs: a linear's 64 x 128 and 64 x 512 floats, GELU's
    # 64 x 512 and the layer norm's 64 x 128, three blocks
    assert ev["activation_bytes"] == 3 * 4 * 64 * (128 + 512 + 512 + 128)
    assert ev["fits"] is True and ev["free_of"] == "host" and ev["free_bytes"] > 1 << 20
    assert ev["segments_that_fit"] == 3
    assert a.change.startswith("drop torch.utils.checkpoint")
    assert recompute.activation_checkpointing in RULES
    assert "activation_checkpointing" in {x.rule for x in advise(runs[mode]).advice}
    if mode == "reentrant":
        assert set(facts.name_texts(nodes)) == {"CheckpointFunctionBackward"}


def test_no_checkpoint_and_double_backward_are_no_recomputation(runs: dict[str, Run]) -> None:
    """The blocks called directly recompute nothing; a gradient penalty's double backward runs
    its nodes' own ops with grad mode on, in most nodes: not checkpointing."""
    for mode in ("plain", "double"):
        facts = Facts.of(runs[mode])
        assert recompute.recomputed(facts) is None, mode
        assert recompute.activation_checkpointing(facts) is None, mode


def test_where_only_some_segments_fit_fewer_are_checkpointed(runs: dict[str, Run]) -> None:
    """Free memory for one and a half segments' activations within the headroom (half of it):
    one of a step's three segments may go unchecked, and the gain is a third of the
    recomputation's."""
    facts = Facts.of(runs["ckpt"])
    start = facts.window(facts.ranks[0])[0]
    # a step's activations are 983,040 bytes (test above): a third each, half of it free
    counters = pa.table({"rank": [-1], "ts": [start], "name": [HOST_AVAILABLE],
                         "device": [-1], "value": [983_040.0]})
    whole = recompute.activation_checkpointing(facts)
    a = recompute.activation_checkpointing(replace(facts, counters=counters))
    assert whole is not None and whole.gain_ns is not None
    assert a is not None and a.gain_ns is not None
    assert a.evidence["fits"] is False and a.evidence["segments_that_fit"] == 1
    assert abs(a.gain_ns - whole.gain_ns / 3) <= 1
    assert a.change.startswith("checkpoint 1 fewer of a step's 3 segments")


def test_activations_that_would_not_fit_are_not_advised_away(
        runs: dict[str, Run], monkeypatch: pytest.MonkeyPatch) -> None:
    """Where not one segment's activations fit in the headroom of the free memory, the
    advice says so, keeps checkpointing and claims no gain."""
    monkeypatch.setattr(recompute, "_HEADROOM", 1e-9)
    a = recompute.activation_checkpointing(Facts.of(runs["ckpt"]))
    assert a is not None and a.gain_ns is None and a.evidence["fits"] is False
    assert a.title.endswith("they would not fit") and a.change.startswith("keep")


def test_free_memory_is_read_around_a_window_between_two_samples(runs: dict[str, Run]) -> None:
    """A window of a few short steps can fall between two of the system sampler's samples:
    the free memory is the lowest of the window's and the sample on either side of it (a
    later one aside), not unknown."""
    facts = Facts.of(runs["ckpt"])
    start, end, _ = facts.window(facts.ranks[0])
    ts = [start - 10, end + 10, end + 10**9]
    counters = pa.table({"rank": [-1] * 3, "ts": ts, "name": [HOST_AVAILABLE] * 3,
                         "device": [-1] * 3, "value": [5e9, 4e9, 1e9]})
    assert recompute._free_bytes(replace(facts, counters=counters)) == (4_000_000_000, "host")
