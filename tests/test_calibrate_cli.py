"""`perfswarm calibrate`: CPU kernel models, and the collective path's arguments."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perfswarm.cli.main import main


def test_calibrate_cpu_kernel_models(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cpu.json"
    assert main(["calibrate", "--budget", "0.01", "-o", str(out), "--json"]) == 0
    profile = json.loads(out.read_text())
    assert profile == json.loads(capsys.readouterr().out)
    assert set(profile["families"]) == {"gemm", "elementwise", "reduction", "copy"}


def test_calibrate_refuses_unbuilt_devices(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate", "--device", "cuda:0"]) == 2
    assert "only cpu is built" in capsys.readouterr().err


def test_calibrate_rejects_unknown_backend(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate", "--collectives", "--backend", "mpi"]) == 2
    assert "auto, gloo or nccl" in capsys.readouterr().err
