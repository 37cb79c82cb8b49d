"""The Run: one directory holding manifest.json, raw/ and tables/*.parquet.

Every write goes to a temporary path and is renamed into place, so a reader (or
a crash) never sees a half-written manifest or table. A new Run is built in a
hidden sibling directory and renamed to its final name only when complete.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import glob
import os
import platform
import shutil
import socket
import tempfile
from collections.abc import Callable, Hashable, Iterable, Iterator
from pathlib import Path
from typing import Any, Final, NotRequired, TypedDict, TypeVar, cast

import msgspec
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from perfswarm import __version__
from perfswarm.errors import ParameterError, PerfswarmError, RunError
from perfswarm.trace.detail import with_detail
from perfswarm.trace.schema import DETAIL, DICTIONARY_TEXT, TABLES, TRACE_TABLES, empty

# The tables a recording writes whenever a stack sampler (perf, py-spy) recorded
SAMPLED_TABLES: Final = ("samples", "stacks")

SCHEMA_VERSION = 1
T = TypeVar("T")
MANIFEST = "manifest.json"


class CollectorStatus(TypedDict):
    status: str  # "ok" | "unavailable: <reason>" | "failed: <reason>"
    files: list[str]


class Warning_(TypedDict):
    source: str
    what: str
    count: int


class Manifest(TypedDict):
    schema_version: int
    perfswarm_version: str
    command: list[str]
    cwd: str
    complete: bool
    exit_status: int | None
    signal: str | None
    host: dict[str, Any]
    devices: list[dict[str, Any]]
    collectors: dict[str, CollectorStatus]
    clock_offsets: dict[str, int]
    ranks: list[int]
    sources: list[dict[str, Any]]
    warnings: list[Warning_]
    processes: dict[str, str]
    threads: dict[str, str]
    process_labels: NotRequired[dict[str, str]]  # Kineto's "CPU", "GPU 0" (newer Runs)
    extra: NotRequired[dict[str, Any]]


# /proc/cpuinfo flags of units that compute bf16 or fp16 natively (x86's AVX-512 and AMX; Arm's
# bf16 and half-precision SIMD)
REDUCED_PRECISION_UNITS: Final = frozenset({"avx512_bf16", "amx_bf16", "avx512_fp16",
                                            "amx_fp16", "bf16", "asimdhp"})


def host_info() -> dict[str, Any]:
    """What this machine is: enough to tell runs apart and to pick a CPU model."""
    cpu_model = platform.processor()
    units: list[str] = []
    with contextlib.suppress(OSError):
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        cpu_model = next((line.split(":", 1)[1].strip() for line in lines
                          if line.startswith("model name")), cpu_model)
        flags = next((line.split(":", 1)[1].split() for line in lines
                      if line.startswith(("flags", "Features"))), [])
        units = sorted(set(flags) & REDUCED_PRECISION_UNITS)
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_model": cpu_model,
        "cores": os.cpu_count() or 1,
        # the CPU's bf16/fp16 units (empty: it computes them by converting to float32)
        "reduced_precision_units": units,
    }


def new_manifest(command: list[str], *, complete: bool = False) -> Manifest:
    return Manifest(
        schema_version=SCHEMA_VERSION,
        perfswarm_version=__version__,
        command=command,
        cwd=os.getcwd(),
        complete=complete,
        exit_status=None,
        signal=None,
        host=host_info(),
        devices=[],
        collectors={},
        clock_offsets={},
        ranks=[],
        sources=[],
        warnings=[],
        processes={},
        threads={},
        process_labels={},
    )


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _readable(fd: int) -> None:
    """mkstemp makes 0600 files; a Run's files get the usual mode (0666 less umask)."""
    os.fchmod(fd, 0o666 & ~_umask())


def atomic_write_bytes(path: Path, data: bytes | Iterable[bytes]) -> None:
    """Write `data` (or its parts, in turn) to `path` so that readers see the old file or the
    new one, never a mix."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        _readable(fd)
        with os.fdopen(fd, "wb") as f:
            if isinstance(data, bytes):
                f.write(data)
            else:
                f.writelines(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


RUN_OWN: Final = ("raw", "tables")  # a Run's folders that hold its recording


def check_output(path: Path) -> None:
    """Refuse, before any work, a file a user names that cannot be written: in a folder that
    is not there, or one of a Run's own files (its manifest, raw/ or tables/)."""
    if not path.parent.is_dir():
        raise PerfswarmError(f"{path.parent}: no such directory (for {path.name})")
    if (run := _owning_run(path)) is not None:
        raise PerfswarmError(f"{path}: would replace a file of the Run {run} (its {MANIFEST}, "
                             f"{'/ and '.join(RUN_OWN)}/ are the recording); write elsewhere")


def write_output(path: Path, data: bytes | Iterable[bytes]) -> None:
    """atomic_write_bytes for a file a user named (a report, a profile), after check_output:
    a full disk or a refused permission is the one-line error naming the file."""
    check_output(path)
    try:
        atomic_write_bytes(path, data)
    except OSError as exc:
        raise _disk_error(path, exc) from None


def _owning_run(path: Path) -> Path | None:
    """The Run whose own files `path` is one of, if any: the nearest folder up that holds a
    manifest, when `path` is that manifest or lies under its raw/ or tables/. Its folder is
    taken after links; the file itself is not (the write replaces a link, not its target)."""
    target = Path(os.path.realpath(path.parent)) / path.name
    for folder in target.parents:
        if (folder / MANIFEST).is_file():
            inside = target.relative_to(folder).parts
            return folder if inside == (MANIFEST,) or inside[0] in RUN_OWN else None
    return None


def _disk_error(path: Path, exc: OSError) -> PerfswarmError:
    # Arrow's messages wrap the system's ("Error writing bytes ... [errno 28] ..."): say it plainly
    why = os.strerror(exc.errno) if exc.errno else (exc.strerror or str(exc))
    return PerfswarmError(f"{path}: cannot write ({why})")


def _dictionary_columns(schema: pa.Schema) -> list[str]:
    """Parquet dictionary pages only where Arrow has dictionaries, or text repeats
    (DICTIONARY_TEXT): for unique text (args) they cost a hash table of every value and save
    nothing."""
    return [f.name for f in schema
            if pa.types.is_dictionary(f.type) or f.name in DICTIONARY_TEXT]


def statistics_columns(schema: pa.Schema) -> list[str]:
    """Parquet min/max statistics on every column but plain text (args, detail, an op's
    inputs): nothing reads them there (a reader of one rank skips row groups by `rank`'s),
    and writing them compared every long value: 22% of the 200k-event events table's write.
    The streaming and parallel paths' spilled files are written alike."""
    return [f.name for f in schema if not pa.types.is_string(f.type)]


ROW_GROUP = 16_384  # rows per Parquet row group: the unit a reader of one rank skips by


def _canonical(table: pa.Table) -> pa.Table:
    """One chunk per column; each dictionary holds the values used, in order of appearance."""
    columns = []
    for field, column in zip(table.schema, table.columns, strict=True):
        array = column.combine_chunks()
        if isinstance(array, pa.DictionaryArray):
            array = array.dictionary_decode().dictionary_encode().cast(field.type)
        columns.append(array)
    return pa.Table.from_arrays(columns, schema=table.schema)


def row_groups(parts: Iterable[pa.Table], schema: pa.Schema) -> Iterator[pa.Table]:
    """`parts` (cast to `schema`) re-cut into row groups of exactly ROW_GROUP rows (the last
    fewer), each canonical: the same rows give the same bytes however the parts were cut,
    whichever path (in memory, out of core, parallel) built them."""
    pending: list[pa.Table] = []
    rows = 0
    for part in parts:
        pending.append(part.select(schema.names).cast(schema))
        del part  # (the parts' source holds none either: one part in memory, not two)
        rows += pending[-1].num_rows
        while rows >= ROW_GROUP:
            table = pa.concat_tables(pending)
            yield _canonical(table.slice(0, ROW_GROUP))
            rows -= ROW_GROUP
            # the rest, if any: an empty slice would hold the whole part's buffers
            pending = [table.slice(ROW_GROUP)] if rows else []
            del table
    if rows:
        yield _canonical(pa.concat_tables(pending))


def _open(path: Path) -> pq.ParquetFile:
    """A table file, its dictionary text columns to be read as dictionaries. (Its own reads:
    pq.read_table goes through pyarrow.dataset, whose import alone is 18 ms of a command.)

    Its reads decode in the calling thread (`use_threads=False`): Arrow's pool threads
    allocate from glibc arenas of their own, whose freed pages the main thread's arrays
    never reuse (a 200k-event report's peak 6-9 MB higher, for no less CPU time)."""
    metadata = pq.read_metadata(path)
    return pq.ParquetFile(path, metadata=metadata, read_dictionary=_dictionary_text(
        metadata.schema.to_arrow_schema()))


def _rank_rows(path: Path, columns: list[str], rank: int) -> pa.Table:
    """The rows of `rank`, reading only the row groups that can hold them, in file order."""
    file = _open(path)
    _present(file, [*columns, "rank"])
    at = file.schema_arrow.get_field_index("rank")
    groups = []
    for i in range(file.num_row_groups):
        stats = file.metadata.row_group(i).column(at).statistics
        if stats is None or not stats.has_min_max or stats.min <= rank <= stats.max:
            groups.append(i)
    stored, derived = _stored_columns(file.schema_arrow, [*columns, "rank"])
    table = derived(file.read_row_groups(groups, columns=stored, use_threads=False))
    return table.filter(pc.equal(table.column("rank"), rank)).select(columns)


def _read_columns(path: Path, columns: list[str]) -> pa.Table:
    file = _open(path)
    stored, derived = _stored_columns(file.schema_arrow, columns)
    _present(file, stored)
    return derived(file.read(columns=stored, use_threads=False))


def _present(file: pq.ParquetFile, columns: list[str]) -> None:
    """An ArrowInvalid naming the columns of `columns` the file lacks (a read leaves them
    out), after the one `_stored_columns` derives (detail, from the kinds and args)."""
    stored, _ = _stored_columns(file.schema_arrow, columns)
    if absent := [c for c in stored if c not in file.schema_arrow.names]:
        raise pa.ArrowInvalid(f"no column {', '.join(absent)}")


def _typed(table: pa.Table, name: str) -> pa.Table:
    """`table`, read from the file of the table `name`, if each column has its schema's type
    (text columns may come as dictionaries); else an ArrowInvalid naming the column."""
    schema = TABLES[name]
    for field in table.schema:
        if field.name not in schema.names:
            raise pa.ArrowInvalid(f"column {field.name} is no column of {name}")
        want = schema.field(field.name).type
        got = field.type.value_type if pa.types.is_dictionary(field.type) and not \
            pa.types.is_dictionary(want) else field.type
        if got != want:
            raise pa.ArrowInvalid(f"column {field.name} is {field.type}, not {want}")
    return table


def _dictionary_text(schema: pa.Schema) -> list[str]:
    """The columns of a table file of `schema` that are read as dictionaries."""
    return [c for c in schema.names if c in DICTIONARY_TEXT]


def _stored_columns(schema: pa.Schema, columns: list[str]
                    ) -> tuple[list[str], Callable[[pa.Table], pa.Table]]:
    """The columns to read from a table file of `schema` for `columns`, and what makes them
    from those: the same, but for a Run written before its events had a `detail`, which is
    derived from their kinds and args (trace/detail.py)."""
    if DETAIL.name not in columns or DETAIL.name in schema.names:
        return list(dict.fromkeys(columns)), lambda table: table
    return (list(dict.fromkeys([*(c for c in columns if c != DETAIL.name), "kind", "args"])),
            _derived_detail)


def _derived_detail(table: pa.Table) -> pa.Table:
    """`table` with its events' detail derived, a dictionary as the stored one is read."""
    table = with_detail(table)
    at = table.column_names.index(DETAIL.name)
    return table.set_column(at, DETAIL.name, table.column(at).dictionary_encode())


def _of_rank(table: pa.Table, ranks: pa.ChunkedArray, rank: int) -> pa.Table:
    """The rows of `rank`: a slice, no copy, where they are one run of rows (the store writes
    its tables sorted by rank), else a filter."""
    first = pc.index(ranks, rank).as_py()
    count = pc.sum(pc.equal(ranks, rank)).as_py() or 0
    if first >= 0 and pc.all(pc.equal(ranks.slice(first, count), rank)).as_py():
        return table.slice(first, count)
    return table.filter(pc.equal(ranks, rank))


class Run:
    """A Run directory. Cheap to construct; tables are read on demand, each column of a table
    once per Run object: every step of one command shares what the first one read."""

    def __init__(self, path: str | Path, *, building: Path | None = None) -> None:
        self.path = Path(path)
        self.building = building  # the final path, while this is its hidden partial directory
        self._columns: dict[str, dict[str, tuple[pa.Field, pa.ChunkedArray]]] = {}
        self._memo: dict[Hashable, object] = {}

    def shown(self, path: Path) -> Path:
        """`path` as messages name it: under the final Run path while building."""
        return self.building / path.relative_to(self.path) if self.building else path

    # -- layout --------------------------------------------------------------
    @property
    def raw_dir(self) -> Path:
        return self.path / "raw"

    @property
    def tables_dir(self) -> Path:
        return self.path / "tables"

    @property
    def manifest_path(self) -> Path:
        return self.path / MANIFEST

    def table_path(self, name: str) -> Path:
        return self.tables_dir / f"{name}.parquet"

    # -- opening -------------------------------------------------------------
    @classmethod
    def open(cls, path: str | Path) -> Run:
        run = cls(path)
        if not run.path.exists():
            raise RunError(f"{run.path}: does not exist (expected a perfswarm Run)")
        if not run.path.is_dir():
            raise RunError(f"{run.path}: not a directory (expected a perfswarm Run)")
        if not run.manifest_path.is_file():
            raise RunError(f"{run.path}: no {MANIFEST} (not a perfswarm Run)")
        run.manifest()  # validates
        return run

    def manifest(self) -> Manifest:
        """The manifest, checked against `Manifest` (every field, every type), so readers
        never meet a missing key or a wrong type; unknown keys are kept."""
        try:
            data = orjson.loads(self.manifest_path.read_bytes())
        except (OSError, orjson.JSONDecodeError) as exc:
            raise RunError(f"{self.manifest_path}: unreadable manifest ({exc})") from None
        if not isinstance(data, dict) or data.get("schema_version") != SCHEMA_VERSION:
            raise RunError(f"{self.manifest_path}: not a schema {SCHEMA_VERSION} manifest")
        try:
            msgspec.convert(data, Manifest)
        except msgspec.ValidationError as exc:
            raise RunError(f"{self.manifest_path}: malformed manifest ({exc})") from None
        return data  # type: ignore[return-value]

    def write_manifest(self, manifest: Manifest) -> None:
        data = orjson.dumps(manifest, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)
        try:
            atomic_write_bytes(self.manifest_path, data + b"\n")
        except OSError as exc:
            raise _disk_error(self.shown(self.manifest_path), exc) from None

    # -- tables --------------------------------------------------------------
    def has_table(self, name: str) -> bool:
        """Whether the Run holds the table `name` (one of TRACE_TABLES missing, or any table
        that cannot be looked at, is a RunError)."""
        path = self.table_path(name)
        try:
            path.stat()
        except FileNotFoundError:
            if name in TRACE_TABLES:
                raise RunError(f"{self.shown(path)}: missing (every Run has its {name} table; "
                               "a damaged Run)") from None
            if name in SAMPLED_TABLES and (sampled := self._sampled()):
                raise RunError(f"{self.shown(path)}: missing ({sampled} recorded samples; a "
                               "damaged Run)") from None
            return False
        except OSError as exc:
            raise RunError(f"{self.shown(path)}: unreadable table "
                           f"({os.strerror(exc.errno or 0)})") from None
        return True

    def _sampled(self) -> str | None:
        """The collector that recorded stack samples into this Run, if one did."""
        collectors = self.manifest()["collectors"]
        return next((name for name in ("perf", "pystacks")
                     if name in collectors and collectors[name]["status"] == "ok"), None)

    def table(self, name: str, columns: list[str] | None = None, *,
              rank: int | None = None) -> pa.Table:
        """The table `name`, or an empty one of its schema when the Run has none.

        With `rank`, only that rank's rows: tables are sorted by rank, so only the row
        groups whose rank statistics include it are read, and kept for no one (a Dask task
        reads its rank alone); once this Run holds columns of the table, from those instead.
        """
        path = self.table_path(name)
        if not self.has_table(name):
            table = empty(name)
            return table.select(columns) if columns else table
        cached = self._columns.setdefault(name, {})
        wanted = columns or TABLES[name].names
        if rank is not None and not cached:
            return self._read(path, lambda: _typed(_rank_rows(path, wanted, rank), name))
        needed = wanted if rank is None else list(dict.fromkeys([*wanted, "rank"]))
        missing = [c for c in needed if c not in cached]
        if missing:
            read = self._read(path, lambda: _typed(_read_columns(path, missing), name))
            cached.update((c, (read.schema.field(c), read.column(c))) for c in missing)
        table = pa.Table.from_arrays([cached[c][1] for c in wanted],
                                     schema=pa.schema([cached[c][0] for c in wanted]))
        return table if rank is None else _of_rank(table, cached["rank"][1], rank)

    def _read(self, path: Path, read: Callable[[], pa.Table]) -> pa.Table:
        try:
            return read()
        except (OSError, pa.ArrowInvalid) as exc:
            raise RunError(f"{path}: unreadable table ({str(exc).strip()})") from None

    def memo(self, key: Hashable, make: Callable[[], T]) -> T:
        """`make()` once per Run object: a frame or result that several steps of one command
        share (the analysis the report and the advice both use). Writing a table forgets it."""
        if key not in self._memo:
            self._memo[key] = make()
        return cast(T, self._memo[key])

    def holds(self, key: Hashable) -> bool:
        """Whether `memo` has made `key` already (a step that can reuse it, or read less)."""
        return key in self._memo

    def write_table(self, name: str, table: pa.Table) -> None:
        """Write `table` atomically, cast to the table's schema."""
        self.write_batches(name, [table])

    def write_batches(self, name: str, parts: Iterable[pa.Table]) -> None:
        """Write a table from consecutive parts (bounded memory), atomically."""
        schema = TABLES[name]
        self._columns.pop(name, None)
        self._memo.clear()
        self.tables_dir.mkdir(parents=True, exist_ok=True)
        path = self.table_path(name)
        fd, tmp = tempfile.mkstemp(dir=self.tables_dir, prefix=f".{name}.", suffix=".tmp")
        _readable(fd)
        os.close(fd)
        try:
            # The sink closes even when the writer's own close fails (a full disk): no open
            # handle keeps the deleted temporary file's space.
            with pa.OSFile(tmp, "wb") as sink, pq.ParquetWriter(
                    sink, schema, compression="zstd",
                    use_dictionary=_dictionary_columns(schema),
                    write_statistics=statistics_columns(schema)) as writer:
                for group in row_groups(parts, schema):
                    writer.write_table(group, row_group_size=ROW_GROUP)
                    del group
                    # Hand freed slices back to the OS, so writing costs one slice, not many.
                    pa.default_memory_pool().release_unused()
            os.replace(tmp, path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise _disk_error(self.shown(path), exc) from None
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def table_names(self) -> list[str]:
        if not self.tables_dir.is_dir():
            return []
        return sorted(p.stem for p in self.tables_dir.glob("*.parquet"))

    def add_raw(self, source: Path, name: str | None = None) -> Path:
        """Put an original input into raw/ (hard link when possible; never modified)."""
        self.raw_dir.mkdir(parents=True, exist_ok=True)
        target = self.raw_dir / (name or source.name)
        if target.exists():
            stem, n = target.name, 1
            while target.exists():
                target = self.raw_dir / f"{n}-{stem}"
                n += 1
        try:
            os.link(source, target)
        except OSError:
            try:
                shutil.copyfile(source, target)
            except OSError as exc:
                raise _disk_error(self.shown(target), exc) from None
        return target


# Errors that mean the disk (or the quota, or RLIMIT_FSIZE) is full, wherever a write hits them.
DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two directories atomically (renameat2 RENAME_EXCHANGE); False where the C library
    or the filesystem cannot."""
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _replace_dir(new: Path, final: Path) -> None:
    """Put `new` at `final`, which exists: at every instant `final` is the old Run or the new
    one, whole. The old one ends in `new`'s hidden place and is removed."""
    if not _exchange(new, final):
        # No atomic swap here: move the old Run aside under a name no sweep removes, so a
        # crash between the two renames leaves it recoverable by hand.
        aside = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.", suffix=".old"))
        os.replace(final, aside)
        os.replace(new, final)
        new = aside
    shutil.rmtree(new, ignore_errors=True)


def _partial_dir(final: Path) -> tuple[Path, int]:
    """A new hidden `.NAME.XXXX.partial` sibling of `final`, and an fd holding its flock.

    The lock says "an import is building this"; a partial directory nobody holds is what
    a killed process left behind. It is taken before the directory gets the name a sweep
    looks for, so a sweep never sees a live one unlocked.
    """
    init = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.", suffix=".init"))
    fd = os.open(init, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    partial = init.with_name(init.name.removesuffix(".init") + ".partial")
    os.replace(init, partial)
    return partial, fd


def sweep_partials(final: Path) -> list[Path]:
    """Remove the partial directories (and the claim's lock file) of `final` that no live
    process holds (left by a process killed while it built the Run); returns them."""
    swept = []
    lock = [_lock_path(final)] if os.path.lexists(_lock_path(final)) else []
    for partial in [*sorted(final.parent.glob(f".{glob.escape(final.name)}.*.partial")), *lock]:
        try:
            fd = os.open(partial, os.O_RDONLY | (os.O_DIRECTORY * (partial not in lock)))
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # being built right now
        else:
            if partial in lock:
                os.unlink(partial)  # a writer that opened it first sees it gone and retries
            else:
                shutil.rmtree(partial, ignore_errors=True)
            swept.append(partial)
        finally:
            os.close(fd)
    return swept


def _claim(final: Path) -> int:
    """An fd holding the flock of `final`'s hidden `.NAME.lock`: one writer per Run path.

    A second writer fails at once rather than silently replacing the first's Run. The lock
    file is removed by its holder; a writer that locked a file already removed retries."""
    lock = _lock_path(final)
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise PerfswarmError(f"{final}: another perfswarm is writing it") from None
        try:
            if os.stat(lock).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


def _lock_path(final: Path) -> Path:
    whole = Path(os.path.abspath(final))
    return whole.with_name(f".{whole.name}.lock")


def _release(final: Path, fd: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(_lock_path(final))
    os.close(fd)


def _check_replaceable(final: Path, inputs: Iterable[Path]) -> None:
    """`force` replaces a Run, nothing else: not a file, a link, a folder without a manifest,
    nor a folder that holds (or is) one of the inputs being read."""
    refused = ParameterError(None, "exists and is not a perfswarm Run ({force} replaces only "
                             "a Run)", subject=final)
    if final.is_symlink() or not final.is_dir() or not (final / MANIFEST).is_file():
        raise refused
    try:
        Run(final).manifest()
    except RunError:
        raise refused from None
    here = final.resolve()
    for path in inputs:
        if path.resolve().is_relative_to(here):
            raise ParameterError(None, "{force} will not replace it", subject=final,
                                 detail=f"holds the input {path}")


@contextlib.contextmanager
def creating(path: str | Path, *, force: bool = False,
             inputs: Iterable[Path] = ()) -> Iterator[Run]:
    """Build a new Run in a hidden sibling directory; rename it to `path` on success.

    On any error the partial directory is removed, so no half-built Run is left; if the
    process is killed, the next `creating` of the same path removes it. With `force`, an
    existing Run (never anything else, nor one holding any of `inputs`) is swapped for the
    new one atomically: it stays whole until then. The path is claimed for the whole build,
    so a concurrent second writer fails instead of replacing the first's Run.
    A full disk is one PerfswarmError naming the Run.
    """
    final = Path(path)
    inputs = list(inputs)
    if os.path.lexists(final) and not force:
        raise ParameterError(None, "already exists (use {force} to replace it)",
                                 subject=final)
    final.parent.mkdir(parents=True, exist_ok=True)
    claim = _claim(final)
    try:
        if os.path.lexists(final):
            if not force:
                raise ParameterError(None, "already exists (use {force} to replace it)",
                                 subject=final)
            _check_replaceable(final, inputs)
        sweep_partials(final)
        tmp, lock = _partial_dir(final)
    except BaseException:
        _release(final, claim)
        raise
    try:
        (tmp / "raw").mkdir()
        (tmp / "tables").mkdir()
        yield Run(tmp, building=final)
        if os.path.lexists(final):
            if not force:  # made by something other than perfswarm while this one built
                raise ParameterError(None, "already exists (use {force} to replace it)",
                                 subject=final)
            _check_replaceable(final, inputs)
            _replace_dir(tmp, final)
        else:
            os.replace(tmp, final)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if exc.errno in DISK_FULL:
            raise PerfswarmError(f"{final}: cannot write ({os.strerror(exc.errno)})") from None
        raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        os.close(lock)
        _release(final, claim)
