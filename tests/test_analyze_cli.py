"""`perfswarm analyze` and `perfswarm diff`: JSON keys, summaries, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from perfswarm.cli.analyze_text import STEP_LINES, _shown
from perfswarm.cli.main import main
from perfswarm.trace.store import Run


def run_json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_analyze_json(corpus_runs: dict[str, Run], capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(capsys, ["analyze", str(corpus_runs["nccl"].path), "--json"])
    assert set(data) == {"path", "events", "ranks", "iterations", "concurrency", "ops", "launch",
                         "stragglers", "critical_path", "swarms", "system", "op_cost",
                         "kernels", "bandwidth", "sequences", "scopes", "cupti",
                         "memory", "windows"}
    # A100 (devices.yaml): 1555 GB/s of memory for the device's own copies and sets
    ((d2d, memset),) = [r["flows"] for r in data["bandwidth"]]
    assert (d2d["direction"], d2d["ops"], d2d["bytes"], d2d["peak_gbps"]) == (
        "d2d", 960, 307_323_096, pytest.approx(1555.0))
    assert (memset["direction"], memset["bytes"]) == ("memset", 409_141_005)
    # the nccl trace was recorded without shapes: no op has a cost, the device is still known
    assert data["op_cost"]["device"] == "A100-40GB" and data["op_cost"]["ops"] == []
    assert data["events"] == 26_935 and data["ranks"] == [0]
    assert data["iterations"]["used"] == "marker"
    assert [s["step"] for s in data["iterations"]["steps"]["0"]] == [4, 5, 6]
    assert data["iterations"]["agreement"][0]["count_matches"] is True
    total = data["concurrency"]["ranks"][0]["total"]
    assert sum(total["ns"].values()) == total["span_ns"]
    assert data["ops"]["categories"][0] == {"category": "communication", "count": 21,
                                           "total_ns": 46_876_493,
                                           "share": pytest.approx(0.28378, abs=1e-5)}


def test_analyze_ignore_markers(corpus_runs: dict[str, Run],
                                capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(capsys, ["analyze", str(corpus_runs["nccl"].path), "--json",
                             "--ignore-markers"])
    its = data["iterations"]
    assert its["used"] == "detected" and its["markers"] == {} and len(its["steps"]["0"]) == 3
    assert len(data["concurrency"]["ranks"][0]["iterations"]) == 3


def test_analyze_is_deterministic(corpus_runs: dict[str, Run],
                                  capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["analyze", str(corpus_runs["simple_add"].path), "--json"]
    assert main(argv) == 0
    first = capsys.readouterr().out
    assert main(argv) == 0
    assert capsys.readouterr().out == first


def test_analyze_summary(corpus_runs: dict[str, Run], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", str(corpus_runs["event_sync"].path)]) == 0
    out = capsys.readouterr().out
    assert "concurrency" in out and "critical path 2.577 ms" in out and "launches" in out
    assert " device ops, " in out  # event_sync ran device work


def test_a_cpu_runs_critical_path_counts_no_device_ops(trainer_run: Run,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    """A recorded CPU run's critical paths (terminal) say nothing of device ops, all 0 there."""
    assert main(["analyze", str(trainer_run.path)]) == 0
    out = capsys.readouterr().out
    assert "critical path " in out and "device ops" not in out and " rank switches" in out


def test_diff_json(corpus_runs: dict[str, Run], capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(capsys, ["diff", str(corpus_runs["compare_base"].path),
                             str(corpus_runs["compare_test"].path), "--json"])
    assert data["ops"][0]["name"] == "All2All_Pooled_Req"
    assert data["ops"][0]["delta_ns"] == 311_000 and data["only_a"] == []
    assert [o["name"] for o in data["only_b"]] == [
        "AddmmBackward0", "All2All_Pooled_Req", "CatBackward0"]
    assert main(["diff", str(corpus_runs["compare_base"].path),
                 str(corpus_runs["compare_test"].path)]) == 0
    assert "+0.311" in capsys.readouterr().out  # the first row: All2All_Pooled_Req


def test_bad_input(tmp_path: Path, corpus_runs: dict[str, Run],
                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    base = str(corpus_runs["compare_base"].path)
    assert main(["diff", base, base, "--rank-a", "5"]) == 2
    assert "no rank 5" in capsys.readouterr().err


def test_analyze_op_cost(corpus_runs: dict[str, Run], capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(capsys, ["analyze", str(corpus_runs["amd"].path), "--json"])["op_cost"]
    # one die of an MI250 (104 of its 208 CUs): half its peaks
    assert data["device"] == "MI250 (104 of 208 units)"
    addmm = next(o for o in data["ops"] if o["name"] == "aten::addmm")
    assert addmm["shapes"] == "128, 5x128, 128x128" and addmm["count"] == 1
    assert addmm["flops"] == 2 * 5 * 128 * 128 and addmm["bound"] == "memory"
    # its kernels (joined by External id) took 24.48 us: 0.18% of the roofline
    assert addmm["time_ns"] == 24_480
    assert addmm["efficiency"] == pytest.approx(addmm["roofline_ns"] / 24_480)
    assert [f["ops"] for f in data["fusion"]][:1] == [["clamp_min", "normal_", "copy_", "mean"]]
    assert main(["analyze", str(corpus_runs["amd"].path)]) == 0
    assert "op cost (roofline on MI250" in capsys.readouterr().out


@given(st.lists(st.integers(0, 10**9), max_size=40))
def test_many_steps_print_their_extremes(sizes: list[int]) -> None:
    """Up to STEP_LINES steps print all; of more, the shortest, the median and the three
    longest, in step order, and the count of the rest."""
    steps = list(enumerate(sizes))
    shown, left = _shown(steps, lambda s: s[1])
    assert shown == sorted(shown) and left == len(steps) - len(shown)
    if len(steps) <= STEP_LINES:
        assert shown == steps
    else:
        assert len(shown) <= 5 and left > 0
        assert min(sizes) == min(s for _, s in shown) and max(sizes) == max(s for _, s in shown)
        assert sorted(sizes)[len(sizes) // 2] in [s for _, s in shown]
