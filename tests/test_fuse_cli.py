"""`perfswarm fuse`: candidates and predictions as JSON, a tuned run and its cached schedules,
and bad input in one line with exit 2."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from perfswarm.cli.main import main
from perfswarm.trace.ingest import ImportOptions, import_traces
from perfswarm.userfiles import write_json


def _profile(path: Path) -> Path:
    """A calibrate profile whose sweeps reached 500 GFLOP/s, 10 GB/s cold and 40 GB/s warm."""
    family = {"coef": [0.0, 1e-10, 1e-11], "chosen": "roofline", "gmae_held_out": 0.1}
    conv = {"op": "aten::conv2d", "dims": [[1, 16, 16, 16], [16, 16, 3, 3]],
            "seconds": 2 * 256 * 16 * 16 * 9 / 500e9}
    write_json(path, {"device": "cpu", "families": {
        "conv": {**family, "sweep": [conv]},
        "copy": {**family, "sweep": [{"op": "aten::copy_", "dims": [[1000], [1000]],
                                      "seconds": 8000 / 10e9}]}},
        "warm": {"copy": {**family, "sweep": [{"op": "aten::copy_", "dims": [[1000], [1000]],
                                               "seconds": 8000 / 40e9}]}}})
    return path


def test_predict_only_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profile = _profile(tmp_path / "p.json")
    code = main(["fuse", "--layer", "dw3x3:C=32,H=112 -> pw:K=64", "--layer",
                 "conv3x3:C=256,H=14,K=256 -> pw:K=256", "--batch", "8", "--profile", str(profile),
                 "--predict-only", "--json"])
    assert code == 0
    data = orjson.loads(capsys.readouterr().out)
    assert data["device"]["peak_tflops"]["fp32"] == pytest.approx(0.5)
    assert data["device"]["memory_bandwidth_gbps"] == pytest.approx(10.0)
    first, second = data["candidates"]
    assert first["pair"] == "dw3x3 -> pw N=8 C=32 H=112 W=112 K=64"
    assert first["prediction"]["intermediate_bytes"] == 4 * 8 * 32 * 112 * 112
    # both memory-bound: fused, the pair moves its input, weights and output once
    outer = 4 * (8 * 32 * 112 * 112 + 32 * 9 + 32 * 64 + 8 * 64 * 112 * 112)
    assert first["prediction"]["fused_s"] == pytest.approx(outer / 10e9)
    assert first["prediction"]["gains"] is True
    # a 3x3 conv of 256 channels is compute-bound: nothing to gain
    assert second["prediction"]["gains"] is False
    assert "results" not in data


def test_candidates_of_a_recorded_run(tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    trace = Path(__file__).parent / "data" / "cnn_cpu_trace.json"
    run = import_traces([trace], tmp_path / "cnn.run", ImportOptions(), ["test"])
    profile = str(_profile(tmp_path / "p.json"))
    assert main(["fuse", str(run.path), "--profile", profile, "--predict-only", "--json"]) == 0
    data = orjson.loads(capsys.readouterr().out)
    assert [c["kind"] for c in data["candidates"]] == ["conv->dw", "dw->pw", "pw->dw", "dw->pw"]
    # the intermediate of the stem conv: 2 x 8 x 16 x 16 floats
    assert data["candidates"][0]["prediction"]["intermediate_bytes"] == 4 * 2 * 8 * 16 * 16
    assert main(["fuse", str(run.path), "--layer", "pw:C=8,H=8,K=8 -> dw3x3"]) == 2
    assert "not both" in capsys.readouterr().err


def test_fuse_tunes_then_reuses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("numba")
    argv = ["fuse", "--layer", "dw3x3:C=16,H=12 -> pw:K=16", "--profile",
            str(_profile(tmp_path / "p.json")), "--trials", "3", "--rounds", "2",
            "--threads", "1", "--cache", str(tmp_path / "new" / "cache.json"), "--json"]
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert main(argv) == 0
        assert torch.get_num_threads() == 2  # tuned at one thread, the caller's given back
    finally:
        torch.set_num_threads(threads)
    (first,) = orjson.loads(capsys.readouterr().out)["results"]
    assert first["correct"] and first["max_rel_error"] <= 1e-4
    assert first["reused_schedule"] is False
    assert first["speedup"] == pytest.approx(first["torch_separate_ms"]["min_ms"]
                                             / first["fused_ms"]["min_ms"])
    # two rounds (four where measured again): the interval is their range, coverage 1/2 or 7/8
    rounds = first["rounds"]
    assert 0 <= first["rounds_won"] <= rounds == (4 if first["remeasured"] else 2)
    low, high = first["speedup_interval"]
    assert low <= first["paired_speedup"] <= high
    assert first["interval_coverage"] == 1 - 2 / 2**rounds
    # a gaining pair is measured again, apart, and recommended only if it gains there too
    again = first["confirmation_interval"]
    assert (again is not None) == (low > 1)
    assert first["recommended"] == (again is not None and again[0] > 1)
    assert first["remeasured"] == (rounds == 4)
    assert first["timer"] == "cpu"  # one thread: CPU seconds
    assert main(argv) == 0
    (second,) = orjson.loads(capsys.readouterr().out)["results"]
    assert second["reused_schedule"] is True
    assert second["schedule"] == first["schedule"]
    assert second["own_schedules"] == first["own_schedules"]


@pytest.mark.parametrize(("args", "why"), [
    (["--layer", "dw3x3:C=8 H=8 -> pw:K=8"], "--layer dw3x3:C=8 H=8 -> pw:K=8: 'C=8 H=8'"),
    (["--layer", "dw3x3:C=8,H=8 -> pw:C=9,K=8"], "shapes do not chain"),
    (["--layer", "dw3x3:C=8,H=8 -> pw:K=8", "--budget", "0"], "--budget 0: must be positive"),
    (["--layer", "dw3x3:C=8,H=8 -> pw:K=8", "--trials", "0"], "--trials 0: must be positive"),
    (["--layer", "dw3x3:C=8,H=8 -> pw:K=8", "--pairs", "3"], "--pairs 3: no candidate"),
    ([], "give a RUN or at least one --layer"),
])
def test_bad_input(args: list[str], why: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fuse", *args, "--predict-only"]) == 2
    err = capsys.readouterr().err
    assert why in err
    assert err.count("\n") == 1
