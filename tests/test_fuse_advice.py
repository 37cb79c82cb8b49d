"""advise's conv_fusion rule: a pair of the run is recommended only where fuse measured it
faster fused on this machine, with the measured figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from perfswarm.optimize.advise import advise
from perfswarm.trace.ingest import ImportOptions, import_traces
from perfswarm.trace.store import host_info
from perfswarm.userfiles import write_json

CNN = Path(__file__).parent / "data" / "cnn_cpu_trace.json"
GAINS = "dw3x3 -> pw N=2 C=8 H=16 W=16 K=16"
LOSES = "pw -> dw3x3/s2 N=2 C=8 H=16 W=16 K=16"


def _entry(pair: str, torch_ms: float, fused_ms: float) -> dict[str, object]:
    speedup = torch_ms / fused_ms
    schedule = {"tile_rows": 4, "tile_cols": 16, "split": "serial", "gemm": "blas"}
    return {"fused": schedule, "first": schedule, "second": schedule, "result": {
        "pair": pair, "speedup": speedup, "recommended": speedup >= 1.05, "schedule": schedule,
        "torch_separate_ms": {"min_ms": torch_ms, "median_ms": torch_ms},
        "fused_ms": {"min_ms": fused_ms, "median_ms": fused_ms}}}


def test_recommends_only_measured_gains(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = import_traces([CNN], tmp_path / "cnn.run", ImportOptions(), ["test"])
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert not [a for a in advise(run).advice if a.rule == "conv_fusion"]  # nothing measured
    cpu = str(host_info()["cpu_model"])
    (tmp_path / "cache" / "perfswarm").mkdir(parents=True)
    write_json(tmp_path / "cache" / "perfswarm" / "fuse-schedules.json", {"version": 1, "pairs": {
        f"{GAINS} threads=1 cpu={cpu}": _entry(GAINS, 0.30, 0.20),
        f"{LOSES} threads=1 cpu={cpu}": _entry(LOSES, 0.30, 0.40),
        f"{LOSES} threads=1 cpu=another CPU": _entry(LOSES, 0.30, 0.10)}})
    (found,) = [a for a in advise(run).advice if a.rule == "conv_fusion"]
    (pair,) = found.evidence["pairs"]
    assert (pair["pair"], pair["per_iteration"], pair["speedup"]) == (GAINS, 1, 1.5)
    # one profiled iteration on one rank: 0.1 ms saved
    assert found.gain_ns == 100_000
