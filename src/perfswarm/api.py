"""The Python API behind `import perfswarm`: a Run and what can be asked of it, for notebooks.

`perfswarm.load(path)`, `perfswarm.import_traces(paths, out=...)` and `perfswarm.record(cmd)`
give a `Run`; `run.analyze()`, `run.predict(...)`, `run.advise()` and `run.project(...)` give a
`Result` (the library's frozen dataclass in `.value`, `.to_dict()` as the CLI's `--json`,
`.to_polars(table)` / `.to_pandas(table)` for one of its tables); `run.report(path)` writes the
HTML report and `run.sql(query)` gives a polars DataFrame. The functions here only translate
Python arguments into the library's options: each stage does its own work, as the CLI has it do.
Errors are `perfswarm.PerfswarmError` (bad arguments: `perfswarm.ParameterError`, which names
the parameter). Every public function here is `@checked` (arguments.py): its type hints are the
contract, each argument conformed to its hint or refused before the function runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Literal, Protocol, TypeVar

from perfswarm.arguments import checked
from perfswarm.errors import ParameterError, PerfswarmError
from perfswarm.trace import store

if TYPE_CHECKING:
    import polars as pl

    from perfswarm.analyze.analysis import Analysis
    from perfswarm.model.hostcosts import HostCosts
    from perfswarm.model.predict import Prediction
    from perfswarm.optimize.advise import AdviceReport
    from perfswarm.optimize.project import Projection

PathLike = str | Path
Rows = list[dict[str, Any]]


class _Dictable(Protocol):
    def to_dict(self) -> Mapping[str, Any]: ...


V_co = TypeVar("V_co", bound=_Dictable, covariant=True)


@dataclass(frozen=True)
class _Table:
    """A list of records in a result's dict, and its columns: `name:type` words (type i64,
    f64, str, bool, strs: a list of str, or nested: a struct or a list of them), so that a
    table with no records still has them."""

    rows: Callable[[Mapping[str, Any]], Rows]
    columns: str

    def schema(self) -> dict[str, Any]:
        import polars as pl

        types = {"i64": pl.Int64, "f64": pl.Float64, "str": pl.String, "bool": pl.Boolean,
                 "strs": pl.List(pl.String), "nested": pl.Null}
        return {name: types[kind] for name, kind in
                (word.split(":") for word in self.columns.split())}


def _node(data: Mapping[str, Any], keys: tuple[str, ...]) -> Any:
    node: Any = data
    for key in keys:
        node = node[key]
    return node


def _at(*keys: str, columns: str) -> _Table:
    """A table that is the list of records at `keys` in a result's dict."""
    return _Table(lambda data: list(_node(data, keys)), columns)


def _per_rank(*keys: str, columns: str) -> _Table:
    """A table from a {rank: [records]} mapping at `keys`, with the rank as a column."""
    return _Table(lambda data: [{"rank": int(rank), **r}
                                for rank, records in _node(data, keys).items()
                                for r in records], f"rank:i64 {columns}")


@dataclass(frozen=True)
class Result(Generic[V_co]):
    """One analysis, prediction, advice or projection of a Run.

    `value` is the library's result (a frozen dataclass); `to_dict()` is its JSON (the keys of
    the CLI's `--json`, docs/cli.md); `tables` names the record lists that `to_polars(name)`
    and `to_pandas(name)` give as data frames (the first one when no name is given)."""

    value: V_co
    _tables: Mapping[str, _Table] = field(repr=False)

    def __repr__(self) -> str:
        """What it is and what it holds (its value's whole dataclass ran to 40-100 KB in a
        notebook cell)."""
        keys = ", ".join(self.to_dict())
        return (f"perfswarm.Result({type(self.value).__name__}: {keys}; "
                f"tables: {', '.join(self.tables) or 'none'})")

    @property
    def tables(self) -> tuple[str, ...]:
        return tuple(self._tables)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.value.to_dict())

    @checked
    def rows(self, table: str | None = None) -> Rows:
        """The records of `table` (default: the first of `tables`)."""
        name = self.tables[0] if table is None else table
        if name not in self._tables:
            raise ParameterError("table", f"not one of {', '.join(self.tables)}", value=name)
        return self._tables[name].rows(self.to_dict())

    @checked
    def to_polars(self, table: str | None = None) -> pl.DataFrame:
        """The table as a DataFrame; one without records has its columns all the same."""
        import polars as pl

        rows = self.rows(table)
        if not rows:
            return pl.DataFrame(schema=self._tables[table or self.tables[0]].schema())
        return pl.DataFrame(rows, infer_schema_length=None)

    @checked
    def to_pandas(self, table: str | None = None) -> Any:
        """A pandas.DataFrame (pandas is optional: typed Any so mypy needs no stubs)."""
        from importlib.util import find_spec

        if find_spec("pandas") is None:  # polars converts; this says what is missing
            raise PerfswarmError("to_pandas: needs pandas (pip install pandas); "
                                 "to_polars gives the same table")
        return self.to_polars(table).to_pandas()


_OPS = "name:str category:str count:i64 total_ns:i64 mean_ns:f64 min_ns:i64 max_ns:i64"
_SCOPES = ("name:str count:i64 cpu_total_ns:i64 cpu_self_ns:i64 device_total_ns:i64 "
           "device_self_ns:i64")
ANALYSIS_TABLES = {
    "steps": _per_rank("iterations", "steps",
                       columns="step:i64 start:i64 end:i64 dur_ns:i64 source:str"),
    "kernels": _at("ops", "kernels", columns=_OPS), "cpu_ops": _at("ops", "cpu_ops", columns=_OPS),
    "categories": _at("ops", "categories",
                      columns="category:str count:i64 total_ns:i64 share:f64"),
    "launch": _at("launch", columns="rank:i64 device_ops:i64 launched:i64 delay_ns:nested "
                  "shorter_than_launch:i64 queue:nested idle:nested streams:nested"),
    "sequences": _at("sequences", columns="names:strs length:i64 count:i64 total_ns:i64 "
                     "mean_ns:f64 fusable:bool"),
    "scopes": _at("scopes", "ops", columns=_SCOPES),
    "annotations": _at("scopes", "annotations", columns=_SCOPES)}
PREDICTION_TABLES = {"steps": _at("steps", columns="rank:i64 step:i64 measured_ns:i64 "
                                  "replayed_ns:i64 predicted_ns:i64 device_active_ns:nested "
                                  "breakdown_ns:nested")}
ADVICE_TABLES = {"advice": _at("advice", columns="rule:str title:str severity:str "
                               "evidence:nested gain_ns:i64 gain_pct:f64 gain_of_ns:i64 "
                               "gain_of:str gain_basis:str change:str")}
PROJECTION_TABLES = {
    "points": _at("points", columns="devices:i64 step_ms:f64 compute_ms:f64 comm_ms:f64 "
                  "exposed_comm_ms:f64 efficiency:f64 throughput_per_s:f64"),
    "options": _at("options", columns="interconnect:str scheme:str efficiency:f64")}


class Run:
    """A recorded or imported Run (a directory: manifest, raw files, Parquet tables).

    Results are computed from the Run's tables when asked; the analysis is computed once per
    Run object and shared by `advise` and `report`."""

    def __init__(self, run: store.Run) -> None:
        self.store = run

    def __repr__(self) -> str:
        return f"perfswarm.Run({str(self.path)!r})"

    @property
    def path(self) -> Path:
        return self.store.path

    @property
    def manifest(self) -> store.Manifest:
        """What the Run says of itself: command, exit status, host, collectors, warnings."""
        return self.store.manifest()

    @checked
    def analyze(self, *, ignore_markers: bool = False,
                window: tuple[float | None, float | None] | None = None) -> Result[Analysis]:
        """Iterations, concurrency, ops and kernels, launches, critical path, stragglers...

        `window=(start, end)`: only that time, in seconds from the Run's start (either side
        None: open); `ignore_markers`: detect iterations from the op sequence."""
        from perfswarm.analyze.summary import analyze

        return Result(analyze(self._windowed(window), ignore_markers=ignore_markers),
                      ANALYSIS_TABLES)

    @checked
    def predict(self, *, device: str | None = None, batch_size: int | None = None,
                recorded_batch_size: int | None = None, dims: Mapping[int, int] | None = None,
                profile: PathLike | None = None, compare: Run | PathLike | None = None,
                source_device: str | None = None) -> Result[Prediction]:
        """Measured, replayed and predicted iteration time, at the recorded configuration or
        on `device` (a bundled GPU spec), at `batch_size`, with dimensions changed (`dims`,
        old -> new); `profile`: a CPU kernel-model profile from calibrate (shape changes on a
        CPU run); `compare`: a Run recorded at the target configuration."""
        from perfswarm.model.predict import Change, predict
        from perfswarm.model.profile import read_profile

        for name, size in (("batch_size", batch_size),
                           ("recorded_batch_size", recorded_batch_size)):
            if size is not None and size < 1:
                raise ParameterError(name, "must be at least 1", value=size)
        if not all(old >= 1 and new >= 1 for old, new in (dims or {}).items()):
            raise ParameterError("dims", "maps each old dimension to a new one, both positive "
                                 "integers, e.g. {768: 1024}", value=dims)
        change = Change(batch_size, recorded_batch_size, tuple((dims or {}).items()), device)
        other = compare.store if isinstance(compare, Run) else (
            store.Run.open(compare) if compare is not None else None)
        return Result(predict(self.store, change,
                              profile=read_profile(Path(profile)) if profile else None,
                              compare=other, source_device=source_device), PREDICTION_TABLES)

    @checked
    def advise(self, *, profile: PathLike | None = None) -> Result[AdviceReport]:
        """What to change, with the evidence and the estimated gain, largest first; `profile`:
        a CPU profile from calibrate on the host (what taking a batch from a DataLoader worker
        and a fused optimizer step cost there; default: figures measured on a 2-core VM)."""
        from perfswarm.model.hostcosts import host_costs
        from perfswarm.optimize.advise import advise

        costs = host_costs(Path(profile) if profile else None)
        return Result(advise(self.store, costs=costs), ADVICE_TABLES)

    @checked
    def project(self, devices: Sequence[int] | None = None, *, interconnect: str = "ib-ndr",
                bandwidth_gbps: float | None = None,
                scheme: Literal["ring", "tree", "ps"] = "ring", intra: str | None = None,
                per_node: int | None = None, servers: int = 1, grad_bytes: int | None = None,
                device: str | None = None) -> Result[Projection]:
        """Throughput and scaling efficiency on `devices` (default 1 to 256), over
        `interconnect` between nodes and `intra` inside one (see `perfswarm project`)."""
        from perfswarm.defaults import DEFAULT_DEVICES
        from perfswarm.optimize.project import project

        return Result(project(self.store, DEFAULT_DEVICES if devices is None else devices,
                              interconnect=interconnect, bandwidth_gbps=bandwidth_gbps,
                              scheme=scheme, intra=intra, per_node=per_node,
                              servers=servers, grad_bytes=grad_bytes, device=device),
                      PROJECTION_TABLES)

    @checked
    def report(self, path: PathLike | None = None, *, tune: PathLike | None = None,
               profile: PathLike | None = None) -> Path:
        """Write the self-contained HTML report (default RUN/report.html); its path.
        `tune`: a `perfswarm tune` output directory, whose trials the report adds; `profile`:
        as `advise`'s."""
        from perfswarm.model.hostcosts import host_costs
        from perfswarm.report import html

        files = None
        if tune is not None:
            from perfswarm.optimize.tune import load_results  # optuna: only with a tune folder

            files = load_results(Path(tune))
        costs = host_costs(Path(profile) if profile else None)
        return html.write(report_data(self.store, tune=files, costs=costs),
                          Path(path) if path is not None else self.path / "report.html")

    @checked
    def sql(self, query: str, *, timeout_s: float = 60.0, memory_mb: int = 2048
            ) -> pl.DataFrame:
        """A read-only DuckDB query over the Run's tables (events, counters, steps, samples,
        stacks, graph_nodes, graph_edges, flows) as a polars DataFrame; events' `dur` is the
        analyses' (a user annotation ends with the trace window it began in), `dur_recorded`
        the trace's."""
        import polars as pl
        import pyarrow as pa

        from perfswarm.defaults import MEMORY_MB, TIMEOUT_S
        from perfswarm.trace.sql import Limits
        from perfswarm.trace.sql import query as run_query

        for param, value, (low, high), kind in (
                ("timeout_s", timeout_s, TIMEOUT_S, "a number of seconds"),
                ("memory_mb", memory_mb, MEMORY_MB, "a whole number of MiB")):
            if not low <= value <= high:
                raise ParameterError(param, f"{kind} from {low:,} to {high:,}",
                                     value=repr(value))
        schema, batches = run_query(self.store, query, Limits(timeout_s, memory_mb << 20))
        # with the query's schema: a result of no rows keeps its columns' types (not Null)
        frame = pl.from_arrow(pa.Table.from_batches(list(batches), schema=schema))
        assert isinstance(frame, pl.DataFrame)
        return frame

    def _windowed(self, window: tuple[float | None, float | None] | None) -> store.Run:
        from perfswarm.analyze.window import windowed

        if window is None:
            return self.store
        start, end = ("" if side is None else side for side in window)
        return windowed(self.store, f"{start}:{end}")


def report_data(run: store.Run, *, tune: Mapping[str, Any] | None = None,
                costs: HostCosts | None = None) -> dict[str, Any]:
    """The whole report of `run` as plain data: analysis, advice (`costs`: what taking a
    batch from a DataLoader worker and a fused optimizer step cost, as `advise`'s; None: its
    defaults), projection (and `tune`, a tune directory as optimize.tune.load_results reads
    it): what `perfswarm report --json` prints and the HTML shows (the timeline's span columns
    as numpy int64 arrays, which the JSON writes as lists). Here, above both report and
    optimize, they are put together."""
    from perfswarm.model.hostcosts import DEFAULT
    from perfswarm.optimize.advise import advise
    from perfswarm.optimize.project import report_projection
    from perfswarm.report.data import report_data as data

    given = costs or DEFAULT
    return data(run, advice=lambda run: advise(run, costs=given).to_dict()["advice"],
                tune=tune, projection=report_projection)


# Paths are made absolute: a notebook's working directory may change while a Run is in use.


@checked
def load(path: PathLike) -> Run:
    """The Run at `path` (a directory written by import or record)."""
    return Run(store.Run.open(Path(path).absolute()))


@checked
def import_traces(paths: PathLike | Iterable[PathLike], out: PathLike | None = None, *,
                  ranks: Sequence[int] = (), execution_traces: Sequence[PathLike] = (),
                  memory_timelines: Sequence[PathLike] = (), drop_bad_events: bool = False,
                  streaming: Literal["auto", "always", "never"] = "auto",
                  force: bool = False) -> Run:
    """Import Kineto traces (.json, .json.gz, or directories of *.pt.trace.json) or Nsight
    Systems SQLite exports, one per rank, into a new Run at `out` (default: the first file's
    name up to its first dot, plus .run, as `perfswarm import` names it).

    `ranks`: each file's rank (default: its distributedInfo, else file order);
    `execution_traces`: PyTorch execution traces, one per rank; `memory_timelines`:
    torch.profiler's memory timeline exports or CUDA memory snapshots (read without running
    code), one per rank (`analyze()`'s `memory`);
    `drop_bad_events`: drop events with negative or absurd times, or args that are not UTF-8
    text, instead of failing;
    `force`: replace `out`."""
    from perfswarm.trace.ingest import ImportOptions, trace_files
    from perfswarm.trace.ingest import import_traces as ingest

    given = [Path(paths)] if isinstance(paths, str | Path) else [Path(p) for p in paths]
    if not given:
        raise ParameterError("paths", "no trace given")
    options = ImportOptions(ranks=tuple(ranks),
                            execution_traces=tuple(Path(p) for p in execution_traces),
                            memory_timelines=tuple(Path(p) for p in memory_timelines),
                            drop_bad_events=drop_bad_events, streaming=streaming, force=force)
    command = ["perfswarm.import_traces", *map(str, given)]
    target = Path(out) if out is not None else Path(given[0].name.split(".")[0] + ".run")
    return Run(ingest(trace_files(given), target.absolute(), options, command))


@checked
def record(command: Sequence[str], out: PathLike | None = None, *,
           collectors: str | Sequence[str] | None = None, skip: int = 5, steps: int = 10,
           execution_trace: bool = True, force: bool = False) -> Run:
    """Run `command` (an unmodified program, as a list of arguments) under the collectors
    (default torch, system, gpu, perf, pystacks) and give the Run it leaves at `out` (default
    PROGRAM.run); the torch profiler opens after `skip` optimizer steps for `steps` steps.
    The program's exit status is in `run.manifest`."""
    from perfswarm.defaults import DEFAULT_COLLECTORS
    from perfswarm.recorder.session import RecordOptions
    from perfswarm.recorder.session import record as run_recorder

    if not command:
        raise ParameterError("command", "the program and its arguments as a list, e.g. "
                             "['python', 'train.py']", value=command or None)
    if skip < 0:
        raise ParameterError("skip", "must be 0 or more", value=skip)
    if steps < 1:
        raise ParameterError("steps", "must be at least 1", value=steps)
    if isinstance(collectors, str):  # one collector's name, not its letters
        collectors = (collectors,)
    options = RecordOptions(collectors=tuple(collectors or DEFAULT_COLLECTORS), skip=skip,
                            steps=steps, execution_trace=execution_trace, force=force)
    target = Path(out if out is not None else Path(command[0]).name + ".run").absolute()
    return Run(run_recorder(list(command), target, options).run)
