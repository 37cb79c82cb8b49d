"""The host/GPU copy bandwidth matrix of `calibrate --collectives`: its assembly from a fake
copier, the guard on machines with fewer than 2 GPUs (this one has none), the profile and the
table it makes, and `project --intra-profile` taking its slowest GPU pair. The torch.cuda copier
itself is unverified: no GPU here."""

from __future__ import annotations

import itertools
from pathlib import Path

import orjson
import pytest

from perfswarm.cli.main import main
from perfswarm.errors import PerfswarmError
from perfswarm.model.bandwidth_matrix import BandwidthMatrix, measure_matrix
from perfswarm.model.collective_fit import Measurement, Sweep, calibration, link_of_profile
from perfswarm.recorder.bench.bandwidth import gpu_count, gpu_matrix

# GB/s of a DGX-1-like box, host and 3 GPUs: PCIe to and from the host, NVLink between GPUs
# except one pair that goes through the host
TRUE = {("host", "cuda:0"): 12.0, ("host", "cuda:1"): 12.0, ("host", "cuda:2"): 11.0,
        ("cuda:0", "host"): 13.0, ("cuda:1", "host"): 13.0, ("cuda:2", "host"): 10.0,
        ("cuda:0", "cuda:1"): 48.0, ("cuda:1", "cuda:0"): 48.0, ("cuda:0", "cuda:2"): 9.0,
        ("cuda:2", "cuda:0"): 9.5, ("cuda:1", "cuda:2"): 46.0, ("cuda:2", "cuda:1"): 47.0}


class FakeCopy:
    """Each pair's copies: the true time, then slower ones (other load only adds time)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, int]] = []
        self.slow = itertools.cycle([1.0, 1.5, 3.0])

    def __call__(self, src: str, dst: str, nbytes: int) -> float:
        self.calls.append((src, dst, nbytes))
        return nbytes / (TRUE[src, dst] * 1e9) * next(self.slow)


def fake_matrix() -> BandwidthMatrix:
    return measure_matrix(FakeCopy(), 3, nbytes=1 << 20, repeats=3)


def test_matrix_from_a_fake_copier() -> None:
    copy = FakeCopy()
    m = measure_matrix(copy, 3, nbytes=1 << 20, repeats=3)
    assert m.nodes == ("host", "cuda:0", "cuda:1", "cuda:2") and m.nbytes == 1 << 20
    assert len(copy.calls) == 12 * 3 and {c[2] for c in copy.calls} == {1 << 20}
    for i, src in enumerate(m.nodes):
        for j, dst in enumerate(m.nodes):
            expected = None if src == dst else TRUE[src, dst]  # the best of the three copies
            assert m.gbps[i][j] == pytest.approx(expected)
    assert sorted(m.between_devices()) == pytest.approx(sorted(
        v for (a, b), v in TRUE.items() if "host" not in (a, b)))
    again = BandwidthMatrix.from_dict(orjson.loads(orjson.dumps(m.to_dict())), "p.json")
    assert again == m


def test_fewer_than_two_gpus_is_refused() -> None:
    assert gpu_count() == 0  # this VM
    with pytest.raises(PerfswarmError, match=r"^bandwidth matrix: needs at least 2 GPUs, found 0$"):
        gpu_matrix()
    with pytest.raises(PerfswarmError, match="found 1"):
        measure_matrix(FakeCopy(), 1)
    with pytest.raises(PerfswarmError, match="not square"):
        BandwidthMatrix.from_dict({"nodes": ["host", "cuda:0"], "bytes": 1,
                                   "gbps": [[None, 1.0]]}, "p.json")


def _sweep() -> Sweep:
    """A sweep of one all-reduce link: 20 us and 4 GB/s, in the fitted model's terms."""
    rows = tuple(Measurement("all_reduce", n, 20e-6 + n / 4e9) for n in
                 (1 << 10, 1 << 14, 1 << 18, 1 << 22, 1 << 24))
    return Sweep("nccl", 2, 2, rows)


def test_calibrate_writes_and_prints_the_matrix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    # the command imports both when it runs
    monkeypatch.setattr("perfswarm.recorder.bench.collectives.sweep", lambda **_: _sweep())
    out = tmp_path / "c.json"
    # no GPUs here: the sweep's profile, and a line that says why there is no matrix
    assert main(["calibrate", "--collectives", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "bandwidth matrix: needs at least 2 GPUs, found 0 (not measured)" in printed
    data = orjson.loads(out.read_bytes())
    assert data["bandwidth_matrix"] is None
    assert data["bandwidth_matrix_note"] == "bandwidth matrix: needs at least 2 GPUs, found 0"
    monkeypatch.setattr("perfswarm.recorder.bench.bandwidth.gpu_matrix", fake_matrix)
    assert main(["calibrate", "--collectives", "-o", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    row = next(line for line in lines if line.startswith("│ cuda:0"))
    assert [c.strip() for c in row.split("│")[2:6]] == ["13.0", "-", "48.0", "9.0"]
    data = orjson.loads(out.read_bytes())
    assert data["bandwidth_matrix"] == fake_matrix().to_dict()
    # project's intra link: the all-reduce's latency, the slowest GPU pair's bandwidth
    link = link_of_profile(data, "c.json")
    assert link.bandwidth_gbps == pytest.approx(9.0) and link.name.endswith("slowest GPU pair")
    plain = link_of_profile(calibration(_sweep()), "c.json")
    assert link.alpha_s == plain.alpha_s and plain.bandwidth_gbps != pytest.approx(9.0)
