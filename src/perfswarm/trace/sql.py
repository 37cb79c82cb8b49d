"""The SQL face of a Run: DuckDB views named after the tables, read-only."""

from __future__ import annotations

from typing import Any

import duckdb

from perfswarm.errors import PerfswarmError
from perfswarm.trace.schema import TABLES
from perfswarm.trace.store import Run


def connect(run: Run) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with one view per table, then locked against writes and file access."""
    tables_dir = str(run.tables_dir.resolve()).replace("'", "''")
    con = duckdb.connect(":memory:")
    for name in TABLES:
        path = run.table_path(name)
        if path.is_file():
            quoted = str(path.resolve()).replace("'", "''")
            con.execute(f"CREATE VIEW {name} AS SELECT * FROM read_parquet('{quoted}')")
    # Queries may read the Run's tables and nothing else, and may not undo that.
    con.execute(f"SET allowed_directories = ['{tables_dir}/']")
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")
    return con


def query(run: Run, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Column names and rows of one read-only query (a SELECT, or EXPLAIN of one)."""
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise PerfswarmError(f"sql: {str(exc).splitlines()[0]}") from None
    if len(statements) != 1:
        raise PerfswarmError(f"sql: expected one statement, got {len(statements)}")
    kind = statements[0].type
    if kind not in (duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN):
        raise PerfswarmError(f"sql: the Run is read-only ({kind.name} statements are refused)")
    con = connect(run)
    try:
        rel = con.sql(sql)
        if rel is None:
            raise PerfswarmError("sql: the statement returned no rows (only queries are allowed)")
        return list(rel.columns), rel.fetchall()
    except duckdb.Error as exc:
        message = str(exc).splitlines()[0]
        raise PerfswarmError(f"sql: {message}") from None
    finally:
        con.close()
