"""Report views beyond the overview and the timeline: ops by input shape, kernels per stream
with their launch geometry, memory, and ranks side by side. Each is a plain dict or list.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from perfswarm.analyze.annotations import HostCalls
from perfswarm.analyze.frame import KIND, Events, args_of, codes, detail_of
from perfswarm.analyze.intervals import union
from perfswarm.analyze.phases import PHASES, phases
from perfswarm.model.opcost import Shapes
from perfswarm.model.opstats import RowShapes
from perfswarm.report.timeline import Spans
from perfswarm.trace.store import Run

# Kineto's launch geometry and occupancy keys on kernel events, shown as they are.
LAUNCH_KEYS: Final = ("grid", "block", "registers per thread", "shared memory",
                      "est. achieved occupancy %", "blocks per SM", "warps per SM")
MEMORY_EVENT: Final = "[memory]"  # profile_memory=True: one instant per allocation and free


def ops_by_shape(run: Run, ev: Events, calls: HostCalls, limit: int) -> list[dict[str, Any]]:
    """Op calls (analyze's HostCalls) grouped by name and input shapes (record_shapes):
    calls, total and self time; the `limit` largest by total."""
    rows = calls.of_kind(ev, "cpu_op")
    group_of: dict[tuple[int, Shapes], int] = {}  # (name, shapes) -> group
    shaped, group = [], []
    for i, name, shapes in zip(rows.tolist(), ev.name[rows].tolist(),
                               RowShapes.of(run).get(rows), strict=True):
        if shapes is not None:
            shaped.append(i)
            group.append(group_of.setdefault((name, shapes), len(group_of)))
    at, g = np.asarray(shaped, np.int64), np.asarray(group, np.int64)
    count = np.bincount(g, minlength=len(group_of))
    total, own = (np.zeros(len(group_of), np.int64) for _ in range(2))
    np.add.at(total, g, ev.dur[at])
    np.add.at(own, g, calls.cpu_self[at])
    # groups of one name whose shapes read alike (a scalar's dims and none) are one row
    rows_of: dict[tuple[str, str], list[int]] = {}
    for (name, shapes), k in group_of.items():
        text = ", ".join("x".join(map(str, d)) if d else "scalar" for d in shapes.dims)
        rows_of.setdefault((ev.names[name], text), []).append(k)
    sums = {key: (int(count[ks].sum()), int(total[ks].sum()), int(own[ks].sum()))
            for key, ks in rows_of.items()}
    order = sorted(sums, key=lambda k: (-sums[k][1], k))[:limit]
    return [{"name": n, "shapes": s, "count": sums[(n, s)][0], "total_ns": sums[(n, s)][1],
             "self_ns": sums[(n, s)][2]} for n, s in order]


def op_stacks(ev: Events, calls: HostCalls) -> dict[str, list[str]]:
    """Each op's heaviest call stack: the python_function calls around its calls
    (with_stack), outermost first, the one its calls spent most time under; ops never
    called under a python_function are left out."""
    python = KIND["python_function"]
    stacks: dict[str, dict[tuple[str, ...], int]] = {}
    for i in calls.of_kind(ev, "cpu_op").tolist():
        frames = [ev.name_of(p) for p in calls.around(i) if ev.kind[p] == python]
        if frames:
            by_stack = stacks.setdefault(ev.name_of(i), {})
            key = tuple(reversed(frames))
            by_stack[key] = by_stack.get(key, 0) + int(ev.dur[i])
    return {n: list(max(s.items(), key=lambda kv: (kv[1], kv[0]))[0])
            for n, s in stacks.items()}


def _launch(args_text: str | None) -> dict[str, str]:
    try:
        args = orjson.loads(args_text or "{}")
    except orjson.JSONDecodeError:
        return {}
    if not isinstance(args, dict):
        return {}
    return {k: " x ".join(map(str, v)) if isinstance(v, list) else str(v)
            for k, v in args.items() if k in LAUNCH_KEYS}


def kernel_streams(run: Run, spans: Spans, limit: int) -> dict[str, Any]:
    """Per device stream: kernels, their summed and busy (union) time and the stream's busy
    share of the traced span; the top kernels with the launch geometry of their longest call."""
    table = spans.table
    kind, kinds = codes(table.column("kind"))
    name_code, names = codes(table.column("name"))
    ts = np.asarray(table.column("ts").to_numpy(), np.int64)
    dur = np.asarray(table.column("dur").to_numpy(), np.int64)
    lane = spans.nesting.lane
    device = np.array([dev for _, dev, _, _ in spans.nesting.lanes] or [False], bool)[lane]
    if not device.any():
        return {"streams": [], "kernels": []}
    traced = int((ts + dur).max() - ts.min())
    is_kernel = np.isin(kind, [i for i, k in enumerate(kinds) if k in {"kernel", "collective"}]
                        ) & device
    streams = []
    for j in sorted(set(lane[device].tolist())):
        mine = is_kernel & (lane == j)
        s, e = union(ts[mine], ts[mine] + dur[mine])
        r, _dev, dev_id, stream = spans.nesting.lanes[j]
        busy = int((e - s).sum())
        streams.append({"rank": r, "device": dev_id, "stream": stream,
                        "kernels": int(mine.sum()), "total_ns": int(dur[mine].sum()),
                        "busy_ns": busy, "busy_share": busy / traced if traced else 0.0})
    groups: dict[str, list[int]] = {}
    for i, n in zip(np.flatnonzero(is_kernel).tolist(), name_code[is_kernel].tolist(),
                    strict=True):
        groups.setdefault(names[n], []).append(i)
    top = sorted(groups, key=lambda n: (-int(dur[groups[n]].sum()), n))[:limit]
    longest = {n: max(groups[n], key=lambda i: (int(dur[i]), -i)) for n in top}
    wanted = np.unique(spans.rows[list(longest.values())])  # their detail read alone
    args = dict(zip(wanted.tolist(), detail_of(run, wanted), strict=True))
    kernels = []
    for name in top:
        rows = groups[name]
        kernels.append({
            "name": name, "count": len(rows), "total_ns": int(dur[rows].sum()),
            "mean_ns": float(dur[rows].mean()),
            "streams": sorted({spans.nesting.lanes[int(lane[i])][3] for i in rows}),
            "launch": _launch(args[int(spans.rows[longest[name]])])})
    return {"streams": streams, "kernels": kernels}


MODULE_PREFIX: Final = "nn.Module: "  # Kineto's python_function spans with with_modules=True


def module_tree(ev: Events, calls: HostCalls, limit: int) -> list[dict[str, Any]]:
    """nn.Module calls (analyze's HostCalls) as a tree: each module path (outer modules
    first) with its calls and total time, in depth-first order of the heaviest children;
    the first `limit` rows."""
    functions = calls.of_kind(ev, "python_function")
    modules = set(functions[[ev.name_of(i).startswith(MODULE_PREFIX)
                             for i in functions.tolist()]].tolist()) if len(functions) else set()
    paths: dict[tuple[str, ...], list[int]] = {}
    for i in sorted(modules):
        path = [ev.name_of(p)[len(MODULE_PREFIX):] for p in [i, *calls.around(i)]
                if p in modules]
        g = paths.setdefault(tuple(reversed(path)), [0, 0])
        g[0] += 1
        g[1] += int(ev.dur[i])
    rows: list[dict[str, Any]] = []

    def visit(prefix: tuple[str, ...]) -> None:
        children = [p for p in paths if len(p) == len(prefix) + 1 and p[:-1] == prefix]
        for path in sorted(children, key=lambda p: (-paths[p][1], p)):
            rows.append({"module": path[-1], "depth": len(prefix), "path": list(path),
                         "calls": paths[path][0], "total_ns": paths[path][1]})
            visit(path)

    visit(())
    return rows[:limit]


BEFORE_TRACE: Final = "before the trace"  # bytes live at the first event the trace saw


def memory_view(run: Run, origin: int, max_points: int) -> list[dict[str, Any]]:
    """profile_memory's `[memory]` instants per rank and device: allocated and reserved bytes
    over time (ms from `origin`, cut to `max_points`), their peaks, allocations and frees, and
    the peak by category: the bytes live at the peak by the pass that allocated them
    (analyze.phases: the forward's activations, the backward's gradients, the optimizer's
    state), and those allocated before the trace began (parameters and what else was there)."""
    table = run.table("events", ["rank", "ts", "name"])
    found = np.flatnonzero(pc.is_in(table.column("name"), pa.array([MEMORY_EVENT]))
                           .to_numpy(zero_copy_only=False))
    if not len(found):
        return []
    rows = found.tolist()
    ranks, ts = (table.column(c).to_pylist() for c in ("rank", "ts"))
    texts = dict(zip(rows, args_of(run, found), strict=True))
    phase_of = dict(zip(rows, phases(Events.load(run), np.asarray(rows, np.int64)).tolist(),
                        strict=True))
    # (ts, bytes, total allocated, total reserved, address, phase) per rank and device
    series: dict[tuple[int, str], list[tuple[int, float, float, float, Any, int]]] = {}
    for i in rows:
        try:
            args = orjson.loads(texts[i])
        except orjson.JSONDecodeError:
            continue
        if not isinstance(args, dict):
            continue
        where = ("cpu" if args.get("Device Type") == 0 else
                 f"device {args.get('Device Id', '?')}")
        series.setdefault((ranks[i], where), []).append(
            (ts[i], float(args.get("Bytes", 0)), float(args.get("Total Allocated", 0)),
             float(args.get("Total Reserved", 0)), args.get("Addr"), phase_of[i]))
    out = []
    for (rank, where), points in sorted(series.items()):
        points.sort(key=lambda p: p[0])  # stable: an allocation and a free at one ts keep order
        step = max(1, -(-len(points) // max_points))
        shown = points[::step]
        peak = max(range(len(points)), key=lambda j: (points[j][2], -j))
        out.append({"rank": rank, "device": where,
                    # torch's CPU allocator counts from the profiler's start: what was there
                    # before (parameters, optimizer state) is in no total
                    "since_profiling": where == "cpu",
                    "allocations": sum(1 for p in points if p[1] > 0),
                    "frees": sum(1 for p in points if p[1] < 0),
                    "allocated_bytes": sum(p[1] for p in points if p[1] > 0),
                    "peak_allocated": points[peak][2],
                    "peak_reserved": max(p[3] for p in points),
                    "peak_ms": (points[peak][0] - origin) / 1e6,
                    "peak_by_category": _live_at(points[:peak + 1]),
                    "t_ms": [(p[0] - origin) / 1e6 for p in shown],
                    "allocated": [p[2] for p in shown], "reserved": [p[3] for p in shown]})
    return out


def _live_at(points: list[tuple[int, float, float, float, Any, int]]) -> dict[str, float]:
    """Bytes live after the last of `points` by the pass that allocated them, and those that
    were live before the first (the first point's total less its own change, less what of it
    was freed since): together the last point's total."""
    live: dict[Any, tuple[float, int]] = {}
    before = points[0][2] - points[0][1]
    for _ts, change, _total, _reserved, addr, phase in points:
        if change > 0:
            live[addr] = (change, phase)
        elif addr in live:
            del live[addr]
        else:  # a free of what was there before: the categories still add up to the total
            before += change
    sums = {BEFORE_TRACE: before, **dict.fromkeys(PHASES, 0.0)}
    for change, phase in live.values():
        sums[PHASES[phase]] += change
    return sums


def memory_category_rows(memory: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The memory timeline's peaks as table rows: per rank, the whole run's, then each step's;
    a snapshot's whole-run row has the bytes reserved then (`reserved_bytes`, else None)."""
    return [{"rank": m["rank"], "step": step, "total_bytes": p["total_bytes"],
             "by_category": p["by_category"], "reserved_bytes": reserved}
            for m in memory for step, p, reserved in [
                ("all", m["peak"], (m["reserved"] or {}).get("at_peak_bytes"))]
            + [(s["step"], s, None) for s in m["steps"]]]


def critical_step_rows(path: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Each iteration's critical path as a table row: its categories by share, largest first;
    its ranks where a step has several paths (ranks that wait for none of the others)."""
    steps = (path or {}).get("steps", [])
    split = len({s["step"] for s in steps}) < len(steps)
    return [{**{k: s[k] for k in ("step", "start", "length_ns", "device_ops", "handovers")},
             "ranks": s["ranks"] if split else [],
             "shares": sorted(((k, v) for k, v in s["share"].items() if v),
                              key=lambda kv: -kv[1])}
            for s in steps]


def queue_rows(launch: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The launch queue over time (analyze's `queue` bins: launched, unfinished ops) of each
    rank (`device` and `stream` None) and of each of its streams, for the report's chart."""
    return [{"rank": r["rank"], "device": device, "stream": stream,
             **{k: q[k] for k in ("start", "bin_ns", "bins", "max", "full_ns")}}
            for r in launch
            for device, stream, q in [(None, None, r["queue"])]
            + [(s["device"], s["stream"], s["queue"]) for s in r["streams"]]
            if q["bins"]]


def ranks_view(analysis: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Ranks side by side: median step, compute and communication time, the share of
    communication hidden under compute, and how long the others waited for this rank."""
    held = {r["rank"]: r["held_back_ns"] for r in analysis["stragglers"]["ranks"]}
    straggler = analysis["stragglers"]["straggler"]
    rows = []
    for rank in analysis["concurrency"]["ranks"]:
        r = rank["rank"]
        ns = rank["total"]["ns"]
        steps = [s["dur_ns"] for s in analysis["iterations"]["steps"].get(str(r), [])]
        on_device = {"compute_ns": ns["compute_only"] + ns["overlapped"],
                     "comm_ns": ns["comm_only"] + ns["overlapped"],
                     "comm_hidden_pct": rank["total"]["comm_overlap_pct"]}
        host = rank.get("host_comm")  # a CPU process group's (gloo): the host's compute
        if host and not on_device["compute_ns"] + on_device["comm_ns"]:
            on_device = {"compute_ns": host["compute_ns"], "comm_ns": host["comm_ns"],
                         "comm_hidden_pct": host["comm_overlap_pct"]}
        elif not on_device["compute_ns"] + on_device["comm_ns"] + ns["memory"]:
            # no device work and no collective: the host computes (its ops' time), and there
            # is no communication to hide (it had read 0 ms of compute, 0.0% hidden)
            on_device = {"compute_ns": rank["total"]["host_ops_ns"], "comm_ns": 0,
                         "comm_hidden_pct": None}
        rows.append({"rank": r, "median_step_ns": float(np.median(steps)) if steps else None,
                     "steps": len(steps), **on_device,
                     "held_back_ns": held.get(r, 0), "straggler": r == straggler})
    return rows
