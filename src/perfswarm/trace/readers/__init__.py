"""Readers of raw trace files, one protocol whatever the format.

A reader takes a file, the rank it stands for when the file does not say, the read options and
a folder it may spill to, and gives the trace's metadata (ranks, devices, clocks, warnings) and
its tables (events, flows, counters, steps) on the run clock. `read_file` picks the reader by
the file's content: Nsight Systems SQLite exports (trace/nsys.py) by their SQLite header, Kineto
Chrome-trace JSON (trace/kineto.py) otherwise. Every path that builds a Run reads trace files
through it (import in memory and on Dask workers, and the recorder's build) but the streaming
path, which decodes Kineto JSON in batches (trace/stream.py).

The files beside a trace have their readers here too, one protocol for them all
(`fields.SideReader`): a file and its `Placement` on the Run (its rank, its processes' ranks,
the sampling interval) give `SideTables`, its format and rows in the Run's schemas. So read
torch's execution traces (`execution_trace`: graph tables), memory timelines and CUDA memory
snapshots (`memory_timeline`, through `memory_snapshot`: counters), strace text (`strace`:
events), pcap captures (`pcap`) and the samplers' JSON lines (`sampler`: counters). `perf
script` text (`perf`) and py-spy's folded stacks (`pyspy`) give samples instead, whose stacks
the recorder interns together (recorder/build.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from perfswarm.trace import nsys
from perfswarm.trace.kineto import ReadOptions, TraceMeta, TraceTables, read_trace


class Reader(Protocol):
    def __call__(self, path: Path, rank_hint: int, opts: ReadOptions,
                 spill_dir: Path | None = None) -> tuple[TraceMeta, TraceTables]: ...


def _nsys(path: Path, rank_hint: int, opts: ReadOptions,
          spill_dir: Path | None = None) -> tuple[TraceMeta, TraceTables]:
    """An Nsight Systems export: read with queries, nothing to spill; its times are checked
    by SQLite's types, so there are no bad events to drop."""
    return nsys.read(path, rank_hint)


def reader_for(path: Path) -> Reader:
    return _nsys if nsys.is_nsys(path) else read_trace


def read_file(path: Path, rank_hint: int, opts: ReadOptions,
              spill_dir: Path | None = None) -> tuple[TraceMeta, TraceTables]:
    """The trace file at `path` read by the reader of its format."""
    return reader_for(path)(path, rank_hint, opts, spill_dir)
