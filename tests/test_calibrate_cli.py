"""`perfswarm calibrate`: the collective path's arguments and its refusal of what is not built."""

from __future__ import annotations

import pytest

from perfswarm.cli.main import main


def test_calibrate_needs_collectives(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate"]) == 2
    assert "only --collectives is available" in capsys.readouterr().err


def test_calibrate_rejects_unknown_backend(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate", "--collectives", "--backend", "mpi"]) == 2
    assert "auto, gloo or nccl" in capsys.readouterr().err
