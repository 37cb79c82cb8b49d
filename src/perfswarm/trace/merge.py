"""Out-of-core merge of spilled per-file tables into a Run's final tables (DuckDB).

The same events order and step marks as build.in_memory (the in-memory
reference, tested against this), with memory bounded by DuckDB's limit: sorts
and joins spill to a temporary directory. The sorted tables are left in scratch
for build.write_tables.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import duckdb

from perfswarm.errors import PerfswarmError
from perfswarm.trace.build import TableParts, parquet_parts
from perfswarm.trace.schema import DEVICE_KINDS, TABLES
from perfswarm.trace.store import Run

_ERRNO = re.compile(r'"errno":\s*"?(\d+)')


def _io_error(run: Run, exc: duckdb.IOException) -> PerfswarmError:
    """DuckDB's I/O errors (a full disk while it spills or writes) as one line naming the Run."""
    text = str(exc)
    m = _ERRNO.search(text)
    why = os.strerror(int(m.group(1))) if m else text.strip().splitlines()[0]
    return PerfswarmError(f"{run.shown(run.path)}: cannot write ({why})")


def _files(paths: list[Path]) -> str:
    return "[" + ", ".join("'" + str(p).replace("'", "''") + "'" for p in paths) + "]"


def _union(paths: list[Path], ranks: list[int], offsets: list[int] | None = None) -> str:
    """Rows of every file with its position, so ties in (rank, ts) keep file order, and the
    file's rank; `offsets`: added to each file's step numbers (a steps table's)."""
    steps = offsets or [0] * len(paths)
    parts = [f"SELECT * REPLACE (CAST({rank} AS INTEGER) AS rank"
             + (f", CAST(step + {offset} AS INTEGER) AS step" if offset else "")
             + f"), {i} AS _file, file_row_number AS _row "
             f"FROM read_parquet({_files([p])}, file_row_number = true)"
             for i, (p, rank, offset) in enumerate(zip(paths, ranks, steps, strict=True))]
    return " UNION ALL ".join(parts)


def merge(run: Run, spills: list[dict[str, Path]], ranks: list[int], offsets: list[int],
          scratch: Path, memory_limit: str) -> TableParts:
    """The Run's trace tables from the spills, each file's rows of its rank in `ranks`, its
    step numbers moved by `offsets` (build.step_offsets):
    events sorted, steps assigned (DuckDB's plain strings re-encoded to the Run's schema as
    build.write_tables writes them)."""
    try:
        return _merge(spills, ranks, offsets, scratch, memory_limit)
    except duckdb.IOException as exc:
        raise _io_error(run, exc) from None


def _merge(spills: list[dict[str, Path]], ranks: list[int], offsets: list[int],
           scratch: Path, memory_limit: str) -> TableParts:
    """The DuckDB part: every table sorted into a scratch file."""
    con = duckdb.connect(":memory:")
    try:
        con.execute(f"SET memory_limit = '{memory_limit}'")
        con.execute(f"SET temp_directory = '{scratch}'")
        con.execute("SET preserve_insertion_order = true")
        con.execute("SET threads = 2")
        con.execute(f"CREATE VIEW st AS SELECT * FROM "
                    f"({_union([s['steps'] for s in spills], ranks, offsets)})")
        con.execute(f"CREATE VIEW ev AS SELECT * FROM "
                    f"({_union([s['events'] for s in spills], ranks)})")
        device = ", ".join(f"'{k}'" for k in sorted(DEVICE_KINDS))
        con.execute("""
            CREATE VIEW host AS
            SELECT e.* EXCLUDE (step),
                   CASE WHEN s.step IS NOT NULL AND e.ts < s."end" THEN s.step ELSE -1 END
                     AS hstep
            FROM ev e ASOF LEFT JOIN st s ON e.rank = s.rank AND e.ts >= s.start
        """)
        con.execute("""
            CREATE VIEW launch AS
            SELECT rank, correlation, arg_min(hstep, (ts, _file, _row)) AS lstep FROM host
            WHERE kind IN ('runtime', 'driver') AND correlation <> -1
            GROUP BY rank, correlation
        """)
        columns = ", ".join(f'h."{c}"' for c in TABLES["events"].names
                            if c not in ("step", "args"))
        ordered = scratch / "events-sorted.parquet"
        con.execute(f"""
            COPY (
              SELECT {columns},
                     CAST(CASE WHEN h.kind IN ({device}) AND h.correlation <> -1
                                    AND l.lstep IS NOT NULL
                               THEN l.lstep ELSE h.hstep END AS INTEGER) AS step,
                     h.args
              FROM host h LEFT JOIN launch l
                ON h.rank = l.rank AND h.correlation = l.correlation
              ORDER BY h.rank, h.ts, h._file, h._row
            ) TO '{ordered}' (FORMAT parquet, ROW_GROUP_SIZE 262144)
        """)
        small = []
        shift = {"steps": offsets, "flows": None, "counters": None}
        for name in ("steps", "flows", "counters"):
            out = scratch / f"{name}-merged.parquet"
            order = "rank, start, _file, _row" if name == "steps" else "_file, _row"
            cols = ", ".join(f'"{c}"' for c in TABLES[name].names)
            con.execute(f"COPY (SELECT {cols} FROM "
                        f"({_union([s[name] for s in spills], ranks, shift[name])}) "
                        f"ORDER BY {order}) TO '{out}' (FORMAT parquet)")
            small.append(parquet_parts([out]))
    finally:
        con.close()
    steps, flows, counters = small
    return TableParts(steps, flows, counters, parquet_parts([ordered]))
