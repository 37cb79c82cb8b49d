"""A Run at a glance: ranks, devices, time span, events per kind, steps."""

from __future__ import annotations

from typing import TypedDict

import pyarrow.compute as pc

from perfswarm.trace.schema import TABLES
from perfswarm.trace.store import Run


class StepInfo(TypedDict):
    rank: int
    step: int
    start: int
    end: int
    duration_ns: int
    source: str


class RunInfo(TypedDict):
    path: str
    complete: bool
    command: list[str]
    ranks: list[int]
    devices: list[dict[str, object]]
    span_ns: int
    start_ns: int
    end_ns: int
    events: int
    events_per_kind: dict[str, int]
    counters: int
    samples: int
    graph_nodes: int
    steps: list[StepInfo]
    collectors: dict[str, str]
    warnings: list[dict[str, object]]


def run_info(run: Run) -> RunInfo:
    manifest = run.manifest()
    for name in TABLES:  # a damaged Run is said here as every other command says it
        run.has_table(name)
    events = run.table("events", ["ts", "dur", "kind"])
    per_kind: dict[str, int] = {}
    start = end = 0
    if events.num_rows:
        counts = pc.value_counts(events.column("kind").combine_chunks().dictionary_decode())
        per_kind = {str(c["values"]): int(c["counts"]) for c in counts.to_pylist()}
        per_kind = dict(sorted(per_kind.items()))
        start = int(pc.min(events.column("ts")).as_py())
        end = int(pc.max(pc.add(events.column("ts"), events.column("dur"))).as_py())
    steps = run.table("steps")
    if not events.num_rows:  # a program without torch: what the samplers and hooks saw
        columns = [run.table("samples", ["ts"]).column("ts"),
                   run.table("counters", ["ts"]).column("ts"),
                   steps.column("start"), steps.column("end")]
        bounds = [pc.min_max(c).as_py() for c in columns]
        times = [t for b in bounds for t in (b["min"], b["max"]) if t is not None]
        start, end = (min(times), max(times)) if times else (0, 0)
    step_rows = [
        StepInfo(rank=r["rank"], step=r["step"], start=r["start"], end=r["end"],
                 duration_ns=r["end"] - r["start"], source=r["source"])
        for r in sorted(steps.to_pylist(), key=lambda r: (r["rank"], r["start"], r["step"]))
    ]  # in time order (a log dir's files are in name order: trace_6 after trace_18)
    devices: list[dict[str, object]] = [
        {k: d.get(k) for k in ("rank", "id", "name", "totalGlobalMem", "numSms") if k in d}
        for d in manifest["devices"]
    ]
    return RunInfo(
        path=str(run.path),
        complete=manifest["complete"],
        command=manifest["command"],
        ranks=manifest["ranks"],
        devices=devices,
        span_ns=end - start,
        start_ns=start,
        end_ns=end,
        events=events.num_rows,
        events_per_kind=per_kind,
        counters=run.table("counters", ["ts"]).num_rows,
        samples=run.table("samples", ["ts"]).num_rows,
        graph_nodes=run.table("graph_nodes", ["node_id"]).num_rows,
        steps=step_rows,
        collectors={k: v["status"] for k, v in manifest["collectors"].items()},
        warnings=[dict(w) for w in manifest["warnings"]],
    )
