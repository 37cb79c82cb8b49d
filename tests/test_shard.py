"""Embedding sharding: cost model, the three plans, YAML input, measured EmbeddingBag check."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfswarm.cli.main import main
from perfswarm.errors import PerfswarmError
from perfswarm.model.embedding import (
    EmbeddingCost,
    Table,
    _harmonic,
    fit_cost,
    hit_fraction,
    lookups,
)
from perfswarm.optimize.shard import (
    STRATEGIES,
    Plan,
    Strategy,
    Workload,
    load_workload,
    measure_plan,
    plan,
    shard,
)
from perfswarm.recorder.bench.embedding import PROBE_BATCHES, calibrate, probe_tables, time_tables

YAML = """\
batch_size: 256
tables:
  - {name: users, rows: 200000, dim: 128, pooling: 10}
  - {name: items, rows: 200000, dim: 64, pooling: 20, distribution: "zipf:1.1"}
  - {name: ads, rows: 50000, dim: 128, pooling: 1}
  - {name: country, rows: 250, dim: 16, pooling: 1}
  - {name: history, rows: 100000, dim: 32, pooling: 50}
  - {name: tags, rows: 5000, dim: 64, pooling: 10}
"""


@pytest.fixture
def tables_yaml(tmp_path: Path) -> Path:
    path = tmp_path / "tables.yaml"
    path.write_text(YAML)
    return path


def names(work: Workload, device_of: tuple[int, ...], d: int) -> list[str]:
    return [t.name for t, k in zip(work.tables, device_of, strict=True) if k == d]


def test_plans_for_two_devices(tables_yaml: Path) -> None:
    work = load_workload(tables_yaml)
    result = shard(work, 2)
    size, lookup, balanced = result.plans
    assert names(work, size.device_of, 0) == ["users"]
    assert names(work, lookup.device_of, 0) == ["history"]
    assert names(work, balanced.device_of, 0) == ["users", "ads", "country", "tags"]
    assert balanced.imbalance < size.imbalance < lookup.imbalance
    assert result.best.strategy == "time_balanced"
    assert balanced.imbalance == pytest.approx(1.0116, abs=1e-4)
    data = result.to_dict()
    assert [p["strategy"] for p in data["plans"]] == list(STRATEGIES)
    assert data["plans"][0]["devices"][0]["bytes"] == 200000 * 128 * 4


def test_hit_fraction() -> None:
    uniform = Table("u", 1 << 20, 64, 1.0)                 # 256 B rows, 4096 fit in 1 MiB
    assert hit_fraction(uniform, 1 << 20) == pytest.approx(4096 / (1 << 20))
    skewed = Table("z", 1 << 20, 64, 1.0, zipf=1.1)
    assert 0.5 < hit_fraction(skewed, 1 << 20) < 1
    assert hit_fraction(Table("s", 100, 4, 1.0), 1 << 20) == 1.0
    exact = sum(k ** -1.1 for k in range(1, 50_001))
    assert _harmonic(50_000, 1.1) == pytest.approx(exact, rel=1e-7)
    assert _harmonic(50_000, 1.0) == pytest.approx(sum(1 / k for k in range(1, 50_001)), rel=1e-7)


TABLES = st.lists(st.builds(Table, st.text("abc", min_size=1), st.integers(1, 10**6),
                            st.integers(1, 256), st.floats(0.1, 100), st.sampled_from([0.0, 1.2])),
                  min_size=1, max_size=12)


@settings(max_examples=50, deadline=None)
@given(TABLES, st.integers(1, 6), st.sampled_from(STRATEGIES))
def test_plan_invariants(tables: list[Table], devices: int, strategy: Strategy) -> None:
    work = Workload(tuple(tables), 128)
    cost = EmbeddingCost()
    p = plan(work, devices, strategy, cost)
    times = [cost.table_time(t, 128) for t in tables]
    assert len(p.device_of) == len(tables) and all(0 <= d < devices for d in p.device_of)
    assert sum(p.device_s) == pytest.approx(sum(times))
    assert p.max_s >= max(sum(times) / devices, *times) - 1e-15
    if strategy == "time_balanced":   # list-scheduling bound
        assert p.max_s <= sum(times) / devices + max(times) + 1e-12
    assert p.imbalance >= 1 - 1e-12


def test_memory_capacity() -> None:
    work = Workload((Table("a", 1000, 100, 1), Table("b", 1000, 100, 1)), 64)   # 400 kB each
    p = plan(work, 2, "lookup_greedy", EmbeddingCost(), memory_bytes=500_000)
    assert sorted(p.device_of) == [0, 1]
    with pytest.raises(PerfswarmError, match="fit on no device"):
        plan(work, 1, "time_balanced", EmbeddingCost(), memory_bytes=500_000)


@pytest.mark.parametrize(("text", "match"), [
    ("tables: []", "non-empty"), ("tables: [{rows: 1}]", "missing 'dim'"),
    ("tables: [{rows: 1, dim: 0}]", "positive"),
    ("tables: [{rows: 1, dim: 4, distribution: pareto}]", "zipf:S"),
    ("[", "invalid YAML"), ("batch_size: 0\ntables: [{rows: 1, dim: 4}]", "batch_size"),
])
def test_bad_tables_yaml(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(text)
    with pytest.raises(PerfswarmError, match=match):
        load_workload(path)


def test_fit_cost_recovers_the_constants_and_the_cache() -> None:
    truth = EmbeddingCost(overhead_s=20e-6, per_bag_s=30e-9, per_lookup_s=4e-9,
                          per_byte_s=0.02e-9, miss_s_per_byte=0.25e-9, miss_exponent=0.25,
                          cache_bytes=1 << 22)
    samples = [(t, b, truth.table_time(t, b)) for t in probe_tables() for b in PROBE_BATCHES]
    got = fit_cost(samples)
    assert got.cache_bytes == truth.cache_bytes
    assert got.to_dict() == pytest.approx(truth.to_dict(), rel=1e-6)
    with pytest.raises(PerfswarmError, match="at least 6"):
        fit_cost(samples[:4])


def test_lookups_and_empty_bags() -> None:
    assert lookups(Table("t", 100, 8, 0.25), 64) == 16      # optional feature: empty bags
    assert lookups(Table("t", 100, 8, 0.001), 64) == 1
    assert lookups(Table("t", 100, 8, 30), 256) == 7680


def test_predictions_track_measured_embedding_bags(tables_yaml: Path) -> None:
    """The cost model fitted to this machine's probe tables, on tables it never saw (one
    process per device): the device it gives 5.3 times the gathered bytes (users, items and
    history: 4,160 elements a bag against 784) is priced at least twice as heavy, and measures
    heavier. Not five times: each device's three tables carry the same per-table overhead,
    which pulls the ratio under the bytes' (a clean-clone CI run priced it 3.77x). How close
    the times are is benchmarks/shard.py's figure: a shared machine's load makes it no test."""
    work = load_workload(tables_yaml)
    cost = calibrate(iters=5)
    device_of = (0, 0, 1, 1, 0, 1)   # users, items, history | ads, country, tags
    times = [cost.table_time(t, work.batch) for t in work.tables]
    split = Plan("size_greedy", device_of,
                 tuple(sum(t for t, d in zip(times, device_of, strict=True) if d == k)
                       for k in range(2)))
    assert split.device_s[0] > 2 * split.device_s[1]
    measured = measure_plan(work, split, iters=10)
    assert measured[0] > measured[1] > 0


def test_timing_leaves_torchs_thread_count_as_it_was() -> None:
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert time_tables([Table("small", 100, 8, 2.0)], 16, iters=2) > 0
        assert torch.get_num_threads() == 2  # timed on one thread, then given back
    finally:
        torch.set_num_threads(saved)


def test_measurement_needs_a_torch_dtype() -> None:
    with pytest.raises(PerfswarmError, match="dtype_bytes 1"):
        time_tables([Table("int8", 10, 4, 1.0, dtype_bytes=1)], 8)


def test_cli(tables_yaml: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["shard", "--tables", str(tables_yaml), "--devices", "3", "--json"]) == 0
    data = orjson.loads(capsys.readouterr().out)
    assert set(data) == {"devices", "batch_size", "tables", "cost_model", "plans", "best"}
    assert data["devices"] == 3 and len(data["plans"][2]["devices"]) == 3
    assert main(["shard", "--tables", str(tables_yaml), "--devices", "2"]) == 0
    assert "choose time_balanced" in capsys.readouterr().out
    assert main(["shard", "--tables", str(tables_yaml.parent / "nope.yaml"), "--devices", "2"]) == 2
    assert main(["shard", "--tables", str(tables_yaml), "--devices", "0"]) == 2
