"""Each bundled workload trains for a few steps and prints one timing line per step."""

from __future__ import annotations

import re

import pytest

from perfswarm.workloads import dlrm, trainer, transformer

CASES = [
    (trainer.main, ["--arch", "cnn", "--loader-delay-ms", "1"]),
    (trainer.main, ["--arch", "mlp", "--image-size", "8"]),
    (dlrm.main, ["--rows", "500", "--tables", "3", "--samples", "64"]),
    (transformer.main, ["--seq-len", "8", "--d-model", "32", "--samples", "32"]),
]


@pytest.mark.parametrize(("main", "extra"), CASES, ids=["cnn", "mlp", "dlrm", "transformer"])
def test_workload_prints_each_step(main: object, extra: list[str],
                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert callable(main)
    assert main(["--steps", "3", "--batch-size", "4", *extra]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3
    for i, line in enumerate(lines):
        m = re.fullmatch(rf"step {i} (\d+\.\d{{3}}) ms loss (-?\d+\.\d{{4}})", line)
        assert m and float(m.group(1)) > 0


def test_bad_arguments_exit() -> None:
    with pytest.raises(SystemExit):
        trainer.main(["--steps", "0"])
