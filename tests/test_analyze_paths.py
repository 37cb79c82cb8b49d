"""Critical path, stragglers, run diff and function swarms."""

from __future__ import annotations

import gzip
import itertools
import tracemalloc
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import GLOO_DDP, TP_GLOO, TRACES, corpus, events, gloo_ddp_raw
from perfswarm.analyze.concurrency import concurrency, host_compute
from perfswarm.analyze.critical_path import (
    CATEGORIES,
    HOST_STATES,
    Segment,
    State,
    Window,
    _Latest,
    _Step,
    build,
    counted,
    critical_path,
    device_waits,
)
from perfswarm.analyze.dependencies import (
    RowMap,
    blocked_in_collectives,
    dependencies,
    sync_events,
    thread_wakes,
)
from perfswarm.analyze.diff import diff, diff_runs
from perfswarm.analyze.frame import DEVICE_OPS, KIND, Events, lane_key
from perfswarm.analyze.groups import NO_GROUP, Group, process_groups
from perfswarm.analyze.intervals import innermost, sorted_unique
from perfswarm.analyze.iterations import (
    StepWindow,
    detected_steps,
    iterations,
    profiled_windows,
)
from perfswarm.analyze.rpc import rpc_hand_overs
from perfswarm.analyze.stragglers import Instance, instances_of, stragglers
from perfswarm.analyze.summary import analyze
from perfswarm.analyze.swarms import Labels, describe, swarms
from perfswarm.analyze.system import system_load
from perfswarm.trace import synthetic
from perfswarm.trace.ingest import ImportOptions, import_traces
from perfswarm.trace.schema import COUNTERS, SAMPLES, STACKS
from perfswarm.trace.store import Run

DATA = Path(__file__).parent / "data"
US = 1000
ALLREDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
W = NO_GROUP  # the group of a trace that names none: every rank's


def test_detection_follows_the_marker_thread() -> None:
    """A DataLoader worker profiled over the same window (tid 2) outlasts the main thread; its
    ops repeat too, at another period. Detection reads the thread holding the step markers."""
    rows = []
    for i in range(4):
        t = 100 * US + i * 1000 * US
        rows.append((0, t, 1000 * US, "user_annotation", f"ProfilerStep#{i}", 1, -1, -1, -1))
        rows += [(0, t + k * 200 * US, 150 * US, "cpu_op", name, 1, -1, -1, -1)
                 for k, name in enumerate(("zero_grad", "forward", "backward", "step"))]
    rows += [(0, k * 300 * US, 100 * US, "cpu_op", ("stack", "cat")[k % 2], 2, -1, -1, -1)
             for k in range(15)]  # 0 .. 4.3 ms: a longer stretch than the main thread's
    detected = detected_steps(events(sorted(rows, key=lambda r: r[1])))
    # the first from its first op, each later one from the end of the step op before it (600
    # us into an iteration, 150 long); the last to its own last op's end
    bounds = [100 * US] + [100 * US + i * 1000 * US - 250 * US for i in range(1, 4)]
    assert [(w.start, w.end) for w in detected[0]] == [
        *itertools.pairwise(bounds), (bounds[3], 100 * US + 3000 * US + 750 * US)]


def test_critical_path_event_sync_exact(corpus_runs: dict[str, Run]) -> None:
    run = corpus_runs["event_sync"]
    ev = Events.load(run)
    path = critical_path(ev, sync_events(run, ev))
    assert path is not None
    # ends with cudaDeviceSynchronize (512482 us); cudaEventSynchronize waited for the 36 us
    # spin kernel (ended 512408, call returned 512416), launched at 512362..512371; before
    # that, item()'s cudaMemcpyAsync to pageable memory waited for its 2 us copy (512270..
    # 512272, the call returned at 512281)
    assert path.end % 10**9 == 512_482_000 and path.length_ns == 2577 * US
    assert sum(path.ns.values()) == path.length_ns
    assert (path.ns["sync"], path.ns["kernel"], path.ns["memcpy"],
            path.ns["launch_overhead"]) == ((8 + 9) * US, 36 * US, 2 * US, 1 * US)
    # the rest is the launching thread, per ns: in a runtime call, in another op, or neither
    host = ev.host_busy & (ev.tid == 948300)
    base = path.end - 512_482_000
    t = np.arange(path.start, path.end, US)  # the trace's times are whole microseconds
    on_host = ((t < base + 512_270_000) | (t >= base + 512_281_000)) & (
        (t < base + 512_371_000) | (t >= base + 512_416_000))
    in_call = np.zeros(len(t), bool)
    busy = np.zeros(len(t), bool)
    for s, e, k in zip(ev.ts[host], ev.end[host], ev.kind[host], strict=True):
        cover = (t >= s) & (t < e)
        busy |= cover
        if k == KIND["runtime"]:
            in_call |= cover
    assert path.ns["runtime"] == int((on_host & in_call).sum()) * US == 109 * US
    assert path.ns["cpu"] == int((on_host & busy & ~in_call).sum()) * US == 2271 * US
    assert path.ns["host_idle"] == int((on_host & ~busy).sum()) * US == 141 * US


def test_stream_wait_event_links_streams(corpus_runs: dict[str, Run]) -> None:
    run = corpus_runs["event_sync_multi"]
    ev = Events.load(run)
    g = dependencies(ev, sync_events(run, ev))
    # cudaStreamWaitEvent (corr 1389): stream 24 waits for the event recorded (corr 1385)
    # after the sgemm launched on stream 20 (corr 27); stream 24's next op is memset 1411
    ((waiter, recorded),) = g.waits_for.items()
    assert (ev.stream[waiter], ev.correlation[waiter]) == (24, 1411)
    assert (ev.stream[recorded], ev.correlation[recorded]) == (20, 27)


def test_device_op_dependencies_are_arrays(corpus_runs: dict[str, Run]) -> None:
    """Each device op's previous op on its stream (by start) and its launch call (same rank
    and correlation id): two arrays each, by the op's row, not dicts of every op."""
    run = corpus_runs["event_sync_multi"]
    ev = Events.load(run)
    d = dependencies(ev, sync_events(run, ev))
    dev = np.flatnonzero(np.isin(ev.kind, [KIND[k] for k in ("kernel", "memcpy", "memset")]))
    lanes: dict[tuple[int, int], list[int]] = {}
    for r in dev.tolist():
        lanes.setdefault((int(ev.rank[r]), int(ev.stream[r])), []).append(r)
    prev = {}
    for lane in lanes.values():
        lane.sort(key=lambda r: (int(ev.ts[r]), r))
        prev.update(zip(lane[1:], lane[:-1], strict=True))
    ops, before = d.prev_on_stream
    assert ops.dtype == before.dtype == np.int64 and (len(ops), len(dev)) == (3, 6)  # 3 streams
    assert ops.tolist() == sorted(prev) and before.tolist() == [prev[o] for o in sorted(prev)]
    ops, calls = d.launch_of
    assert np.all(np.diff(ops) > 0) and len(ops) == len(dev)
    assert np.array_equal(ev.correlation[ops], ev.correlation[calls])
    assert set(ev.kind[calls].tolist()) == {KIND["runtime"]}


@pytest.mark.parametrize("name", sorted(TRACES))
def test_critical_path_partitions_its_span(corpus_runs: dict[str, Run], name: str) -> None:
    run = corpus_runs[name]
    ev = Events.load(run)
    steps = iterations(run, ev).steps
    path = critical_path(ev, sync_events(run, ev), steps)
    assert path is not None
    assert sum(path.ns.values()) == path.length_ns > 0
    assert all(v >= 0 for v in path.ns.values())
    windows = {w.step: w for ws in steps.values() for w in ws}
    for step in path.steps:  # each inside its iteration, from its start, partitioned too
        assert windows[step.step].start <= step.start <= step.end
        assert sum(step.ns.values()) == step.length_ns
        assert all(v >= 0 for v in step.ns.values())


def _two_ranks() -> Events:
    return events([
        (0, 0, 100, "cpu_op", "step", 1, -1, -1, -1),
        (0, 10, 10, "runtime", "cudaLaunchKernel", 1, -1, -1, 1),
        (0, 30, 170, "collective", ALLREDUCE, 0, 0, 7, 1),
        (1, 0, 150, "cpu_op", "step", 1, -1, -1, -1),
        (1, 120, 10, "runtime", "cudaLaunchKernel", 1, -1, -1, 1),
        (1, 140, 50, "collective", ALLREDUCE, 0, 0, 7, 1),
    ])


def test_critical_path_follows_the_late_rank() -> None:
    path = critical_path(_two_ranks(), [])
    assert path is not None
    # rank 0's all-reduce ends at 200 but could only finish after rank 1 entered it (140);
    # rank 1 launched it at 120..130 after 120 ns of its own op
    assert (path.start, path.end, path.rank_switches) == (0, 200, 1)
    assert {k: v for k, v in path.ns.items() if v} == {
        "collective": 60, "launch_overhead": 10, "runtime": 10, "cpu": 120}


def test_a_steps_path_starts_where_its_rank_started_the_step() -> None:
    """Two ranks with no collective between them: rank 1 ends its previous step at 15, starts
    step 0 at 20 and ends it last, at 110; its path of the step is its 90 (walked back to the
    earliest rank's start, 0, it had been 110, the previous step's tail in it: longer than
    either rank's step), and rank 0, waiting for no other rank, has its own, its 100."""
    ev = events([(0, 0, 100, "cpu_op", "work", 1, -1, -1, -1),
                 (1, -30, 45, "cpu_op", "before", 1, -1, -1, -1),
                 (1, 20, 90, "cpu_op", "work", 1, -1, -1, -1)])
    steps = {0: [StepWindow(0, 0, 100, "marker")], 1: [StepWindow(0, 20, 110, "marker")]}
    path = critical_path(ev, [], steps)
    assert path is not None
    assert [(s.ranks, s.start, s.end, s.length_ns, s.rank_switches, s.ns["cpu"])
            for s in path.steps] == [((0,), 0, 100, 100, 0, 100), ((1,), 20, 110, 90, 0, 90)]


# One iteration, 0..500 us, built so its critical path is known: the main thread (1) runs
# forward and launches k1, then sits in `## backward ##` while the autograd thread (2) runs
# backward: it launches k2 and k3 (queued behind k2 on stream 7), synchronizes, and works on;
# the main thread resumes 10 us after it and runs the optimizer to the end.
ITERATION = [
    (0, 0, 100 * US, "cpu_op", "forward", 1, -1, -1, -1),
    (0, 10 * US, 10 * US, "runtime", "cudaLaunchKernel", 1, -1, -1, 1),
    (0, 30 * US, 50 * US, "kernel", "k1", 0, 0, 7, 1),
    (0, 100 * US, 300 * US, "user_annotation", "## backward ##", 1, -1, -1, -1),
    (0, 120 * US, 80 * US, "cpu_op", "evaluate_function: A", 2, -1, -1, -1),
    (0, 130 * US, 10 * US, "runtime", "cudaLaunchKernel", 2, -1, -1, 2),
    (0, 150 * US, 200 * US, "kernel", "k2", 0, 0, 7, 2),
    (0, 190 * US, 5 * US, "runtime", "cudaLaunchKernel", 2, -1, -1, 3),
    (0, 352 * US, 8 * US, "kernel", "k3", 0, 0, 7, 3),
    (0, 210 * US, 90 * US, "cpu_op", "evaluate_function: B", 2, -1, -1, -1),
    (0, 220 * US, 142 * US, "runtime", "cudaDeviceSynchronize", 2, -1, -1, 4),
    (0, 365 * US, 25 * US, "cpu_op", "evaluate_function: C", 2, -1, -1, -1),
    (0, 410 * US, 90 * US, "cpu_op", "optimizer", 1, -1, -1, -1),
]
# its path, in us per category: optimizer (main) <- 10 us hand-over <- C <- sync (362 after
# k3's end at 360) <- k3 <- 2 us behind k2 on its stream <- k2 <- 10 us after its launch call
# (autograd, in A) <- 20 us hand-over <- forward (main)
ITERATION_PATH = {"cpu": 90 + 25 + 10 + 10 + 80, "host_idle": 10 + 3, "runtime": 10 + 10,
                  "thread_wait": 10 + 20, "sync": 2, "kernel": 200 + 8, "stream_queue": 2,
                  "launch_overhead": 10}


def _iterations(n: int) -> Events:
    """`n` copies of ITERATION, one after the other (correlation ids renumbered)."""
    return events(sorted([(r, ts + i * 500 * US, d, k, name, tid, dev, stream,
                           c + 10 * i if c >= 0 else c)
                          for i in range(n) for r, ts, d, k, name, tid, dev, stream, c
                          in ITERATION], key=lambda r: r[1]))


def test_critical_path_follows_the_autograd_thread() -> None:
    path = critical_path(_iterations(1), [])
    assert path is not None
    # the iteration, 0..500 us, is on the path whole
    assert (path.start, path.end, path.length_ns) == (0, 500 * US, 500 * US)
    assert (path.thread_switches, path.device_ops, path.rank_switches) == (2, 2, 0)
    assert {k: v // US for k, v in path.ns.items() if v} == ITERATION_PATH


def test_critical_path_per_step_follows_each_iteration() -> None:
    """Two copies of the iteration above, 0..500 and 500..1000 us: each step's own path is the
    iteration's, category by category; the Run's path runs through both."""
    ev = _iterations(2)
    steps = {0: [StepWindow(i, i * 500 * US, (i + 1) * 500 * US, "marker") for i in range(2)]}
    path = critical_path(ev, [], steps)
    assert path is not None
    assert (path.length_ns, path.thread_switches) == (1000 * US, 4)
    assert [s.step for s in path.steps] == [0, 1]
    for i, step in enumerate(path.steps):
        assert (step.start, step.end) == (i * 500 * US, (i + 1) * 500 * US)
        assert {k: v // US for k, v in step.ns.items() if v} == ITERATION_PATH
        # forward (main, tid 1) hands over to the autograd thread (2) 20 us before A, which
        # hands back 10 us before the optimizer
        assert [(h.from_tid, h.to_tid, h.at - i * 500 * US, h.wait_ns) for h in step.handovers
                ] == [(1, 2, 120 * US, 20 * US), (2, 1, 400 * US, 10 * US)]
    assert path.handovers == tuple(h for s in path.steps for h in s.handovers)


THREE_ITERATIONS = build(_iterations(3), [], {}, {})


def test_the_steps_walks_count_host_time_once_per_thread(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """Every walk's host time is counted after the walks, thread by thread (counted): as many
    numpy sorts (np.unique) for 8 steps as for 2; span by span they grew with the host states
    walked (0.1-0.2 ms each, two thirds of the walk at 200k events)."""
    calls: list[int] = []
    unique = np.unique
    monkeypatch.setattr(np, "unique", lambda *a, **k: (calls.append(1), unique(*a, **k))[1])

    def sorts(n: int) -> int:
        ev = _iterations(n)
        steps = {0: [StepWindow(i, i * 500 * US, (i + 1) * 500 * US, "marker")
                     for i in range(n)]}
        calls.clear()
        path = critical_path(ev, [], steps)
        assert path is not None and len(path.steps) == n
        assert [{k: v // US for k, v in s.ns.items() if v} for s in path.steps
                ] == [ITERATION_PATH] * n
        return len(calls)

    assert sorts(8) == sorts(2)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.sampled_from([1, 2]),
                          st.integers(-50 * US, 1600 * US), st.integers(0, 700 * US)),
                max_size=12))
def test_counted_host_time_is_each_spans_own(spans: list[tuple[int, int, int, int]]) -> None:
    """counted's one pass over every walk's host spans gives each walk what its spans give one
    by one: StateSums.between per state, and the op and runtime time named by the innermost op
    over each of the thread's segments (walked in Python), time outside its events idle."""
    g = THREE_ITERATIONS
    walks = [Segment(dict.fromkeys(CATEGORIES, 0), {}, 0, 0, [], [], None,
                     [(int(lane_key(0, tid)), lo, lo + length)
                      for i, tid, lo, length in spans if i == walk])
             for walk in range(4)]
    for walk, segment in zip(walks, counted(g, walks), strict=True):
        ns = dict.fromkeys(CATEGORIES, 0)
        by_name: dict[tuple[str, str], int] = {}
        for key, lo, hi in walk.host:
            sums, owner = g.thread_sums[key], g.thread_owner[key]
            ns_of = sums.between(np.array([lo]), np.array([hi]))[0].tolist()
            for state, v in zip(HOST_STATES, ns_of, strict=True):
                ns[state] += v
            points = sums.points.tolist()
            for i in range(len(points) - 1):
                overlap = min(points[i + 1], hi) - max(points[i], lo)
                state = HOST_STATES[int(sums.codes[i])]
                if overlap > 0 and owner[i] >= 0 and state != "host_idle":
                    name = (state, g.ev.names[int(g.ev.name[owner[i]])])
                    by_name[name] = by_name.get(name, 0) + overlap
        assert (segment.ns, segment.by_name) == (ns, by_name)


def test_the_walk_resolves_no_device_op_s_waits_as_it_goes(monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    """A device op's last wait is resolved for every op at once (device_waits), before the
    walks: the walk looks up none of the stream, event and launch maps (RowMap.get), where it
    had looked up all three and compared their candidates at each device op it passed."""
    ev = _iterations(8)
    steps = {0: [StepWindow(i, i * 500 * US, (i + 1) * 500 * US, "marker") for i in range(8)]}
    looked_up: list[int] = []
    get = RowMap.get
    monkeypatch.setattr(RowMap, "get", lambda self, row: (looked_up.append(row),
                                                          get(self, row))[1])
    path = critical_path(ev, [], steps)
    assert path is not None and path.device_ops == 16
    assert [{k: v // US for k, v in s.ns.items() if v} for s in path.steps
            ] == [ITERATION_PATH] * 8
    assert looked_up == []


def test_each_state_is_worked_out_once_for_every_walk(monkeypatch: pytest.MonkeyPatch
                                                      ) -> None:
    """The Run's walk and its steps' cross the same states (at 200k events all 667 of the
    Run's, of 865): what walking a state adds is worked out once (_Step.of) and each walk
    applies it cut at its own floor, with the same paths as walked state by state."""
    worked: list[State] = []
    of = _Step.of
    monkeypatch.setattr(_Step, "of", lambda self, state: (worked.append(state),
                                                          of(self, state))[1])
    ev = _iterations(8)
    steps = {0: [StepWindow(i, i * 500 * US, (i + 1) * 500 * US, "marker") for i in range(8)]}
    path = critical_path(ev, [], steps)
    assert path is not None and len(path.steps) == 8
    assert [{k: v // US for k, v in s.ns.items() if v} for s in path.steps
            ] == [ITERATION_PATH] * 8
    assert {k: v // US for k, v in path.ns.items() if v} == {
        k: 8 * v for k, v in ITERATION_PATH.items()}
    assert path.handovers == tuple(h for s in path.steps for h in s.handovers)
    assert len(worked) == len(set(worked)) == 8 * 6  # walk by walk: 89


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_device_waits_are_each_ops_own(data: st.DataObject) -> None:
    """device_waits gives every op the wait the walk had found one op at a time: of its
    stream's previous op, the op its stream waited on and its launch call, those started by
    its start, the largest (ready, row, where, category); its stream's previous op with no
    launch call device_idle. Random maps over the rows of three iterations (many ties)."""
    ev = THREE_ITERATIONS.ev
    rows = st.integers(0, len(ev) - 1)
    prev, waits_for, launch = maps = [data.draw(st.dictionaries(rows, rows)) for _ in range(3)]
    found = device_waits(ev, *(RowMap(np.array(sorted(m), np.int64).reshape(-1),
                                      np.array([m[k] for k in sorted(m)], np.int64).reshape(-1))
                               for m in maps))
    expected: dict[int, tuple[int, int, str]] = {}
    for row in range(len(ev)):
        start = int(ev.ts[row])
        preds = [(min(int(ev.end[dep]), start), dep, where, category)
                 for m, where, category in ((prev, "dev", "stream_queue"),
                                            (waits_for, "dev", "event_wait"),
                                            (launch, "host", "launch_overhead"))
                 if (dep := m.get(row)) is not None and int(ev.ts[dep]) <= start]
        if preds:
            ready, dep, _, category = max(preds)
            queued = category == "stream_queue" and row not in launch
            expected[row] = (dep, ready, "device_idle" if queued else category)
    assert {row: w for row in range(len(ev)) if (w := found.get(row))} == expected
    assert found.get(len(ev)) is None


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 9), st.integers(1, 4)),
                min_size=1, max_size=30),
       st.lists(st.one_of(st.none(), st.dictionaries(
           st.integers(0, 3), st.tuples(st.integers(-1, 10), st.integers(0, 5)), max_size=3)),
           max_size=6))
def test_the_latest_work_of_every_window_at_once(
        rows: list[tuple[int, int, int]],
        windows: list[dict[int, tuple[int, int]] | None]) -> None:
    """_Latest finds every window's latest work at once (laid end to end, a max and a min over
    each window's rows) as it had window by window: of the rows started in the window on any
    of its ranks, the one ending last, ties the first row; None where it has none (windows
    overlapping, empty, on ranks without rows; None: all rows)."""
    ev = events([(rank, ts * US, dur * US, "kernel", "k", 0, 0, 7, -1)
                 for rank, ts, dur in rows])
    since = ev.ts - (np.arange(len(ev)) % 3) * US  # launched before they start, out of order
    asked: list[Window | None] = [None if w is None else {r: (lo * US, (lo + n) * US)
                                                          for r, (lo, n) in w.items()}
                                  for w in windows]
    expected = []
    for window in asked:
        chosen = [row for row in range(len(ev)) if window is None or (
            int(ev.rank[row]) in window
            and window[int(ev.rank[row])][0] <= since[row] < window[int(ev.rank[row])][1])]
        end = max((int(ev.end[row]) for row in chosen), default=None)
        first = min((row for row in chosen if int(ev.end[row]) == end), default=None)
        expected.append(None if first is None else (end, int(ev.rank[first]), first))
    assert _Latest(ev, np.arange(len(ev)), since)(asked) == expected


def _raw_ns(name: str | Path) -> tuple[list[dict[str, Any]], Callable[[Any], int], int]:
    """The complete events of a corpus trace (or a trace file), its µs read as decimals (x1000),
    and its base."""
    path = name if isinstance(name, Path) else corpus(name)
    raw = orjson.loads(gzip.decompress(path.read_bytes()))
    return ([e for e in raw["traceEvents"] if e.get("ph") == "X"],
            lambda us: int(Decimal(str(us)) * 1000), raw.get("baseTimeNanoseconds", 0))


def test_critical_path_per_step_nccl(corpus_runs: dict[str, Run]) -> None:
    """Each ProfilerStep of the A100 DDP trace, from the raw JSON: the step's path runs from
    the marker's start (or the main thread's first op, when later) to the end of the step's
    last work (host events of launching threads starting in the step, device ops whose launch
    call, joined by correlation, does), and hands over to the autograd thread when it starts
    the step's backward and back to the main thread after its last op."""
    run = corpus_runs["nccl"]
    ev = Events.load(run)
    path = critical_path(ev, sync_events(run, ev), iterations(run, ev).steps)
    assert path is not None
    x, ns, base = _raw_ns("nccl")
    dev = [e for e in x if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    calls = {e["args"]["correlation"]: e for e in x
             if e.get("cat") == "cuda_runtime" and "correlation" in e["args"]}
    launchers = {calls[d["args"]["correlation"]]["tid"] for d in dev
                 if d["args"].get("correlation") in calls}
    host = [(e["tid"], base + ns(e["ts"]), base + ns(e["ts"]) + ns(e["dur"])) for e in x
            if e.get("cat") in ("cpu_op", "user_annotation", "cuda_runtime") and e["dur"] > 0
            and not e["name"].startswith("ProfilerStep#")]
    markers = sorted((base + ns(e["ts"]), base + ns(e["ts"]) + ns(e["dur"]), e["tid"])
                     for e in x if e["name"].startswith("ProfilerStep#"))
    (autograd,) = launchers - {markers[0][2]}
    assert [s.step for s in path.steps] == [4, 5, 6]
    for step, (lo, hi, main) in zip(path.steps, markers, strict=True):
        last = max([e for t, s, e in host if t in launchers and lo <= s < hi]
                   + [base + ns(d["ts"]) + ns(d["dur"]) for d in dev
                      if (c := calls.get(d["args"].get("correlation")))
                      and lo <= base + ns(c["ts"]) < hi])
        first = max(lo, min(s for t, s, _ in host if t == main))
        assert (step.start, step.end) == (first, last)
        assert sum(step.ns.values()) == step.length_ns
        ours = [(s, e) for t, s, e in host if t == autograd and lo <= s < hi]
        resume_autograd = min(s for s, _ in ours)
        finish_autograd = max(e for _, e in ours)
        main_bounds = sorted({b for t, s, e in host if t == main for b in (s, e)})
        resume_main = next(b for b in main_bounds if b >= finish_autograd)
        main_before = max(e for t, _, e in host if t == main and e <= resume_autograd)
        assert [(h.from_tid, h.to_tid, h.at, h.wait_ns) for h in step.handovers] == [
            (main, autograd, resume_autograd, resume_autograd - main_before),
            (autograd, main, resume_main, resume_main - finish_autograd)]


def test_critical_path_waits_for_the_dataloader_worker(tmp_path: Path) -> None:
    """A CPU training loop whose one DataLoader worker is slower than its step, recorded with
    the real torch.profiler in both processes (tests/data/loader_workers.py); from the raw
    JSON of the two. Each step's path ends with the main thread's last event started in the
    step (the worker, fetching later batches, outlasts it, but is not what the step waited
    for), and wherever a worker's event ended inside the main thread's wait in next(loader)
    (torch's `enumerate(DataLoader)#...__next__`), the path crosses from the worker to the
    main thread when the main thread next resumed: 3 of the 4 profiled steps (the first one's
    batch was fetched before the worker was profiled). The batch takes ms to arrive after
    the worker's fetch (pickled into shared memory, queued, rebuilt), and still hands over."""
    main_file, worker_file = (DATA / f"loader_workers_{p}.pt.trace.json.gz"
                              for p in ("main", "worker"))
    run = import_traces([main_file, worker_file], tmp_path / "w.run",
                        ImportOptions(ranks=(0, 0)), ["test"])
    ev = Events.load(run)
    path = critical_path(ev, sync_events(run, ev), iterations(run, ev).steps)
    assert path is not None
    x, ns, base = _raw_ns(main_file)
    w, _, worker_base = _raw_ns(worker_file)
    host = [(e["tid"], base + ns(e["ts"]), base + ns(e["ts"]) + ns(e["dur"]), e["cat"],
             e["name"]) for e in x if e.get("cat") in ("cpu_op", "user_annotation")]
    markers = sorted((s, e) for _, s, e, _, n in host if n.startswith("ProfilerStep#"))
    host = [h for h in host if not h[4].startswith("ProfilerStep#")]
    (main,) = {t for t, *_ in host}
    worker = [(e["tid"], worker_base + ns(e["ts"]),
               worker_base + ns(e["ts"]) + ns(e["dur"]), e["name"])
              for e in w if e.get("cat") in ("cpu_op", "user_annotation")]
    (worker_tid,) = {t for t, *_ in worker}
    bounds = sorted({b for _, s, e, _, _ in host for b in (s, e)})
    crossed = 0
    for step, (lo, hi) in zip(path.steps, markers, strict=True):
        assert step.start == max(lo, min(s for _, s, *_ in host))
        assert step.end == max(e for _, s, e, _, _ in host if lo <= s < hi)
        (wait,) = [(s, e) for _, s, e, _, n in host
                   if lo <= s < hi and n.startswith("enumerate(DataLoader)#")]
        resumed = min(s for _, s, _, cat, _ in host if cat == "cpu_op" and wait[0] <= s)
        fetched = [e for _, _, e, n in worker
                   if n == "DataLoader worker fetch" and wait[0] < e <= resumed]
        expected = []
        if fetched:
            finished = max(e for _, _, e, _ in worker if e <= resumed)
            at = next(b for b in bounds if b >= finished)
            expected = [(worker_tid, main, at, at - finished)]
            crossed += 1
        assert [(h.from_tid, h.to_tid, h.at, h.wait_ns) for h in step.handovers
                if h.from_tid == worker_tid] == expected
    assert crossed == 3 and len(markers) == 4


def test_critical_path_follows_a_torchscript_fork(tmp_path: Path) -> None:
    """A scripted forward that forks a wide branch onto an inter-op thread, runs a narrow one
    itself and waits for the wide one (tests/data/jit_fork.py), from the raw JSON. torch
    records the forward as one op and not the wait: where the wide branch ended after the
    main thread's narrow one, the interpreter, suspended at the wait, ran the rest (the head)
    on an inter-op thread, and the main thread's forward ended after it. There the path
    crosses from the main thread to the fork's thread where it took the fork up, to the
    head's thread where it began after the fork's last op, and back to the main thread where
    its forward ended; elsewhere it stays on the main thread. It had stayed there throughout,
    the wait counted as the forward's CPU."""
    trace = DATA / "jit_fork_cpu.pt.trace.json.gz"
    run = import_traces([trace], tmp_path / "f.run", ImportOptions(), ["test"])
    ev = Events.load(run)
    path = critical_path(ev, sync_events(run, ev), iterations(run, ev).steps)
    assert path is not None
    x, ns, base = _raw_ns(trace)
    host = [(e["tid"], base + ns(e["ts"]), base + ns(e["ts"]) + ns(e["dur"]), e["name"])
            for e in x if e.get("cat") in ("cpu_op", "user_annotation") and e["dur"] > 0]
    markers = sorted((s, e) for _, s, e, n in host if n.startswith("ProfilerStep#"))
    (main,) = {t for t, _, _, n in host if n.startswith("ProfilerStep#")}
    waited = 0
    for step, (lo, hi) in zip(path.steps, markers, strict=True):
        assert step.end == max(e for t, s, e, n in host
                               if t == main and lo <= s < hi and not n.startswith("Profiler"))
        assert step.length_ns == step.end - step.start
        (forward,) = [(s, e) for t, s, e, n in host
                      if t == main and n == "forward" and lo <= s < hi]
        (fork, at, fork_end) = next((t, s, e) for t, s, e, n in host
                                    if n == "<forked function>" and forward[0] <= s < forward[1])
        branch_end = max(e for t, s, e, n in host if t == fork and at <= s and e <= fork_end
                         and n != "<forked function>")
        head = max((s, t) for t, s, e, n in host if n == "<forward op>" and
                   forward[0] <= s and e <= forward[1])[1]
        if head == main:
            assert step.handovers == ()
            continue
        waited += 1
        resumed = min(s for t, s, _, _ in host if t == head and branch_end <= s)
        finished = max(e for t, _, e, _ in host if t == head and e <= forward[1])
        expected = [(main, fork, at, 0), (fork, head, resumed, resumed - branch_end),
                    (head, main, forward[1], forward[1] - finished)]
        assert [(h.from_tid, h.to_tid, h.at, h.wait_ns) for h in step.handovers] == expected
        assert step.ns["thread_wait"] == sum(w for *_, w in expected)
    assert waited >= 1 and len(markers) == 3


def test_a_fork_taken_up_late_continued_on_a_thread_that_forked_nothing() -> None:
    """A scripted forward (thread 1, 0..970 us) runs its own branch (10..110), then waits; its
    fork is taken up only at 700 (thread 2, its work to 920: 31% of the wait), and the
    function's rest runs on thread 3 (930..960), which ran no fork; the loss follows on
    thread 1 (980..1000). The path: the loss, 10 us idle, 10 us waiting for thread 3, its 30,
    10 us waiting for the fork's last op, the fork's 220, its launch (0 us) and thread 1's 700
    up to it (the wait, whose time the fork's ops hold, is not on it)."""
    ev = events([(0, 0, 970 * US, "cpu_op", "forward", 1, -1, -1, -1),
                 (0, 10 * US, 100 * US, "cpu_op", "<forward op>", 1, -1, -1, -1),
                 (0, 20 * US, 80 * US, "cpu_op", "aten::addmm", 1, -1, -1, -1),
                 (0, 700 * US, 295 * US, "cpu_op", "<forked function>", 2, -1, -1, -1),
                 (0, 705 * US, 195 * US, "cpu_op", "aten::mm", 2, -1, -1, -1),
                 (0, 905 * US, 15 * US, "cpu_op", "aten::add", 2, -1, -1, -1),
                 (0, 930 * US, 30 * US, "cpu_op", "<forward op>", 3, -1, -1, -1),
                 (0, 932 * US, 26 * US, "cpu_op", "aten::linear", 3, -1, -1, -1),
                 (0, 980 * US, 20 * US, "cpu_op", "loss", 1, -1, -1, -1)])
    path = critical_path(ev, [], {0: [StepWindow(0, 0, 1000 * US, "marker")]})
    assert path is not None
    (step,) = path.steps
    assert (step.start, step.end) == (0, 1000 * US)
    assert {k: v // US for k, v in step.ns.items() if v} == {
        "cpu": 20 + 30 + 220 + 700, "host_idle": 10, "thread_wait": 20}
    assert [(h.from_tid, h.to_tid, h.at // US, h.wait_ns // US) for h in step.handovers] == [
        (1, 2, 700, 0), (2, 3, 930, 10), (3, 1, 970, 10)]


def test_a_function_forking_twice_waits_once() -> None:
    """A scripted forward (thread 1, 0..960 us) forks two branches (threads 2 and 3), runs its
    own (10..110) and waits for both; the function's rest runs on thread 2 (920..950) after
    thread 3's branch, the later, ended (895). Thread 1 was handed over to once, at 960 by
    thread 2's op (its wait had been listed once a fork: two hand-overs at one resumption);
    thread 2 resumed at 920 after thread 3's last op; each fork's thread took it up from
    `forward`."""
    ev = events([(0, 0, 960 * US, "cpu_op", "forward", 1, -1, -1, -1),
                 (0, 10 * US, 100 * US, "cpu_op", "<forward op>", 1, -1, -1, -1),
                 (0, 20 * US, 580 * US, "cpu_op", "<forked function>", 2, -1, -1, -1),
                 (0, 25 * US, 300 * US, "cpu_op", "aten::mm", 2, -1, -1, -1),
                 (0, 330 * US, 260 * US, "cpu_op", "aten::mm", 2, -1, -1, -1),
                 (0, 30 * US, 870 * US, "cpu_op", "<forked function>", 3, -1, -1, -1),
                 (0, 35 * US, 845 * US, "cpu_op", "aten::mm", 3, -1, -1, -1),
                 (0, 885 * US, 10 * US, "cpu_op", "aten::add", 3, -1, -1, -1),
                 (0, 920 * US, 30 * US, "cpu_op", "<forward op>", 2, -1, -1, -1)])
    rows = {(int(ev.tid[r]), ev.names[ev.name[r]], int(ev.ts[r]) // US): r for r in range(len(ev))}
    wakes = thread_wakes(ev)
    got = {tid: [(int(t) // US, int(w), int(e) // US)
                 for t, w, e in zip(wakes[int(lane_key(0, tid))].resume,
                                    wakes[int(lane_key(0, tid))].waker,
                                    wakes[int(lane_key(0, tid))].waker_end, strict=True)]
           for tid in (1, 2, 3)}
    forward = rows[(1, "forward", 0)]
    assert got == {1: [(960, rows[(2, "<forward op>", 920)], 950)],
                   2: [(20, forward, 20), (920, rows[(3, "aten::add", 885)], 895)],
                   3: [(30, forward, 30)]}


def test_ranks_that_wait_for_no_other_each_have_their_own_step_paths(tmp_path: Path) -> None:
    """Two Hogwild processes (tests/data/hogwild_cpu.py, ranks 1 and 2, no process group, one
    computing 3x as long), from the raw JSON: each step has a path on each rank, walked back
    from that rank's last work in its step to its start of it, never crossing to the other.
    There had been one a step, the slower rank's (it ended each step later), the faster one's
    steps on no path."""
    files = {r: DATA / f"hogwild_cpu_rank{r}.pt.trace.json.gz" for r in (1, 2)}
    run = import_traces(list(files.values()), tmp_path / "h.run", ImportOptions(), ["test"])
    ev = Events.load(run)
    path = critical_path(ev, sync_events(run, ev), iterations(run, ev).steps)
    assert path is not None
    expected = []
    for rank, file in files.items():
        x, ns, base = _raw_ns(file)
        host = [(base + ns(e["ts"]), base + ns(e["ts"]) + ns(e["dur"]), e["name"])
                for e in x if e.get("cat") in ("cpu_op", "user_annotation") and e["dur"] > 0]
        markers = sorted((s, e) for s, e, n in host if n.startswith("ProfilerStep#"))
        first = min(s for s, _, n in host if not n.startswith("ProfilerStep#"))
        expected += [(i, (rank,), max(lo, first),
                      max(e for s, e, n in host if lo <= s < hi and not n.startswith("Profiler")))
                     for i, (lo, hi) in enumerate(markers)]
    got = [(s.ranks, s.start, s.end, s.rank_switches) for s in path.steps]
    steps = sorted({s.step for s in path.steps})
    assert got == [(ranks, start, end, 0) for _, ranks, start, end in
                   sorted(expected, key=lambda e: (e[0], e[1]))]
    assert len(steps) == len(expected) // 2 >= 2
    assert all(s.length_ns == s.end - s.start for s in path.steps)


Traced = list[tuple[int, int, str, int, str]]  # start, end, name, tid, category
RpcPair = tuple[tuple[int, int], tuple[int, int], int]  # request, callee's work, send's end


def _rpc_named() -> tuple[list[Path], Traced, Traced, list[RpcPair], list[RpcPair],
                          list[tuple[int, int, int, int]]]:
    """tests/data/rpc_named_rank{1,2} read from the raw JSON: the files, the server's and the
    trainer's events, the requests' pairs ((send, reply's arrival), (the callee's start, end),
    the send), the distributed backward's (the RecvRpcBackward's start and the backward op's
    end, the server's SendRpcBackward and its thread's work to its next work for a request,
    the RecvRpcBackward's end or the server's start if sooner), and the engine thread's
    take-ups (the loop thread, the thread that ran GraphRoot, its start, 0)."""
    files = [DATA / f"rpc_named_rank{r}.pt.trace.json.gz" for r in (1, 2)]
    traced = {}
    for rank, file in zip((1, 2), files, strict=True):
        x, ns, base = _raw_ns(file)
        window = max(base + ns(e["ts"]) + ns(e["dur"]) for e in x if e.get("cat") == "Trace")
        # an annotation in flight at the profiler's stop ends with its trace (frame.Events)
        traced[rank] = [(base + ns(e["ts"]), min(base + ns(e["ts"]) + ns(e["dur"]), window)
                         if e["cat"] == "user_annotation" else base + ns(e["ts"]) + ns(e["dur"]),
                         e["name"], e["tid"], e["cat"]) for e in x
                        if e.get("cat") in ("cpu_op", "user_annotation")]
    server, trainer = traced[1], traced[2]
    sent = [e for e in trainer if e[2].startswith(("rpc_sync#", "rpc_async#"))
            and e[2].endswith("(w0 -> w1)")]
    pairs = []  # (the request: send, reply's arrival), (its callee: start, end), send's end
    for start, end, name, *_ in server:
        if name in ("rpc_serve#_local_invoke(w1)", "_script_local_optimizer_step"):
            function = name.removeprefix("rpc_serve#").removesuffix("(w1)")
            (request,) = [r for r in sent if f"{function}(w0" in r[2]
                          and r[0] <= start and end <= r[1]]
            pairs.append(((request[0], request[1]), (start, end), request[0]))
    assert len(pairs) == 10  # 5 steps, a forward and an optimizer step each
    # the backward: the trainer's op, the RecvRpcBackward inside it (its autograd thread's last
    # work there), the server's SendRpcBackward inside it and its thread's work up to its next
    # work for a request
    gradients, taken_up = [], []
    for lo, hi, name, tid, _ in trainer:
        if name == "torch::distributed::autograd::backward":
            (recv,) = [e for e in trainer if e[2].endswith("::RecvRpcBackward")
                       and lo <= e[0] and e[1] <= hi and e[3] != tid]
            assert recv[1] == max(e[1] for e in trainer if e[3] == recv[3] and lo <= e[0] < hi)
            (send,) = [e for e in server if e[2].endswith("::SendRpcBackward")
                       and recv[0] <= e[0] and e[1] <= hi]
            later = min([e[0] for e in server if e[3] == send[3] and e[0] > send[0] and e[2] in (
                send[2], "rpc_serve#_local_invoke(w1)", "_script_local_optimizer_step")],
                default=float("inf"))
            end = max(e[1] for e in server if e[3] == send[3] and e[4] == "cpu_op"
                      and send[0] <= e[0] < later)
            assert send[0] < end <= hi
            gradients.append(((recv[0], hi), (send[0], end), min(recv[1], send[0])))
            # the autograd thread took the graph up from the op: its root, inside it
            (root,) = [e for e in trainer if e[2] == "torch::autograd::GraphRoot"
                       and lo <= e[0] < hi]
            assert root[3] == recv[3]
            taken_up.append((tid, root[3], root[0], 0))
    assert len(gradients) == len(taken_up) == 5
    return files, server, trainer, pairs, gradients, taken_up


def test_critical_path_crosses_an_rpc_request_and_its_reply(tmp_path: Path) -> None:
    """tests/data/rpc_server.py recorded (`rpc_named_rank{1,2}`: the server, the trainer): the
    recorder names each request the trainer sends (`rpc_sync#_local_invoke(w0 -> w1)`, the
    remote forward; `rpc_async#...(w0 -> w1)`, the DistributedOptimizer's TorchScript step)
    and each Python request the server runs (`rpc_serve#_local_invoke(w1)`; the TorchScript
    step is its op `_script_local_optimizer_step`). From the raw JSON: each callee's work pairs
    with the request of its function that holds it; each step's path runs from the trainer's
    step start to its last work (the next forward's reply), crossing to the server and back
    at both requests and at the distributed backward (6 rank switches), and to the autograd
    thread where it took the backward's graph up from the op (its GraphRoot), the transfers (a send
    to the callee's start, its end to the reply) its collective time. Unpaired, each rank had
    had its own step paths, none crossing: the server's one pool thread's request; the
    backward unpaired, the trainer's `torch::distributed::autograd::backward` op had been its
    path's cpu for the whole of the server's backward."""
    files, _, trainer, pairs, gradients, taken_up = _rpc_named()
    run = import_traces(files, tmp_path / "r.run", ImportOptions(), ["test"])
    ev = Events.load(run)
    found = rpc_hand_overs(ev)
    assert sorted((int(ev.end[row]), end) for row, (_, _, end) in found.replies[2].items()) \
        == sorted((r[1], c[1]) for r, c, _ in pairs + gradients)
    assert sorted((int(ev.ts[row]), at) for row, (_, _, at) in found.requested[1].items()) \
        == sorted((c[0], by) for _, c, by in pairs + gradients)
    path = critical_path(ev, sync_events(run, ev), iterations(run, ev).steps)
    assert path is not None
    markers = sorted((s, e) for s, e, n, *_ in trainer if n.startswith("ProfilerStep#"))
    first = min(s for s, _, n, *_ in trainer if not n.startswith("ProfilerStep#"))
    assert len(path.steps) == len(markers) == 5
    for step, (lo, hi), handed in zip(path.steps, markers, taken_up, strict=True):
        mine = [p for p in pairs + gradients if lo <= p[0][0] < hi]
        assert [(h.from_tid, h.to_tid, h.at, h.wait_ns) for h in step.handovers] == [handed]
        last = max(e for s, e, n, *_ in trainer if lo <= s < hi and not n.startswith("Profiler"))
        assert (step.ranks, step.start, step.end) == ((1, 2), max(lo, first), last)
        assert step.rank_switches == 2 * len(mine) == 6
        assert step.ns["collective"] == sum(c[0] - by + r[1] - c[1] for r, c, by in mine)
        assert step.length_ns == step.end - step.start
        # the server's backward is on the path: none of the backward op's time is its cpu
        assert all(n != "torch::distributed::autograd::backward" for c, n, _ in step.top
                   if c == "cpu")


def test_an_rpc_servers_steps_are_the_requests_it_serves(tmp_path: Path) -> None:
    """rpc_named with its markers ignored: the server (rank 1) has no loop (each request on
    whichever pool thread took it), and had no detected iteration. Its steps are the trainer's
    detected ones as it served them: step k from its first work for a request the trainer
    sent in its step k (the backward, the optimizer's step, the next forward) to its first for
    step k + 1, the last to its last work's end, from the raw JSON's pairs."""
    files, _, _, pairs, gradients, _ = _rpc_named()
    run = import_traces(files, tmp_path / "r.run", ImportOptions(), ["test"])
    ev = Events.load(run)
    steps = iterations(run, ev, ignore_markers=True).steps
    trainer = steps[2]
    assert len(trainer) == 5
    work = [(r[0], c) for r, c, _ in pairs + gradients]
    first = [min(c[0] for sent, c in work if w.start <= sent < w.end) for w in trainer]
    assert all(any(w.start <= sent < w.end for w in trainer) for sent, _ in work)
    ends = [*first[1:], max(c[1] for _, c in work)]
    assert [(w.step, w.start, w.end, w.source) for w in steps[1]] == [
        (t.step, lo, hi, "detected") for t, lo, hi in zip(trainer, first, ends, strict=True)]


# Two steps of a distributed backward (us): the trainer (rank 0) calls backward (tid 1), its
# engine's thread (tid 2) takes the graph up at its root and sends the gradient
# (RecvRpcBackward); the server (rank 1) runs it on one thread (tid 6) from SendRpcBackward,
# its nodes under load 59 us apart, until that thread's next backward; its pool thread tid 5
# served a request with no op of its own traced.
DIST_BACKWARD_STEPS = [
    (0, 10, 90, "user_annotation", "rpc_sync#f(w0 -> w1)", 1, -1, -1, -1),
    (0, 200, 800, "cpu_op", "torch::distributed::autograd::backward", 1, -1, -1, -1),
    (0, 250, 1, "cpu_op", "torch::autograd::GraphRoot", 2, -1, -1, -1),
    (0, 300, 50, "cpu_op", "torch::distributed::autograd::RecvRpcBackward", 2, -1, -1, -1),
    (0, 1200, 800, "cpu_op", "torch::distributed::autograd::backward", 1, -1, -1, -1),
    (0, 1240, 1, "cpu_op", "torch::autograd::GraphRoot", 2, -1, -1, -1),
    (0, 1250, 50, "cpu_op", "torch::distributed::autograd::RecvRpcBackward", 2, -1, -1, -1),
    (1, 20, 60, "user_annotation", "rpc_serve#f(w1)", 5, -1, -1, -1),
    (1, 400, 1, "cpu_op", "torch::distributed::autograd::SendRpcBackward", 6, -1, -1, -1),
    (1, 460, 40, "cpu_op", "ReluBackward0", 6, -1, -1, -1),
    (1, 530, 170, "cpu_op", "AddmmBackward0", 6, -1, -1, -1),
    (1, 1400, 1, "cpu_op", "torch::distributed::autograd::SendRpcBackward", 6, -1, -1, -1),
    (1, 1420, 180, "cpu_op", "AddmmBackward0", 6, -1, -1, -1),
]


def test_a_distributed_backward_pairs_with_its_callees() -> None:
    """Each server backward pairs with the RecvRpcBackward inside the trainer's backward op
    begun last before it: its start waited for the gradient's send (the RecvRpcBackward's
    end), the op's end for its end, the thread's work up to its next backward (a pause of 59 us
    inside it); the engine's thread took each graph up from the op at its root (a hand-over
    with no wait). The request's range pairs with the server's `rpc_serve#` range, on a thread
    with no op of its own traced (no work to read there)."""
    ev = events([(r, ts * US, d * US, *rest) for r, ts, d, *rest in DIST_BACKWARD_STEPS])
    row = {(int(ev.rank[i]), int(ev.ts[i]) // US): i for i in range(len(ev))}
    found = rpc_hand_overs(ev)
    assert found.requested == {1: {row[(1, 20)]: (0, row[(0, 10)], 10 * US),
                                   row[(1, 400)]: (0, row[(0, 300)], 350 * US),
                                   row[(1, 1400)]: (0, row[(0, 1250)], 1300 * US)}}
    assert found.replies == {0: {row[(0, 10)]: (1, row[(1, 20)], 80 * US),
                                 row[(0, 200)]: (1, row[(1, 400)], 700 * US),
                                 row[(0, 1200)]: (1, row[(1, 1400)], 1600 * US)}}
    wakes = thread_wakes(ev)[int(lane_key(0, 2))]
    assert [(int(t) // US, int(w), int(e) // US) for t, w, e in zip(
        wakes.resume, wakes.waker, wakes.waker_end, strict=True)] == [
        (250, row[(0, 200)], 250), (1240, row[(0, 1200)], 1240)]


def test_critical_path_spans_the_corpus_runs(corpus_runs: dict[str, Run]) -> None:
    """On real traces whose backward runs on the autograd thread (an A100 DDP run and an
    MI250 one), the path reaches back to the main thread's first work: its length is the
    whole run's, crossing to the autograd thread and back in each iteration."""
    for name, switches in (("nccl", 6), ("amd", 2)):
        run = corpus_runs[name]
        ev = Events.load(run)
        path = critical_path(ev, sync_events(run, ev))
        assert path is not None
        host = np.flatnonzero(ev.host_busy)
        first = host[np.argmin(ev.ts[host])]
        main = host[ev.tid[host] == ev.tid[first]]  # (a watchdog thread outlasts it)
        assert (path.start, path.end) == (int(ev.ts[first]), int(ev.end[main].max()))
        assert path.thread_switches == switches
        # hand-overs are short; the autograd thread's work is on the path as work, not idle
        assert path.ns["thread_wait"] < 0.02 * path.length_ns
        assert path.ns["host_idle"] < 0.07 * path.length_ns


# Two CPU ranks of DDP on gloo, one step (us): each main thread (tid 1) runs its forward and
# backward, issues the all-reduce (c10d::allreduce_) and sits idle until gloo's worker thread
# (tid 2) has run it, then steps its optimizer. Rank 1's forward is slow: rank 0's all-reduce
# waits for it from 110 to 260; both end at 400.
GLOO_STEP = [
    (0, 0, 100, "cpu_op", "forward", 1, -1, -1, -1),
    (0, 100, 20, "cpu_op", "c10d::allreduce_", 1, -1, -1, -1),
    (0, 110, 290, "user_annotation", "gloo:all_reduce", 2, -1, -1, -1),
    (0, 120, 40, "cpu_op", "backward", 1, -1, -1, -1),
    (0, 410, 90, "cpu_op", "optimizer", 1, -1, -1, -1),
    (1, 0, 250, "cpu_op", "forward", 1, -1, -1, -1),
    (1, 250, 20, "cpu_op", "c10d::allreduce_", 1, -1, -1, -1),
    (1, 260, 140, "user_annotation", "gloo:all_reduce", 2, -1, -1, -1),
    (1, 405, 80, "cpu_op", "optimizer", 1, -1, -1, -1),
]


def _gloo_step() -> Events:
    return events([(r, ts * US, d * US, *rest) for r, ts, d, *rest in GLOO_STEP])


def test_critical_path_through_a_host_collective() -> None:
    """The path leaves rank 0's loop where it resumed after gloo's thread (10 us late), spends
    the all-reduce from the moment rank 1 took it up (260..400), moves to rank 1 and to the
    call that issued it there, and runs back through rank 1's slow forward: the step whole,
    500 us. It had been rank 0's 290 us of blocked loop as host_idle."""
    path = critical_path(_gloo_step(), [], {0: [StepWindow(0, 0, 500 * US, "marker")],
                                            1: [StepWindow(0, 0, 485 * US, "marker")]})
    assert path is not None
    (step,) = path.steps
    for p in (path, step):
        assert (p.start, p.end, p.rank_switches) == (0, 500 * US, 1)
        assert {k: v // US for k, v in p.ns.items() if v} == {
            "cpu": 90 + 260, "thread_wait": 10, "collective": 140}
        assert [(h.rank, h.from_tid, h.to_tid, h.at // US, h.wait_ns // US)
                for h in p.handovers] == [(1, 1, 2, 260, 0), (0, 2, 1, 410, 10)]


def test_host_collectives_are_communication() -> None:
    """Stragglers match gloo's ranges across ranks; the concurrency breakdown counts a rank's
    gloo thread as waiting, not as host work, and sets it against the loop's ops."""
    ev = _gloo_step()
    result = stragglers(ev)
    assert (result.instances, result.max_skew_ns, result.straggler) == (1, 150 * US, 1)
    rank0 = concurrency(ev, {}).ranks[0]
    # host work: the loop's 0..160 and 410..500, not gloo's 110..400; its compute leaves out
    # the call issuing the all-reduce (100..120): the backward's 120..160 hides 40 us of it
    assert rank0.total.ns["host_busy_device_idle"] == 250 * US
    assert rank0.host_comm is not None
    assert {k: v // US for k, v in rank0.host_comm.ns.items()} == {
        "overlapped": 40, "compute_only": 190, "comm_only": 250, "neither": 20}
    assert rank0.host_comm.comm_overlap_pct == pytest.approx(100 * 40 / 290)


# A tensor-parallel backward on gloo, one rank (us): the loop (tid 1) in an autograd function
# issues the all-reduce (c10d::allreduce_, inside _c10d_functional::all_reduce) and waits for it
# in wait_tensor, which gloo's thread (tid 2) ends 10 us before the wait returns.
TP_STEP = [
    (0, 0, 500, "cpu_op", "_FromTorchTensorBackward", 1, -1, -1, -1),
    (0, 10, 120, "cpu_op", "_c10d_functional::all_reduce", 1, -1, -1, -1),
    (0, 20, 100, "cpu_op", "c10d::allreduce_", 1, -1, -1, -1),
    (0, 60, 390, "user_annotation", "gloo:all_reduce", 2, -1, -1, -1),
    (0, 150, 310, "cpu_op", "_c10d_functional::wait_tensor", 1, -1, -1, -1),
]


def test_a_wait_for_a_host_collective_hides_nothing() -> None:
    """The ops covering gloo's all-reduce are the call that issued it (with the op around it)
    and the wait for it (the thread's last event boundary before the all-reduce's end, 150, to
    that end, 450, resumed 10 us after): only the thread's 120..150 between the two hides any
    of it, 30 of its 390 us (all of it had read hidden, under _FromTorchTensorBackward)."""
    ev = events([(r, ts * US, d * US, *rest) for r, ts, d, *rest in TP_STEP])
    host = concurrency(ev, {}).ranks[0].host_comm
    assert host is not None
    assert {k: v // US for k, v in host.ns.items()} == {
        "overlapped": 30, "compute_only": 20 + 50, "comm_only": 360, "neither": 40}


# FSDP2's pre-backward on gloo, one rank (us): the loop (tid 1) in an autograd node issues the
# next layer's all-gather (c10d::_allgather_base_) and sits in the node, no op inside, until
# gloo's thread (tid 2) ends it at 480; its next op begins 20 us later.
FSDP_STEP = [
    (0, 0, 600, "cpu_op", "autograd::engine::evaluate_function: AddmmBackward0", 1, -1, -1, -1),
    (0, 20, 40, "cpu_op", "c10d::_allgather_base_", 1, -1, -1, -1),
    (0, 200, 280, "user_annotation", "gloo:all_gather", 2, -1, -1, -1),
    (0, 500, 90, "cpu_op", "aten::mm", 1, -1, -1, -1),
]


def test_a_wait_for_a_collective_inside_an_op_is_a_hand_over() -> None:
    """The loop sat in the autograd node from the call's end (60) to the all-gather's end
    (480) and resumed 20 us after it: gloo's thread handed over to it there, though the node
    is an op (thread_wakes had read the node as work, no hand-over: FSDP2's waits in its
    pre- and post-backward), and that wait hides none of the all-gather (one definition,
    dependencies.blocked_in_collectives, for both)."""
    ev = events([(r, ts * US, d * US, *rest) for r, ts, d, *rest in FSDP_STEP])
    wakes = thread_wakes(ev)[int(lane_key(0, 1))]
    assert [(int(ev.tid[w]), e // US, b // US, r // US) for w, e, b, r in zip(
        wakes.waker, wakes.waker_end, wakes.blocked, wakes.resume, strict=True)] == [
        (2, 480, 60, 500)]
    host = concurrency(ev, {}).ranks[0].host_comm
    assert host is not None
    assert {k: v // US for k, v in host.ns.items()} == {
        "overlapped": 0, "compute_only": 20 + 120, "comm_only": 280, "neither": 600 - 420}


def test_functional_collective_waits_in_a_real_tensor_parallel_trace(tmp_path: Path) -> None:
    """tests/data/tp_gloo (DTensor's MLP, two gloo ranks), against the raw JSON: each
    wait_tensor inside which the all-reduce its thread issued ended is a hand-over from that
    all-reduce, from the wait's start to the all-reduce's end, resumed at the wait's return;
    the concurrency breakdown leaves exactly those stretches out of the work that hides
    communication. Rank 0's step-5 wait (3,593.1 us) had no hand-over: gloo took that
    all-reduce up 3,020.7 us into it and worked 532.2 us of the stretch, under the share
    thread_wakes asks of a thread it finds as the waker (the call's own collective needs no
    finding)."""
    run = import_traces(TP_GLOO, tmp_path / "tp.run", ImportOptions(ranks=(0, 1)), ["test"])
    ev = Events.load(run)
    wakes, blocked = thread_wakes(ev), blocked_in_collectives(ev)
    for rank, path in enumerate(TP_GLOO):
        x = [e for e in orjson.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
             if e.get("ph") == "X"]
        waits = sorted((e for e in x if e["name"] == "_c10d_functional::wait_tensor"),
                       key=lambda e: e["ts"])
        ends = [Decimal(str(e["ts"])) + Decimal(str(e["dur"])) for e in x
                if e["name"] == "gloo:all_reduce"]
        expected = []
        for w in waits:
            lo, hi = Decimal(str(w["ts"])), Decimal(str(w["ts"])) + Decimal(str(w["dur"]))
            (done,) = [e for e in ends if lo < e <= hi]
            expected.append((round((done - lo) * 1000), round((hi - lo) * 1000)))
        (key,) = {int(lane_key(rank, w["tid"])) for w in waits}
        got = wakes[key]
        mine = ev.host_collective[got.waker]
        assert [(int(e - b), int(r - b)) for b, e, r in zip(
            got.blocked[mine], got.waker_end[mine], got.resume[mine], strict=True)] == expected
        assert len(expected) == 10
        lo, hi = blocked[key].stretches()
        assert (lo.tolist(), hi.tolist()) == (got.blocked[mine].tolist(),
                                             got.waker_end[mine].tolist())
        s, e = host_compute(ev, rank)
        assert not any(max(0, min(b, e2) - max(a, s2)) for a, b in zip(lo, hi, strict=True)
                       for s2, e2 in zip(s, e, strict=True))


def test_a_real_gloo_ddp_trace(tmp_path: Path) -> None:
    """DDP on gloo, two CPU ranks, three profiled steps (tests/data/ddp_gloo.py: rank 1
    computes 6 ms more before its backward in each), against the raw JSON: every all-reduce
    is matched across the ranks with rank 1 the last to take it up; each step's path runs back
    from the end of its last work on the loops' threads to rank 1's start of the step, spends
    the all-reduce as a collective from rank 1's start of it to its end on the rank whose loop
    ended last, and hands over twice (rank 1's loop to its gloo thread; the gloo thread to
    the loop that ended last); each rank's communication is its gloo ranges, hidden where its
    loop's own host spans overlap them (not while it sits in the call issuing one)."""
    run = import_traces(GLOO_DDP, tmp_path / "g.run", ImportOptions(ranks=(0, 1)), ["test"])
    ev = Events.load(run)
    raw = gloo_ddp_raw()
    result = stragglers(ev)
    skews = [b[0] - a[0] for a, b in zip(raw[0].gloo, raw[1].gloo, strict=True)]
    assert result.instances == len(skews) == 3 and min(skews) > 0
    assert (result.max_skew_ns, result.straggler) == (max(skews), 1)
    # rank 0's wait for rank 1 at each all-reduce, less the time its own ops ran meanwhile
    waited = sum(b[0] - a[0] - sum(max(0, min(e, b[0]) - max(s, a[0]))
                                   for s, e in raw[0].merged_work())
                 for a, b in zip(raw[0].gloo, raw[1].gloo, strict=True))
    assert 0 < waited < sum(skews)
    assert [(r.rank, r.waited_ns, r.held_back_ns) for r in result.ranks] == [
        (0, waited, 0), (1, 0, waited)]

    path = critical_path(ev, [], iterations(run, ev).steps)
    assert path is not None and len(path.steps) == 3
    for i, step in enumerate(path.steps):
        ends = [max(e for s, e in r.loop if r.markers[i][0] <= s < r.markers[i][1])
                for r in raw]
        last = raw[int(np.argmax(ends))]
        assert step.end == max(ends)
        assert step.start == max(raw[1].markers[i][0], raw[1].loop[0][0])
        assert step.rank_switches == (last is raw[0])
        assert step.ns["collective"] == last.gloo[i][1] - raw[1].gloo[i][0]
        resume = min(s for s, _ in last.loop if s >= last.gloo[i][1])
        assert [(h.rank, h.from_tid, h.to_tid, h.at) for h in step.handovers] == [
            (1, raw[1].loop_tid, raw[1].gloo[i][2], raw[1].gloo[i][0]),
            (raw.index(last), last.gloo[i][2], last.loop_tid, resume)]

    for rank in concurrency(ev, {}).ranks:
        host = rank.host_comm
        assert host is not None
        mine = raw[rank.rank]
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(mine.gloo))  # one at a time
        assert host.comm_ns == sum(e - s for s, e, _ in mine.gloo)
        assert host.ns["overlapped"] == sum(mine.work_in(gs, ge) for gs, ge, _ in mine.gloo)


P2P = [DATA / f"p2p_gloo_rank{r}.pt.trace.json.gz" for r in (0, 1)]


def _p2p_raw(paths: list[Path]) -> list[dict[str, list[tuple[int, int]]]]:
    """Each rank's step markers, send and receive calls, gloo's ranges and its work (its ops
    and annotations but the markers), as (start, end) ns in time order, from the raw JSON."""
    out = []
    for path in paths:
        trace = orjson.loads(gzip.decompress(path.read_bytes()))
        base = trace["baseTimeNanoseconds"]
        x = [e for e in trace["traceEvents"] if e.get("ph") == "X"]

        def span(e: dict[str, Any], base: int = base) -> tuple[int, int]:
            start = base + int(Decimal(str(e["ts"])) * 1000)
            return start, start + int(Decimal(str(e["dur"])) * 1000)

        out.append({name: sorted(span(e) for e in x if e["name"].startswith(name))
                    for name in ("ProfilerStep#", "c10d::send", "c10d::recv_", "gloo:send",
                                 "gloo:recv")})
        out[-1]["work"] = sorted(span(e) for e in x if e.get("cat") in ("cpu_op",
                                 "user_annotation") and not e["name"].startswith("Profiler"))
    return out


def test_a_receive_that_waited_hands_the_path_to_its_sender(tmp_path: Path) -> None:
    """A pipeline's hand-off on gloo (tests/data/p2p_gloo.py: rank 1 posts its receive, rank 0
    computes, then sends), against the raw JSON: a step whose last work is rank 1's (the compute
    after its receive) runs back to rank 0's send call, one rank switch, the transfer from that
    call's start to the receive's completion (gloo:recv's end) a collective; a step that ends
    with rank 0's send (its gloo:send range, a collective) stays on rank 0. Before, each
    receive's wait was rank 1's own CPU time: no rank switch."""
    raw = _p2p_raw(P2P)
    sends, receives = raw[0]["c10d::send"], raw[1]["c10d::recv_"]
    assert raw[0]["c10d::recv_"] == raw[1]["c10d::send"] == [] and len(sends) == len(receives)
    run = import_traces(P2P, tmp_path / "p.run", ImportOptions(ranks=(0, 1)), ["test"])
    path = analyze(run).critical_path
    assert path is not None and len(path.steps) == 3
    waited = 0
    for i, step in enumerate(path.steps):
        last = [max(e for s, e in r["work"] if s < r["ProfilerStep#"][i][1]
                    and e > r["ProfilerStep#"][i][0]) for r in raw]
        assert step.end == max(last)
        if last[1] > last[0] and sends[i][0] > receives[i][0]:
            waited += 1
            assert step.rank_switches == 1
            assert step.ns["collective"] == raw[1]["gloo:recv"][i][1] - sends[i][0]
        else:
            assert step.rank_switches == 0
            gloo = raw[0]["gloo:send"][i]
            assert step.ns["collective"] == gloo[1] - gloo[0]
    assert waited > 0


def test_a_receive_that_completed_while_its_thread_worked_hands_over_nothing(
        tmp_path: Path) -> None:
    """Rank 1 computing (an aten::mm) while its third receive completes, as an irecv, compute
    and wait would (tests/data/p2p_gloo_variants.py, busy), though rank 0's send started after
    the receive was posted: rank 1's own work decided the step, whose path stays on rank 1 from
    its step's start (the marker's) to its last work, no collective on it. Before, it went over
    to rank 0's send at the receive's completion, in the middle of the op."""
    paths = [P2P[0], DATA / "p2p_gloo_busy_rank1.pt.trace.json.gz"]
    raw = _p2p_raw(paths)
    mm = [w for w in raw[1]["work"] if w[0] < raw[1]["gloo:recv"][2][1] < w[1]]
    assert len(mm) == 1 and raw[0]["c10d::send"][2][0] > raw[1]["c10d::recv_"][2][0]
    run = import_traces(paths, tmp_path / "p.run", ImportOptions(ranks=(0, 1)), ["test"])
    path = analyze(run).critical_path
    assert path is not None and len(path.steps) == 3
    step = path.steps[2]
    marker = raw[1]["ProfilerStep#"][2]
    assert (step.rank_switches, step.ns["collective"]) == (0, 0)
    assert step.start == marker[0]
    assert step.end == max(e for s, e in raw[1]["work"] if marker[0] <= s < marker[1])


def test_a_send_that_started_after_a_receive_completed_is_a_later_ones(tmp_path: Path) -> None:
    """Rank 0's profiler starting a step later than rank 1's (tests/data/p2p_gloo_variants.py,
    late): rank 1's first receive has no send in the trace, its first traced send started after
    that receive completed and feeds the second; the third still hands its step to the third
    send, the transfer from that send's start to the receive's completion. Before, the n-th send
    fed the n-th receive: the first receive went forward in time to the second send, the third
    had none."""
    paths = [DATA / "p2p_gloo_late_rank0.pt.trace.json.gz", P2P[1]]
    raw = _p2p_raw(paths)
    sends, received = raw[0]["c10d::send"], raw[1]["gloo:recv"]
    assert len(sends) == 2 and len(received) == 3 and sends[0][0] > received[0][1]
    run = import_traces(paths, tmp_path / "p.run", ImportOptions(ranks=(0, 1)), ["test"])
    path = analyze(run).critical_path
    assert path is not None and len(path.steps) == 3
    assert [s.rank_switches for s in path.steps] == [0, 0, 1]
    assert path.steps[0].ns["collective"] == 0
    assert path.steps[2].ns["collective"] == received[2][1] - sends[1][0]


SUBGROUPS = [DATA / f"subgroups_gloo_rank{r}.pt.trace.json.gz" for r in range(4)]


def _subgroups_raw() -> list[dict[str, Any]]:
    """Each rank of tests/data/subgroups_gloo.py's trace, read from the raw JSON: its
    subgroup (pg_config's group of two ranks), its loop thread's spans (start, end ns; not the
    step markers), its step markers, and its gloo all-reduces (start ns, tid, subgroup's or
    not) in time order. Which group ran each is the program's order: every step calls an
    all-reduce in the world, one in the subgroup and one more in the world, each waiting for
    the one before, so the rank's n-th c10d::allreduce_ call takes up its n-th range."""
    out = []
    for path in SUBGROUPS:
        raw = orjson.loads(gzip.decompress(path.read_bytes()))
        base = raw["baseTimeNanoseconds"]
        x = [e for e in raw["traceEvents"] if e.get("ph") == "X"]

        def span(e: dict[str, Any], base: int = base) -> tuple[int, int]:
            start = base + int(Decimal(str(e["ts"])) * 1000)
            return start, start + int(Decimal(str(e["dur"])) * 1000)

        (sub,) = [g for g in raw["distributedInfo"]["pg_config"] if len(g["ranks"]) == 2]
        calls = sorted(span(e)[0] for e in x if e["name"] == "c10d::allreduce_")
        ranges = sorted((*span(e), e["tid"]) for e in x if e["name"] == "gloo:all_reduce")
        assert len(calls) == len(ranges) == 9 and all(
            c < r for c, (r, _, _) in zip(calls, ranges, strict=True))
        marks = [e for e in x if e["name"].startswith("ProfilerStep#")]
        loop = marks[0]["tid"]
        out.append({"sub": Group(sub["pg_name"], tuple(sub["ranks"])),
                    "loop": sorted(span(e) for e in x if e["tid"] == loop and e["dur"] > 0
                                   and not e["name"].startswith("ProfilerStep#")),
                    "markers": sorted(span(e) for e in marks),
                    "gloo": [(ts, tid, i % 3 == 1) for i, (ts, _, tid) in enumerate(ranges)],
                "calls": calls, "gloo_ends": [end for _, end, _ in ranges]})
    return out


def test_subgroups_pair_within_their_group(tmp_path: Path) -> None:
    """Four gloo ranks, an all-reduce in the world, one in subgroup [0, 1] or [2, 3] and one
    more in the world each step, as many on every rank (tests/data/subgroups_gloo.py): each
    subgroup's all-reduces pair within it (by name and occurrence over every rank, ranks 0
    and 1's had paired with ranks 2 and 3's: 9 instances, each of the subgroups' 8 ms long
    with rank 2 last), the world's over the four ranks; rank 1 is last in its group by the
    4 ms it sleeps, rank 2 in its by its 8 ms. The trace names no group at a gloo range:
    each group's two threads, the world's started first, hold its ranges. The critical path
    and the collectives' peers follow the groups."""
    run = import_traces(SUBGROUPS, tmp_path / "s.run", ImportOptions(), ["test"])
    ev = Events.load(run)
    raw = _subgroups_raw()
    for mine in raw:  # what the pairing reads: the group's threads, in order of their ids
        world = sorted({tid for _, tid, sub in mine["gloo"] if not sub})
        theirs = sorted({tid for _, tid, sub in mine["gloo"] if sub})
        assert len(world) == len(theirs) == 2 and max(world) < min(theirs)
    expected: dict[Instance, dict[int, int]] = {}
    for rank, mine in enumerate(raw):
        for sub in (False, True):
            group = mine["sub"] if sub else NO_GROUP
            starts = [ts for ts, _, s in mine["gloo"] if s == sub]
            for n, ts in enumerate(starts):
                expected.setdefault(("gloo:all_reduce", n, group), {})[rank] = ts
    assert len(expected) == 3 * 2 + 3 + 3

    groups = process_groups(run, ev, ev.ranks)
    result = stragglers(ev, groups=groups)
    assert result.instances == len(expected) == len(result.worst)
    found = {(w.name, w.occurrence, w.group): (w.starts, w.last_rank, w.skew_ns)
             for w in result.worst}
    assert found == {key: (starts, max(starts, key=lambda r: (starts[r], -r)),
                           max(starts.values()) - min(starts.values()))
                     for key, starts in expected.items()}
    for (_, _, group), (_, last, skew) in found.items():
        if group.ranks == (0, 1):
            assert last == 1 and 3_500 * US < skew < 6_000 * US  # rank 1's 4 ms sleep
        elif group.ranks == (2, 3):
            assert last == 2 and 7_500 * US < skew < 10_000 * US  # rank 2's 8 ms sleep
    assert stragglers(ev).instances == 9  # without the groups: by name and occurrence

    peers = instances_of(ev, groups)
    assert {key: sorted(r for r, _, _ in p) for key, p in peers.items()} == {
        key: sorted(starts) for key, starts in expected.items()}
    path = critical_path(ev, [], iterations(run, ev).steps, None, groups)
    assert path is not None and len(path.steps) == 3
    for i, step in enumerate(path.steps):
        # rank 2, its 8 ms sleep the longest, is where each step's path begins; it ends at
        # the end of the last loop's work
        assert step.start == max(raw[2]["markers"][i][0], raw[2]["loop"][0][0])
        assert step.end == max(max(e for s, e in r["loop"] if r["markers"][i][0] <= s
                                   < r["markers"][i][1]) for r in raw)
        assert step.ns["collective"] < 1_000 * US  # a rank's own all-reduces, not the wait


def test_subgroups_steps_detected_by_their_groups(tmp_path: Path) -> None:
    """Without markers, tests/data/subgroups_gloo.py's steps are found by the group each
    all-reduce ran in: a step is three c10d::allreduce_ calls, the world's, the subgroup's,
    the world's, and nothing else on the loop thread (ranks 1 and 2 sleep untraced), so by op name
    the sequence is one name nine times and no loop (main's code found none on every rank);
    by group it repeats at three. Each step starts at its first call (the first, at the
    trace's first op), the step before it ending where the gloo range its last call took up
    ended, the last step with the last range; three steps, as the markers count. The markers
    close each step later, by what the trace does not hold: the loop thread's return from its
    wait (0.4% to 1.7% of a mean step) and, after the last, the profiler's stop (0.1 to
    0.2 ms on ranks 0 and 1, 1.5 and 2.6 ms on ranks 2 and 3: 6.3% and 11.1%)."""
    run = import_traces(SUBGROUPS, tmp_path / "s.run", ImportOptions(), ["test"])
    ev = Events.load(run)
    found = detected_steps(ev, profiled_windows(run), run)
    for rank, mine in enumerate(_subgroups_raw()):
        calls, ends = mine["calls"], mine["gloo_ends"]
        assert [(w.start, w.end) for w in found[rank]] == [
            (calls[0], ends[2]), (ends[2], ends[5]), (ends[5], ends[8])]
        markers = mine["markers"]
        mean = np.mean([e - s for s, e in markers])
        for (_, end), (start, _), w in zip(markers[:-1], markers[1:], found[rank][1:],
                                             strict=True):
            assert end - 0.017 * mean <= w.start <= start
        assert 0 <= markers[-1][1] - found[rank][-1].end < (0.01 if rank < 2 else 0.12) * mean


def test_which_group_a_gloo_thread_ran() -> None:
    """A rank's gloo threads in id order are its gloo groups' in pg_config's order, two each
    (ProcessGroupGloo's default), only where it shows two for each; a group of every rank, an
    empty rank list, and a group without the rank (a trace imported as another rank than
    torch's) name none."""
    from perfswarm.analyze.groups import UNTOLD, group_of, thread_groups
    from perfswarm.analyze.stragglers import skews

    everyone = frozenset(range(4))
    low = group_of("1", "[0, 1]", 0, everyone)
    assert low == Group("1", (0, 1))
    assert group_of("0", [0, 1, 2, 3], 0, everyone) == NO_GROUP
    assert group_of("0", "[]", 0, everyone) == group_of("1", "[0, 1]", 2, everyone) == NO_GROUP
    assert group_of("1", "[0, 1", 0, everyone) == group_of(None, "[0, 1]", 0, everyone) == NO_GROUP
    tids = np.array([10, 12, 20, 21])
    assert thread_groups(tids, [NO_GROUP, low]) == {20: low, 21: low}
    # which two are one group's? None can say: its collectives pair with none (by name over
    # every rank, a subgroup's had paired with another subgroup's)
    assert thread_groups(tids[:3], [NO_GROUP, low]) == dict.fromkeys([10, 12, 20], UNTOLD)
    assert thread_groups(tids[:3], [low]) == dict.fromkeys([10, 12, 20], low)
    assert thread_groups(tids, [NO_GROUP]) == thread_groups(tids, []) == {}
    for group, paired in ((NO_GROUP, 1), (UNTOLD, 0)):
        key = ("gloo:all_reduce", 0, group)
        assert skews({0: {key: 5}, 1: {key: 9}}).instances == paired


def test_nccl_subgroups_pair_by_their_args(tmp_path: Path) -> None:
    """The corpus's NCCL kernels as four ranks, its broadcasts moved into subgroups by their
    args ("Process Group Name" 1 of ranks [0, 1], 2 of [2, 3]) and each rank later by 100 us
    than the one before it: each broadcast pairs within its group (rank 1 and rank 3 last by
    100 us), each all-reduce over the four (rank 3 last by 300 us)."""
    raw = orjson.loads(gzip.decompress(corpus("nccl").read_bytes()))
    files = []
    for rank in range(4):
        kernels = []
        for e in raw["traceEvents"]:
            if e.get("cat") == "kernel" and "Process Group Name" in e.get("args", {}):
                args = dict(e["args"])
                if args["Collective name"] == "broadcast":
                    args["Process Group Name"] = "1" if rank < 2 else "2"
                    args["Process Group Ranks"] = "[0, 1]" if rank < 2 else "[2, 3]"
                else:
                    args["Process Group Ranks"] = "[0, 1, 2, 3]"
                kernels.append({**e, "ts": e["ts"] + 100 * rank, "args": args})
        files.append(tmp_path / f"rank{rank}.json")
        files[-1].write_bytes(orjson.dumps({
            **{k: v for k, v in raw.items() if k != "traceEvents"},
            "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 4},
            "traceEvents": kernels}))
    run = import_traces(files, tmp_path / "n.run", ImportOptions(), ["test"])
    ev = Events.load(run)
    result = stragglers(ev, top=100, groups=process_groups(run, ev, ev.ranks))
    assert result.instances == len(result.worst) == 15 + 6 + 6
    by_group: dict[Group, set[tuple[int, int, tuple[int, ...]]]] = {}
    for w in result.worst:
        by_group.setdefault(w.group, set()).add((w.last_rank, w.skew_ns, tuple(w.starts)))
    assert by_group == {NO_GROUP: {(3, 300 * US, (0, 1, 2, 3))},
                        Group("1", (0, 1)): {(1, 100 * US, (0, 1))},
                        Group("2", (2, 3)): {(3, 100 * US, (2, 3))}}
    assert stragglers(ev).instances == 15 + 6  # without the groups: broadcasts over all four


def test_stragglers_count_each_wait_once() -> None:
    """Two DDP buckets a step all-reduce at once, both waiting for rank 1: rank 0 waits from
    0 to 105 (it had been 100 + 95: longer than the wait); a name the ranks ran a different
    number of times does not pair (subgroups); ranks taking turns at being last name no
    straggler."""
    from perfswarm.analyze.stragglers import skews

    buckets = skews({0: {("ar", 0, W): 0, ("ar", 1, W): 10, ("g", 0, W): 0, ("g", 1, W): 5,
                         ("g", 2, W): 9},
                     1: {("ar", 0, W): 100, ("ar", 1, W): 105, ("g", 0, W): 50,
                         ("g", 1, W): 60}})
    assert buckets.instances == 2  # the two all-reduces; "g" (3 against 2) left out
    assert [(r.rank, r.waited_ns, r.held_back_ns, r.last_count) for r in buckets.ranks] == [
        (0, 105, 0, 0), (1, 0, 105, 2)]
    assert buckets.straggler == 1 and buckets.total_skew_ns == 100 + 95
    turns = skews({0: {("ar", 0, W): 0, ("ar", 1, W): 50},
                   1: {("ar", 0, W): 10, ("ar", 1, W): 40}})
    assert [r.held_back_ns for r in turns.ranks] == [10, 10] and turns.straggler is None


def test_a_straggler_is_last_more_often_than_chance() -> None:
    """Two ranks over 20 all-reduces: rank 1 last at 13 of them by 10 ns, rank 0 at 7 by 1 ns
    (held back 130 against 7: dominant) is what equally quick ranks give 13% of the time, no
    straggler (two symmetric DDP ranks, their threads over the cores, had made one); last at
    16 of 20 (0.6%), it is one; last at its only collective, too."""
    from perfswarm.analyze.stragglers import last_by_chance, skews

    def ar(late_1: int) -> dict[int, dict[Instance, int]]:
        return {0: {("ar", i, W): 100 * i + (0 if i < late_1 else 1) for i in range(20)},
                1: {("ar", i, W): 100 * i + (10 if i < late_1 else 0) for i in range(20)}}

    even = skews(ar(13))
    assert [(r.last_count, r.held_back_ns) for r in even.ranks] == [(7, 7), (13, 130)]
    assert last_by_chance(13, 20, 2) == pytest.approx(0.1316, abs=1e-4)
    assert even.straggler is None
    assert skews(ar(16)).straggler == 1 and last_by_chance(16, 20, 2) < 0.01
    assert skews(ar(20)).straggler == 1


def test_stragglers_hand_made() -> None:
    result = stragglers(_two_ranks())
    assert (result.instances, result.max_skew_ns, result.straggler) == (1, 110, 1)
    assert result.worst[0].starts == {0: 30, 1: 140}


def test_stragglers_two_ranks_of_one_trace(tmp_path: Path) -> None:
    path = corpus("nccl")
    run = import_traces([path, path], tmp_path / "two.run", ImportOptions(ranks=(0, 1)),
                        ["test"])
    table = run.table("events")
    ev = Events.from_table(table)
    assert stragglers(ev).max_skew_ns == 0  # the same trace twice: every rank in lockstep
    coll = np.flatnonzero((ev.rank == 1) & ev.of_kind("collective"))
    third = coll[np.argsort(ev.ts[coll], kind="stable")][2]
    ts = table.column("ts").to_numpy().copy()
    ts[third] += 500 * US
    shifted = Events.from_table(table.set_column(1, "ts", pa.array(ts)))
    result = stragglers(shifted)
    assert result.instances == 21
    assert (result.max_skew_ns, result.total_skew_ns, result.straggler) == (500 * US,
                                                                          500 * US, 1)
    assert [(r.rank, r.last_count, r.held_back_ns) for r in result.ranks] == [
        (0, 0, 0), (1, 1, 500 * US)]


def test_diff_trace_compare(corpus_runs: dict[str, Run]) -> None:
    result = diff_runs(corpus_runs["compare_base"], corpus_runs["compare_test"])
    top = [(o.kind, o.name, o.a_count, o.b_count, o.delta_ns, o.per_iteration_delta_ns)
           for o in result.ops[:3]]
    # test adds three cpu ops inside step 1010 (2 steps each side)
    assert top == [("cpu_op", "All2All_Pooled_Req", 0, 1, 311 * US, 155.5 * US),
                   ("cpu_op", "AddmmBackward0", 0, 1, 207 * US, 103.5 * US),
                   ("cpu_op", "CatBackward0", 0, 1, 11 * US, 5.5 * US)]
    # the three ops fell where nothing ran: the steps' time no op covers is 529 us less
    last, before = result.ops[-1], result.ops[-2]
    assert (last.kind, last.name, last.a_count, last.b_count, last.delta_ns) == (
        "no op", "Python, or waiting", 2, 2, -(311 + 207 + 11) * US)
    assert (before.kind, before.name, before.a_count, before.b_count, before.delta_ns) == (
        "user_annotation", "nccl:all_reduce", 2, 1, -67 * US)
    assert (result.only_a, result.only_b) == ((), (
        ("cpu_op", "AddmmBackward0"), ("cpu_op", "All2All_Pooled_Req"),
        ("cpu_op", "CatBackward0")))
    assert [(s.a_step, s.b_step, s.a_ns - s.b_ns) for s in result.steps] == [
        (1009, 1009, 0), (1010, 1010, 0)]


def test_diff_of_a_run_with_itself_is_zero(corpus_runs: dict[str, Run]) -> None:
    run = corpus_runs["nccl"]
    ev = Events.load(run)
    steps = iterations(run, ev).steps[0]
    result = diff(ev, steps, ev, steps, top=None)
    assert all(o.delta_ns == 0 for o in result.ops) and result.only_a == result.only_b == ()


def test_diff_of_detected_steps_against_marked_ones(tmp_path: Path) -> None:
    """tests/data/eval_every3 (no markers: its steps are detected) against the same trace with
    a ProfilerStep marker on each step the detection found: the same steps and events, so
    every per-iteration change is 0 and both sides have a step time (the detected side's
    ops had counted 0 a step: every op a regression of its whole time, no step time)."""
    trace = Path(__file__).parent / "data" / "eval_every3_cpu.pt.trace.json.gz"
    raw = orjson.loads(gzip.decompress(trace.read_bytes()))
    a = import_traces([trace], tmp_path / "a.run", ImportOptions(), ["t"])
    found = detected_steps(Events.load(a))[0]
    loop = next(e for e in raw["traceEvents"] if e["name"].startswith("Optimizer.step#"))
    base = raw.get("baseTimeNanoseconds", 0)
    marked = dict(raw, traceEvents=[*raw["traceEvents"], *(
        {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{w.step}",
         "pid": loop["pid"], "tid": loop["tid"], "ts": (w.start - base) / 1000,
         "dur": w.dur / 1000, "args": {}} for w in found)])
    other = tmp_path / "marked.json"
    other.write_bytes(orjson.dumps(marked))
    b = import_traces([other], tmp_path / "b.run", ImportOptions(), ["t"])
    result = diff_runs(a, b)
    assert [s.a_ns for s in result.steps] == [s.b_ns for s in result.steps]
    assert len(result.steps) == 12 and result.step_time is not None
    assert result.step_time.a.median_ns == result.step_time.b.median_ns
    assert all(o.per_iteration_delta_ns == 0 for o in (*result.ops, *result.improvements)
               if o.name != "ProfilerStep#")


def test_diff_of_the_loop_process_and_the_time_no_op_covers() -> None:
    """Two steps a side of the loop (pid 1): its op 40 us in A, 40 in B, and B sleeps 30 us
    more a step between ops; a DataLoader worker (pid 2) fetches 50 us a step in B only,
    beside the loop. The worker's fetch is no change of the loop's; the time no op covers is
    +30 us a step, beyond its band (A: 60 and 60 us, B: 90 and 90). With the step times of
    both sides the headline's change and band are the medians' (1.2533 x 1.4826 x MAD)."""
    from perfswarm.analyze.diff import StepTimeDelta
    from perfswarm.analyze.iterations import StepTime, StepWindow

    def side(gap: int, worker: bool) -> tuple[Events, list[StepWindow]]:
        rows, windows, t = [], [], 0
        for i in range(2):
            span = 100 + gap
            rows.append((0, t, span, "user_annotation", f"ProfilerStep#{i}", 1, -1, -1, -1))
            rows.append((0, t + 10, 40, "cpu_op", "aten::mm", 1, -1, -1, -1))
            if worker:
                rows.append((0, t + 20, 50, "user_annotation", "DataLoader worker fetch", 7,
                             -1, -1, -1))
            windows.append(StepWindow(i, t, t + span, "marker"))
            t += span
        ev = events(rows)
        pid = np.where(ev.tid == 7, 2, 1).astype(np.int64)
        return Events(rank=ev.rank, ts=ev.ts, dur=ev.dur, kind=ev.kind, name=ev.name,
                      names=ev.names, pid=pid, tid=ev.tid, device=ev.device, stream=ev.stream,
                      correlation=ev.correlation, step=np.array(
                          [0 if t < 100 + gap else 1 for t in ev.ts], np.int64)), windows

    (ea, sa), (eb, sb) = side(0, False), side(30, True)
    times = StepTimeDelta(StepTime(100_000.0, 9, True, None, spread_ns=3000.0),
                          StepTime(130_000.0, 16, True, None, spread_ns=4000.0))
    result = diff(ea, sa, eb, sb, top=None, pids=(1, 1), step_time=times)
    names = {o.name: o for o in result.ops}
    assert "DataLoader worker fetch" not in names and result.only_b == ()
    no_op = names["Python, or waiting"]
    assert (no_op.a_ns, no_op.b_ns, no_op.per_iteration_delta_ns) == (120, 180, 30)
    assert no_op.beyond_noise and names["aten::mm"].per_iteration_delta_ns == 0
    band = 2 * np.hypot(1.2533 * 3000 / 3, 1.2533 * 4000 / 4)
    assert result.to_dict()["step_time"]["noise_ns"] == pytest.approx(band)
    assert result.to_dict()["step_time"]["delta_ns"] == 30_000
    # every process's ops without the loop's pid: the worker's fetch is B's only
    assert ("user_annotation", "DataLoader worker fetch") in diff(ea, sa, eb, sb).only_b


def test_diff_says_which_side_waited_for_other_processes() -> None:
    """Over a side's compared steps the sampler read its tree at 0.5 cores and 1.0 of run
    delay on 2 cores: the threads wanted 1.5, under the cores, so all 1.0 was for others; at
    1.5 cores and 1.5 of delay, 0.5 (the rest beyond the cores is the tree's own). Readings
    outside the steps, or none, count nothing."""
    from perfswarm.analyze.diff import contended
    from perfswarm.analyze.iterations import StepWindow

    steps = [StepWindow(0, 100, 200, "marker"), StepWindow(1, 200, 300, "marker")]

    def counters(got: float, waited: float) -> pa.Table:
        return pa.table({"ts": [150, 250, 900, 150, 250, 900],
                         "name": ["proc.cpu_cores"] * 3 + ["proc.run_delay_cores"] * 3,
                         "value": [got, got, 9.0, waited, waited, 9.0]})

    assert contended(counters(0.5, 1.0), steps, 2) == 1.0
    assert contended(counters(1.5, 1.5), steps, 2) == 0.5
    assert contended(counters(0.5, 1.0).slice(0, 3), steps, 2) is None
    assert contended(counters(0.5, 1.0), [], 2) is None


def test_diff_says_a_side_unsampled_beside_one_that_waited() -> None:
    """x-transformers recorded with the defaults (A, 0.53 cores' worth waited for others) and
    with `-c torch` (B, no sampler, 3.6x slower steps at a higher load): the note named A's
    wait alone; B's is unknown, not none."""
    from perfswarm.analyze.diff import RunDiff

    def sides(a: float | None, b: float | None) -> RunDiff:
        return RunDiff(0, 0, (), (), (), (), contention=(a, b))

    assert sides(0.53, None).unsampled_beside_waits == [1]
    assert sides(None, 0.53).unsampled_beside_waits == [0]
    assert sides(0.53, 0.0).unsampled_beside_waits == []  # B sampled: it did not wait
    assert sides(None, None).unsampled_beside_waits == []  # neither sampled: no wait noted


def _samples(groups: int = 3, variants: int = 8, n: int = 600) -> tuple[pa.Table, pa.Table,
                                                                        np.ndarray]:
    """Stacks in `groups` code regions (distinct leaf module, function, address range)."""
    regions = [("libtorch_cuda.so", 0x10000, ["at::native::conv2d", "at::native::convolution",
                                              "torch::autograd::Engine::execute"]),
               ("python3.11", 0x900000, ["PyEval_EvalFrame", "dataloader.__next__", "collate"]),
               ("libc.so.6", 0x50000, ["__memmove_avx", "aten::copy_", "train_step"])][:groups]
    stacks: dict[str, list[object]] = {k: [] for k in STACKS.names}
    group_of = []
    for g, (module, base, frames) in enumerate(regions):
        for v in range(variants):
            sid = len(group_of)
            for depth, function in enumerate([*frames, f"caller_{v % 2}"]):
                stacks["stack_id"].append(sid)
                stacks["depth"].append(depth)
                stacks["function"].append(function)
                stacks["module"].append(module if depth == 0 else "libpython3.11.so")
                stacks["address"].append(base + 16 * v + 4096 * depth)
            group_of.append(g)
    rng = np.random.default_rng(7)
    chosen = rng.integers(0, len(group_of), n)
    samples = pa.table({"rank": [0] * n, "ts": [1000 * i for i in range(n)],
                        "source": ["perf"] * n, "pid": [1] * n, "tid": [1] * n,
                        "stack_id": chosen.tolist(), "weight": [1] * n}).cast(SAMPLES)
    return samples, pa.table(stacks).cast(STACKS), np.array(group_of)[chosen]


def test_swarms_find_the_code_regions() -> None:
    samples, stacks, truth = _samples()
    result = swarms(samples, stacks)
    assert result.k == 3 and result.silhouette is not None and result.silhouette > 0.5
    expected = sorted((int((truth == g).sum()) for g in range(3)), reverse=True)
    assert [s.samples for s in result.swarms] == expected
    assert {s.caption for s in result.swarms} == {
        "libtorch_cuda.so: at::native::conv2d", "python3.11: PyEval_EvalFrame",
        "libc.so.6: __memmove_avx"}
    assert sum(s.share for s in result.swarms) == pytest.approx(1.0)


def test_swarms_of_the_steps() -> None:
    """With steps, only the samples inside them are clustered (not the export's step: the
    recorder's own work), their wall time the steps'; without, every sample over its span."""
    samples, stacks, _ = _samples(groups=2)  # 600 samples, one every 1,000 ns
    steps = {0: [StepWindow(1, 0, 300_000, "marker"), StepWindow(2, 300_000, 400_000, "export"),
                 StepWindow(3, 400_000, 500_000, "detected")],
             1: [StepWindow(3, 450_000, 520_000, "marker")]}  # another rank's, overlapping
    inside = swarms(samples, stacks, steps)
    assert (inside.scope, inside.left_out, inside.sampled_ns) == ("steps", 180, 420_000)
    assert sum(s.samples for s in inside.swarms) == 420
    whole = swarms(samples, stacks)
    assert (whole.scope, whole.left_out, whole.sampled_ns) == ("run", 0, 599_000)
    assert sum(s.samples for s in whole.swarms) == 600


def test_swarm_caption_is_one_leaf() -> None:
    """A swarm is captioned by its heaviest leaf, a function with its own module: here the
    heaviest function (40% of the weight, in libA) against the heaviest module (libB's two
    functions, 30% each); the two apart made "libB.so: gemm", a function libB never ran."""
    leaves = [("gemm", "libA.so"), ("memcpy", "libB.so"), ("memset", "libB.so")]
    stacks = pa.table({"stack_id": [0, 1, 2], "depth": [0, 0, 0],
                       "function": [f for f, _ in leaves], "module": [m for _, m in leaves],
                       "address": [16, 32, 48]}).cast(STACKS)
    chosen = [0] * 4 + [1] * 3 + [2] * 3
    n = len(chosen)
    samples = pa.table({"rank": [0] * n, "ts": list(range(n)), "source": ["perf"] * n,
                        "pid": [1] * n, "tid": [1] * n, "stack_id": chosen,
                        "weight": [1] * n}).cast(SAMPLES)
    lab = Labels(np.array([0, 1, 2]), np.array(chosen), np.zeros(3, np.int64), 1, None)
    (only,) = describe(samples, stacks, lab, np.ones(n, np.int64), {})
    assert only.caption == "libA.so: gemm"
    assert only.functions == ("gemm", "memcpy", "memset")
    assert only.modules == ("libA.so", "libB.so")


def test_swarms_by_iteration() -> None:
    samples, stacks, _ = _samples(groups=2)
    steps = {0: [StepWindow(0, 0, 300_000, "marker"), StepWindow(1, 300_000, 600_000, "marker")]}
    result = swarms(samples, stacks, steps)
    assert result.k == 2
    for s in result.swarms:
        assert set(s.steps) == {0, 1} and sum(s.steps.values()) == pytest.approx(1.0)


def test_swarms_leave_out_the_recorders_export(corpus_runs: dict[str, Run],
                                               tmp_path: Path) -> None:
    """Samples in the step that holds the recorder's trace export are the tool's own work
    (the profiler's stop, its trace written): no swarm is made of them."""
    import shutil

    from perfswarm.analyze.swarms import run_samples
    from perfswarm.trace.schema import STEPS

    run = Run(shutil.copytree(corpus_runs["simple_add"].path, tmp_path / "r.run"))
    run.write_table("steps", pa.table({"rank": [0, 0], "step": [1, 2], "start": [0, 100],
                                       "end": [100, 200], "source": ["detected", "export"]}
                                      ).cast(STEPS))
    ts = [10, 50, 99, 100, 150, 199, 200]
    run.write_table("samples", pa.table({
        "rank": [0] * 7, "ts": ts, "source": ["perf"] * 7, "pid": [1] * 7, "tid": [1] * 7,
        "stack_id": list(range(7)), "weight": [1] * 7}).cast(SAMPLES))
    assert run_samples(run).column("ts").to_pylist() == [10, 50, 99, 200]


def test_swarms_without_samples() -> None:
    empty = swarms(SAMPLES.empty_table(), STACKS.empty_table())
    assert (empty.k, empty.swarms) == (0, ())


@pytest.mark.parametrize("rank", [0, -1])  # -1: a recorder's host-wide samplers
def test_system_load_dominators_and_correlation(rank: int) -> None:
    t = np.arange(0, 2000, 10, dtype=np.int64)  # 200 samples, 10 ns apart
    wave = (np.sin(t / 50.0) + 1) / 2
    series = {
        "cpu.core0.usr": np.where(t < 1000, 90.0, 10.0),  # percent
        "cpu.core0.sys": np.full(len(t), 5.0),
        "cpu.core0.iowait": np.where(t < 1000, 0.0, 60.0),
        "gpu0.sm_util": 30.0 * wave,
        "net.rx_bytes": np.cumsum(1 + 9 * wave),  # cumulative: its rate follows the wave
        # one flow's bytes, against the wave: not part of the host's network total
        "net.flow.tcp.10.0.0.1:1->10.0.0.2:2.bytes": np.cumsum(10 - 9 * wave),
    }
    n = len(t)
    table = pa.table({"rank": [rank] * (n * len(series)), "ts": np.tile(t, len(series)),
                      "name": [k for k in series for _ in range(n)],
                      "device": [-1] * (n * len(series)),
                      "value": np.concatenate(list(series.values()))}).cast(COUNTERS)
    steps = {0: [StepWindow(0, 0, 1000, "marker"), StepWindow(1, 1000, 2000, "marker")]}
    (load,) = system_load(table, steps)
    assert load.rank == 0  # host counters are read against rank 0's iterations
    assert [w.dominator for w in load.windows] == ["usr", "iowait"]
    assert load.windows[0].mean["usr"] == pytest.approx(0.9)
    assert load.windows[1].mean["iowait"] == pytest.approx(0.6)
    assert load.gpu_correlation["net"] > 0.99
    assert set(load.gpu_correlation) == {"cpu", "net"}


def test_the_busiest_core_sets_the_cpu_load() -> None:
    """One core of four 80% busy in user time (a loop's Python), the GPU 35%: the mean over the
    cores (20%) would make the GPU the dominator; the busiest core says the host."""
    t = np.arange(0, 1000, 10, dtype=np.int64)
    series = {f"cpu.core{i}.usr": np.full(len(t), 80.0 if i == 2 else 0.0) for i in range(4)}
    series["gpu0.sm_util"] = np.full(len(t), 35.0)
    n = len(t)
    table = pa.table({"rank": [-1] * (n * len(series)), "ts": np.tile(t, len(series)),
                      "name": [k for k in series for _ in range(n)],
                      "device": [-1] * (n * len(series)),
                      "value": np.concatenate(list(series.values()))}).cast(COUNTERS)
    (load,) = system_load(table, {0: [StepWindow(0, 0, 1000, "marker")]})
    (window,) = load.windows
    assert window.mean["usr"] == pytest.approx(0.2) and window.busiest["usr"] == pytest.approx(0.8)
    assert window.dominator == "usr"


def test_diff_lists_improvements_with_a_noise_band(tmp_path: Path) -> None:
    """B's aten::mm is 2 ms faster a step (3 steps: 5, 6, 7 -> 3, 4, 5 ms); aten::relu moves by
    a step-to-step wobble (1, 2, 3 -> 2, 1, 3 ms): inside its band. The noise is twice the
    standard error of the difference of the means: 2 sqrt(var_a / 3 + var_b / 3)."""
    from perfswarm.cli.main import main

    def run(name: str, mm: list[int], relu: list[int]) -> Run:
        events = []
        for i, (m, r) in enumerate(zip(mm, relu, strict=True)):
            t = i * 20_000
            events += [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}",
                        "pid": 1, "tid": 1, "ts": t, "dur": 19_000, "args": {}},
                       {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1,
                        "ts": t + 10, "dur": m * 1000, "args": {}},
                       {"ph": "X", "cat": "cpu_op", "name": "aten::relu", "pid": 1, "tid": 1,
                        "ts": t + 10 + m * 1000, "dur": r * 1000, "args": {}}]
        path = tmp_path / f"{name}.json"
        path.write_bytes(orjson.dumps({"traceEvents": events}))
        return import_traces([path], tmp_path / f"{name}.run", ImportOptions(), ["test"])

    a, b = run("a", [5, 6, 7], [1, 2, 3]), run("b", [3, 4, 5], [2, 1, 3])
    result = diff_runs(a, b)
    (mm,) = [o for o in result.improvements if o.name == "aten::mm"]
    ms = 1e6
    assert mm.per_iteration_delta_ns == -2 * ms
    assert mm.noise_ns == pytest.approx(2 * np.sqrt(1 / 3 + 1 / 3) * ms)  # variances 1 and 1
    assert mm.beyond_noise
    (relu,) = [o for o in result.ops if o.name == "aten::relu"]
    assert relu.per_iteration_delta_ns == 0 and not relu.beyond_noise
    assert main(["diff", str(a.path), str(b.path)]) == 0


def test_step_time_after_the_window() -> None:
    """The program's step time is the median of the recorder's steps after its window (10 ms),
    not the profiled ones (15 ms: x1.5 under the profiler) nor the warm-up before it (40 ms);
    with fewer than three after it, the profiled median; without a window, every timed step."""
    from perfswarm.analyze.iterations import step_time
    from perfswarm.trace.schema import STEPS

    ms = 1_000_000

    def table(rows: list[tuple[int, float, str]]) -> pa.Table:
        t = 0
        out: dict[str, list[Any]] = {k: [] for k in ("rank", "step", "start", "end", "source")}
        for step, (_, dur, source) in enumerate(rows, 1):
            for k, v in zip(out, (0, step, t, t + round(dur * ms), source), strict=True):
                out[k].append(v)
            t += round(dur * ms)
        return pa.table(out).cast(STEPS)

    warm = [(0, 40, "detected")] * 2
    window = [(0, 15, "marker")] * 3 + [(0, 90, "export")]
    found = step_time(table(warm + window + [(0, 10, "detected")] * 3))
    assert found is not None and (found.median_ns, found.steps, found.outside) == (
        10 * ms, 3, True)
    assert found.profiled_ns == 15 * ms and found.profiler_slowdown == 1.5
    short = step_time(table(warm + window + [(0, 10, "detected")] * 2))
    assert short is not None and (short.median_ns, short.outside) == (15 * ms, False)
    assert short.profiler_slowdown == 1.0
    bare = step_time(table(warm + [(0, 20, "detected")] * 3))
    assert bare is not None and (bare.median_ns, bare.steps) == (20 * ms, 5)
    assert (found.which, short.which) == ("after the profiler's window", "profiled")
    assert bare.which == "timed, none profiled"  # no window (had read "after" one)
    # a sweep of batches (the recorder's STEP_BATCH at each step's start): the window ran
    # batch 8; after it, three steps of 8 (10 ms) and five of 64 (80 ms) -- the step time is
    # batch 8's (the median of all eight had been 80 ms: samples/s 8x low)
    sweep = table(warm + window + [(0, 10, "detected")] * 3 + [(0, 80, "detected")] * 5)
    starts = sweep.column("start").to_pylist()
    batches = [8] * 9 + [64] * 5
    sizes = pa.table({"rank": [0] * len(starts), "ts": starts, "value": [float(b) for b in
                                                                         batches]})
    found = step_time(sweep, sizes)
    assert found is not None and (found.median_ns, found.steps) == (10 * ms, 3)
    mixed = step_time(sweep)
    assert mixed is not None and mixed.median_ns == 80 * ms
    # three steps before the window past the first (the warm-up, 40 ms): 15 ms there, 10
    # after it: the heap the window left (x0.67) is said; 10.5 before it is within 10%
    before = [(0, 40, "detected")] + [(0, 15, "detected")] * 3
    shifted = step_time(table(before + window + [(0, 10, "detected")] * 3))
    assert shifted is not None and shifted.before_ns == 15 * ms
    assert shifted.heap_shift == 10 / 15
    close = step_time(table([(0, 40, "detected")] + [(0, 10.5, "detected")] * 3 + window
                            + [(0, 10, "detected")] * 3))
    assert close is not None and close.before_ns == 10.5 * ms and close.heap_shift is None
    assert found.before_ns is None  # two steps before the window, the first the warm-up
    # a first profiled step that times the recorder (the profiler's start, 60 ms) set aside:
    # the profiled median is the other steps' (20 ms), not 25 ms of the four
    started = table(warm + [(0, dur, "marker") for dur in (60, 15, 20, 30)]
                    + [(0, 90, "export")] + [(0, 10, "detected")] * 3)
    kept = step_time(started)
    assert kept is not None and kept.profiled_ns == 25 * ms
    aside = step_time(started, aside={(0, 3)})
    assert aside is not None and aside.profiled_ns == 20 * ms
    assert aside.profiler_slowdown == 2.0 and aside.median_ns == 10 * ms


def test_step_paths_past_their_window_and_an_unexplained_device_wait(
        corpus_runs: dict[str, Run]) -> None:
    """HTA's trace_compare base: each step's last device op (of those launched in it, or with
    no launch, starting in it) ends after its ProfilerStep closed; `beyond_step_ns` says by how
    much (the raw JSON's last end less the marker's end). Its memsets and copies have no launch
    in the trace: the stream's wait before them is `device_idle`, not `stream_queue` (nothing
    says they were queued)."""
    with gzip.open(corpus("compare_base"), "rt") as f:
        raw = orjson.loads(f.read())["traceEvents"]

    def ns(x: Any) -> int:
        return int(Decimal(str(x)) * 1000)

    launches = {e["args"]["correlation"]: ns(e["ts"]) for e in raw
                if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    device = [e for e in raw if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    marks = sorted((ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])) for e in raw
                   if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#"))
    expected = []
    for lo, hi in marks:
        ends = [ns(e["ts"]) + ns(e["dur"]) for e in device
                if lo <= launches.get(e["args"].get("correlation"), ns(e["ts"])) < hi]
        expected.append(max(0, max(ends) - hi))
    path = analyze(corpus_runs["compare_base"]).critical_path
    assert path is not None
    assert [s.beyond_step_ns for s in path.steps] == expected
    assert all(b > 50_000_000 for b in expected)  # 57 and 52 ms
    assert all(s.ns["device_idle"] > 0.99 * s.length_ns - s.ns["kernel"] - s.ns["memcpy"]
               - s.ns["memset"] - s.ns["stream_queue"] for s in path.steps)
    assert path.beyond_step_ns == 0


@st.composite
def nested_spans(draw: st.DrawFn) -> list[tuple[int, int]]:
    """Properly nested spans of one thread (children within parents, siblings apart)."""
    spans: list[tuple[int, int]] = []

    def fill(lo: int, hi: int, depth: int) -> None:
        t = lo
        while t < hi and len(spans) < 40 and draw(st.booleans()):
            a = t + draw(st.integers(0, 3))
            b = min(hi, a + draw(st.integers(1, 30)))
            if a >= b:
                return
            spans.append((a, b))
            if depth < 4:
                fill(a, b, depth + 1)
            t = b

    fill(0, 400, 0)
    return spans


@given(nested_spans())
def test_innermost_span_of_each_segment(spans: list[tuple[int, int]]) -> None:
    starts = np.array([a for a, _ in spans], np.int64)
    ends = np.array([b for _, b in spans], np.int64)
    points = sorted_unique(np.concatenate([starts, ends]))
    got = innermost(starts, ends, points, np.arange(len(spans), dtype=np.int64) + 7)
    for i, p in enumerate(points[:-1].tolist()):
        over = [j for j, (a, b) in enumerate(spans) if a <= p < b]
        # the latest to open, the shorter of two opening together, the later of twins
        assert got[i] == (max(over, key=lambda j: (spans[j][0], -spans[j][1], j)) + 7
                          if over else -1)


def test_the_path_names_its_host_work(corpus_runs: dict[str, Run]) -> None:
    """HTA's simple_add: runtime calls are 91% of the path, the CUDA context's set-up in
    cudaDeviceGetStreamPriorityRange 24.6 s, one cudaLaunchKernel 4.2 s (the longest of each
    in the raw JSON); the path's top names them (it had named only a copy and a sync). The
    names' time is the innermost op's: within each category's total."""
    with gzip.open(corpus("simple_add"), "rt") as f:
        raw = orjson.loads(f.read())["traceEvents"]
    longest: dict[str, int] = {}
    for e in raw:
        if e.get("cat") == "cuda_runtime":
            dur = int(Decimal(str(e["dur"])) * 1000)
            longest[e["name"]] = max(longest.get(e["name"], 0), dur)
    first = max(longest, key=lambda n: longest[n])
    assert first == "cudaDeviceGetStreamPriorityRange" and longest[first] > 24_000_000_000
    assert longest["cudaLaunchKernel"] > 4_000_000_000
    path = analyze(corpus_runs["simple_add"]).critical_path
    assert path is not None
    top = {(c, n): v for c, n, v in path.top}
    assert path.top[0][:2] == ("runtime", first)
    assert top[("runtime", first)] >= longest[first]
    assert top[("runtime", "cudaLaunchKernel")] >= longest["cudaLaunchKernel"]
    for category in ("cpu", "runtime"):
        assert sum(v for (c, _), v in top.items() if c == category) <= path.ns[category]


def test_swarms_of_the_program_unprofiled() -> None:
    """Where the recorder timed three or more steps outside the profiler's window, swarms read
    their samples (in the window the profiler's own work led an RL loop's, 27%): a sample in a
    marked step counts not, one in a hook-timed step does; under three, the marked steps."""
    from perfswarm.analyze.iterations import unprofiled_steps
    from perfswarm.trace.schema import STEPS

    marked = {0: [StepWindow(0, 0, 100, "marker")]}
    rows = [(0, 0, 0, 100, "marker"), (0, 1, 100, 200, "export"),
            *((0, s, 100 * s, 100 * s + 100, "detected") for s in range(2, 5))]
    table = pa.table({k: [r[i] for r in rows] for i, k in
                      enumerate(("rank", "step", "start", "end", "source"))}).cast(STEPS)
    found = unprofiled_steps(table, marked)
    assert [(w.step, w.source) for w in found[0]] == [(2, "detected"), (3, "detected"),
                                                      (4, "detected")]
    assert unprofiled_steps(table.slice(0, 4), marked) is marked  # two: too few


def test_the_critical_paths_device_maps_are_arrays(tmp_path: Path) -> None:
    """The walk looks up the device ops it passes (a few thousand of 40k at 200k events) in
    their stream and launch maps kept as arrays (dependencies.RowMap): as dicts they had been
    7.8 MB at analyze's peak. Held by the graph of a 20k-event synthetic trace: 132 bytes a
    device op (the host threads' timelines), where it had been 301."""
    run = Run(import_traces([synthetic.write(tmp_path / "t.json", 20_000)], tmp_path / "t.run",
                            ImportOptions(), ["t"]).path)
    ev = Events.load(run)
    syncs = sync_events(run, ev)
    build(ev, syncs, {}, {})  # (what any first one derives once)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        g = build(ev, syncs, {}, {})
        held = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    device = np.flatnonzero(ev.of_kind(*DEVICE_OPS))
    assert len(device) == 3_838
    assert held < 200 * len(device)
    launched = [int(r) for r in device.tolist() if r in g.launch_of]
    assert len(launched) == len(g.launch_of.keys) > 0
    assert all(g.launch_of.get(r) == int(c) for r, c in zip(
        g.launch_of.keys.tolist(), g.launch_of.values.tolist(), strict=True))
    assert g.launch_of.get(-5) is None and g.waits.get(len(ev)) is None
