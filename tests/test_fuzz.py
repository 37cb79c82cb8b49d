"""Fuzzing the trace readers: any input gives a Run or the typed error (exit 2), nothing else."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import corpus
from fuzz_cases import cases
from perfswarm.errors import PerfswarmError
from perfswarm.trace.ingest import ImportOptions, import_traces

SMALL = [corpus(n) for n in ("event_sync", "compare_base", "old_format", "triton", "amd")]


def _import(path: Path, streaming: str = "never") -> None:
    try:
        import_traces([path], path.with_suffix(".run"),
                      ImportOptions(streaming=streaming), ["fuzz"])  # type: ignore[arg-type]
    except PerfswarmError as exc:
        assert exc.exit_code == 2
        assert "\n" not in str(exc)
        assert not path.with_suffix(".run").exists()


@pytest.mark.parametrize("streaming", ["never", "always"])
def test_mutated_corpus(tmp_path: Path, streaming: str) -> None:
    for name, data in cases(SMALL, 60 if streaming == "never" else 25, seed=7):
        path = tmp_path / name
        path.write_bytes(data)
        _import(path, streaming)


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
def test_arbitrary_bytes(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.json"
        path.write_bytes(data)
        _import(path)
