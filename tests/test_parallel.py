"""Scale-out on Dask: the parallel import and analyze against the single-process paths, byte for
byte and key for key, on a synthetic multi-rank run."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import orjson
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from conftest import CORPUS, ET, corpus
from perfswarm.analyze.critical_path import Segment, State, path_of
from perfswarm.cli.main import main
from perfswarm.errors import PerfswarmError
from perfswarm.trace import store, synthetic
from perfswarm.trace.cluster import ClusterOptions
from perfswarm.trace.ingest import ImportOptions, import_traces
from perfswarm.trace.store import Run

RANKS = 8


@pytest.fixture(scope="module")
def scheduler() -> Iterator[str]:
    """A running two-worker cluster, used through --scheduler ADDRESS."""
    from distributed import LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0", silence_logs=logging.ERROR) as cluster:
        yield cluster.scheduler_address


@pytest.fixture(scope="module", autouse=True)
def small_row_groups() -> Iterator[None]:
    """Row groups of 4,096 rows, so the events span several and a rank's read skips some."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(store, "ROW_GROUP", 4_096)
        yield


@pytest.fixture(scope="module")
def rank_traces(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("ranks")
    return [synthetic.write(root / f"rank{r}.json", 6_000, seed=r, rank=r) for r in range(RANKS)]


def _tables(run: Run) -> dict[str, bytes]:
    return {name: run.table_path(name).read_bytes() for name in run.table_names()}


def _manifest(run: Run) -> dict[str, object]:
    m = dict(run.manifest())
    m.pop("command")
    return m


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory, rank_traces: list[Path]) -> Run:
    return import_traces(rank_traces, tmp_path_factory.mktemp("single") / "r.run",
                         ImportOptions(cluster=ClusterOptions(workers=0)), ["t"])


def test_parallel_import_is_byte_identical(tmp_path: Path, rank_traces: list[Path], single: Run,
                                           scheduler: str) -> None:
    parallel = import_traces(rank_traces, tmp_path / "p.run",
                             ImportOptions(cluster=ClusterOptions(scheduler=scheduler)), ["t"])
    assert single.table_names() == parallel.table_names()
    assert _tables(single) == _tables(parallel)
    assert _manifest(single) == _manifest(parallel)
    assert single.manifest()["ranks"] == list(range(RANKS))
    events = single.table("events", ["rank"]).column("rank").to_pylist()
    assert events == sorted(events) and len(set(events)) == RANKS
    assert not list(tmp_path.glob(".*"))  # no scratch or partial directory left


def test_shared_ranks_and_execution_trace(tmp_path: Path, rank_traces: list[Path],
                                          scheduler: str) -> None:
    """Two files claiming one rank are merged by time; the ET joins the same way."""
    files = [*rank_traces[:3], CORPUS / "execution_trace/benchmark_simple_add_trace.json.gz"]
    ranks = (0, 1, 0, 2)
    runs = [import_traces(files, tmp_path / f"{name}.run",
                          ImportOptions(ranks=ranks, execution_traces=(CORPUS / ET,),
                                        cluster=cluster), ["t"])
            for name, cluster in (("single", ClusterOptions(workers=0)),
                                  ("parallel", ClusterOptions(scheduler=scheduler)))]
    assert _tables(runs[0]) == _tables(runs[1])
    assert _manifest(runs[0]) == _manifest(runs[1])
    warnings = [w["what"] for w in runs[0].manifest()["warnings"]]
    assert "several files claim rank 0" in warnings
    assert runs[0].table("graph_nodes").num_rows > 0


def test_three_paths_one_run(tmp_path: Path, scheduler: str) -> None:
    """In memory, streaming (DuckDB) and Dask, all handing their tables to build.write_tables,
    give the same Run from real corpus traces (with an execution trace joined)."""
    from test_ingest import EXPECTED_FLOWS, EXPECTED_KINDS

    files = [corpus("et_trace"), corpus("nccl")]
    paths = {"memory": ClusterOptions(workers=0), "streaming": ClusterOptions(workers=0),
             "dask": ClusterOptions(scheduler=scheduler)}
    runs = {name: import_traces(files, tmp_path / f"{name}.run", ImportOptions(
        ranks=(0, 1), execution_traces=(CORPUS / ET,), cluster=cluster,
        streaming="always" if name == "streaming" else "never"), ["t"])
        for name, cluster in paths.items()}
    memory = runs["memory"]
    assert _tables(memory) == _tables(runs["dask"])
    assert _manifest(memory) == _manifest(runs["dask"])
    assert memory.table_names() == runs["streaming"].table_names()
    for name in memory.table_names():
        a, b = memory.table(name), runs["streaming"].table(name)
        if name == "events":  # DuckDB writes the same args JSON with its own spacing
            assert a.drop(["args"]).equals(b.drop(["args"]))
            assert ([orjson.loads(x) for x in a.column("args").to_pylist()]
                    == [orjson.loads(x) for x in b.column("args").to_pylist()])
        else:
            assert a.equals(b), name
    events = memory.table("events", ["rank", "kind"]).to_pylist()
    for rank, name in enumerate(("et_trace", "nccl")):
        kinds = Counter(e["kind"] for e in events if e["rank"] == rank)
        assert kinds == EXPECTED_KINDS[name]
    flow_ranks = memory.table("flows", ["rank"]).column("rank").to_pylist()
    assert flow_ranks.count(1) == EXPECTED_FLOWS["nccl"]
    assert memory.table("graph_nodes").num_rows > 0


def test_nsys_exports_on_the_workers(tmp_path: Path, scheduler: str) -> None:
    """Nsight Systems exports are read on the workers too (the readers pick the format), with
    the in-memory path's tables."""
    from test_nsys import export

    files = [export(tmp_path / f"report{r}.sqlite") for r in range(2)]
    said: list[str] = []
    runs = [import_traces(files, tmp_path / f"{name}.run", ImportOptions(cluster=cluster), ["t"],
                          progress=lambda what, _n, _total: said.append(what))
            for name, cluster in (("single", ClusterOptions(workers=0)),
                                  ("parallel", ClusterOptions(scheduler=scheduler)))]
    assert any(w.startswith("reading on") for w in said)  # the second import ran on Dask
    assert _tables(runs[0]) == _tables(runs[1])
    assert _manifest(runs[0]) == _manifest(runs[1])
    ranks = runs[1].table("events", ["rank"]).column("rank").to_pylist()
    assert ranks == [0] * 11 + [1] * 11  # 11 events in each export (test_nsys)


def test_local_cluster_from_the_cli(tmp_path: Path, rank_traces: list[Path], single: Run,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli.run"
    assert main(["import", *map(str, rank_traces), "-o", str(out), "--workers", "2",
                 "--worker-memory", "1GB"]) == 0
    assert "8 file(s)" in capsys.readouterr().out
    assert _tables(Run(out)) == _tables(single)


def test_cluster_errors_are_one_line(tmp_path: Path, rank_traces: list[Path],
                                     capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": [{"ph": "X", "ts": "soon"}]}')
    with pytest.raises(PerfswarmError, match=r"bad\.json \(json\)"):
        import_traces([*rank_traces[:2], bad], tmp_path / "b.run",
                      ImportOptions(cluster=ClusterOptions(workers=1)), ["t"])
    assert not (tmp_path / "b.run").exists() and not list(tmp_path.glob(".b.run*"))
    assert main(["import", str(rank_traces[0]), "-o", str(tmp_path / "c.run"),
                 "--scheduler", "tcp://127.0.0.1:9"]) == 2
    assert "--scheduler tcp://127.0.0.1:9: cannot connect" in capsys.readouterr().err
    assert main(["import", str(rank_traces[0]), "-o", str(tmp_path / "d.run"), "--workers", "1",
                 "--worker-memory", "lots"]) == 2
    assert "--worker-memory lots" in capsys.readouterr().err


def test_when_to_go_parallel() -> None:
    auto = ClusterOptions()
    assert not auto.parallel(7, cores=16) and auto.parallel(8, cores=16)
    # on 2 or 3 cores the local cluster's start-up is not repaid
    assert auto.parallel(8, cores=4) and not auto.parallel(64, cores=3)
    assert not ClusterOptions(workers=0).parallel(64)
    assert ClusterOptions(workers=2).parallel(1)
    assert ClusterOptions(workers=0, scheduler="tcp://h:8786").parallel(1)


def test_analysis_json_is_identical(single: Run, scheduler: str,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    outs = []
    for flags in (["--workers", "0"], ["--scheduler", scheduler]):
        assert main(["analyze", str(single.path), "--json", *flags]) == 0
        outs.append(orjson.loads(capsys.readouterr().out))
    assert outs[0] == outs[1]
    assert outs[0]["ranks"] == list(range(RANKS))
    assert outs[0]["critical_path"]["rank_switches"] > 0
    assert len(outs[0]["critical_path"]["steps"]) == len(outs[0]["iterations"]["steps"]["0"])
    assert outs[0]["stragglers"]["instances"] > 0


def test_subgroups_analyzed_on_the_workers(tmp_path: Path, scheduler: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """Four gloo ranks with subgroups (tests/data/subgroups_gloo.py): each worker reads its
    rank's process groups, and the collectives pair within them as in one process."""
    data = Path(__file__).parent / "data"
    run = import_traces([data / f"subgroups_gloo_rank{r}.pt.trace.json.gz" for r in range(4)],
                        tmp_path / "s.run", ImportOptions(), ["t"])
    outs = []
    for flags in (["--workers", "0"], ["--scheduler", scheduler]):
        assert main(["analyze", str(run.path), "--json", *flags]) == 0
        outs.append(orjson.loads(capsys.readouterr().out))
    assert outs[0] == outs[1]
    assert outs[0]["stragglers"]["instances"] == 12
    assert Counter(w["group"] for w in outs[0]["stragglers"]["worst"]) == {
        None: 6, "1": 3, "2": 3}


@pytest.mark.parametrize("name,ranks", [("p2p_gloo", (0, 1)), ("rpc_named", (1, 2))])
def test_transfers_analyzed_on_the_workers(tmp_path: Path, scheduler: str,
                                           capsys: pytest.CaptureFixture[str], name: str,
                                           ranks: tuple[int, int]) -> None:
    """A pipeline's hand-off on gloo (tests/data/p2p_gloo.py), an RPC trainer and its server
    (rpc_named: tests/data/rpc_server.py): each worker reads its rank's sends and receives, or
    its requests and then its work for them, and the path crosses from a receive to its send,
    a reply to its callee and a callee to its request, as in one process."""
    data = Path(__file__).parent / "data"
    run = import_traces([data / f"{name}_rank{r}.pt.trace.json.gz" for r in ranks],
                        tmp_path / "p.run", ImportOptions(), ["t"])
    outs = []
    for flags in (["--workers", "0"], ["--scheduler", scheduler]):
        assert main(["analyze", str(run.path), "--json", *flags]) == 0
        outs.append(orjson.loads(capsys.readouterr().out))
    assert outs[0] == outs[1]
    assert outs[0]["critical_path"]["rank_switches"] > 0


def test_one_rank_reads_its_row_groups(single: Run) -> None:
    full = single.table("events")
    groups = pq.ParquetFile(single.table_path("events")).num_row_groups
    assert groups == -(-full.num_rows // 4_096) == 6
    for rank in (0, 3, 7):
        mine = single.table("events", ["ts", "name", "args"], rank=rank)
        expected = full.filter(pc.equal(full.column("rank"), rank)).select(["ts", "name", "args"])
        assert mine.to_pylist() == expected.to_pylist()
    assert single.table("events", rank=99).num_rows == 0


def test_path_across_segments_stops_at_the_first_repeat() -> None:
    """The walk goes graph to graph; a state met again, in the same segment or an earlier one,
    ends the path before it, as one walk over every rank would end it."""
    order: list[State] = [(0, "dev", 5, 90), (0, "host", 4, 80), (1, "dev", 9, 85),
                          (1, "host", 8, 70), (0, "host", 4, 80), (0, "dev", 2, 60)]

    def walk_from(state: State, stop: int | None) -> Segment:
        i = order.index(state)
        visited: list[State] = []
        while (i < len(order) and order[i][0] == state[0] and order[i] not in visited
               and (stop is None or len(visited) < stop)):
            visited.append(order[i])
            i += 1
        ns = dict.fromkeys(["cpu"], len(visited))
        return Segment(ns, {}, 0, 0, [], visited, order[i] if i < len(order) else None)

    segments = path_of(order[0], walk_from)
    assert [s.visited for s in segments] == [order[:2], order[2:4]]
    assert segments[-1].next == order[4]  # seen before: the path ends here


def test_one_processs_windows_on_the_workers(tmp_path: Path, scheduler: str) -> None:
    """Files that name no rank are one rank per process, their colliding step numbers moved
    apart, on Dask as in memory (the workers had kept each file's position as its rank)."""
    from test_ingest import window

    files = [window(tmp_path / "a.json", 7, 20.0, 2), window(tmp_path / "b.json", 7, 1020.0, 2),
             window(tmp_path / "c.json", 8, 25.0, 1)]
    runs = [import_traces(files, tmp_path / f"{name}.run", ImportOptions(cluster=cluster), ["t"])
            for name, cluster in (("single", ClusterOptions(workers=0)),
                                  ("parallel", ClusterOptions(scheduler=scheduler)))]
    assert _tables(runs[0]) == _tables(runs[1])
    assert _manifest(runs[0]) == _manifest(runs[1])
    steps = runs[1].table("steps", ["rank", "step"]).to_pylist()
    assert sorted((s["rank"], s["step"]) for s in steps) == [(0, 2), (0, 3), (1, 1)]


def test_two_windows_analyzed_on_the_workers(tmp_path: Path, scheduler: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A rank of two profiling windows: its detected steps after the gap and its whole span's
    breakdown without it, on Dask as in one process."""
    from test_analyze import two_windows

    run = import_traces(two_windows(tmp_path)[0], tmp_path / "r.run", ImportOptions(), ["t"])
    outs = []
    for flags in (["--workers", "0"], ["--scheduler", scheduler]):
        assert main(["analyze", str(run.path), "--json", *flags]) == 0
        outs.append(orjson.loads(capsys.readouterr().out))
    assert outs[0] == outs[1] and outs[0]["concurrency"]["ranks"][0]["total"]["unprofiled_ns"] > 0


def test_optimizers_told_apart_on_the_workers(tmp_path: Path, scheduler: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """tests/data/eval_every2: its one optimizer's calls, told apart from a GAN's two by the
    shapes they update (read from the Run), on Dask as in one process: 12 steps, not 6."""
    trace = Path(__file__).parent / "data" / "eval_every2_cpu.pt.trace.json.gz"
    run = import_traces([trace], tmp_path / "r.run", ImportOptions(), ["t"])
    outs = []
    for flags in (["--workers", "0"], ["--scheduler", scheduler]):
        assert main(["analyze", str(run.path), "--json", *flags]) == 0
        outs.append(orjson.loads(capsys.readouterr().out))
    assert outs[0] == outs[1] and len(outs[1]["iterations"]["steps"]["0"]) == 12
