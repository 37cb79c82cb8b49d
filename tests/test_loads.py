"""One load per command: each column of a Run's tables is read once, the analysis made once."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from conftest import corpus
from perfswarm.analyze import summary
from perfswarm.cli.main import main
from perfswarm.report.data import report_data
from perfswarm.trace.ingest import ImportOptions, import_traces
from perfswarm.trace.store import Run

LOADER = Path(__file__).parent / "data" / "loader_cpu_w0_main.pt.trace.json.gz"
CONV1D_H200 = Path(__file__).parent / "data" / "conv1d_h200.pt.trace.json.gz"


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Counter[tuple[str, str]]:
    """(table, column) -> how many times Parquet was read for it."""
    counted: Counter[tuple[str, str]] = Counter()
    read_table = pq.read_table
    init, read, read_row_groups = (pq.ParquetFile.__init__, pq.ParquetFile.read,
                                   pq.ParquetFile.read_row_groups)

    def counting_read_table(source: Any, *args: Any, columns: list[str] | None = None,
                            **kwargs: Any) -> Any:
        table = read_table(source, *args, columns=columns, **kwargs)
        counted.update((Path(source).stem, c) for c in table.column_names)
        return table

    def named_init(self: pq.ParquetFile, source: Any, *args: Any, **kwargs: Any) -> None:
        init(self, source, *args, **kwargs)
        self.counted_as = (
            Path(source).stem if isinstance(source, str | Path) else "")

    def counting(method: Any) -> Any:
        def counted_read(self: pq.ParquetFile, *args: Any, **kwargs: Any) -> Any:
            table = method(self, *args, **kwargs)
            counted.update((self.counted_as, c)
                           for c in table.column_names)
            return table
        return counted_read

    monkeypatch.setattr(pq, "read_table", counting_read_table)
    monkeypatch.setattr(pq.ParquetFile, "__init__", named_init)
    monkeypatch.setattr(pq.ParquetFile, "read", counting(read))
    monkeypatch.setattr(pq.ParquetFile, "read_row_groups", counting(read_row_groups))
    return counted


@pytest.fixture(scope="module")
def added_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("loads") / "simple_add.run"
    return import_traces([corpus("simple_add")], out, ImportOptions(), ["test"]).path


def test_report_reads_each_column_once(added_run: Path, reads: Counter[tuple[str, str]],
                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(added_run), "--json"]) == 0
    assert '"timeline"' in capsys.readouterr().out
    # every step read events: analysis, advice, op costs, prediction, projection, timeline;
    # what they read of the args is in `detail` (no memory events here: no args read)
    read = {c for t, c in reads if t == "events"}
    assert {"ts", "dur", "kind", "name", "detail", "external_id"} <= read
    assert "args" not in read
    assert {k: n for k, n in reads.items() if n > 1} == {}


def test_demo_steps_share_one_analysis(added_run: Path, reads: Counter[tuple[str, str]],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    made = Counter[bool]()
    make = summary._analyze

    def counting(run: Run, ignore_markers: bool) -> summary.Analysis:
        made[ignore_markers] += 1
        return make(run, ignore_markers)

    monkeypatch.setattr(summary, "_analyze", counting)
    run = Run.open(added_run)
    analysis = summary.analyze(run)  # as `demo` does, before it writes the report
    data = report_data(run)
    assert made == {False: 1}
    assert data["concurrency"] == analysis.concurrency.to_dict()
    assert reads[("events", "ts")] == 1


def test_report_reads_the_batch_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    """The samples per step (overview.throughput) are read once per report: its cards and
    the per-sample advice read the same."""
    from perfswarm.report import overview

    run = import_traces([LOADER], tmp_path / "loader.run", ImportOptions(), ["test"])
    made = Counter[str]()
    read = overview._from_embedding  # throughput's first source, each time it is made
    monkeypatch.setattr(overview, "_from_embedding",
                        lambda *a: (made.update(["rates"]), read(*a))[1])
    assert main(["report", str(run.path), "--json"]) == 0
    assert '"samples_per_step": 16.0' in capsys.readouterr().out
    assert made == {"rates": 1}


def test_report_finds_the_iterations_once(added_run: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """The iterations are found once per report: the analysis and the prediction's graph
    read the same."""
    from perfswarm.analyze import iterations

    made = Counter[str]()
    detect = iterations.detected_steps
    monkeypatch.setattr(iterations, "detected_steps",
                        lambda *a: (made.update(["detected"]), detect(*a))[1])
    assert main(["report", str(added_run), "--json"]) == 0
    assert '"prediction": {' in capsys.readouterr().out
    assert made == {"detected": 1}


def test_shapes_parsed_once_a_text(added_run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The recorded shapes of a Run's rows are parsed once a distinct text: every iteration
    records the same shapes again."""
    from perfswarm.analyze.frame import Events, detail_of
    from perfswarm.model import opstats

    run = Run.open(added_run)
    rows = np.flatnonzero(Events.load(run).of_kind("cpu_op"))
    texts = detail_of(run, rows)
    parsed = Counter[str]()
    parse = opstats.shapes_from_args
    monkeypatch.setattr(opstats, "shapes_from_args",
                        lambda text: (parsed.update([text]), parse(text))[1])
    assert opstats.RowShapes.of(run).get(rows) == [parse(t) for t in texts]
    assert len(parsed) == len(set(texts)) < len(rows)
    assert set(parsed.values()) == {1}
    # rows in any order, repeated, some read already: each row's own shapes, one index a
    # distinct text parsed (no dict by row), each parsed once a call (the two calls below)
    fresh = opstats.RowShapes(run)
    fresh.get(rows[::2])
    shuffled = np.random.default_rng(0).permutation(np.concatenate([rows, rows[:5]]))
    found, index = fresh.indexed(shuffled)
    want = dict(zip(rows.tolist(), texts, strict=True))
    assert [found[i] for i in index.tolist()] == [parse(want[r]) for r in shuffled.tolist()]
    assert len(found) <= 2 * len(set(texts)) and set(parsed.values()) == {3}


def test_op_costs_cost_each_shapes_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                        ) -> None:
    """The op table costs each distinct (name, recorded shapes) once and hashes no Shapes per
    row: every iteration records its ops' shapes again (31.7k costed ops of 288 pairs at 200k
    events had cost a cache lookup each, a Shapes hash walking all its tuples)."""
    from perfswarm.analyze.frame import Events
    from perfswarm.model import opstats
    from perfswarm.model.opcost import Shapes, has_cost_model, shapes_cost

    path = import_traces([CONV1D_H200], tmp_path / "conv1d.run", ImportOptions(), ["test"]).path
    run = Run.open(path)
    ev = Events.load(run)
    rows = np.flatnonzero(ev.of_kind("cpu_op"))
    want = {}  # the reference: each row costed alone
    pairs = set()  # the distinct (name, shapes) of the modelled ops
    for row, name, found in zip(rows.tolist(), ev.name[rows].tolist(),
                                opstats.RowShapes.of(run).get(rows), strict=True):
        if found is None or not has_cost_model(ev.names[name]):
            continue
        pairs.add((name, found))
        if (cost := shapes_cost(ev.names[name], found)) is not None:
            want[row] = (cost, found)
    costed, hashed = Counter[str](), Counter[str]()
    monkeypatch.setattr(opstats, "shapes_cost", lambda name, found: (
        costed.update([name]), shapes_cost(name, found))[1])
    shapes_hash = Shapes.__hash__
    monkeypatch.setattr(Shapes, "__hash__", lambda self: (
        hashed.update(["hash"]), shapes_hash(self))[1])
    fresh = Run.open(path)
    table = opstats.op_costs(fresh, [0], top=len(want))
    assert sum(costed.values()) == len(pairs) < len(want)
    assert sum(hashed.values()) <= len(pairs)
    assert opstats.costed_ops(fresh, Events.load(fresh)) == want
    owned, owner = opstats._counted_ops(ev, opstats.costed_rows(fresh, Events.load(fresh)))
    counted = owned[owned == owner]
    assert sum(op.count for op in table.ops) == len(counted) > len(table.ops)
    assert {(op.name, op.flops) for op in table.ops} == {
        (ev.names[int(ev.name[row])], want[row][0].flops) for row in counted.tolist()}


def test_advise_makes_what_rules_share_once(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """host.contended (read by cpu_contention, thread_oversubscription and the loader's plan)
    and loader.loader_plan (read by data_loading and loader_oversubscription) are made once
    per advise, not by each rule that reads them."""
    from perfswarm.optimize.advise import advise
    from perfswarm.optimize.rules import host, loader

    run = import_traces([LOADER], tmp_path / "loader.run", ImportOptions(), ["test"])
    manifest = run.manifest()
    manifest["host"]["cores"] = 2
    manifest["extra"] = {"record": {"threads": [8]}}  # more threads than cores
    run.write_manifest(manifest)
    contention, plans = Counter[bool](), Counter[str]()
    over, per_rank = host._contention, loader._workers_per_rank
    monkeypatch.setattr(host, "_contention", lambda facts, timed: (
        contention.update([timed]), over(facts, timed))[1])
    monkeypatch.setattr(loader, "_workers_per_rank", lambda facts: (
        plans.update(["plan"]), per_rank(facts))[1])
    found = {a.rule for a in advise(Run.open(run.path)).advice}
    assert "data_loading" in found and "thread_oversubscription" in found
    # one contended: over the profiled steps and over every timed step; one plan
    assert contention == {False: 1, True: 1}
    assert plans == {"plan": 1}


def test_launches_joined_once_a_frame(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each device op's launch call is joined once per Events object: the launch statistics,
    the scopes, the dependencies and the op table's launching ops had each joined them (4
    joins of 40k kernels at 200k events). A rank's launches are its own rows' join."""
    from perfswarm.analyze import launch
    from perfswarm.analyze.frame import Events
    from perfswarm.model.opstats import op_costs

    join = launch._launch_pairs
    joined = Counter[int]()
    monkeypatch.setattr(launch, "_launch_pairs", lambda ev: (joined.update([id(ev)]),
                                                             join(ev))[1])
    run = import_traces([CONV1D_H200], tmp_path / "conv1d.run", ImportOptions(), ["test"])
    result = summary.analyze(run)
    costs = op_costs(run, result.ranks)
    assert list(joined.values()) == [1]
    assert costs.kernels and result.scopes.to_dict() and result.launch[0].launched > 0
    two = import_traces([corpus("compare_base"), corpus("compare_test")], tmp_path / "two.run",
                        ImportOptions(ranks=(0, 1)), ["test"])
    ev = Events.load(two)
    dev, calls = launch.launch_pairs(ev)
    assert ev.ranks == [0, 1]
    for rank in ev.ranks:
        rows = ev.rank_slice(rank)
        alone = join(ev.select(rows))
        mine = ev.rank[dev] == rank
        assert len(alone[0]) > 0
        assert np.array_equal(dev[mine], alone[0] + rows.start)
        assert np.array_equal(calls[mine], alone[1] + rows.start)
    assert [s.launched for s in summary.analyze(two).launch] == [
        int(np.count_nonzero(ev.rank[dev] == rank)) for rank in ev.ranks]


def test_op_table_makes_no_dict_of_costed_rows(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The op table counts and sums the costed ops by array (their rows, each one's distinct
    (cost, shapes)): no dict of them by row is made for it (31.7k rows at 200k events; the
    advice's rules make one, reading them a row at a time). Its FLOPs are each counted op's
    cost's, its groups' counts those of the counted ops."""
    from perfswarm.analyze.frame import Events
    from perfswarm.model import opstats

    run = import_traces([CONV1D_H200], tmp_path / "conv1d.run", ImportOptions(), ["test"])
    by_row = Counter[str]()
    costed_ops = opstats.costed_ops
    monkeypatch.setattr(opstats, "costed_ops", lambda *args: (by_row.update(["dict"]),
                                                              costed_ops(*args))[1])
    table = opstats.op_costs(run, [0], top=1000)
    assert not by_row
    ev = Events.load(run)
    costed = costed_ops(run, ev)
    owned, owner = opstats._counted_ops(ev, opstats.costed_rows(run, ev))
    counted = owned[owned == owner].tolist()
    assert len(counted) == sum(op.count for op in table.ops) > 0
    assert sum(table.phase_flops.values()) == pytest.approx(
        sum(costed[row][0].flops for row in counted), rel=1e-12)
