"""Export -> import round trip: a Run exported as Chrome trace JSON imports to the same tables."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import corpus
from perfswarm.report import perfetto
from perfswarm.trace.ingest import ImportOptions, import_traces
from perfswarm.trace.store import Run

CATEGORIES = ("cpu_op", "user_annotation", "cuda_runtime", "kernel", "gpu_memcpy", "gpu_memset",
              "cuda_sync", "python_function", "cuda_driver", "gpu_user_annotation")
DEVICE = {"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"}
NAMES = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=20)


@st.composite
def traces(draw: st.DrawFn) -> dict[str, object]:
    events = []
    for i in range(draw(st.integers(1, 30))):
        cat = draw(st.sampled_from(CATEGORIES))
        ts_ns = draw(st.integers(0, 10**15))
        event: dict[str, object] = {
            "ph": "X", "cat": cat, "name": draw(NAMES),
            "pid": 0 if cat in DEVICE else 100, "tid": 7 if cat in DEVICE else 101,
            "ts": float(f"{ts_ns // 1000}.{ts_ns % 1000:03d}"),
            "dur": draw(st.integers(0, 10**9)) / 1000,
            "args": {"External id": i, "correlation": draw(st.integers(0, 50))},
        }
        if cat in DEVICE:
            event["args"] = {**event["args"], "device": 0, "stream": 7}  # type: ignore[dict-item]
        events.append(event)
    steps = draw(st.integers(0, 3))
    for s in range(steps):
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s}",
                       "pid": 100, "tid": 101, "ts": float(s * 10**9), "dur": 10.0**6,
                       "args": {}})
    return {"traceEvents": events, "baseTimeNanoseconds": 1_700_000_000_000_000_000,
            "distributedInfo": {"rank": 0}}


def _comparable(run: Run, name: str) -> list[dict[str, object]]:
    rows = run.table(name).to_pylist()
    for r in rows:
        for column in ("args", "detail"):  # the same JSON, spaced as its writer spaced it
            if column in r:
                r[column] = json.loads(r[column])
    return rows


def _assert_same(a: Run, b: Run) -> None:
    for name in ("events", "steps", "flows", "counters"):
        left, right = _comparable(a, name), _comparable(b, name)
        if name == "events":
            for row in (*left, *right):
                for column in ("args", "detail"):
                    row[column] = {k: v for k, v in row[column].items()  # type: ignore[union-attr]
                                   if k not in perfetto.EXPORTED_ARG_KEYS}
        assert left == right, name


@settings(max_examples=25, deadline=None)
@given(traces())
def test_round_trip_of_generated_traces(trace: dict[str, object]) -> None:
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        src = tmp / "in.json"
        src.write_text(json.dumps(trace))
        a = import_traces([src], tmp / "a.run", ImportOptions(), ["t"])
        out = perfetto.write(a, tmp / "out.json.gz")
        b = import_traces([out], tmp / "b.run", ImportOptions(), ["t"])
        _assert_same(a, b)


def test_round_trip_of_a_real_trace(tmp_path: Path) -> None:
    a = import_traces([corpus("simple_add")], tmp_path / "a.run", ImportOptions(), ["t"])
    out = perfetto.write(a, tmp_path / "out.json.gz")
    b = import_traces([out], tmp_path / "b.run", ImportOptions(), ["t"])
    _assert_same(a, b)
    assert b.table("events").num_rows == 840
