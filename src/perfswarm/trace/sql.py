"""The SQL face of a Run: DuckDB views named after the tables, read-only, in a sandbox.

A query runs in a child process with a memory rlimit and is killed at its time limit: DuckDB's
own memory_limit does not cover every allocation (a 2 GB `repeat()` passes it) and interrupting
a connection does not stop a long scalar function, so only the operating system bounds both.
The child streams Arrow record batches back, so the caller holds one batch at a time.
"""

from __future__ import annotations

import os
import re
import resource
import subprocess
import sys
import threading
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path

import duckdb
import orjson
import pyarrow as pa
from pyarrow import ipc

from perfswarm.errors import PerfswarmError
from perfswarm.trace.schema import TABLES, empty
from perfswarm.trace.store import Run

# `EXPLAIN [ANALYZE | (options)] <statement>`: what it explains must itself be a query, since
# EXPLAIN ANALYZE executes it.
_EXPLAIN = re.compile(r"\s*explain\s+(?:analy[sz]e\s+|\([^)]*\)\s*)?", re.IGNORECASE)


@dataclass(frozen=True)
class Limits:
    """What one query may use: wall-clock seconds, and bytes of address space beyond what its
    process had mapped before the query ran."""

    seconds: float = 60.0
    memory_bytes: int = 2 << 30


def check_query(sql: str) -> None:
    """Refuse anything but one pure query (a SELECT, or EXPLAIN of one, ANALYZE included)."""
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise PerfswarmError(f"sql: {_first_line(str(exc))}") from None
    if len(statements) != 1:
        raise PerfswarmError(f"sql: expected one statement, got {len(statements)}")
    kind = statements[0].type
    if kind == duckdb.StatementType.EXPLAIN:
        inner = _EXPLAIN.sub("", statements[0].query, count=1)
        try:
            explained = duckdb.extract_statements(inner)
        except duckdb.Error:
            explained = []
        if len(explained) != 1 or explained[0].type != duckdb.StatementType.SELECT:
            raise PerfswarmError("sql: the Run is read-only (EXPLAIN of anything but a query "
                                 "is refused)")
    elif kind != duckdb.StatementType.SELECT:
        raise PerfswarmError(f"sql: the Run is read-only ({kind.name} statements are refused)")


# DuckDB's errors of the query itself; any other (a damaged Parquet file: "don't know what
# type", no class of its own) may be of reading a table
_OF_THE_QUERY = (duckdb.ParserException, duckdb.BinderException, duckdb.CatalogException,
                 duckdb.ConversionException, duckdb.OutOfRangeException,
                 duckdb.NotImplementedException, duckdb.PermissionException,
                 duckdb.InterruptException, duckdb.OutOfMemoryException)


def trace_windows(con: duckdb.DuckDBPyConnection, source: str
                  ) -> dict[int, list[tuple[int, int]]]:
    """Each rank's profiler trace windows (its `trace_span` events in the Parquet file
    `source`, a quoted SQL string) as (start, stop), in time order, ties in file order (as
    analyze.frame sorts them)."""
    rows = con.sql(f"SELECT rank, ts, ts + dur FROM read_parquet({source}, "
                   f"file_row_number = true) WHERE kind = 'trace_span' "
                   f"ORDER BY rank, ts, file_row_number").fetchall()
    windows: dict[int, list[tuple[int, int]]] = {}
    for rank, start, stop in rows:
        windows.setdefault(int(rank), []).append((int(start), int(stop)))
    return windows


def events_view(source: str, windows: dict[int, list[tuple[int, int]]]) -> str:
    """The events view: `dur` as the analyses read it (analyze.frame's `_within_trace`), the
    trace's own as `dur_recorded`. A user annotation ends no later than the profiler trace
    window of its rank that it began in (the last to start at or before it): a profiler
    stopped inside a range (from an optimizer step hook) closes that range only after its stop
    and export (nanoGPT's last Optimizer.step 31.6 ms past a 16.1 ms step on an H200). The
    windows are constants of the view, so it is a projection of the Parquet scan: rows keep
    the table's order, and a query that reads no `dur` reads no more (a join had cost 20x on
    `count(*)` and lost the order)."""
    if not windows:
        return f"CREATE VIEW events AS SELECT *, dur AS dur_recorded FROM read_parquet({source})"
    by_rank = ", ".join(f"{rank}: [{', '.join(f'[{a}, {b}]' for a, b in spans)}]"
                        for rank, spans in sorted(windows.items()))
    stop = (f"list_last(list_filter(MAP {{{by_rank}}}[rank], lambda w: w[1] <= ts))[2]")
    return (f"CREATE VIEW events AS SELECT * EXCLUDE (_stop) REPLACE ("
            f"CASE WHEN ts < _stop AND ts + dur > _stop THEN _stop - ts ELSE dur END AS dur), "
            f"dur AS dur_recorded FROM (SELECT *, CASE WHEN kind = 'user_annotation' "
            f"THEN {stop} END AS _stop FROM read_parquet({source}))")


def _windows_of(run: Run, con: duckdb.DuckDBPyConnection, source: str
                ) -> dict[int, list[tuple[int, int]]]:
    try:
        return trace_windows(con, source)
    except duckdb.Error:
        run.table("events", ["rank", "ts", "dur", "kind"])  # the store names the damage
        raise


def connect(run: Run, limits: Limits) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with one view per table, then locked against writes and file access."""
    tables_dir = str(run.tables_dir.resolve()).replace("'", "''")
    con = duckdb.connect(":memory:")
    for name in TABLES:
        path = run.table_path(name)
        if run.has_table(name):  # a trace table missing: the Run is damaged, and said so
            source = "'{}'".format(str(path.resolve()).replace("'", "''"))
            con.execute(events_view(source, _windows_of(run, con, source))
                        if name == "events" else
                        f"CREATE VIEW {name} AS SELECT * FROM read_parquet({source})")
        else:  # a table the Run's sources did not write (no perf, no py-spy): no rows
            con.register(name, empty(name))
    # Queries may read the Run's tables and nothing else, and may not undo that; nothing spills.
    con.execute(f"SET memory_limit = '{limits.memory_bytes // 2 >> 20}MB'")
    con.execute("SET temp_directory = ''")
    con.execute("SET threads = 2")
    con.execute(f"SET allowed_directories = ['{tables_dir}/']")
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")
    return con


def _mapped_bytes() -> int:
    """The address space this process has mapped (/proc/self/status VmSize)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) << 10
    return 0


def _first_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[0] if lines else "failed"


def query(run: Run, sql: str, limits: Limits = Limits()
          ) -> tuple[pa.Schema, Generator[pa.RecordBatch, None, None]]:
    """The columns (names and types: a query of no rows has them too) and record batches of
    one read-only query, run in a bounded child process.

    Iterate the batches to the end (or close the iterator) so the child is reaped."""
    check_query(sql)
    src = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (src, os.environ.get("PYTHONPATH", "")) if p)}
    child = subprocess.Popen(
        [sys.executable, "-c", "from perfswarm.trace.sql import worker; worker()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert child.stdin is not None and child.stdout is not None and child.stderr is not None
    timed_out = threading.Event()

    def stop() -> None:
        timed_out.set()
        child.kill()

    timer = threading.Timer(limits.seconds, stop)
    timer.daemon = True
    timer.start()
    child.stdin.write(orjson.dumps({"run": str(run.path), "sql": sql,
                                    "seconds": limits.seconds, "memory": limits.memory_bytes}))
    child.stdin.close()

    def finish() -> None:
        timer.cancel()
        if child.poll() is None:
            child.kill()
        child.wait()
        stdout.close()
        stderr.close()

    def failure() -> PerfswarmError:
        child.kill()
        child.wait()
        message = _first_line(stderr.read().decode(errors="replace"))
        finish()
        if timed_out.is_set():
            return PerfswarmError(f"sql: the query ran past its time limit ({limits.seconds:g} s)")
        if child.returncode == -9 or "Out of Memory" in message or message == "sql: MemoryError":
            return PerfswarmError(f"sql: the query needed more than its memory limit "
                                  f"({limits.memory_bytes >> 20} MB)")
        return PerfswarmError(message if message.startswith("sql:") else f"sql: {message}")

    stdout, stderr = child.stdout, child.stderr
    try:
        reader = ipc.open_stream(stdout)
    except (pa.ArrowInvalid, OSError):
        raise failure() from None

    def batches() -> Generator[pa.RecordBatch, None, None]:
        try:
            while True:
                try:
                    batch = reader.read_next_batch()
                except StopIteration:
                    break
                except (pa.ArrowInvalid, OSError):
                    raise failure() from None
                yield batch
            if child.wait() != 0:
                raise failure()
        finally:
            finish()

    return reader.schema, batches()


def worker() -> None:
    """The child's side: limits, one checked query, Arrow IPC batches on stdout."""
    request = orjson.loads(sys.stdin.buffer.read())
    limits = Limits(request["seconds"], request["memory"])
    try:
        check_query(request["sql"])
        run = Run.open(request["run"])
        try:
            con = connect(run, limits)
            # the query's bytes on top of what the process has mapped before it runs: the
            # libraries and DuckDB's own threads reserve about 1 GB of address space, which a
            # limit on the whole process took out of every --memory under 1.3 GB
            limit = _mapped_bytes() + limits.memory_bytes
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
            reader = con.sql(request["sql"])
            if reader is None:
                raise PerfswarmError("sql: the statement returned no rows (only queries are "
                                     "allowed)")
            stream = reader.to_arrow_reader(2048)
            with ipc.new_stream(sys.stdout.buffer, stream.schema) as out:
                for batch in stream:
                    out.write_batch(batch)
        except duckdb.Error as exc:
            if isinstance(exc, _OF_THE_QUERY):
                raise
            for name in TABLES:  # it could not read a table: the store names which, and why
                if run.has_table(name):
                    run.table(name)
            raise PerfswarmError(f"sql: {run.shown(run.tables_dir)}: unreadable "
                                 f"({_first_line(str(exc))})") from None
    except (PerfswarmError, duckdb.Error, MemoryError) as exc:
        message = _first_line(str(exc)) if not isinstance(exc, MemoryError) else "MemoryError"
        sys.stderr.write((message if isinstance(exc, PerfswarmError) else f"sql: {message}") + "\n")
        sys.stderr.flush()
        os._exit(2)
    except BrokenPipeError:
        os._exit(0)
    sys.stdout.flush()
