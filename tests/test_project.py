"""`project`: profile of the A100 DDP corpus trace, the collective-wait simulation, the CLI."""

from __future__ import annotations

import itertools
from pathlib import Path

import orjson
import pytest

from conftest import corpus
from perfswarm.cli.main import main
from perfswarm.errors import ParameterError, PerfswarmError
from perfswarm.model.collectives import RING, CollectiveConfig, collective_time
from perfswarm.model.predict import Change, predict
from perfswarm.model.topology import Topology, interconnect
from perfswarm.optimize.project import (
    Call,
    Choice,
    StepProfile,
    on_device,
    profile,
    project,
    recommend,
    simulate_step,
)
from perfswarm.trace.ingest import ImportOptions, import_traces
from perfswarm.trace.store import Run

NVS, IB = interconnect("nvswitch-a100"), interconnect("ib-ndr")


@pytest.fixture(scope="module")
def nccl(tmp_path_factory: pytest.TempPathFactory) -> Run:
    out = tmp_path_factory.mktemp("project") / "nccl.run"
    return import_traces([corpus("nccl")], out, ImportOptions(), ["test"])


def test_profile_of_ddp_trace(nccl: Run) -> None:
    prof = profile(nccl)
    d = prof.to_dict()
    assert (d["ranks"], d["steps"], d["world"]) == ([0], 3, 2)
    # 2 broadcasts (DDP's buffer sync) and 5 gradient buckets per step
    assert d["collectives_per_step"] == 7
    assert [c.op for c in prof.steps[1].calls] == ["broadcast"] * 2 + ["all_reduce"] * 5
    assert [c.nbytes for c in prof.steps[1].calls][2:] == [8196000, 31502336, 26255360,
                                                           26550272, 9724160]
    assert (d["grad_bytes"], d["grad_bytes_source"]) == (102228128, "collective kernels")
    assert [s.compute_ns for s in prof.steps] == [39391994, 39296837, 39620514]
    assert d["compute_ms"] == pytest.approx(39.391994)
    assert d["overlap_fraction"] == pytest.approx(0.163959, abs=1e-6)
    assert all(0 < c.ready_ns <= s.compute_ns for s in prof.steps for c in s.calls)
    link = prof.measured_link()
    assert link is not None and link.bandwidth_gbps > 0


def test_projection_of_ddp_trace(nccl: Run) -> None:
    result = project(nccl, [1, 2, 8, 16, 256])
    points = result.points
    assert [p.devices for p in points] == [1, 2, 8, 16, 256]
    assert points[0].step_s == pytest.approx(0.039391994) and points[0].comm_s == 0
    assert all(a.efficiency >= b.efficiency for a, b in itertools.pairwise(points))
    assert result.intra.name == "nvswitch-a100"   # from the Run's A100s
    assert len(result.options) == 12
    ps = [c for c in result.options if c.scheme == "ps"]
    assert all(c.efficiency < 0.1 for c in ps)   # one server cannot feed 256 workers
    assert result.recommended.efficiency >= 0.9
    slow = project(nccl, [1, 256], bandwidth_gbps=0.1)
    assert slow.points[-1].efficiency < 0.5 < result.points[-1].efficiency
    assert slow.inter.name == "ib-ndr@0.1GB/s"


def test_collective_waits_for_the_last_rank() -> None:
    call = Call("all_reduce", 100_000_000, 10_000_000, 0, 2)
    late = Call("all_reduce", 100_000_000, 30_000_000, 0, 2)
    fast = StepProfile(0, 1, 0, 40_000_000, 5_000_000, 0, (call,))
    slow = StepProfile(1, 1, 0, 40_000_000, 5_000_000, 0, (late,))
    top = Topology(2, 8, NVS, IB)
    t = collective_time("all_reduce", 100_000_000, top, RING)
    step, comm = simulate_step([fast, slow], top, RING)
    assert comm == pytest.approx(t)
    assert step == pytest.approx(max(0.035, 0.030 + t) + 0.005)
    assert simulate_step([fast], top, RING)[0] == pytest.approx(max(0.035, 0.010 + t) + 0.005)
    assert simulate_step([fast], Topology(1, 8, NVS, IB), CollectiveConfig())[0] == 0.04


def test_recommend_takes_the_slowest_good_network() -> None:
    options = [Choice("eth-100g", "ring", 0.5), Choice("ib-hdr", "ps", 0.2),
               Choice("ib-hdr", "tree", 0.95), Choice("ib-ndr", "ring", 0.99)]
    assert recommend(options) == Choice("ib-hdr", "tree", 0.95)
    assert recommend(options[:2]) == Choice("eth-100g", "ring", 0.5)


def test_run_without_collectives_needs_grad_bytes(tmp_path: Path) -> None:
    run = import_traces([corpus("amd")], tmp_path / "a.run", ImportOptions(), ["t"])
    with pytest.raises(ParameterError, match=r"give the gradient size with grad_bytes$"):
        profile(run)
    prof = profile(run, grad_bytes=1 << 20)
    assert prof.grad_bytes_source == "--grad-bytes"
    assert len(prof.steps) == 1   # one of the three steps ran kernels
    assert all(s.calls[0].ready_ns == s.compute_ns for s in prof.steps)
    assert project(run, [1, 2], grad_bytes=1 << 20).points[1].comm_s > 0


def test_cli_json_and_errors(nccl: Run, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["project", str(nccl.path), "--devices", "1,4", "--scheme", "tree", "--json"]) == 0
    data = orjson.loads(capsys.readouterr().out)
    assert set(data) == {"profile", "measured_link", "intra", "inter", "devices_per_node",
                         "scheme", "points", "options", "recommended"}
    assert data["scheme"] == "tree" and [p["devices"] for p in data["points"]] == [1, 4]
    page = nccl.path.parent / "projection.html"
    assert main(["project", str(nccl.path), "--devices", "1,8", "--html", str(page)]) == 0
    out = capsys.readouterr().out
    assert "choose" in out and f"plots: {page}" in out
    text = page.read_text()
    assert text.startswith("<!DOCTYPE html>") and 'id="chart-scaling"' in text
    assert "<tr><td>8</td>" in text and "<strong>choose</strong>" in text
    assert main(["project", str(nccl.path), "--devices", "0"]) == 2
    assert main(["project", str(nccl.path), "--bandwidth", "-1"]) == 2
    assert main(["project", str(nccl.path), "--devices", "1,x"]) == 2


def test_run_without_step_markers_is_one_iteration(tmp_path: Path) -> None:
    run = import_traces([corpus("old_format")], tmp_path / "o.run", ImportOptions(), ["t"])
    prof = profile(run, grad_bytes=1000)
    assert (prof.whole_run, prof.ranks) == (True, (1,))
    assert [(s.step, s.compute_ns) for s in prof.steps] == [(-1, 30000)]
    cpu = import_traces([corpus("cpu_only")], tmp_path / "c.run", ImportOptions(), ["t"])
    with pytest.raises(PerfswarmError, match="no device kernels"):
        profile(cpu, grad_bytes=1000)


def test_intra_link_from_a_collectives_profile(nccl: Run, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    profile = {"sweep": {"backend": "gloo", "world_size": 2},
               "models": {"all_reduce": {"latency_us": 40.0, "regimes": [
                   {"up_to_bytes": 1 << 20, "bandwidth_gbps": 6.0},
                   {"up_to_bytes": None, "bandwidth_gbps": 2.5}]}}}
    path = tmp_path / "collectives.json"
    path.write_bytes(orjson.dumps(profile))
    assert main(["project", str(nccl.path), "--devices", "1,2,8", "--intra-profile", str(path),
                 "--json"]) == 0
    intra = orjson.loads(capsys.readouterr().out)["intra"]
    # the largest messages' bandwidth: gradient buckets are megabytes
    assert intra["name"] == "measured gloo x2" and intra["latency_us"] == pytest.approx(40.0)
    assert intra["bandwidth_gbps"] == pytest.approx(2.5)
    path.write_text('{"models": {}}')
    assert main(["project", str(nccl.path), "--intra-profile", str(path)]) == 2
    assert "not a collectives profile" in capsys.readouterr().err


def test_compute_predicted_on_another_gpu(nccl: Run) -> None:
    measured = profile(nccl)
    on_h100 = on_device(nccl, measured, "H100-SXM")
    prediction = predict(nccl, Change(device="H100-SXM"))
    ratio = prediction.median_active("predicted") / prediction.median_active("measured")
    assert on_h100.compute_source == "predicted on H100-SXM" and 0.3 < ratio < 0.9
    for before, after in zip(measured.steps, on_h100.steps, strict=True):
        assert after.compute_ns == round(before.compute_ns * ratio)
        assert [c.ready_ns for c in after.calls] == [round(c.ready_ns * ratio)
                                                     for c in before.calls]
    assert project(nccl, [8], device="H100-SXM").to_dict()["profile"]["compute_source"] == \
        "predicted on H100-SXM"
