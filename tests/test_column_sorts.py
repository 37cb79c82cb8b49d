"""The analyses make no hash or set test of a whole column where a lookup or one sort does.

numpy 2.3+'s `np.unique` asked for the values alone takes a hash path: 27 CPU ms for 160k
mostly distinct int64 values, `intervals.sorted_unique` 1.3 ms; `np.isin` took 1.0 ms for a
kind mask of 120k events, a table of flags read at each code (`schema.among`) 0.06 ms. A report
of the 200k-event synthetic trace asked for 161 such masks (docs/benchmarks.md, issue 18's
twenty-fifth pass)."""

from __future__ import annotations

import traceback
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import corpus
from perfswarm.analyze.intervals import sorted_unique
from perfswarm.cli.main import main
from perfswarm.trace.ingest import ImportOptions, import_traces
from perfswarm.trace.schema import among

BIG = 1000  # values in a call that counts as a column's (the NCCL trace: 27k events)


@pytest.fixture(scope="module")
def nccl_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sorts") / "nccl.run"
    return import_traces([corpus("nccl")], out, ImportOptions(), ["test"]).path


@pytest.fixture
def sorts(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """'isin FUNCTION' and 'unique FUNCTION' -> calls over BIG values or more made from
    perfswarm's FUNCTION (np.unique only asked for the values: its hash path)."""
    seen: Counter[str] = Counter()
    isin, unique = np.isin, np.unique

    def caller() -> str | None:
        frame = traceback.extract_stack(limit=3)[0]
        return frame.name if "/perfswarm/" in frame.filename else None

    def counted_isin(values: Any, *args: Any, **kwargs: Any) -> Any:
        if np.size(values) >= BIG and (name := caller()):
            seen[f"isin {name}"] += 1
        return isin(values, *args, **kwargs)

    def counted_unique(values: Any, *args: Any, **kwargs: Any) -> Any:
        plain = not args and not any(kwargs.get(k) for k in (
            "return_index", "return_inverse", "return_counts", "axis"))
        if plain and np.size(values) >= BIG and (name := caller()):
            seen[f"unique {name}"] += 1
        return unique(values, *args, **kwargs)

    monkeypatch.setattr(np, "isin", counted_isin)
    monkeypatch.setattr(np, "unique", counted_unique)
    return seen


@pytest.mark.parametrize("command", ["analyze", "report", "predict", "advise"])
def test_commands_hash_no_column(nccl_run: Path, sorts: Counter[str], command: str,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main([command, str(nccl_run), "--json"]) == 0
    assert capsys.readouterr().out.startswith("{")
    assert {k: n for k, n in sorts.items() if k.startswith("unique")} == {}


def test_kind_and_name_masks_sort_nothing(nccl_run: Path, sorts: Counter[str],
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(nccl_run), "--json"]) == 0
    assert capsys.readouterr().out.startswith("{")
    masks = {"isin of_kind", "isin _named", "isin named_as"}
    assert {k: n for k, n in sorts.items() if k in masks} == {}



@pytest.mark.parametrize("streaming", ["never", "always"])
def test_import_masks_phases_and_kinds_by_lookup(tmp_path: Path, sorts: Counter[str],
                                                 streaming: str) -> None:
    """Each chunk's phase, kind and step-marker masks and the steps' launch and device masks
    are flags read at each code, not np.isin (an import of 200k events had asked for 322,
    30 CPU ms; a chunk is 5,000 events)."""
    import_traces([corpus("nccl")], tmp_path / "t.run", ImportOptions(streaming=streaming),
                  ["test"])
    assert {k: n for k, n in sorts.items() if k.startswith("isin")} == {}


CODES = 40  # a dictionary's size (kinds, names)


@given(st.lists(st.integers(0, CODES - 1), max_size=200),
       st.lists(st.integers(0, CODES - 1), max_size=CODES))
def test_among_is_isin(values: list[int], wanted: list[int]) -> None:
    codes = np.array(values, np.int64)
    assert among(codes, wanted, CODES).tolist() == np.isin(codes, wanted).tolist()


@given(st.lists(st.integers(-2**31, 2**31 - 1), max_size=300))
def test_sorted_unique_is_unique(values: list[int]) -> None:
    for column in (np.array(values, np.int64), np.array(values, np.int32)):
        found = sorted_unique(column)
        assert found.tolist() == np.unique(column).tolist()
        assert found.dtype == column.dtype
