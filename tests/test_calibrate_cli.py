"""`perfswarm calibrate`: CPU kernel models, and the collective path's arguments."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perfswarm.cli.main import main
from perfswarm.model.fusedstep import FusedStepCosts, StepCost, fused_of
from perfswarm.model.receive import ReceiveCost, receive_of


def _gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def test_calibrate_cpu_kernel_models(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cpu.json"
    assert main(["calibrate", "--budget", "0.01", "-o", str(out), "--json"]) == 0
    profile = json.loads(out.read_text())
    assert profile == json.loads(capsys.readouterr().out)
    assert set(profile["families"]) == {"gemm", "conv", "conv_backward", "embedding_bag",
                                        "elementwise", "reduction", "copy", "sdpa",
                                        "sdpa_backward", "rnn", "rnn_backward"}
    for family in ("rnn", "rnn_backward"):  # oneDNN's LSTM layer, timed and fitted
        entry = profile["families"][family]
        assert entry["points"] >= 8 and entry["gmae_held_out"] > 0
        assert {p["op"] for p in entry["sweep"]} == {
            "mkldnn_rnn_layer" + ("_backward" if family == "rnn_backward" else "")}
    assert set(profile["warm"]) == {"elementwise", "reduction", "copy"}
    # what taking a batch from a DataLoader worker costs here, for advise --profile: a batch
    # of 4 tensors costs more than one of 1 (each its own shared-memory file)
    got = profile["loader_receive"]
    assert got["next_cpu_ns"]["4"] > got["next_cpu_ns"]["1"] > 0 and got["tensor_ns"] > 0
    assert got["batch_ns"] + got["tensor_ns"] == pytest.approx(got["next_cpu_ns"]["1"], abs=1)
    assert receive_of(out) == ReceiveCost(got["batch_ns"], got["tensor_ns"],
                                          "calibrated on this host (cpu.json)")
    # what a fused optimizer step costs here, for advise --profile: six points each, a step
    # over 64 small tensors dearer than over one
    steps = profile["fused_optimizer_step"]
    for name in ("Adam", "AdamW", "SGD"):
        points = {(p["tensors"], p["elements"]): p["ns"] for p in steps[name]["points"]}
        assert len(points) == 6 and points[64, 256] > points[1, 256] > 0
        assert min(steps[name]["call_ns"], steps[name]["tensor_ns"], steps[name]["byte_ns"]) >= 0
    assert fused_of(out) == FusedStepCosts(
        {n: StepCost(e["call_ns"], e["tensor_ns"], e["byte_ns"]) for n, e in steps.items()},
        "calibrated on this host (cpu.json)")
    assert main(["calibrate", "--budget", "0.01", "-o", str(out)]) == 0
    table = capsys.readouterr().out
    assert "copy (warm)" in table and "embedding_bag" in table and "profile:" in table
    assert "taking a batch from a DataLoader worker (the training process's CPU): " in table
    assert "a fused optimizer step (fused=True): Adam " in table


@pytest.mark.parametrize(("device", "message"), [("cuda:0", "no such CUDA device here"),
                                                 ("tpu", "expected cpu or cuda:N"),
                                                 ("cuda:x", "expected cpu or cuda:N")])
def test_calibrate_refuses_missing_devices(capsys: pytest.CaptureFixture[str], device: str,
                                           message: str) -> None:
    assert main(["calibrate", "--device", device]) == 2
    assert message in capsys.readouterr().err


def test_calibrate_rejects_unknown_backend(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate", "--collectives", "--backend", "mpi"]) == 2
    assert "auto, gloo or nccl" in capsys.readouterr().err


@pytest.mark.skipif(_gpus() >= 2, reason="this machine can run the NCCL sweep")
def test_calibrate_nccl_without_gpus_is_a_one_line_error(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate", "--collectives", "--backend", "nccl"]) == 2
    err = capsys.readouterr().err
    assert f"--backend nccl: needs 2 GPUs, found {_gpus()}" in err
    assert len(err.strip().splitlines()) == 1


def test_calibrate_collectives_needs_two_ranks(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate", "--collectives", "--world-size", "1"]) == 2
    assert "world_size >= 2" in capsys.readouterr().err


def test_no_lstm_sweep_without_onednn(monkeypatch: pytest.MonkeyPatch) -> None:
    """A torch built without oneDNN runs nn.LSTM by its own kernels: calibrate sweeps no
    mkldnn_rnn_layer there (its call had raised, a traceback for the whole calibration), and
    no CPU-only family on a GPU."""
    import torch

    from perfswarm.recorder.bench.kernels import swept_families

    every = swept_families("cpu")
    assert {"rnn", "rnn_backward", "sdpa"} <= set(every)
    assert not {"rnn", "rnn_backward", "sdpa", "sdpa_backward"} & set(swept_families("cuda:0"))
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    assert swept_families("cpu") == [f for f in every if f not in ("rnn", "rnn_backward")]
