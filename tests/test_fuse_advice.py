"""advise's conv_fusion rule: a pair of the run is recommended only where fuse measured it
faster fused on this machine, with the measured figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from perfswarm.optimize.advise import advise
from perfswarm.optimize.fuse.tune import median_interval
from perfswarm.trace.ingest import ImportOptions, import_traces
from perfswarm.trace.store import host_info
from perfswarm.userfiles import write_json

CNN = Path(__file__).parent / "data" / "cnn_cpu_trace.json"
GAINS = "dw3x3 -> pw N=2 C=8 H=16 W=16 K=16"
LOSES = "pw -> dw3x3/s2 N=2 C=8 H=16 W=16 K=16"


def _entry(pair: str, torch_ms: float, fused_ms: float, confirmed: bool = True
           ) -> dict[str, object]:
    speedup = torch_ms / fused_ms
    schedule = {"tile_rows": 4, "tile_cols": 16, "split": "serial", "gemm": "blas"}
    result = {
        "pair": pair, "speedup": speedup, "recommended": speedup >= 1.05, "schedule": schedule,
        "speedup_interval": [speedup * 0.9, speedup * 1.1],
        "torch_separate_ms": {"min_ms": torch_ms, "median_ms": torch_ms},
        "fused_ms": {"min_ms": fused_ms, "median_ms": fused_ms}}
    if confirmed:
        result["confirmation_interval"] = [speedup * 0.8, speedup * 1.2]
    return {"fused": schedule, "first": schedule, "second": schedule, "result": result}


def test_recommends_only_measured_gains(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = import_traces([CNN], tmp_path / "cnn.run", ImportOptions(), ["test"])
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert not [a for a in advise(run).advice if a.rule == "conv_fusion"]  # nothing measured
    # nor is the rank's op table built for it (25 MB at 200k events): no rule reads it then
    assert not run.holds(("rank_ops", 0))
    cpu = str(host_info()["cpu_model"])
    (tmp_path / "cache" / "perfswarm").mkdir(parents=True)
    write_json(tmp_path / "cache" / "perfswarm" / "fuse-schedules.json", {"version": 1, "pairs": {
        f"{GAINS} threads=1 cpu={cpu}": _entry(GAINS, 0.30, 0.20),
        f"{LOSES} threads=1 cpu={cpu}": _entry(LOSES, 0.30, 0.40),
        f"{LOSES} threads=1 cpu=another CPU": _entry(LOSES, 0.30, 0.10),
        # stored before a gain had to hold in a second, separate measurement: not taken
        f"{LOSES} threads=2 cpu={cpu}": _entry(LOSES, 0.30, 0.10, confirmed=False)}})
    (found,) = [a for a in advise(run).advice if a.rule == "conv_fusion"]
    (pair,) = found.evidence["pairs"]
    assert (pair["pair"], pair["per_iteration"], pair["speedup"]) == (GAINS, 1, 1.5)
    assert pair["speedup_interval"] == pytest.approx([1.35, 1.65])
    assert pair["confirmation_interval"] == pytest.approx([1.2, 1.8])
    # one profiled iteration on one rank: 0.1 ms saved
    assert found.gain_ns == 100_000


def test_median_interval() -> None:
    """The sign test's order statistics: 15 rounds give the 4th smallest to the 4th largest,
    coverage 1 - 2 (1 + 15 + 105 + 455) / 2**15; 7 rounds the whole range (1 - 2 / 2**7);
    under 6 values no interval reaches 95% and its real coverage is said."""
    rounds = [1.3, 0.9, 1.2, 1.1, 1.05, 1.4, 0.95, 1.25, 1.15, 1.01, 1.5, 0.8, 1.35, 1.02, 1.12]
    assert median_interval(rounds) == (1.01, 1.3, pytest.approx(1 - 2 * 576 / 2**15))
    assert median_interval(rounds[:7]) == (0.9, 1.4, 1 - 2 / 2**7)
    assert median_interval([2.0, 1.0, 3.0]) == (1.0, 3.0, 0.75)
