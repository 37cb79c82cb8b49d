"""single_tensor_optimizer on a real recording: an Adam loop over 80 small parameter tensors,
its claimed gain against the fused step's saving measured here, unrecorded."""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from perfswarm.model.fusedstep import DEFAULT as FUSED_DEFAULT
from perfswarm.optimize.rules import optimizer
from perfswarm.optimize.rules.facts import Facts, col
from perfswarm.recorder.session import RecordOptions, record

LAYERS, WIDTH = 40, 16  # 80 parameter tensors: 40 weights of 256 floats, 40 biases of 16
LOOP = f"""
import sys
import torch
from torch import nn

torch.set_num_threads(1)
torch.manual_seed(0)
net = nn.Sequential(*[nn.Linear({WIDTH}, {WIDTH}) for _ in range({LAYERS})])
opt = torch.optim.Adam(net.parameters(), lr=1e-3)
x = torch.randn(8, {WIDTH})
for _ in range(int(sys.argv[1])):
    loss = net(x).square().mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
"""


def _saved_share(calls: int = 40) -> float:
    """1 - a fused Adam step's thread CPU time over a single-tensor one's, both over the
    loop's parameters (gradients set), stepped in turns: medians of `calls` each."""
    torch.set_num_threads(1)
    optimizers = []
    for fused in (False, True):
        net = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])
        net(torch.randn(8, WIDTH)).square().mean().backward()
        optimizers.append(torch.optim.Adam(net.parameters(), lr=1e-3, fused=fused))
    spent: list[list[int]] = [[], []]
    for i in range(calls + 3):
        for which in ((0, 1) if i % 2 else (1, 0)):
            start = time.thread_time_ns()
            optimizers[which].step()
            if i >= 3:  # after the state is made
                spent[which].append(time.thread_time_ns() - start)
    return 1 - statistics.median(spent[1]) / statistics.median(spent[0])


def test_fused_gain_is_the_single_tensor_calls_less_a_fused_step(tmp_path: Path) -> None:
    """fused=True replaces the whole single-tensor call, its per-parameter ops and the Python
    between them, by one fused step over the 80 parameters (calibrate's cost of it, here the
    defaults). The claim had been the ops' time less their bytes' at the best rate an op
    reached, the Python kept: 0.22-0.75 of the call on this loop where the fused step saves
    0.76-0.81 (20 recordings on the 2-core VM at load 4.4-6.5, /tmp/p33/fusedgain/band*.log).
    Now its share of the call is held from 0.05 under the share measured here, unrecorded,
    to 0.25 over it: it read 0.11-0.20 over it, as the fused step is priced at calibrate's
    CPU time while the recorded calls waited for a core (their wall time: the fused one
    would wait too), and it cannot read more over than the fused step's own share of the
    call (0.19-0.24 here), nor 0.05 under unless the calibrated step were slower than the
    loop's or the recorded call faster than the one timed here."""
    script = tmp_path / "adam_loop.py"
    script.write_text(LOOP)
    result = record([sys.executable, str(script), "16"], tmp_path / "adam.run",
                    RecordOptions(collectors=("torch",), skip=3, steps=4))
    assert result.exit_code == 0
    facts = Facts.of(result.run)
    a = optimizer.single_tensor_optimizer(facts)
    assert a is not None and a.gain_ns is not None
    calls, _ = facts.optimizer_steps
    slowdown = facts.optimizer_slowdown or facts.profiler_slowdown
    call_ns = float(np.median(col(calls, "dur"))) / slowdown  # a call, unprofiled
    claimed = a.gain_ns / calls.num_rows / call_ns
    measured = _saved_share()
    assert measured - 0.05 <= claimed <= measured + 0.25, (claimed, measured)
    # the parameters each call updates, read from its loop: all 80, 40 x (256 + 16) floats
    parameter_bytes = LAYERS * (WIDTH * WIDTH + WIDTH) * 4
    assert (a.evidence["tensors"], a.evidence["parameter_bytes"]) == (2 * LAYERS,
                                                                      parameter_bytes)
    fused = FUSED_DEFAULT.steps["Adam"].of(2 * LAYERS, parameter_bytes) * calls.num_rows
    assert a.evidence["fused_ns"] == round(fused)
    assert a.gain_ns == round(a.evidence["calls_ns"] / slowdown - fused)
