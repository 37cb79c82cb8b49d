"""Build the Run from a recording directory: every collector's raw files become tables."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import NamedTuple, TypeVar

import numpy as np
import orjson
import pyarrow as pa

from perfswarm.defaults import SAMPLER_HZ
from perfswarm.errors import TraceFormatError
from perfswarm.recorder.torch_profiler import read_live
from perfswarm.trace.build import (
    Extent,
    add_execution_traces,
    describe,
    in_memory,
    write_tables,
)
from perfswarm.trace.kineto import ReadOptions, TraceTables, concat
from perfswarm.trace.readers import execution_trace, pcap, perf, pyspy, read_file, sampler, strace
from perfswarm.trace.readers.fields import (
    Placement,
    SideReader,
    SideTables,
    counter_table,
)
from perfswarm.trace.schema import (
    COUNTERS,
    EVENTS,
    EXPORT,
    FAULTS,
    FLOWS,
    HOOK_COMPILE,
    HOOK_DELAY,
    HOOK_LOADER,
    HOOK_THREADS,
    LOADED,
    NONE,
    OPTIMIZER_CALL,
    SAMPLES,
    STACKS,
    STEP_BATCH,
    STEP_FORWARD,
    STEP_INPUT,
    STEPS,
    TAIL,
)
from perfswarm.trace.store import Manifest, Run, creating

_PER_PROCESS = re.compile(r"^(?:torch|et|steps)-rank(\d+)-pid(\d+)\.")
T = TypeVar("T")


@dataclass(frozen=True)
class Recording:
    """What the session hands over: where the raw files are and how the child ended."""

    raw: Path
    manifest: Manifest
    perf_exe: str | None
    start_ns: int  # when the collectors started (py-spy's aggregated samples get this time)


def _rank_pid(path: Path) -> tuple[int, int]:
    m = _PER_PROCESS.match(path.name)
    assert m, path
    return int(m.group(1)), int(m.group(2))


def step_files(raw: Path) -> list[Path]:
    """Each stepping process's hook times: its `.json` (written at exit), else its `.live`
    file (the process was killed, or died before its exit handlers ran)."""
    done = {p.stem for p in raw.glob("steps-rank*-pid*.json")}
    return sorted([*raw.glob("steps-rank*-pid*.json"),
                   *(p for p in raw.glob("steps-rank*-pid*.live") if p.stem not in done)])


class Hooks(NamedTuple):
    """A stepping process's steps file."""

    rank: int
    times: list[int]  # of every step hook
    faults: list[int]  # minor page faults at each
    optimizer_ns: dict[int, int]  # hook index -> the optimizer call's own ns
    cut: int | None = None  # the marked step its exit closed (the window still open then)
    batches: dict[int, int] | None = None  # hook index -> a forward-driven step's batch
    # hook index -> when its profiler step() returned: the next marked step has begun
    done: dict[int, int] | None = None
    inputs: dict[int, int] | None = None  # hook index -> its input's elements (STEP_INPUT)
    forward_ns: dict[int, int] | None = None  # hook index -> its forward's ns (STEP_FORWARD)
    delays: list[int] | None = None  # the hooking thread's run delay at each (HOOK_DELAY)
    threads: list[int] | None = None  # torch.get_num_threads() at each (HOOK_THREADS)
    compiles: list[int] | None = None  # torch.compile's compile ns so far at each (HOOK_COMPILE)
    loaders: list[int] | None = None  # DataLoader workers' start ns so far at each (HOOK_LOADER)
    loaded: list[list[int]] | None = None  # the loaders' batches so far at each (LOADED)


def _hooks(path: Path) -> Hooks:
    """A stepping process's hooks; a `.live` file holds the times alone."""
    try:
        if path.suffix == ".live":
            return Hooks(_rank_pid(path)[0], read_live(path.read_bytes()), [], {})
        data = orjson.loads(path.read_bytes())
        rank = int(data["rank"])  # (first: a list here is the TypeError the error names)
        cut = data.get("cut_step")
        return Hooks(rank, [int(t) for t in data["hook_ns"]],
                     [int(f) for f in data.get("hook_faults", [])],
                     {int(i): int(ns) for i, ns in data.get("optimizer_ns", {}).items()},
                     int(cut) if cut is not None else None,
                     {int(i): int(n) for i, n in data.get("batches", {}).items()},
                     {int(i): int(t) for i, t in data.get("step_done_ns", {}).items()},
                     {int(i): int(n) for i, n in data.get("inputs", {}).items()},
                     {int(i): int(n) for i, n in data.get("forward_ns", {}).items()},
                     [int(d) for d in data.get("hook_delays", [])],
                     [int(n) for n in data.get("hook_threads", [])],
                     [int(n) for n in data.get("hook_compile", [])],
                     [int(n) for n in data.get("hook_loader", [])],
                     _loaded(data.get("hook_loaded", [])))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:  # orjson's: ValueErrors
        raise TraceFormatError(path, "steps", f"not a steps file: {exc!r}") from None


def _loaded(rows: list[list[int]]) -> list[list[int]]:
    """A steps file's `hook_loaded`: at each hook, a reading of each LOADED counter."""
    out = [[int(n) for n in row] for row in rows]
    if any(len(row) != len(LOADED) for row in out):
        raise ValueError(f"hook_loaded: rows of {len(LOADED)} counts wanted")
    return out


def stepping_facts(stepping: Iterable[Path]) -> dict[str, object]:
    """What the stepping processes with a `.json` say of themselves (a `.live` file holds
    times alone). The first one's `torch_version`; `window_on`, what counted its steps
    (optimizer, backward or forward); `fp32_matmul` and `fp32_conv`, how its FP32 matrix
    products and convolutions would run on a CUDA GPU ("tf32" or "ieee"), as it had set them
    when its window opened; `cuda`, whether CUDA was there; `pin_memory_unused`, true where it
    iterated a DataLoader(pin_memory=True) that pinned nothing (no accelerator). Every one's
    `threads`:
    torch.get_num_threads() as its window opened, one per process (each step's: the counter
    HOOK_THREADS)."""
    found: dict[str, object] = {}
    threads = []
    for path in stepping:
        if path.suffix == ".json":
            with contextlib.suppress(ValueError, AttributeError):
                data = orjson.loads(path.read_bytes())
                if not found:
                    found = {key: data.get(field) for key, field in (
                        ("torch_version", "torch"), ("window_on", "window_on"),
                        ("fp32_matmul", "fp32_matmul"), ("fp32_conv", "fp32_conv"))}
                    found = {k: v for k, v in found.items() if isinstance(v, str)}
                    found |= {k: data[k] for k in ("cuda", "pin_memory_unused")
                              if isinstance(data.get(k), bool)}
                if isinstance(data.get("threads"), int) and not isinstance(data["threads"], bool):
                    threads.append(data["threads"])
    return {**found, "threads": threads} if threads else found


def hook_counters(hooked: Iterable[Hooks]) -> pa.Table:
    """Each stepping process's minor page-fault count at its step hooks, its optimizer calls'
    own time, and a forward-driven step's batch, input elements and forward's time, as the
    per-rank counters FAULTS, OPTIMIZER_CALL, STEP_BATCH, STEP_INPUT and STEP_FORWARD, the
    hooking thread's run delay, HOOK_DELAY (none where the kernel kept no schedstat), the
    intra-op threads, HOOK_THREADS, torch.compile's compile time so far, HOOK_COMPILE, the
    time spent starting DataLoader workers so far, HOOK_LOADER, and what its DataLoaders
    handed it so far, LOADED (none from a process that took no batch)."""
    rows: dict[str, list[object]] = {k: [] for k in ("rank", "ts", "name", "device", "value")}
    for h in hooked:
        # a fault count and an optimizer call's time belong to the step the hook ends, at
        # the hook; a batch to the step it begins, once the profiler's step() has returned
        # (the next marked step begun)
        begins = [(h.done or {}).get(i, t) for i, t in enumerate(h.times)]
        delays = {i: d for i, d in enumerate(h.delays or []) if d >= 0}
        loaded = h.loaded if h.loaded and h.loaded[-1][0] > 0 else []
        for name, values, at in ((FAULTS, dict(enumerate(h.faults)), h.times),
                                 (HOOK_DELAY, delays, h.times),
                                 (HOOK_THREADS, dict(enumerate(h.threads or [])), h.times),
                                 (HOOK_COMPILE, dict(enumerate(h.compiles or [])), h.times),
                                 (HOOK_LOADER, dict(enumerate(h.loaders or [])), h.times),
                                 *((name, {i: row[k] for i, row in enumerate(loaded)}, h.times)
                                   for k, name in enumerate(LOADED)),
                                 (OPTIMIZER_CALL, h.optimizer_ns, h.times),
                                 (STEP_BATCH, h.batches or {}, begins),
                                 (STEP_INPUT, h.inputs or {}, begins),
                                 (STEP_FORWARD, h.forward_ns or {}, begins)):
            for i, value in sorted(values.items()):
                if i < len(at):
                    for key, v in zip(rows, (h.rank, at[i], name, NONE, float(value)),
                                      strict=True):
                        rows[key].append(v)
    return pa.table(rows).cast(COUNTERS) if rows["ts"] else COUNTERS.empty_table()


def hook_steps(hooked: Iterable[Hooks], marked: set[tuple[int, int]]) -> pa.Table:
    """Steps outside the profiling window, from the optimizer.step() hook times (source
    `detected`): step i runs from hook i-1 to hook i. The step after a rank's last marked one
    holds the trace export (inject/sitecustomize.py), source `export`: it is no normal step."""
    rows: dict[str, list[object]] = {"rank": [], "step": [], "start": [], "end": [], "source": []}
    for rank, hooks, *_ in hooked:
        mine = [s for r, s in marked if r == rank]
        export = max(mine) + 1 if mine else -1
        for i in range(1, len(hooks)):
            if (rank, i) not in marked:
                source = EXPORT if i == export else "detected"
                for key, value in zip(rows, (rank, i, hooks[i - 1], hooks[i], source),
                                      strict=True):
                    rows[key].append(value)
    return pa.table(rows).cast(STEPS) if rows["step"] else STEPS.empty_table()


def tails(marked: pa.Table, hooked: Iterable[Hooks]) -> pa.Table:
    """The marked steps, the one a process's exit closed (the program exited or raised in its
    window: no step hook ended that marker, sitecustomize's flush did) as source `tail`."""
    cut = {(h.rank, h.cut) for h in hooked if h.cut is not None}
    rows = marked.to_pylist()
    for row in rows:
        if (row["rank"], row["step"]) in cut:
            row["source"] = TAIL
    return pa.Table.from_pylist(rows, schema=STEPS)


class Stacks:
    """Interns stacks (tuples of frames) to ids; rows for the `stacks` table."""

    def __init__(self) -> None:
        self.ids: dict[tuple[tuple[str, str, int], ...], int] = {}

    def id(self, frames: tuple[tuple[str, str, int], ...]) -> int:
        # A sample the unwinder found no frames for still needs a stack row to join to.
        return self.ids.setdefault(frames or (("[unknown]", "", NONE),), len(self.ids))

    def table(self) -> pa.Table:
        rows: dict[str, list[object]] = {"stack_id": [], "depth": [], "function": [],
                                         "module": [], "address": []}
        for frames, sid in self.ids.items():
            for depth, (fn, module, address) in enumerate(frames):
                for key, value in zip(rows, (sid, depth, fn, module, address), strict=True):
                    rows[key].append(value)
        return pa.table(rows).cast(STACKS) if rows["depth"] else STACKS.empty_table()


def _samples(rows: dict[str, list[int]], source: str) -> pa.Table:
    if not rows["ts"]:
        return SAMPLES.empty_table()
    table = pa.table({**rows, "source": pa.array([source] * len(rows["ts"]))})
    return table.select(SAMPLES.names).cast(SAMPLES)


def perf_samples(samples: Sequence[perf.Sample], offset_ns: int, rank_of: dict[int, int],
                 stacks: Stacks) -> pa.Table:
    rows: dict[str, list[int]] = {k: [] for k in ("rank", "ts", "pid", "tid", "stack_id",
                                                  "weight")}
    for s in samples:
        for key, value in zip(rows, (rank_of.get(s.pid, NONE), s.mono_ns + offset_ns, s.pid,
                                     s.tid, stacks.id(tuple(s.frames)), 1), strict=True):
            rows[key].append(value)
    return _samples(rows, "perf")


def pyspy_samples(folded: Sequence[pyspy.Folded], start_ns: int, rank_of: dict[int, int],
                  stacks: Stacks) -> pa.Table:
    rows: dict[str, list[int]] = {k: [] for k in ("rank", "ts", "pid", "tid", "stack_id",
                                                  "weight")}
    for f in folded:
        for key, value in zip(rows, (rank_of.get(f.pid, NONE), start_ns, f.pid, f.tid,
                                     stacks.id(f.frames), f.count), strict=True):
            rows[key].append(value)
    return _samples(rows, "py-spy")


def readable(manifest: Manifest, collector: str, read: Callable[[], T], instead: T) -> T:
    """`read()`, or `instead` when the collector's file cannot be read (a child killed while
    it was written, a tool's odd output): the collector is marked failed with the reason
    and the rest of the Run is built. raw/ keeps the file either way."""
    try:
        return read()
    except TraceFormatError as exc:
        status = manifest["collectors"].setdefault(collector, {"status": "ok", "files": []})
        status["status"] = f"failed: {_in_raw(exc)}"
        return instead


def _in_raw(exc: TraceFormatError) -> str:
    """The error naming its file where the Run keeps it (raw/NAME), not in the recording's
    hidden folder, which is gone once the Run is built."""
    where = f" ({exc.where})" if exc.where else ""
    return f"raw/{Path(exc.path).name}{where}: {exc.why}"


def _side(manifest: Manifest, collector: str, read: SideReader, path: Path,
          at: Placement) -> SideTables:
    """A collector's file beside the traces, through its reader (`readable`: none when it
    cannot be read)."""
    return readable(manifest, collector, partial(read, path, at), SideTables(collector))


def build_run(rec: Recording, out: Path, force: bool) -> Run:
    """Ingest the recording into a new Run at `out` (atomic: all or nothing)."""
    manifest = rec.manifest
    raw = rec.raw
    traces = sorted(raw.glob("torch-rank*-pid*.pt.trace.json"))
    with creating(out, force=force) as run:
        # dot files are scratch (a window flag, a half-written export) left by a killed child
        for path in sorted(p for p in raw.iterdir() if p.is_file() and p.name[0] != "."):
            run.add_raw(path)
        parts: list[TraceTables] = []
        rank_of: dict[int, int] = {}
        for path in traces:
            rank, pid = _rank_pid(path)
            rank_of[pid] = rank
            read = readable(manifest, "torch", partial(read_file, path, rank,
                                                       ReadOptions(drop_bad_events=True)), None)
            if read is None:
                continue
            meta, tables = read
            parts.append(tables)
            # the trace's own rank (distributedInfo) where it has one: a process without RANK
            # (torch.multiprocessing.spawn's ranks) was named the recorder's next free rank
            rank_of[pid] = meta.rank if meta.rank is not None else rank
            describe(manifest, path, rank_of[pid], meta, tables.events.num_rows,
                     Extent.of(tables.events))
        stepping = step_files(raw)
        for path in stepping:
            rank, pid = _rank_pid(path)
            rank_of.setdefault(pid, rank)
        marker_steps = concat([p.steps for p in parts], STEPS)
        marked = set(zip(marker_steps.column("rank").to_pylist(),
                         marker_steps.column("step").to_pylist(), strict=True))
        # each process's steps on its trace's rank (spawned ranks' steps files had been ranks
        # 1 and 2 beside traces of 0 and 1: a phantom rank, another's export step its outlier)
        hooked = [h._replace(rank=rank_of[_rank_pid(path)[1]]) for path in stepping
                  if (h := readable(manifest, "torch", partial(_hooks, path), None)) is not None]
        steps = concat([tails(marker_steps, hooked), hook_steps(hooked, marked)], STEPS)
        steps = steps.take(pa.array(np.lexsort((steps.column("step").to_numpy(),
                                                steps.column("rank").to_numpy()))))
        at = Placement(rank_of=rank_of, interval_ns=_interval_ns(manifest))
        held = "attached" not in manifest.get("extra", {}).get("record", {})  # not --pid
        syscalls = _side(manifest, "strace", partial(strace.read, held=held), raw / "strace.txt",
                         at).events
        sampled = [_side(manifest, p.stem, sampler.read, p, at).counters
                   for p in sorted(raw.glob("*.jsonl"))]
        perf_read = _perf_samples(rec)
        perf_counted = counter_table(perf.event_counters(
            perf_read, manifest["clock_offsets"].get("perf", 0), at.interval_ns))
        counted = concat([*(p.counters for p in parts), *sampled, _flows(raw / "net.pcap",
                          manifest, at), perf_counted, hook_counters(hooked)], COUNTERS)
        write_tables(run, in_memory([TraceTables(
            concat([*(p.events for p in parts), syscalls], EVENTS),
            concat([p.flows for p in parts], FLOWS), counted.sort_by("ts"), steps)]))
        _graph(run, manifest, sorted(raw.glob("et-rank*-pid*.json")), rank_of)
        _stack_samples(run, rec, rank_of, [p for p in perf_read if p.event == perf.STACKS_EVENT])
        manifest["ranks"] = sorted(set(rank_of.values()))
        manifest.setdefault("extra", {}).setdefault("record", {}).update(
            stepping_facts(stepping))
        run.write_manifest(manifest)
    return Run(out)


def _interval_ns(manifest: Manifest) -> int:
    """The samplers' interval: the recorded rate, or the default one for raw files whose
    manifest never said (a Run rebuilt from another recorder's raw/)."""
    hz: float = manifest.get("extra", {}).get("record", {}).get("hz", SAMPLER_HZ)
    return round(1e9 / hz)


def _flows(path: Path, manifest: Manifest, at: Placement) -> pa.Table:
    """The capture's flow counters, one point per sampling interval; a capture that cannot be
    read is a warning, not a lost Run."""
    try:
        return pcap.read(path, at).counters
    except TraceFormatError as e:
        manifest["warnings"].append({"source": path.name, "what": e.why, "count": 1})
        return COUNTERS.empty_table()


def _graph(run: Run, manifest: Manifest, paths: Sequence[Path], rank_of: dict[int, int]
           ) -> None:
    """The profiled processes' execution traces; one that cannot be read (cut short by a
    kill; the unescaped names torch writes are mended by the reader) is a warning, not a lost
    Run nor a failed torch collector (its traces and steps stand)."""

    def read(path: Path, at: Placement) -> SideTables | None:
        try:
            return execution_trace.read(path, at)
        except TraceFormatError as exc:
            manifest["warnings"].append({"source": "torch", "what": "execution trace "
                                         f"unreadable, no op graph: {_in_raw(exc)}",
                                         "count": 1})
            return None

    add_execution_traces(run, manifest, [(path, rank_of.get(pid, rank)) for path in paths
                                         for rank, pid in [_rank_pid(path)]], read)


def _perf_samples(rec: Recording) -> list[perf.Sample]:
    """perf's samples, every event's, of each file it wrote (perf.data, and perf-N.data where
    the recorder started it again: ToolCollector.watch); none without them, or where one
    cannot be read."""
    exe = rec.perf_exe
    files = sorted((p for p in rec.raw.glob("perf*.data") if p.is_file() and p.stat().st_size),
                   key=lambda p: int(p.stem.partition("-")[2] or 1))
    none: list[perf.Sample] = []
    return [s for data in files if exe
            for s in readable(rec.manifest, "perf", partial(perf.read_perf_data, exe, data),
                              none)]


def _stack_samples(run: Run, rec: Recording, rank_of: dict[int, int],
                   stacked: Sequence[perf.Sample]) -> None:
    stacks = Stacks()
    parts = []
    if stacked:
        parts.append(perf_samples(stacked, rec.manifest["clock_offsets"]["perf"], rank_of,
                                  stacks))
    spy = rec.raw / "pystacks.txt"
    if spy.is_file():
        parts.append(pyspy_samples(readable(rec.manifest, "pystacks",
                                            partial(pyspy.read, spy), []),
                                   rec.start_ns, rank_of, stacks))
    samples = concat(parts, SAMPLES)
    order = np.lexsort((samples.column("ts").to_numpy(), samples.column("rank").to_numpy()))
    run.write_table("samples", samples.take(pa.array(order)))
    run.write_table("stacks", stacks.table())
