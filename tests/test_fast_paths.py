"""The array forms of per-event loops against the simple forms they replaced, on real traces."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import corpus
from perfswarm.analyze.aisi import NONE, _lookup, _vote
from perfswarm.analyze.dependencies import _LatestEnd
from perfswarm.analyze.frame import Events
from perfswarm.analyze.intervals import DENSE_PER_KEY, covered, key_sums, sorted_unique
from perfswarm.analyze.launch import DEVICE_OPS, launch_pairs
from perfswarm.trace.ingest import ImportOptions, import_traces
from perfswarm.trace.store import _of_rank


def _latest_end_reference(ev: Events, pool: np.ndarray, launch_ts: np.ndarray, t: int
                          ) -> int | None:
    """The pass over the pool per query that `_LatestEnd` replaced."""
    cand = pool[(launch_ts[pool] < t) & (ev.ts[pool] < t)]
    return int(cand[np.argmax(ev.end[cand])]) if len(cand) else None


@pytest.mark.parametrize("name", ["nccl", "event_sync_multi"])
def test_latest_end_matches_a_pass_per_query(name: str, tmp_path: Path) -> None:
    run = import_traces([corpus(name)], tmp_path / "r.run", ImportOptions(), ["test"])
    ev = Events.load(run)
    dev, calls = launch_pairs(ev)
    launch_ts = ev.ts.copy()
    launch_ts[dev] = ev.ts[calls]
    device = np.flatnonzero(ev.of_kind(*DEVICE_OPS))
    # the pools the dependencies ask: a rank's device ops, one stream's (by launch time)
    pools = [device, *(device[ev.stream[device] == s] for s in np.unique(ev.stream[device]))]
    times = np.unique(np.concatenate([ev.ts[device], ev.end[device], launch_ts[device],
                                      ev.end[calls]]))
    times = times[:: max(1, len(times) // 1500)]  # every instant of a small trace
    for unsorted in pools:
        pool = unsorted[np.argsort(launch_ts[unsorted], kind="stable")]
        fast = _LatestEnd(ev, pool, launch_ts)
        answers = [fast.before(int(t)) for t in times]
        assert answers == [_latest_end_reference(ev, pool, launch_ts, int(t)) for t in times]
        assert any(a is not None for a in answers)


def test_rank_rows_are_a_slice_where_contiguous_else_a_filter() -> None:
    table = pa.table({"rank": pa.chunked_array([[0, 0, 1], [1, 2]]),
                      "x": pa.chunked_array([[10, 11, 12], [13, 14]])})
    assert _of_rank(table, table.column("rank"), 1).column("x").to_pylist() == [12, 13]
    assert _of_rank(table, table.column("rank"), 3).num_rows == 0
    mixed = pa.table({"rank": [1, 0, 1], "x": [10, 11, 12]})
    assert _of_rank(mixed, mixed.column("rank"), 1).column("x").to_pylist() == [10, 12]


def _vote_reference(raw: np.ndarray, half: int) -> np.ndarray:
    """The loop over samples that `_vote` replaced."""
    out = raw.copy()
    for i in range(len(raw)):
        around = raw[max(0, i - half):i + half + 1]
        values, counts = np.unique(around, return_counts=True)
        if counts.max() > len(around) // 2:
            out[i] = values[np.argmax(counts)]
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-1, 3), max_size=60), st.integers(0, 4))
def test_vote_matches_the_loop_over_samples(values: list[int], half: int) -> None:
    raw = np.array(values, np.int64)
    assert _vote(raw, half).tolist() == _vote_reference(raw, half).tolist()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 5)), max_size=30),
       st.lists(st.integers(0, 25), max_size=30))
def test_lookup_matches_a_dict(pairs: list[tuple[int, int]], wanted: list[int]) -> None:
    of = dict(pairs)  # the last value given for a key wins, as in the dict it replaced
    keys = np.array([k for k, _ in pairs], np.int64)
    values = np.array([v for _, v in pairs], np.int64)
    found = _lookup(keys, values, np.array(wanted, np.int64))
    assert found.tolist() == [of.get(w, NONE) for w in wanted]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(-5, 40), st.integers(0, 12)), max_size=25),
       st.lists(st.integers(-10, 50), max_size=30))
def test_covered_matches_a_test_per_segment(spans: list[tuple[int, int]],
                                            extra: list[int]) -> None:
    """covered (each interval's bounds searched among the points, then a running count)
    against asking every interval of every segment; the points hold every bound inside
    their range and more (intervals may start before them or end after), and empty or
    reversed intervals cover nothing."""
    bounds = [(s, s + d if d % 5 else s - d) for s, d in spans]
    lo, hi = min(extra, default=0), max(extra, default=0)
    points = sorted_unique(np.array(extra + [x for pair in bounds for x in pair
                                             if lo <= x <= hi], np.int64))
    want = [any(s <= left < e for s, e in bounds) for left in points[:-1].tolist()]
    starts, ends = (np.array([pair[i] for pair in bounds], np.int64) for i in (0, 1))
    assert covered(starts, ends, points).tolist() == want


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(0, 10**12)), max_size=40),
       st.integers(0, 2 * DENSE_PER_KEY))
def test_key_sums_match_a_dict(pairs: list[tuple[int, int]], spare: int) -> None:
    """key_sums (a count over every slot where the keys are dense enough, else a sort)
    against summing into a dict: zero weights kept, slots past every key or keys spread
    over more slots than DENSE_PER_KEY a key either way."""
    sums: dict[int, int] = {}
    for k, w in pairs:
        sums[k] = sums.get(k, 0) + w
    keys, weights = (np.array([p[i] for p in pairs], np.int64) for i in (0, 1))
    size = max(sums, default=-1) + 1 + spare * len(pairs)
    found, total_of = key_sums(keys, weights, size)
    assert (found.tolist(), total_of.tolist()) == (sorted(sums), [sums[k] for k in sorted(sums)])
