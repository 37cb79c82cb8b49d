"""Advice rules: each on a run that shows it (exact evidence) and on one that does not."""

from __future__ import annotations

import gzip
import itertools
import re
import sys
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import corpus, gloo_wait_ns
from perfswarm.analyze.frame import Events
from perfswarm.analyze.intervals import total
from perfswarm.cli.main import main
from perfswarm.model.fusedstep import DEFAULT as FUSED_DEFAULT
from perfswarm.model.fusedstep import OPTIMIZERS, FusedStepCosts, StepCost
from perfswarm.model.hostcosts import DEFAULT as DEFAULT_COSTS
from perfswarm.model.hostcosts import HostCosts
from perfswarm.model.receive import DEFAULT as DEFAULT_RECEIVE
from perfswarm.optimize.advise import advise
from perfswarm.optimize.rules import device, distributed, host, loader, optimizer, samples
from perfswarm.optimize.rules.base import Advice, Rule
from perfswarm.optimize.rules.facts import Facts
from perfswarm.trace.ingest import ImportOptions, import_traces
from perfswarm.trace.schema import COUNTERS, KINDS, STEPS
from perfswarm.trace.store import Run

A100 = {"id": 0, "name": "NVIDIA A100-SXM4-40GB", "computeMajor": 8, "computeMinor": 0,
        "totalGlobalMem": 42_297_524_224, "numSms": 108}


def ev(name: str, ts: float, dur: float, cat: str = "cpu_op", tid: int = 1,
       **args: Any) -> dict[str, Any]:
    """One complete ('X') Kineto event; ts and dur in µs as torch.profiler writes them."""
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur,
            "args": args}


def kernel(name: str, ts: float, dur: float, stream: int = 7, **args: Any) -> dict[str, Any]:
    return {**ev(name, ts, dur, "kernel", tid=stream, device=0, stream=stream, **args), "pid": 0}


def launched(op: str, dims: list[list[int]], ts: float, dur: float, corr: int,
             name: str, kernel_us: float) -> list[dict[str, Any]]:
    """An aten op with recorded shapes whose launch call (at +1 µs) runs `name` (at +5 µs)."""
    return [ev(op, ts, dur, **{"Input Dims": dims, "Input type": ["float"] * len(dims)}),
            ev("cudaLaunchKernel", ts + 1, 2, "cuda_runtime", correlation=corr),
            kernel(name, ts + 5, kernel_us, correlation=corr)]


def make_run(tmp: Path, name: str, events: list[dict[str, Any]], *, rank: int | None = None,
             devices: tuple[dict[str, Any], ...] = ()) -> Path:
    trace: dict[str, Any] = {"traceEvents": events, "deviceProperties": list(devices)}
    if rank is not None:
        trace["distributedInfo"] = {"rank": rank}
    path = tmp / f"{name}.json"
    path.write_bytes(orjson.dumps(trace))
    return path


def imported(tmp: Path, name: str, events: list[dict[str, Any]], **kw: Any) -> Run:
    trace = make_run(tmp, name, events, **kw)
    return import_traces([trace], tmp / f"{name}.run", ImportOptions(), ["test"])


def with_manifest(run: Run, **changes: Any) -> Run:
    m = run.manifest()
    for key, value in changes.items():
        if key == "cores":
            m["host"]["cores"] = value
        else:
            m[key] = value  # type: ignore[literal-required]
    run.write_manifest(m)
    return run


def found(rule: Rule, run: Run, costs: HostCosts = DEFAULT_COSTS) -> Advice | None:
    return rule(Facts.of(run, costs))


def shows(rule: Rule, run: Run, costs: HostCosts = DEFAULT_COSTS) -> Advice:
    a = found(rule, run, costs)
    assert a is not None
    return a


# -- data loading -----------------------------------------------------------------------------
def _loader_steps(loader_us: float, compute_us: float, steps: int = 3) -> list[dict[str, Any]]:
    events, step_us = [], loader_us + compute_us
    for i in range(steps):
        t = i * step_us
        events += [ev(f"ProfilerStep#{i}", t, step_us, "user_annotation"),
                   ev("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", t, loader_us),
                   ev("aten::conv2d", t + loader_us, compute_us)]
    return events


def test_data_loading_shows_on_a_loader_bound_run(tmp_path: Path) -> None:
    run = with_manifest(imported(tmp_path, "loader", _loader_steps(6000, 4000)), cores=4)
    a = shows(loader.data_loading, run)
    assert dict(a.evidence) == {"loader_calls": 3, "loader_ns": 18_000_000,
                                "loader_share_pct": 60.0, "single_process": True,
                                "pageable_h2d_copies": 0, "cores": 4, "workers": 0,
                                "batch_ns": 6_000_000, "batch_cpu_ns": 6_000_000,
                                "loader_on_cpu_pct": None,  # no perf samples: CPU work
                                # no stack in its waits: 1 tensor, the least
                                "tensors_per_batch": None, "receive_ns": 600_000,
                                # no system sampler in an import, nor the step hooks
                                "free_cores": None, "loop_run_delay_pct": None}
    # 2 workers, the fewest that keep up: a step takes max(4 ms compute + 0.6 ms taking its
    # batch from a worker, 6 ms / 2, the 10.6 ms of CPU work / 4 cores) = 4.6 ms instead of
    # 10 ms (3 had been advised: a core kept for training, which waits for its batches, and a
    # third worker gains nothing).
    assert a.gain_ns == 3 * 5_400_000 and a.gain_pct == 54.0 and a.severity == "high"
    assert "its own 4.60 ms (4.00 ms + 1 x 0.60 ms taking a batch from a worker)" in a.gain_basis
    # a CPU run: pinned memory speeds copies to an accelerator only
    assert a.change == "DataLoader(num_workers=2, prefetch_factor=4, persistent_workers=True)"
    # on 2 cores, 2 workers: max(4.6, 6 / 2, 10.6 / 2) = 5.3 ms. The workers and the training
    # process share both cores, the training process waiting while the workers work: 1 worker
    # (cores - 1) had been advised, max(4, 6, 5) = 6 ms, where 2 workers ran an expensive
    # __getitem__ 1.9x faster than 1 on a 2-core host. On 1 core the work only moves: no gain,
    # no advice.
    two = shows(loader.data_loading, with_manifest(run, cores=2))
    assert two.gain_ns == 3 * (10_000_000 - 5_300_000) and "num_workers=2," in two.change
    assert found(loader.data_loading, with_manifest(run, cores=1)) is None


def test_an_imported_trace_does_not_know_its_hosts_cores(tmp_path: Path) -> None:
    """A trace does not say what host recorded it: an imported Run's host has no cores (the
    importing machine's had been taken: the same trace advised workers up to 2 cores or 64
    by where it was imported), and data_loading's model is not bounded by them: enough
    workers to overlap the load with the compute, ceil(6 / 4.6) = 2: max(4 + 0.6 taking a
    batch from a worker, 6 / 2) = 4.6 ms a step instead of 10 (one more had been added to keep
    one ahead, as prefetch_factor does)."""
    run = imported(tmp_path, "loader", _loader_steps(6000, 4000))
    host_section = run.manifest()["host"]
    assert host_section["cores"] is None and host_section["imported_on"]["cores"] >= 1
    a = shows(loader.data_loading, run)
    assert a.evidence["cores"] is None and a.gain_ns == 3 * 5_400_000
    assert "num_workers=2," in a.change and "not bounded by them" in a.gain_basis


def _perf_samples(run: Run, every_us: float, until_us: float, hz: int) -> Run:
    """perf cpu-clock samples of the loop's thread (pid 1, tid 1) every `every_us` µs."""
    from perfswarm.trace.schema import SAMPLES

    ts = [round(t * 1000) for t in np.arange(0, until_us, every_us)]
    run.write_table("samples", pa.table({
        "rank": [0] * len(ts), "ts": ts, "source": ["perf"] * len(ts), "pid": [1] * len(ts),
        "tid": [1] * len(ts), "stack_id": [0] * len(ts), "weight": [1] * len(ts)}).cast(SAMPLES))
    m = run.manifest()
    m.setdefault("extra", {}).setdefault("record", {})["perf_hz"] = hz
    run.write_manifest(m)
    return run


def test_data_loading_that_waits(tmp_path: Path) -> None:
    """A loader that mostly waits (its reads, a sleep): perf (1 kHz) saw its thread on a CPU
    once in each step's 6 ms of loading, 1 ms of CPU: 17% of it. Its CPU work hardly binds
    the cores, and workers overlap the waits: 6 ms of loading over 4.6 ms of compute and
    taking the batch from a worker takes 2, a step max(4.6, 6 / 2, (1 + 4.6) / 2 cores) = 4.6
    ms of 10 on 2 cores (1 worker had been advised: 0-3.5% gain measured, where 2 and 4
    workers took 58% and 74% off); one that computes (perf saw it all the time) is bound by
    its cores: max(4.6, 6 / 2, 10.6 / 2) = 5.3 ms."""
    run = with_manifest(imported(tmp_path, "reads", _loader_steps(6000, 4000)), cores=2)
    waits = shows(loader.data_loading, _perf_samples(run, 10_000, 30_000, 1000))
    assert waits.evidence["loader_on_cpu_pct"] == pytest.approx(100 * 3 / 18, abs=0.1)
    assert "num_workers=2," in waits.change and waits.gain_ns == 3 * 5_400_000
    assert waits.evidence["batch_cpu_ns"] == 1_000_000
    busy = shows(loader.data_loading, _perf_samples(run, 1_000, 30_000, 1000))
    assert busy.evidence["loader_on_cpu_pct"] == 100.0
    assert "num_workers=2," in busy.change and busy.gain_ns == 3 * 4_700_000


def test_data_loading_with_workers_pipeline_model(tmp_path: Path) -> None:
    """Workers already load in the background, yet each step waits 6 ms for 4 ms of compute.
    Untraced, they make a batch in 10 ms; twice as many make one in 5 ms, so a step waits 1 ms.
    Traced (their fetches, 16 ms a batch of CPU work, two workers), the model prices them: on
    2 cores, the 16 ms of a batch and the 4 ms of the step's own take 10 ms a step, as
    measured: more workers share those cores (doubling had been advised on 2 workers of 2
    cores, the whole wait its gain); on 4 cores, 4 workers take max(4, 16 / 4, 20 / 4) = 5 ms
    against the 2 workers' 16 / 2 = 8: 3 ms a step."""
    events = [{**e, "name": e["name"].replace("_SingleProcessDataLoaderIter",
                                              "_MultiProcessingDataLoaderIter")}
              for e in _loader_steps(6000, 4000)]
    run = with_manifest(imported(tmp_path, "workers", events), cores=4)
    a = shows(loader.data_loading, run)
    assert a.evidence["single_process"] is False
    assert a.evidence["receive_ns"] is None  # no batch is received in this model: not said
    assert a.gain_ns == 3 * (6 - 1) * 1_000_000
    assert a.gain_basis.startswith("pipeline model, the workers untraced")
    fetch = [{**ev("DataLoader worker fetch", start, 16_000, "user_annotation", tid=100 + w),
              "pid": 100 + w} for w, start in ((0, 0), (1, 2000), (0, 16_000), (1, 18_000))]
    full = with_manifest(imported(tmp_path, "full", [*events, *fetch]), cores=2)
    b = shows(loader.data_loading, full)
    assert (b.evidence["workers"], b.evidence["batch_cpu_ns"]) == (2, 16_000_000)
    assert b.gain_ns is None and b.gain_basis.startswith(
        "none: 2 workers a rank and the training process need all of the 2 cores")
    assert b.change.startswith("make each sample cheaper")
    assert found(loader.loader_oversubscription, full) is None  # the rules agree: 2 it is
    c = shows(loader.data_loading, with_manifest(full, cores=4))
    assert c.gain_ns == 3 * 3_000_000 and "num_workers=4," in c.change
    # workers that keep up (5 µs a batch) while the step still waits: more would not help
    quick = [{**e, "dur": 5} for e in fetch]
    idle = with_manifest(imported(tmp_path, "idle", [*events, *quick]), cores=4)
    d = shows(loader.data_loading, idle)
    assert d.gain_ns is None and d.gain_basis.startswith("none: the 2 workers keep up")


def _loader_cpu(tmp: Path, workers: int) -> tuple[Run, list[dict[str, Any]]]:
    """tests/data/loader_cpu.py's recording with `workers` DataLoader workers (the real
    torch.profiler in each process), imported as one rank on the 2-core host it ran on, and
    the raw events of its training process (ts and dur in ns)."""
    data = Path(__file__).parent / "data"
    files = sorted(data.glob(f"loader_cpu_w{workers}_*.pt.trace.json.gz"))
    run = import_traces(files, tmp / f"w{workers}.run", ImportOptions(ranks=(0,) * len(files)),
                        ["test"])
    main = orjson.loads(gzip.decompress(files[0].read_bytes()))["traceEvents"]
    raw = [{**e, "ts": int(Decimal(str(e["ts"])) * 1000), "dur": int(Decimal(str(e["dur"])) * 1000)}
           for e in main if e.get("ph") == "X"]
    return with_manifest(run, cores=2), raw


def test_data_loading_on_two_cores_as_an_a_b_measured(tmp_path: Path) -> None:
    """An expensive __getitem__ (40 ms of Python a batch of 16, the step's own work 4-6 ms) on
    2 cores, timed apart: 45-52 ms a step with no worker, 43-46 with 1, 24-31 with 2, 25-32
    with 4. No worker: the model's 2 workers take max(compute and taking a batch from a
    worker, batch / 2, all the CPU work / 2 cores) (numbers from the raw trace), half the
    step, as measured; 1 worker (cores - 1) had been advised, for 9%. Two workers: they and
    the training process need both cores, no gain (doubling them had been advised for 50%,
    beside loader_oversubscription's 1 worker, 1.8x slower). Four: no faster than two, which
    loader_oversubscription now names."""
    run, raw = _loader_cpu(tmp_path, 0)
    marks = sorted((e["ts"], e["ts"] + e["dur"]) for e in raw
                   if e["name"].startswith("ProfilerStep#"))
    loads = [e["dur"] for e in raw if e["name"].startswith("enumerate(DataLoader)")]
    steps, wall = len(marks), sum(hi - lo for lo, hi in marks)
    assert marks[0][1] - marks[0][0] < 2 * float(np.median([hi - lo for lo, hi in marks[1:]]))
    batch, own = sum(loads) / len(loads), (wall - sum(loads)) / steps
    # each batch taken from a worker's queue: 2 tensors a batch, its samples' tensors and
    # their int labels (torch.tensor), as default_collate makes them
    own += DEFAULT_RECEIVE.of(2)
    then = max(own, batch / 2, (batch + own) / 2)
    assert then == (batch + own) / 2  # the cores bind: 2 workers fill them
    a = shows(loader.data_loading, run)
    assert a.evidence["tensors_per_batch"] == 2 and "2 tensors a batch" in a.gain_basis
    assert a.change.startswith("DataLoader(num_workers=2,")
    assert a.gain_ns == pytest.approx(steps * (wall / steps - then), abs=steps)
    assert 45 <= a.gain_pct <= 55 and found(loader.loader_oversubscription, run) is None

    for workers in (2, 4):
        run, raw = _loader_cpu(tmp_path, workers)
        b = shows(loader.data_loading, run)
        assert b.evidence["workers"] == workers and b.gain_ns is None
        assert b.gain_basis.startswith(f"none: {workers} workers a rank and the training "
                                       "process need all of the 2 cores")
        over = found(loader.loader_oversubscription, run)
        assert (over is None) == (workers == 2)
    assert over is not None and over.change == "DataLoader(num_workers=2)"


def test_data_loading_absent_when_loading_is_cheap(corpus_runs: dict[str, Run],
                                                   tmp_path: Path) -> None:
    # non_gpu has one enumerate(DataLoader) of 71 µs in a 75 ms step.
    assert found(loader.data_loading, corpus_runs["non_gpu"]) is None
    assert found(loader.data_loading, imported(tmp_path, "fast", _loader_steps(500, 9500))) is None


def test_no_worker_advised_where_taking_a_batch_from_one_costs_more(tmp_path: Path) -> None:
    """k-fold cross-validation's MLP (/tmp/p29/unseen/kfold.py, twenty-ninth pass): a
    TensorDataset's batch of 64 made in the training process took 10% of its profiled steps
    (1.49 of 16.3 ms; 0.33 of 3.5 ms at the program's own speed, the profiler's slowdown
    4.56x), and 1 worker had been advised for 10%. Taking a batch from a worker's queue cost
    that process 0.6-0.9 ms of CPU, more than making it: 1 worker, measured, made its steps
    28% slower. Priced at the steps' profiled speed (0.6 ms x 4.5 here), a worker gains
    nothing; unprofiled the same loader still would (1.5 ms a batch against 0.6)."""
    from perfswarm.recorder.build import Hooks, hook_steps
    from perfswarm.trace.schema import STEPS

    run = with_manifest(imported(tmp_path, "kfold", _loader_steps(1500, 13_500)), cores=2)
    assert shows(loader.data_loading, run).change.startswith("DataLoader(num_workers=1,")
    ms = 1_000_000  # the three profiled steps lie in [0, 45 ms); 3.3 ms a step after them
    hooks = [45 * ms + round(i * 3.3 * ms) for i in range(8)]
    outside = hook_steps([Hooks(0, hooks, [0] * len(hooks), {})], {(0, 0), (0, 1), (0, 2)})
    run.write_table("steps", pa.concat_tables([run.table("steps"), outside]).cast(STEPS))
    assert Facts.of(run).profiler_slowdown == pytest.approx(15 / 3.3)
    assert found(loader.data_loading, run) is None


def _recorded(tmp: Path, stem: str, rank: int) -> Run:
    """tests/data/{stem}.py's Run as recorded on the 2-core VM, made one: its torch trace, and
    from {stem}_host.json its steps outside the window (the optimizer's hooks), the counters
    recorded (each reading ts, name, value, of `rank`) and the recorder's tools' CPU time."""
    data = Path(__file__).parent / "data"
    run = import_traces([data / f"{stem}.pt.trace.json.gz"], tmp / f"{stem}.run",
                        ImportOptions(), ["test"])
    host_ = orjson.loads((data / f"{stem}_host.json").read_bytes())
    outside = pa.table({k: [s[i] for s in host_["steps"]] for i, k in
                        enumerate(("rank", "step", "start", "end", "source"))}).cast(STEPS)
    run.write_table("steps", pa.concat_tables([run.table("steps").cast(STEPS), outside]))
    ts, names, values = zip(*host_["readings"], strict=True)
    run.write_table("counters", pa.table({
        "rank": [rank] * len(ts), "ts": ts, "name": names, "device": [-1] * len(ts),
        "value": values}).cast(COUNTERS))
    m = run.manifest()
    m["host"]["cores"] = 2
    m.setdefault("extra", {})["record"] = host_.get("record", {})
    run.write_manifest(m)
    return run


def _busy_compiled(tmp: Path) -> Run:
    """tests/data/busy_compiled.py recorded (defaults) on the 2-core VM while other processes
    held one of its cores: the system sampler's CPU readings (its run delay too) beside."""
    return _recorded(tmp, "busy_compiled", -1)


def test_no_worker_where_other_processes_hold_the_cores(tmp_path: Path) -> None:
    """A compiled MLP loading its TensorDataset's batches in the training process (1.95 ms of a
    10.4 ms profiled step), recorded while other processes held one of the host's 2 cores and
    the loop kept the other (its steps hardly held back: the model, which had taken the free
    cores from cpu_contention's finding alone, had them all). With the cores taken as the
    host's, 1 worker had been advised for 8.8%; a worker has only the 1.08 cores the others
    left, shared with the training process, which also takes each batch from its queue (1.04
    ms): max(9.50 ms, 1.95, 11.45 / 1.08) = 10.6 ms against 10.4 now. Measured apart
    (/tmp/p31/busyworker/ab.py, the host's other processes holding ~1 core): 1 worker ran 17-44%
    slower. No worker is advised, and the advice says why; the same Run without the sampler's
    readings is still told the worker, saying that it took the cores as free."""
    run = _busy_compiled(tmp_path)
    a = shows(loader.data_loading, run)
    e = a.evidence
    assert e["single_process"] and e["workers"] == 0 and e["cores"] == 2
    assert e["free_cores"] == 1.08 and e["loader_share_pct"] == pytest.approx(18.7, abs=0.1)
    assert a.gain_ns is None and a.severity == "medium"
    assert a.gain_basis.startswith("none: other processes held 0.92 of the 2 cores")
    assert ("all the CPU work / 1.08 cores a rank (of the 1.08 other processes left free of 2, "
            "measured by the system sampler" in a.gain_basis)
    assert a.change.startswith("no DataLoader worker while other processes hold the cores "
                               "(with them free the model gives num_workers=1, 0.91 ms a step)")
    run.write_table("counters", COUNTERS.empty_table())
    free = shows(loader.data_loading, run)
    assert free.change.startswith("DataLoader(num_workers=1,") and free.gain_pct == 8.78
    assert free.evidence["free_cores"] is None
    assert "other processes' use of the cores not recorded (no system sampler): taken as " \
        "free" in free.gain_basis


def test_no_worker_where_the_loop_thread_waited_for_a_core(tmp_path: Path) -> None:
    """tests/data/busy_inproc.py's loop (a 0.5 ms __getitem__ a sample, batches of 8, loaded
    in the training process) recorded with `-c torch` (no system sampler) on the 2-core VM
    beside two busy processes, each in a session of its own: its loop thread sat on a runqueue
    53% of the profiled steps (its run delay at the step hooks). Its cores had been taken as
    free and 2 workers advised for 46.4%; timed apart under the same load (3 rounds, own
    clock's median step) 0 workers ran 6.7-12.9 ms, 1 worker 9.4-14.7 and 2 workers 5.6-11.3:
    no gain. No worker is advised now, the basis saying what the cores were read from."""
    run = _recorded(tmp_path, "busy_inproc", 0)  # the step hooks' readings: rank 0
    a = shows(loader.data_loading, run)
    e = a.evidence
    assert e["single_process"] and e["workers"] == 0 and e["free_cores"] == 0.47
    assert e["loop_run_delay_pct"] == 53.3
    assert a.gain_ns is None
    assert a.gain_basis.startswith("none: other processes held 1.53 of the 2 cores")
    assert ("no system sampler: its loop thread waited for a core 53% of the profiled steps "
            "(its run delay at the step hooks)") in a.gain_basis
    assert a.change.startswith("no DataLoader worker while other processes hold the cores")
    # without the hooks' run delay (a Run recorded before): the cores taken as free, as before
    run.write_table("counters", COUNTERS.empty_table())
    free = shows(loader.data_loading, run)
    assert free.change.startswith("DataLoader(num_workers=2,")
    assert free.evidence["free_cores"] is None and free.evidence["loop_run_delay_pct"] is None
    assert "(no system sampler): taken as free" in free.gain_basis


def test_workers_kept_where_the_cores_left_free_still_gain(tmp_path: Path) -> None:
    """tests/data/loader_cpu.py's expensive __getitem__ (40 ms of a 45 ms step) under the same
    load (busy_compiled's sampler readings, moved onto its steps): on the 1.21 cores left, 2
    workers still take max(4.95 ms with receiving, 40.7 / 2, all the CPU / 1.21) = 37.7 ms
    against 44.8 now (15.9%);
    measured apart (/tmp/p31/busyworker/ab.py, ~1 of the 2 cores held by others) 2 workers
    ran 37 ms a step against 65, and with two more busy processes 46 against 90."""
    run, _ = _loader_cpu(tmp_path, 0)
    steps = run.table("steps")
    start = int(np.min(steps.column("start").to_numpy()))
    busy = _busy_compiled(tmp_path)
    first = int(np.min(busy.table("steps").column("start").to_numpy()))
    readings = busy.table("counters")
    moved = readings.set_column(1, "ts", pa.array(
        readings.column("ts").to_numpy() - first + start, pa.int64()))
    run.write_table("counters", moved)
    a = shows(loader.data_loading, run)
    assert a.evidence["free_cores"] == 1.21  # the readings over its own steps
    assert a.change.startswith("DataLoader(num_workers=2,") and a.gain_pct is not None
    assert 2 <= a.gain_pct < 45  # less than the 45-55% the free host's cores give
    assert "all the CPU work / 1.21 cores a rank" in a.gain_basis


_THREE = """
import torch
from torch.utils.data import DataLoader, TensorDataset

data = TensorDataset(torch.randn(640, 16), torch.randn(640, 4), torch.randint(0, 3, (640,)))
model = torch.nn.Linear(16, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for x, y, z in DataLoader(data, batch_size=64):
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
"""


def test_tensors_a_batch_read_from_a_recording(tmp_path: Path) -> None:
    """A TensorDataset of 3 tensors loaded in the training process, recorded: default_collate
    stacks each field in every wait for a batch (`aten::stack`, after the samples' selects),
    so a batch taken from a worker would bring 3 tensors, each one priced (a constant had
    priced every batch as one of 1-2 tensors: a batch of 4 costs twice that)."""
    from perfswarm.recorder.session import RecordOptions, record

    script = tmp_path / "three.py"
    script.write_text(_THREE)
    run = record([sys.executable, str(script)], tmp_path / "three.run",
                 RecordOptions(collectors=("torch",), skip=2, steps=4)).run
    facts = Facts.of(run)
    plan = loader.loader_plan(facts)
    assert plan is not None and plan.workers == 0 and plan.tensors == 3
    assert plan.receive_ns == pytest.approx(
        (DEFAULT_RECEIVE.batch_ns + 3 * DEFAULT_RECEIVE.tensor_ns) * facts.profiler_slowdown)


def test_tensors_a_batch_are_the_collates_alone(tmp_path: Path) -> None:
    """Samples of (a tensor, an int label) whose dataset makes each a tensor itself
    (torch.tensor: empty, to, lift_fresh, detach_, as collate_ops.py recorded them):
    default_collate stacks the tensors and makes the labels one tensor, 2 a batch; the
    dataset's own tensors, before the collate, are not the batch's (4 would have been
    counted)."""
    def made(t: float) -> list[dict[str, Any]]:  # torch.tensor(...) at t, 4 us
        return [ev(f"aten::{op}", t + i, 0.5) for i, op in enumerate(
            ("empty", "to", "lift_fresh", "detach_"))]

    events = []
    for i in range(3):
        t = i * 10_000.0
        events += [ev(f"ProfilerStep#{i}", t, 10_000, "user_annotation"),
                   ev("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", t, 6000)]
        for k in range(2):  # the samples: a row selected, a label made a tensor
            events += [ev("aten::select", t + 100 + 1000 * k, 10), *made(t + 200 + 1000 * k)]
        events += [ev("aten::stack", t + 5000, 100), ev("aten::cat", t + 5010, 50),
                   *made(t + 5200), ev("aten::conv2d", t + 6000, 4000)]
    run = with_manifest(imported(tmp_path, "labels", events), cores=2)
    plan = loader.loader_plan(Facts.of(run))
    assert plan is not None and plan.tensors == 2


def test_advise_prices_the_receive_by_a_calibrated_profile(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    """`advise --profile` (and `report --profile`, and the advice on `board --profile`'s
    reports) price taking a batch from a worker at the
    host's cost, from calibrate's profile: a loader of 1.5 ms a batch beside 13.5 ms of compute
    on 2 cores is told 1 worker at the defaults (0.6 ms a batch of 1 tensor), and nothing
    where the host takes 2 ms (a slower host, or larger batches: 4 tensors cost twice 1's); the
    model says which figures it used. A profile without them is a one-line error."""
    run = with_manifest(imported(tmp_path, "kfold", _loader_steps(1500, 13_500)), cores=2)

    def data_loading(*options: str) -> list[dict[str, Any]]:
        assert main(["advise", str(run.path), "--json", *options]) == 0
        return [a for a in orjson.loads(capsys.readouterr().out)["advice"]
                if a["rule"] == "data_loading"]

    (default,) = data_loading()
    assert default["change"].startswith("DataLoader(num_workers=1,")
    assert "the defaults measured on the 2-core VM" in default["gain_basis"]
    profile = tmp_path / "cpu-profile.json"
    profile.write_text('{"loader_receive": {"batch_ns": 1000000, "tensor_ns": 1000000}}')
    assert data_loading("--profile", str(profile)) == []
    profile.write_text('{"loader_receive": {"batch_ns": 200000, "tensor_ns": 100000}}')
    (cheap,) = data_loading("--profile", str(profile))
    assert cheap["evidence"]["receive_ns"] == 300_000
    assert "calibrated on this host (cpu-profile.json)" in cheap["gain_basis"]
    assert main(["report", str(run.path), "--json", "--profile", str(profile)]) == 0
    report = orjson.loads(capsys.readouterr().out)
    assert [a["evidence"]["receive_ns"] for a in report["advice"]
            if a["rule"] == "data_loading"] == [300_000]
    served: dict[str, Any] = {}

    class Board:  # the server the command starts, its advice kept and its serving stopped
        def __init__(self, root: Path, host: str, port: int, **given: Any) -> None:
            self.root, self.url = root, "http://board"
            served.update(given)

        def serve_forever(self) -> None:
            raise KeyboardInterrupt

        def server_close(self) -> None:
            pass

    monkeypatch.setattr("perfswarm.report.board.BoardServer", Board)
    assert main(["board", str(tmp_path), "--profile", str(profile)]) == 0
    assert [a["evidence"]["receive_ns"] for a in served["advice"](run)
            if a["rule"] == "data_loading"] == [300_000]
    profile.write_text('{"families": {}}')
    assert main(["advise", str(run.path), "--profile", str(profile)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cpu-profile.json: no DataLoader receive cost" in err


def test_shares_divide_by_the_profiled_steps_alone(tmp_path: Path) -> None:
    """A recording also times the steps outside its window (optimizer hook, `detected`) and the
    one holding the trace export: they carry no events, so no share or per-step rate counts
    them (here they would turn the loader's 60% into 20%)."""
    from perfswarm.analyze.summary import analyze
    from perfswarm.recorder.build import Hooks, hook_steps
    from perfswarm.trace.schema import STEPS

    run = with_manifest(imported(tmp_path, "window", _loader_steps(6000, 4000)), cores=4)
    marked = run.table("steps")
    assert marked.column("source").to_pylist() == ["marker"] * 3
    ms = 1_000_000  # the three profiled steps lie in [0, 30 ms); hooks 10 ms apart around them
    hooks = [-40 * ms, -30 * ms, -20 * ms, -10 * ms, 30 * ms, 40 * ms, 50 * ms, 60 * ms]
    outside = hook_steps([Hooks(0, hooks, [0] * len(hooks), {})], {(0, 0), (0, 1), (0, 2)})
    # hook i-1 to hook i is step i; 1 and 2 are marked, so the hooks time steps 3-7, and
    # step 3, after the last marked one, holds the export
    assert list(zip(outside.column("step").to_pylist(),
                    outside.column("source").to_pylist(), strict=True)) == [
        (3, "export"), (4, "detected"), (5, "detected"), (6, "detected"), (7, "detected")]
    run.write_table("steps", pa.concat_tables([marked, outside]).cast(STEPS))
    facts = Facts.of(run)
    assert facts.wall_ns == 30 * ms and facts.step_count() == 3
    a = shows(loader.data_loading, run)
    assert a.evidence["loader_share_pct"] == 60.0 and a.gain_pct == 54.0  # 0.6 ms to receive
    result = analyze(run)
    assert [w.step for w in result.iterations.steps[0]] == [0, 1, 2]
    assert [i.step for i in result.concurrency.ranks[0].iterations] == [0, 1, 2]


def test_shares_leave_out_the_step_that_starts_the_profiler(tmp_path: Path) -> None:
    """The first profiled step also starts the profiler (and, recorded, runs the execution
    trace observer: an Adam loop's 146 ms among 27-30 ms steps, 36% of its measured time, had
    cut its fused optimizer's gain to 21.7% where a window without it said 33%). In
    closure_adam_cpu's real trace it takes 3.8 ms against 1.3 and 1.0: advice measures the two
    usual steps (their ProfilerStep spans, from the raw JSON), and says so."""
    trace = Path(__file__).parent / "data" / "closure_adam_cpu.pt.trace.json.gz"
    events = orjson.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    marks = sorted((int(e["name"].split("#")[1]), int(Decimal(str(e["dur"])) * 1000))
                   for e in events if e.get("name", "").startswith("ProfilerStep#"))
    assert [s for s, _ in marks] == [2, 3, 4] and marks[0][1] > 2 * max(marks[1][1], marks[2][1])
    run = import_traces([trace], tmp_path / "c.run", ImportOptions(), ["test"])
    facts = Facts.of(run)
    assert facts.set_aside == {(0, 2): marks[0][1]}
    assert facts.wall_ns == marks[1][1] + marks[2][1] and facts.step_count() == 2
    assert facts.measured_as == ("the profiled steps but the first "
                                 f"({marks[0][1] / 1e6:,.3f} ms, which starts the profiler)")
    a = shows(optimizer.single_tensor_optimizer, run)
    assert a.evidence["steps"] == 2 and a.gain_of_ns == facts.wall_ns  # no steps after it
    assert a.gain_of.startswith(facts.measured_as)
    assert advise(run).measured_ns == facts.wall_ns


@pytest.mark.parametrize(("durations", "aside"), [
    ({0: [30, 10, 10, 12]}, {(0, 0)}),  # 3x the others' median: the profiler's start
    ({0: [19, 10, 10, 12]}, set()),  # 1.9x: as usual as a step may be
    ({0: [30]}, set()),  # alone: nothing to tell it from
    ({0: [10, 30, 10]}, set()),  # a slow later step is outlier_steps' to weigh
    ({0: [30, 10, 10], 1: [10, 10, 10]}, {(0, 0)}),  # each rank on its own
    # work that comes back (a stall every fifth step, the window's first step the fifth) is
    # the program's: a later profiled step, or one after the window, half as far above or more
    ({0: [30, 10, 10, 10, 21]}, set()),
    ({0: [30, 10, 10], 9: [10]}, {(0, 0)}),  # another rank's step is no rank 0's
])
@pytest.mark.parametrize("after", [10, 30])  # a step after the window: usual, or as slow
def test_which_profiled_step_starts_the_profiler(durations: dict[int, list[int]],
                                                 aside: set[tuple[int, int]],
                                                 after: int) -> None:
    from perfswarm.analyze.system import profiler_start

    rows = [(r, i, 100 * i, 100 * i + d, "marker") for r, ds in durations.items()
            for i, d in enumerate(ds)] + [(0, 9, 900, 900 + after, "detected"),
                                          (0, 8, 800, 890, "export")]  # the export: aside
    aside = aside if after == 10 else set()
    table = pa.table({k: [row[i] for row in rows] for i, k in
                      enumerate(("rank", "step", "start", "end", "source"))}).cast(STEPS)
    assert profiler_start(table, COUNTERS.empty_table(), 2) == aside


@pytest.mark.parametrize(("first_waited", "later_waited", "aside"), [
    (0, 6, {(0, 0)}),  # the later step sat descheduled: a wait, not work that comes back
    (0, 0, set()),  # it ran its 10 ms: the program's work, which the first step holds too
    (9, 6, set()),  # the first step waited as it did: their excess alike a wait
])
def test_a_later_step_descheduled_is_no_work_that_comes_back(
        first_waited: int, later_waited: int, aside: set[tuple[int, int]]) -> None:
    """A first profiled step of 12 ms among steps of 4 ms, on a host whose 2 cores others keep
    98% busy, and a step of 10 ms after the window (half the first's excess or more). Where the
    loop thread's run delay at its hooks (HOOK_DELAY) says that step waited 6 ms for a core
    (analyze.system.descheduled, the test outlier_steps leaves steps to cpu_contention by),
    it is another process's time slice, not the program's work coming back: the first step
    times the profiler's start, set aside (an int8 inference loop's 9.7 ms first step had been
    kept for 12 such steps). A step that ran its 10 ms, or a first step that waited as much,
    keeps it."""
    from perfswarm.analyze.system import profiler_start
    from perfswarm.trace.schema import HOOK_DELAY

    ms = 1_000_000
    durs = [12, 4, 4, 4, 4, 4, 10, 4, 4]
    waits = [first_waited, 0, 0, 0, 0, 0, later_waited, 0, 0]
    ends = np.cumsum(durs).tolist()
    rows = [(0, i, (e - d) * ms, e * ms, "marker" if i < 4 else "detected")
            for i, (d, e) in enumerate(zip(durs, ends, strict=True))]
    rows.append((0, 9, ends[-1] * ms, (ends[-1] + 30) * ms, "export"))
    steps = pa.table({k: [row[i] for row in rows] for i, k in
                      enumerate(("rank", "step", "start", "end", "source"))}).cast(STEPS)
    readings = [(t * ms, name, value) for t in range(1, ends[-1] + 1)
                for name, value in (("proc.cpu_cores", 1.0), ("cpu.core0.usr", 0.98),
                                    ("cpu.core1.usr", 0.98))]
    readings += [(t * ms, HOOK_DELAY, float(w * ms)) for t, w in
                 zip([0, *ends], np.cumsum([0, *waits]).tolist(), strict=True)]
    counters = pa.table({"rank": [-1 if n != HOOK_DELAY else 0 for _, n, _ in readings],
                         "ts": [t for t, _, _ in readings], "name": [n for _, n, _ in readings],
                         "device": [-1] * len(readings),
                         "value": [v for _, _, v in readings]}).cast(COUNTERS)
    assert profiler_start(steps, counters, 2) == aside
    assert profiler_start(steps, COUNTERS.empty_table(), 2) == set()  # no counters: as before


def _rpc_server_steps() -> pa.Table:
    """tests/data/rpc_server_steps.json: the steps table of a recorded RPC parameter server
    (rank 2) and its trainer (rank 1), each process starting and exporting its own profiler."""
    raw = orjson.loads((Path(__file__).parent / "data" / "rpc_server_steps.json").read_bytes())
    return pa.table({k: [row[i] for row in raw["rows"]]
                     for i, k in enumerate(raw["columns"])}).cast(STEPS)


def test_steps_another_process_s_recorder_holds() -> None:
    """The RPC server waits for its trainer's requests: while the trainer starts its profiler
    (from its last step before the window, 5, to the end of its first profiled step, 6, which
    `profiler_start` sets aside: 5,891.7 ms) the server's step 5 takes 2,600.7 ms, 2,589.0 of
    them inside it, and while the trainer exports its trace (its step 16) the server's last
    profiled step, 15, takes 944.2 ms, 904.2 inside it: both far over twice the server's
    median timed step (63.2 ms), their excess the recorder's. The trainer's step 17 (98.2 ms,
    12.2 of it in the server's export) is its own; nothing of the trainer's is another's
    profiler start but the one its own first step holds."""
    from perfswarm.analyze.system import profiler_start, recorder_steps

    steps = _rpc_server_steps()
    at = {(r["rank"], r["step"]): (r["start"], r["end"]) for r in steps.to_pylist()}

    def inside(step: tuple[int, int], lo: int, hi: int) -> int:
        return max(0, min(at[step][1], hi) - max(at[step][0], lo))

    start, export = (at[1, 5][1], at[1, 6][1]), at[1, 16]
    assert start[1] - start[0] == 5_891_699_446
    assert (at[2, 5][1] - at[2, 5][0], inside((2, 5), *start)) == (2_600_706_643, 2_588_951_906)
    assert (at[2, 15][1] - at[2, 15][0], inside((2, 15), *export)) == (944_199_225, 904_218_739)
    assert float(np.median([e - b for (r, s), (b, e) in at.items()
                            if r == 2 and s != 16])) == 63_205_371.0
    assert profiler_start(steps, COUNTERS.empty_table(), 2) == {(1, 6)}
    assert recorder_steps(steps, COUNTERS.empty_table(), 2) == {(1, 6), (2, 5), (2, 15)}


@pytest.mark.parametrize(("server", "aside"), [
    ((100, 400), {(1, 3)}),  # waits from before the trainer's export to its middle
    ((300, 500), {(1, 3)}),  # from its middle to its end
    ((150, 450), set()),  # shares the cores with it throughout: no wait begins or ends there
    ((100, 150), set()),  # 50 ms: its excess, 40 ms, under half in the export (10 ms)
])
def test_a_step_waits_for_another_process_s_recorder_as_it_starts_or_ends(
        server: tuple[int, int], aside: set[tuple[int, int]]) -> None:
    """A trainer (rank 0: steps 0-2 profiled, 10 ms each, the first no slower, then its export
    from 140 to 460 ms) and a server (rank 1: steps of 10 ms, step 3 at `server`, in ms). A
    server step over twice its median that the export begins or ends in, half its excess or
    more inside it, waited for the recorder; one wholly inside the export only shared the
    cores with it (Hogwild's processes: 26 of 30 such steps of one recording, 13-36 ms
    inside another's export of 1.0-1.3 s, had been set aside); one that is mostly its own is
    the program's."""
    from perfswarm.analyze.system import recorder_steps

    ms = 1_000_000
    rows = [(0, i, 100 + 10 * i, 110 + 10 * i, "marker") for i in range(3)]
    rows += [(0, 3, 140, 460, "export"), (0, 4, 460, 470, "detected")]
    rows += [(1, i, 10 * i, 10 * i + 10, "detected") for i in range(3)]
    rows += [(1, 3, *server, "detected"), (1, 4, server[1], server[1] + 10, "detected"),
             (1, 5, server[1] + 10, server[1] + 20, "detected")]
    table = pa.table({k: [r[i] * (ms if k in ("start", "end") else 1) for r in rows]
                      for i, k in enumerate(("rank", "step", "start", "end", "source"))}
                     ).cast(STEPS)
    assert recorder_steps(table, COUNTERS.empty_table(), 2) == aside


def test_advice_leaves_out_the_steps_another_process_s_recorder_holds(tmp_path: Path) -> None:
    """The server's two steps that wait for its trainer's profiler start and export are set
    aside as the trainer's first profiled step is: outlier_steps had named them (2,600.7 and
    944.2 ms, HIGH 45.71% of every timed step of the recorded Run, beside cpu_contention's
    57.45%); the shares leave them out."""
    run = imported(tmp_path, "rpc", _loader_steps(500, 3500))
    steps = _rpc_server_steps()
    run.write_table("steps", steps)
    facts = Facts.of(run)
    # the profiled ones among them (the trainer's first, 3,308.6 ms, and the server's 15)
    assert facts.set_aside == {(1, 6): 3_308_567_240, (2, 15): 944_199_225}
    kept = {(r["rank"], r["step"]) for r in facts.run_steps.to_pylist()}
    assert kept.isdisjoint({(1, 6), (2, 5), (2, 15)}) and len(kept) == 56 - 3
    assert facts.measured_as == ("the profiled steps but 2 that time the recorder (4,252.766 "
                                 "ms: a profiler's start, or another process's start or "
                                 "export)")
    assert found(host.outlier_steps, run) is None


# -- the events frame ----------------------------------------------------------------------------
def test_facts_events_are_analyzes_events(corpus_runs: dict[str, Run]) -> None:
    """The rules' frame is the store's events (the same rows and values, read once by analyze),
    and each row's `row` is its row in analyze's Events."""
    run = corpus_runs["simple_add"]
    facts = Facts.of(run)
    frame = facts.events
    stored = run.table("events", ["rank", "ts", "dur", "kind", "name", "pid", "tid", "device",
                                  "stream", "correlation", "step", "args", "detail"]
                       ).to_pydict()
    assert frame.num_rows == len(stored["ts"]) > 0
    for column, values in stored.items():
        if column not in ("args", "detail", "kind", "name"):  # args: read for a rule's rows
            assert frame.column(column).to_pylist() == values
    # kinds and names as their codes, read as text
    assert [KINDS[k] for k in frame.column("kind").to_pylist()] == [str(k) for k in
                                                                     stored["kind"]]
    assert facts.name_texts(frame) == [str(n) for n in stored["name"]]
    ev = Events.load(run)
    assert frame.column("row").to_pylist() == list(range(len(ev)))
    assert facts.name_texts(frame.slice(7, 1)) == [ev.name_of(7)]
    # a rule's rows with their args or detail, in the frame's order whatever it is
    some = frame.take([9, 3, 27])
    for column in ("args", "detail"):
        assert facts.with_text(some, column).column(column).to_pylist() == [
            stored[column][i] or "{}" for i in (9, 3, 27)]


def test_kernel_launches_are_the_calls_joined_to_a_kernel(corpus_runs: dict[str, Run]) -> None:
    """launch_bound's launches are analyze's: every runtime or driver call whose correlation id
    a kernel carries, whatever its name (ROCm's hipExtModuleLaunchKernel, triton's driver
    cuLaunchKernel), counted from the raw JSON."""
    for name, expected in (("amd", 14), ("triton", 1), ("nccl", 2700)):
        with gzip.open(corpus(name), "rt") as f:
            raw = orjson.loads(f.read())["traceEvents"]
        kernels = {e["args"]["correlation"] for e in raw if e.get("cat") == "kernel"}
        calls = Counter(e["name"] for e in raw if e.get("cat") in ("cuda_runtime", "cuda_driver")
                        and e.get("args", {}).get("correlation") in kernels)
        launches = Facts.of(corpus_runs[name]).kernel_launches
        assert launches.num_rows == sum(calls.values()) == expected
        assert Counter(Facts.of(corpus_runs[name]).name_texts(launches)) == calls


# -- pageable copies ----------------------------------------------------------------------------
def test_pageable_h2d_on_simple_add(corpus_runs: dict[str, Run]) -> None:
    a = shows(host.pageable_h2d, corpus_runs["simple_add"])
    # On the A100's PCIe 4 (31.5 GB/s x 0.8 achieved, 1 µs per copy): 16 µs + 9,698,546 ns.
    assert dict(a.evidence) == {"copies": 16, "bytes": 244_403_360, "copy_ns": 39_080_000,
                                "bandwidth_gbps": 6.254, "pinned_estimate_ns": 9_714_546,
                                "peak_gbps": 25.2}
    assert a.gain_ns == 39_080_000 - 9_714_546
    assert a.gain_basis.startswith("link model (model/interconnects.yaml)")
    assert "pcie4's achieved 25.2 GB/s" in a.gain_basis and "A100-40GB" in a.gain_basis
    assert "pin_memory" in a.change and "non_blocking=True" in a.change


def test_pageable_h2d_without_a_device_spec(tmp_path: Path) -> None:
    copy = {**ev("Memcpy HtoD (Pageable -> Device)", 10, 400, "gpu_memcpy", tid=7, device=0,
                 stream=7, bytes=1_000_000), "pid": 0}
    run = imported(tmp_path, "pageable", [ev("ProfilerStep#0", 0, 1000, "user_annotation"), copy])
    a = shows(host.pageable_h2d, run)
    assert a.gain_ns == 200_000 and a.gain_basis.startswith("fixed factor, no model")


def test_pinned_copies_get_no_pageable_advice(corpus_runs: dict[str, Run]) -> None:
    assert found(host.pageable_h2d, corpus_runs["compare_base"]) is None  # Pinned -> Device


# -- host syncs ----------------------------------------------------------------------------------
def test_host_syncs_on_simple_add(corpus_runs: dict[str, Run]) -> None:
    a = shows(host.host_syncs, corpus_runs["simple_add"])
    assert a.evidence["by_api"] == {"cudaDeviceSynchronize": 5, "cudaStreamSynchronize": 16}
    assert a.evidence["per_step"] == 21.0 and a.evidence["blocked_ns"] == 713_000


def test_synchronous_memcpy_is_a_sync(tmp_path: Path) -> None:
    """A synchronous cudaMemcpy blocks the host until its copy is done: the advice counts it,
    as the dependency graph does (one definition); cudaMemcpyAsync does not block."""
    events = [ev("ProfilerStep#0", 0, 1000, "user_annotation")]
    for i in range(4):
        events += [ev("cudaMemcpy", 100 + 200 * i, 50, "cuda_runtime"),
                   ev("cudaMemcpyAsync", 180 + 200 * i, 10, "cuda_runtime")]
    a = shows(host.host_syncs, imported(tmp_path, "memcpy", events))
    assert a.evidence["by_api"] == {"cudaMemcpy": 4} and a.evidence["blocked_ns"] == 200_000


def test_scalar_reads_count_as_syncs(corpus_runs: dict[str, Run]) -> None:
    # a GPU trace's .item() (aten::_local_scalar_dense over a device-to-host copy) waits
    a = shows(host.host_syncs, corpus_runs["event_sync"])
    assert a.evidence["scalar_reads"] == 1 and a.evidence["dtoh_copies"] == 1
    # a trace that names no device (no deviceProperties) and calls no runtime: its 10
    # .item() read CPU tensors, which wait for no device (the advice had said they did)
    assert found(host.host_syncs, corpus_runs["non_gpu"]) is None


def test_one_final_synchronize_is_fine(corpus_runs: dict[str, Run]) -> None:
    assert found(host.host_syncs, corpus_runs["triton"]) is None


# -- threads --------------------------------------------------------------------------------------
def test_oversubscribed_threads_from_the_environment(tmp_path: Path) -> None:
    run = with_manifest(imported(tmp_path, "threads", _loader_steps(100, 9900)), cores=4,
                        ranks=[0, 1], extra={"env": {"OMP_NUM_THREADS": "8"}})
    a = shows(host.thread_oversubscription, run)
    assert dict(a.evidence) == {"cores": 4, "processes": 2, "threads_per_process": 8,
                                "threads": 16, "source": "environment"}
    assert a.change.startswith("OMP_NUM_THREADS=2 MKL_NUM_THREADS=2")
    # cpu_ops are busy 3 x 10 ms; a quarter of the threads fit the cores.
    assert a.gain_ns == 22_500_000


def test_threads_within_cores_or_unknown(tmp_path: Path, corpus_runs: dict[str, Run]) -> None:
    run = with_manifest(imported(tmp_path, "fit", _loader_steps(100, 9900)), cores=4,
                        ranks=[0, 1], extra={"env": {"OMP_NUM_THREADS": "2"}})
    assert found(host.thread_oversubscription, run) is None
    assert found(host.thread_oversubscription, corpus_runs["nccl"]) is None  # imported: unknown


def test_threads_each_process_ran_with(tmp_path: Path) -> None:
    """The recorder notes torch.get_num_threads() of each stepping process: under torchrun
    (OMP_NUM_THREADS=1 in each worker) two ranks on two cores fit; two threads each do not.
    A recording from before that note, of a torchrun command, takes torchrun's default."""
    def recorded(name: str, **changes: Any) -> Run:
        return with_manifest(imported(tmp_path, name, _loader_steps(100, 9900)), cores=2,
                             ranks=[0, 1], collectors={"torch": {"status": "ok", "files": []}},
                             **changes)

    assert found(host.thread_oversubscription,
                 recorded("one", extra={"record": {"threads": [1, 1]}})) is None
    a = shows(host.thread_oversubscription, recorded("two", extra={"record": {"threads": [2, 2]}}))
    assert dict(a.evidence) == {"cores": 2, "processes": 2, "threads_per_process": 2,
                                "threads": 4, "source": "torch.get_num_threads() in each process"}
    torchrun = ["/venv/bin/torchrun", "--nproc_per_node", "2", "train.py"]
    assert found(host.thread_oversubscription, recorded("old", command=torchrun)) is None
    module = ["env", "A=B", "python", "-m", "torch.distributed.run", "--nproc_per_node", "2",
              "train.py"]
    assert found(host.thread_oversubscription, recorded("module", command=module)) is None
    plain = shows(host.thread_oversubscription, recorded("plain", command=["python", "a.py"]))
    assert plain.evidence["source"] == "torch default (one thread per core in each process)"


def test_single_threaded_processes_over_the_cores(tmp_path: Path) -> None:
    """Hogwild's 4 processes of one thread each (torch.set_num_threads(1), their steps files'
    threads [1, 1, 1, 1]) on 2 cores: no thread setting takes them under the cores (the advice
    had said "OMP_NUM_THREADS=1 ... or torch.set_num_threads(1) in each process", as they ran,
    claiming half their CPU ops' time); two of two threads each still get it."""
    def recorded(name: str, threads: list[int]) -> Run:
        return with_manifest(imported(tmp_path, name, _loader_steps(100, 9900)), cores=2,
                             ranks=list(range(1, len(threads) + 1)),
                             collectors={"torch": {"status": "ok", "files": []}},
                             extra={"record": {"threads": threads}})

    assert found(host.thread_oversubscription, recorded("hogwild", [1, 1, 1, 1])) is None
    a = shows(host.thread_oversubscription, recorded("two", [2, 2]))
    assert a.change.startswith("OMP_NUM_THREADS=1 MKL_NUM_THREADS=1")


def test_no_host_syncs_without_an_accelerator(tmp_path: Path) -> None:
    """Adam's .item()s (8 in the 2 usual steps of the closure loop: its first profiled step,
    3.8 ms against 1.3 and 1.0, times the profiler's start and is set aside) read host memory
    on a recording whose processes had no GPU, and in an imported trace that names no device
    (no deviceProperties) and calls no runtime; where a recording had CUDA, they count."""
    trace = Path(__file__).parent / "data" / "closure_adam_cpu.pt.trace.json.gz"
    run = import_traces([trace], tmp_path / "c.run", ImportOptions(), ["test"])
    assert found(host.host_syncs, run) is None
    for record in ({"cuda": False}, {"torch_version": "2.13.0+cpu"}):
        assert found(host.host_syncs, with_manifest(run, extra={"record": record})) is None
    assert shows(host.host_syncs, with_manifest(run, extra={"record": {"cuda": True}})
                 ).evidence["scalar_reads"] == 8


# -- launch-bound ---------------------------------------------------------------------------------
def _small_kernels(n: int, kernel_us: float, launch_us: float) -> list[dict[str, Any]]:
    events = [ev("ProfilerStep#0", 0, n * launch_us + 10, "user_annotation")]
    for i in range(n):
        t = i * launch_us
        events += [ev("cudaLaunchKernel", t, launch_us, "cuda_runtime", correlation=i),
                   kernel("void at::native::vectorized_elementwise_kernel<4>", t + launch_us,
                          kernel_us, correlation=i)]
    return events


def test_launch_bound_small_kernels(tmp_path: Path) -> None:
    run = imported(tmp_path, "launch", _small_kernels(150, 3, 10), devices=(A100,))
    a = shows(device.launch_bound, run)
    assert dict(a.evidence) == {"kernels": 150, "small_kernels": 150, "kernel_mean_ns": 3000,
                                "host_per_kernel_ns": 10_000, "launches": 150,
                                "launch_mean_ns": 10_000, "device_busy_pct": 29.8,
                                "idle_host_wait_pct": 100.0, "launch_queue_max": 2,
                                "launch_queue_full_ns": 0}
    # each kernel ends 3 µs after the next one's launch call began: 2 launched, unfinished
    # The host without its 150 x 10 µs of launches needs 10 µs; the device 450 µs busy plus
    # 150 x 1 µs between replayed kernels: a 600 µs step instead of 1510.
    assert a.gain_ns == 910_000
    assert a.gain_basis.startswith("launch model from this run's times")
    assert "10,000 ns of host per kernel, launch calls of 10,000 ns included" in a.gain_basis
    assert a.title == "many small kernels: launch overhead dominates"
    assert "CUDA graph" in a.change


def test_launch_bound_absent(tmp_path: Path) -> None:
    # 30 µs kernels launched every 10 µs: the device is the bound
    big = imported(tmp_path, "big", _small_kernels(150, 30, 10), devices=(A100,))
    assert found(device.launch_bound, big) is None


def _outermost_launching_ns(raw: list[dict[str, Any]], start: float, end: float) -> int:
    """From the raw JSON: the union (ns) over the threads of the outermost cpu_ops that hold a
    launch call of a kernel (its correlation id), and those calls, that start in [start, end)
    µs, outside the sync calls there (the trace has no device-reading .item())."""
    kernels = {e["args"]["correlation"] for e in raw if e.get("cat") == "kernel"}
    calls = [e for e in raw if e.get("cat") == "cuda_runtime"
             and e.get("args", {}).get("correlation") in kernels and start <= e["ts"] < end]
    held = []
    by_tid: dict[int, list[dict[str, Any]]] = {}
    for e in raw:
        if e.get("cat") == "cpu_op" and e.get("ph") == "X":
            by_tid.setdefault(e["tid"], []).append(e)
    for tid, ops in by_tid.items():
        ops.sort(key=lambda e: (e["ts"], -e["dur"]))
        top, reach = [], -1.0
        for e in ops:
            if e["ts"] >= reach:
                top.append(e)
                reach = e["ts"] + e["dur"]
        mine = [c for c in calls if c["tid"] == tid]
        held += [o for o in top if start <= o["ts"] < end and any(
            o["ts"] <= c["ts"] and c["ts"] + c["dur"] <= o["ts"] + o["dur"] for c in mine)]
    def ns(events: list[dict[str, Any]]) -> list[tuple[int, int]]:
        return [(int(Decimal(str(e["ts"])) * 1000),
                 int((Decimal(str(e["ts"])) + Decimal(str(e["dur"]))) * 1000)) for e in events]

    syncs = ns([e for e in raw if e.get("cat") == "cuda_runtime" and start <= e["ts"] < end
                and e["name"] in ("cudaDeviceSynchronize", "cudaStreamSynchronize",
                                  "cudaEventSynchronize", "cudaMemcpy")])
    return _union_ns(ns(held + calls) + syncs) - _union_ns(syncs)


def test_launch_bound_on_ddp_with_mid_size_kernels(corpus_runs: dict[str, Run]) -> None:
    """HTA's DDP trace: kernels of 43 µs on average (1,156 of 2,679 under 10 µs), but the
    host spends 168 µs of ops per kernel it launches, and 98.9% of the device's idle time is
    host wait: launch-bound, though the kernels are not small."""
    with gzip.open(corpus("nccl"), "rt") as f:
        raw = orjson.loads(f.read())["traceEvents"]
    steps = [e for e in raw if e.get("name", "").startswith("ProfilerStep#")
             and e.get("cat") == "user_annotation"]
    start, end = min(e["ts"] for e in steps), max(e["ts"] + e["dur"] for e in steps)
    # NCCL's kernels are collectives: 21 more
    kernels = [e for e in raw if e.get("cat") == "kernel" and start <= e["ts"] < end
               and "nccl" not in e["name"]]
    a = shows(device.launch_bound, corpus_runs["nccl"])
    assert a.title == "the host launches kernels slower than the device runs them"
    assert a.evidence["kernels"] == len(kernels) == 2679
    assert a.evidence["small_kernels"] == sum(e["dur"] < 10 for e in kernels) == 1156
    facts = Facts.of(corpus_runs["nccl"])
    captured = _outermost_launching_ns(raw, start, end)
    assert captured == 449_614_416
    assert a.evidence["host_per_kernel_ns"] == round(captured / len(kernels)) == 167_829
    assert a.evidence["idle_host_wait_pct"] == 98.87
    # a step without the captured host work: the device's 157.5 ms busy plus 1 µs a kernel
    window = facts.window(0)[2]
    idle, span = facts.device_idle[0]
    after = max(window - captured, span - idle + len(kernels) * 1000)
    assert a.gain_ns == window - after


def test_launch_bound_not_when_the_device_waits_on_other_work(tmp_path: Path) -> None:
    """Small kernels and slow launches, but every launch returned long before its kernel
    ran: the device's idle time is kernel wait (analyze's split), not launches."""
    events = [ev("ProfilerStep#0", 0, 5000, "user_annotation")]
    for i in range(150):
        events += [ev("cudaLaunchKernel", i * 10, 10, "cuda_runtime", correlation=i),
                   kernel("void at::native::vectorized_elementwise_kernel<4>", 2000 + i * 20, 3,
                          correlation=i)]
    run = imported(tmp_path, "queued", events, devices=(A100,))
    (stats,) = Facts.of(run).launch
    assert (stats.idle.host_wait_ns, stats.idle.kernel_wait_ns) == (0, 149 * 17_000)
    assert found(device.launch_bound, run) is None


# -- utilization and GEMM precision -------------------------------------------------------------
TF32_GEMM = "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x64_16x4_nn_align4>(Params)"


def _busy_gemms(tmp: Path, name: str, gemm: str) -> Run:
    events = [ev("ProfilerStep#0", 0, 1000, "user_annotation")]
    events += [kernel(gemm, 10 + 95 * i, 90) for i in range(10)]
    return imported(tmp, name, events, devices=(A100,))


def test_low_utilization_on_nccl(corpus_runs: dict[str, Run]) -> None:
    """The batch model: the host's own work (667.1 ms less the 24 cudaEventSynchronize calls
    that waited) stays, the device's 157.5 ms doubles; twice the samples in max of the two."""
    with gzip.open(corpus("nccl"), "rt") as f:
        raw = orjson.loads(f.read())["traceEvents"]
    steps = [e for e in raw if e.get("name", "").startswith("ProfilerStep#")
             and e.get("cat") == "user_annotation"]
    start, end = min(e["ts"] for e in steps), max(e["ts"] + e["dur"] for e in steps)
    syncs = [(int(Decimal(str(e["ts"])) * 1000),
              int((Decimal(str(e["ts"])) + Decimal(str(e["dur"]))) * 1000))
             for e in raw if e.get("name") == "cudaEventSynchronize" and start <= e["ts"] < end]
    assert len(syncs) == 24
    a = shows(device.low_utilization, corpus_runs["nccl"])
    window = Facts.of(corpus_runs["nccl"]).window(0)[2]
    host = window - _union_ns(syncs)
    assert a.evidence["devices"] == [{
        "rank": 0, "device": 0, "busy_pct": 23.61, "idle_ns": 509_605_325, "host_work_ns": host,
        "loader_ns": 0, "device_busy_ns": 157_500_014,
        "per_sample_at_2x_batch_ns": round(max(host, 2 * 157_500_014) / 2)}]
    assert a.gain_ns == round(window - host / 2)
    assert a.gain_basis.startswith("batch model from this run's times")


def test_busy_device_is_not_low_utilization(tmp_path: Path) -> None:
    assert found(device.low_utilization, _busy_gemms(tmp_path, "busy", TF32_GEMM)) is None


def test_fp32_gemms_on_an_a100(corpus_runs: dict[str, Run]) -> None:
    a = shows(device.fp32_gemm, corpus_runs["simple_add"])
    assert a.evidence["fp32_gemms"] == 8 and a.evidence["gemms"] == 14
    assert a.evidence["fp32_gemm_ns"] == 3_319_000 and a.gain_ns == 1_659_500
    assert a.evidence["top_kernels"][0] == "ampere_sgemm_32x32_sliced1x4_tn"
    assert a.evidence["modelled_gemms"] == 0  # the trace has no recorded shapes
    assert a.gain_basis == ("fixed factor, no model (no recorded shapes (record_shapes=True) for "
                            "these GEMMs): TF32 tensor-core GEMMs run about 2x faster than FP32 "
                            "ones")
    assert "allow_tf32" in a.change and "bfloat16" in a.change


def test_fp32_gemm_gain_from_the_roofline_of_recorded_shapes(tmp_path: Path) -> None:
    square = [[4096, 4096], [4096, 4096]]  # compute-bound: TF32 peak / FP32 peak = 8x
    skinny = [[8192, 16], [16, 8192]]  # memory-bound either way: no faster in TF32
    events = [ev("ProfilerStep#0", 0, 20_000, "user_annotation"),
              *launched("aten::mm", square, 0, 12_000, 1, "ampere_sgemm_128x128_nn", 10_000),
              *launched("aten::mm", skinny, 12_100, 1500, 2, "ampere_sgemm_64x64_nn", 1000),
              # launched outside any op with shapes: the fixed 2x
              ev("cudaLaunchKernel", 13_700, 2, "cuda_runtime", correlation=3),
              kernel("ampere_sgemm_64x64_nn", 13_800, 2000, correlation=3)]
    a = shows(device.fp32_gemm, imported(tmp_path, "shapes", events, devices=(A100,)))
    assert a.evidence["fp32_gemm_ns"] == 13_000_000 and a.evidence["modelled_gemms"] == 2
    assert a.gain_ns == 10_000_000 * 7 // 8 + 1_000_000  # + 0 for the skinny one
    assert a.evidence["tf32_estimate_ns"] == 13_000_000 - a.gain_ns
    assert a.gain_basis.startswith("roofline model (model/opcost.py) of 2 kernels' recorded "
                                   "shapes on A100-40GB (19.5 FP32 vs 156 TF32 TFLOP/s")
    assert a.gain_basis.endswith("; the 1 without recorded shapes: TF32 tensor-core GEMMs run "
                                 "about 2x faster than FP32 ones")


def test_launching_ops_are_rows(tmp_path: Path) -> None:
    """Each kernel's launching op with a cost model is its row (-1 for none), the Facts holding
    two arrays for them, not an object per op; a rule reads a few columns of the kernels
    alone."""
    events = [ev("ProfilerStep#0", 0, 20_000, "user_annotation"),
              *launched("aten::mm", [[64, 64], [64, 64]], 0, 12_000, 1, "ampere_sgemm", 10_000),
              *launched("aten::mm", [[8, 16], [16, 8]], 12_100, 1500, 2, "ampere_sgemm", 1000),
              ev("cudaLaunchKernel", 13_700, 2, "cuda_runtime", correlation=3),
              kernel("ampere_sgemm", 13_800, 2000, correlation=3)]
    facts = Facts.of(imported(tmp_path, "rows", events, devices=(A100,)))
    kernels = facts.kind("kernel", columns=("row", "ts"))
    assert kernels.column_names == ["kind", "row", "ts"]
    mm = facts.named("^aten::mm$", "cpu_op").sort_by("ts").column("row").to_pylist()
    ops = facts.launching_ops(kernels.sort_by("ts"))
    assert ops.dtype == np.int64 and ops.tolist() == [*mm, -1]
    assert all(isinstance(a, np.ndarray) for a in facts._launching)
    assert [c.flops if c else None for c in facts.costs_of(ops)] == [2 * 64**3, 2 * 8 * 16 * 8,
                                                                    None]


# -- fusion --------------------------------------------------------------------------------------
EW = "void at::native::vectorized_elementwise_kernel<4>"
BIG = [4096, 4096]


def _chain(tmp: Path, name: str, between: bool) -> Run:
    ops = [("aten::add", [BIG, BIG], 200), ("aten::mul", [BIG, BIG], 200),
           ("aten::relu", [BIG], 150)]
    events, t, corr = [ev("ProfilerStep#0", 0, 2000, "user_annotation")], 0.0, 0
    for op, dims, us in ops:
        events += launched(op, dims, t, us + 10, corr, EW, us)
        t, corr = t + us + 20, corr + 1
        if between:  # a compute-bound GEMM breaks every chain
            events += launched("aten::mm", [BIG, BIG], t, 60, corr, "ampere_sgemm", 50)
            t, corr = t + 80, corr + 1
    return imported(tmp, name, events, devices=(A100,))


def test_fusion_of_a_memory_bound_chain(tmp_path: Path) -> None:
    a = shows(device.fusion, _chain(tmp_path, "chain", between=False))
    # Unfused the three move 3 + 3 + 2 tensors of 64 MiB; fused, 3: the 550 µs shrink to 3/8.
    assert a.evidence["candidates"] == 1 and a.evidence["kernel_ns"] == 550_000
    assert a.evidence["top_chains"] == [{"ops": "add -> mul -> relu", "count": 1}]
    assert a.evidence["roofline_fused_ns"] * 8 == pytest.approx(
        a.evidence["roofline_unfused_ns"] * 3, abs=8)
    assert a.gain_ns == 550_000 * 5 // 8
    assert a.gain_basis.startswith("roofline model (model/fusion.py) on A100-40GB")
    assert "torch.compile" in a.change


def test_fusion_names_the_frequent_kernel_sequences(tmp_path: Path) -> None:
    """Two steps of the chain, each op its own kernel: analyze's frequent sequences find the
    three kernels twice, all elementwise (fusable): the advice lists them beside its chains."""
    names = [f"void at::native::vectorized_elementwise_kernel<4, {op}>" for op in
             ("add", "mul", "relu")]
    events, corr = [], 0
    for step in range(2):
        t = step * 1000.0
        events.append(ev(f"ProfilerStep#{step}", t, 1000, "user_annotation"))
        for (op, dims, us), name in zip([("aten::add", [BIG, BIG], 200),
                                         ("aten::mul", [BIG, BIG], 200),
                                         ("aten::relu", [BIG], 150)], names, strict=True):
            events += launched(op, dims, t, us + 10, corr, name, us)
            t, corr = t + us + 20, corr + 1
    a = shows(device.fusion, imported(tmp_path, "twice", events, devices=(A100,)))
    # (the fuser's chain runs on across the step boundary)
    assert a.evidence["top_chains"] == [{"ops": "add -> mul -> relu -> add -> mul -> relu",
                                         "count": 1}]
    assert a.evidence["fusable_sequences"] == [
        {"kernels": names, "runs": 2, "total_ns": 2 * 550_000}]


def test_no_fusion_when_chains_are_broken_or_unmodelled(tmp_path: Path,
                                                        corpus_runs: dict[str, Run]) -> None:
    assert found(device.fusion, _chain(tmp_path, "broken", between=True)) is None
    assert found(device.fusion, corpus_runs["simple_add"]) is None  # no recorded shapes
    no_spec = imported(tmp_path, "nospec", [ev("ProfilerStep#0", 0, 2000, "user_annotation"),
                                            *launched("aten::add", [BIG, BIG], 0, 210, 0, EW,
                                                      200),
                                            *launched("aten::mul", [BIG, BIG], 220, 210, 1, EW,
                                                      200)])
    assert found(device.fusion, no_spec) is None


def test_tensor_core_gemms_and_non_nvidia(tmp_path: Path, corpus_runs: dict[str, Run]) -> None:
    assert found(device.fp32_gemm, _busy_gemms(tmp_path, "tf32", TF32_GEMM)) is None
    assert found(device.fp32_gemm, corpus_runs["amd"]) is None


# -- optimizer ------------------------------------------------------------------------------------
def _optimizer(step: str, ops: tuple[str, ...], zero: int) -> list[dict[str, Any]]:
    events = []
    for i in range(2):
        t = i * 1000
        events += [ev(f"ProfilerStep#{i}", t, 1000, "user_annotation"),
                   ev("Optimizer.zero_grad#SGD.zero_grad", t, 100, "user_annotation")]
        events += [ev("aten::zero_", t + 1 + 10 * j, 5) for j in range(zero)]
        events += [ev(step, t + 200, 600, "user_annotation")]
        events += [ev(op, t + 201 + 10 * j, 5) for j, op in enumerate(ops)]
    return events


SINGLE_TENSOR = ("aten::add_", "aten::mul_", "aten::addcdiv_") * 10


def test_single_tensor_optimizer_on_a_device(tmp_path: Path) -> None:
    events = [*_optimizer("Optimizer.step#AdamW.step", SINGLE_TENSOR, 0),
              kernel("elementwise_kernel", 300, 50)]
    a = shows(optimizer.single_tensor_optimizer, imported(tmp_path, "adam", events))
    assert dict(a.evidence) == {"optimizer": "AdamW", "steps": 2, "ops_per_step": 30.0,
                                "distinct_ops": 3, "optimizer_ns": 1_200_000}
    assert a.gain_ns == 1_080_000  # 3 multi-tensor ops instead of 30
    assert a.change == "torch.optim.AdamW(..., foreach=True), or fused=True"


def test_single_tensor_optimizer_after_a_clipping_closure(tmp_path: Path) -> None:
    """Lightning's gradient_clip_val: clip_grad_norm_ runs inside step()'s closure, after the
    backward: its _foreach_norm and _foreach_mul_ (and the ops between: the total norm) are no
    multi-tensor update, and had hidden the 30 single-tensor ops of the
    update that follows (no advice); a _foreach_ op of the update itself still means none."""
    clip = ("aten::_foreach_norm", "aten::linalg_vector_norm", "aten::stack",
            "aten::_foreach_mul_")
    events = [*_optimizer("Optimizer.step#AdamW.step", clip + SINGLE_TENSOR, 0),
              kernel("elementwise_kernel", 300, 50)]
    a = shows(optimizer.single_tensor_optimizer, imported(tmp_path, "clip", events))
    assert a.evidence["ops_per_step"] == 30.0 and a.evidence["distinct_ops"] == 3
    events = [*_optimizer("Optimizer.step#AdamW.step",
                          (*clip, "aten::_foreach_add_", *SINGLE_TENSOR), 0),
              kernel("elementwise_kernel", 300, 50)]
    assert found(optimizer.single_tensor_optimizer, imported(tmp_path, "fe", events)) is None


def _cpu_adam(tmp: Path, name: str, version: str | None, wrapped: bool = False,
              sgd: bool = False, steps: int = 2, slowed: int | None = None,
              optimizer: str = "AdamW", subclass: bool = False) -> Run:
    """CPU steps of 600 µs, each 30 add_ of two 1,024-float tensors (12,288 bytes): 18 µs
    each, but one of them 3 µs (525 µs of ops a step); step `slowed`'s ops 10x as long.
    `subclass`: each add_ on a DTensor of 2,048 floats, the local add_ of the rank's 1,024
    (1 µs for the short one) under a PythonSubclass op inside it."""
    events = []
    every = 1000 if slowed is None else 10_000  # room for a slowed step
    for i in range(steps):
        t, x = i * every, 10 if i == slowed else 1
        events += [ev(f"ProfilerStep#{i}", t, every, "user_annotation"),
                   ev(f"Optimizer.step#{optimizer}.step", t + 200, 600 * x,
                      "user_annotation")]
        if wrapped:  # a wrapper optimizer whose step() steps the AdamW inside it
            events.append(ev("Optimizer.step#Wrap.step", t + 150, 700, "user_annotation"))
        if sgd:  # another optimizer first in the step, over two parameters
            events += [ev("Optimizer.step#SGD.step", t + 100, 50, "user_annotation"),
                       *(ev("aten::add_", t + 101 + 20 * j, 10,
                            **{"Input Dims": [[1024], [1024]], "Input type": ["float", "float"]})
                         for j in range(2))]
        dims = [[2048], [2048]] if subclass else [[1024], [1024]]  # a DTensor's: global
        events += [ev("aten::add_", t + 201 + 19 * j * x, (3 if j == 7 else 18) * x,
                      **{"Input Dims": dims, "Input type": ["float", "float"]})
                   for j in range(30)]
        if subclass:  # the local add_ (half the tensor: the rank's shard), 2 µs less
            events += [e for j in range(30) for e in (
                ev("PythonSubclass", t + 201.5 + 19 * j * x, (3 if j == 7 else 18) * x - 1),
                ev("aten::add_", t + 202 + 19 * j * x, (3 if j == 7 else 18) * x - 2,
                   **{"Input Dims": [[1024], [1024]], "Input type": ["float", "float"]}))]
    run = imported(tmp, name, events)
    return with_manifest(run, extra={"record": {"torch_version": version}} if version else {})


# a fused step of 10 µs a call, 1 µs a tensor and 0.1 ns a byte: _cpu_adam's 30 tensors of 4 KiB
# (1,024 floats) 52,288 ns a call
FUSED = HostCosts(fused=FusedStepCosts({n: StepCost(10_000.0, 1_000.0, 0.1) for n in OPTIMIZERS},
                                       "the test's"))
FUSED_CALL = 10_000 + 30 * 1_000 + 12_288


def test_no_fused_sgd_over_dtensor_parameters(tmp_path: Path) -> None:
    """SGD over DTensor parameters (FSDP2's, tensor parallelism's: each op a PythonSubclass
    op) was advised fused=True, which raises NotImplementedError in torch 2.13 (no sharding
    strategy for aten._fused_sgd_; /tmp/p22/rec22/s/fused_dt.py, 2 gloo ranks): no fused
    advice for it now; AdamW's fused kernel has one (1.3-1.5 ms a step against 17-19) and is
    advised as over plain tensors, the same gain."""
    plain = shows(optimizer.single_tensor_optimizer,
                  _cpu_adam(tmp_path, "sgd", "2.13.0+cpu", optimizer="SGD"), FUSED)
    assert plain.change == "torch.optim.SGD(..., fused=True)"
    assert found(optimizer.single_tensor_optimizer, _cpu_adam(
        tmp_path, "sgd_dt", "2.13.0+cpu", optimizer="SGD", subclass=True), FUSED) is None
    adamw = shows(optimizer.single_tensor_optimizer,
                  _cpu_adam(tmp_path, "adamw_dt", "2.13.0+cpu", subclass=True), FUSED)
    assert adamw.change == "torch.optim.AdamW(..., fused=True)"
    assert plain.gain_ns == 1_200_000 - 2 * FUSED_CALL
    # each op counted once, the local one: 30 a step (the DTensor's add_ and the local one had
    # read 60), its parameters the shard's (30 of 1,024 floats; the global 2,048 each); the
    # calls the fused step replaces are the DTensor's, 1,200 µs
    assert (adamw.evidence["ops_per_step"], adamw.evidence["tensors"],
            adamw.evidence["parameter_bytes"], adamw.evidence["calls_ns"]) == (
        30.0, 30, 30 * 4_096, 1_200_000)
    assert adamw.gain_ns == 1_200_000 - 2 * FUSED_CALL


def test_single_tensor_optimizer_on_the_cpu(tmp_path: Path) -> None:
    """On the CPU foreach=True gains nothing; fused=True (torch >= 2.4) replaces each call, its
    ops and the Python between them, by one fused step over the call's parameters: 30 tensors
    of 4,096 bytes (the ops like the loop's first, each one's largest tensor), priced at the
    step costs given (FUSED), against the two calls' 1,200 µs."""
    a = shows(optimizer.single_tensor_optimizer, _cpu_adam(tmp_path, "new", "2.13.0+cpu"), FUSED)
    assert (a.evidence["tensors"], a.evidence["parameter_bytes"]) == (30, 30 * 4_096)
    assert a.evidence["fused_ns"] == round(2 * FUSED_CALL)
    assert a.evidence["torch_version"] == "2.13.0+cpu"
    assert a.evidence["calls_ns"] == 1_200_000 and a.evidence["optimizer_ns"] == 1_200_000
    assert a.gain_ns == 1_200_000 - 2 * FUSED_CALL
    assert a.gain_basis.endswith("10.0 µs a call + 1.00 µs a tensor + 100.00 µs a MB of CPU "
                                 "time, the test's")
    assert a.change == "torch.optim.AdamW(..., fused=True)"
    # at the defaults (a calibrate on the 2-core VM), said so
    default = shows(optimizer.single_tensor_optimizer, _cpu_adam(tmp_path, "d", "2.13.0+cpu"))
    assert default.gain_ns == round(1_200_000 - 2 * FUSED_DEFAULT.steps["AdamW"].of(30, 30 * 4_096))
    assert default.gain_basis.endswith("µs a MB of CPU time, the defaults measured on the "
                                       "2-core VM")
    unknown = shows(optimizer.single_tensor_optimizer, _cpu_adam(tmp_path, "unknown", None),
                    FUSED)
    assert unknown.change == "torch.optim.AdamW(..., fused=True) (on the CPU since torch 2.4)"
    assert found(optimizer.single_tensor_optimizer, _cpu_adam(tmp_path, "old", "2.3.1"),
                 FUSED) is None
    # inside a wrapper's step(): the optimizer that updates is the inner one, its two calls
    inner = shows(optimizer.single_tensor_optimizer,
                  _cpu_adam(tmp_path, "wrapped", "2.13.0+cpu", wrapped=True), FUSED)
    assert (inner.evidence["optimizer"], inner.evidence["steps"], inner.gain_ns) == (
        "AdamW", 2, a.gain_ns)
    # beside another optimizer (SGD, first in each step): each priced on its own calls (pooled,
    # the 64 ops of four calls had been 16 a step, named SGD, and no advice came)
    both = shows(optimizer.single_tensor_optimizer,
                 _cpu_adam(tmp_path, "both", "2.13.0+cpu", sgd=True), FUSED)
    assert (both.evidence["optimizer"], both.evidence["steps"], both.gain_ns) == (
        "AdamW", 2, a.gain_ns)
    # outside the window the hooks timed 500 µs steps, half the profiled 1,000 µs: the
    # calls' time without the profiler is half their profiled time
    from perfswarm.trace.schema import STEPS

    slowed = _cpu_adam(tmp_path, "slowed", "2.13.0+cpu")
    rows = [(0, s, 10_000_000 + 500_000 * s, 10_500_000 + 500_000 * s, "detected")
            for s in range(3, 6)]
    hooked = pa.table({k: [r[i] for r in rows] for i, k in
                       enumerate(("rank", "step", "start", "end", "source"))}).cast(STEPS)
    slowed.write_table("steps", pa.concat_tables([slowed.table("steps"), hooked]).cast(STEPS))
    half = shows(optimizer.single_tensor_optimizer, slowed, FUSED)
    assert half.evidence["profiler_slowdown"] == 2.0
    assert half.gain_ns == 1_200_000 / 2 - 2 * FUSED_CALL
    assert half.evidence["optimizer_slowdown"] is None
    # the recorder timed the optimizer's calls that ended those steps: 200 µs each, a third
    # of the profiled 600 µs (a call in the window, or at no hook, counts not)
    from perfswarm.trace.schema import COUNTERS, OPTIMIZER_CALL

    calls = pa.table({"rank": [0] * 4, "ts": [10_500_000 + 500_000 * s for s in (3, 4, 5)] + [0],
                      "name": [OPTIMIZER_CALL] * 4, "device": [-1] * 4,
                      "value": [200_000.0, 150_000.0, 250_000.0, 1.0]}).cast(COUNTERS)
    slowed.write_table("counters", pa.concat_tables([slowed.table("counters"), calls]))
    third = shows(optimizer.single_tensor_optimizer, slowed, FUSED)
    # the gain over the calls' slowdown; gain_of over the steps', as its text and evidence say
    assert third.evidence["optimizer_slowdown"] == 3.0
    assert third.evidence["profiler_slowdown"] == 2.0
    assert third.gain_of.endswith("(over the profiler's slowdown of the steps, 2.00x)")
    assert third.gain_of_ns == 2 * 1_000_000 // 2  # the two profiled steps of 1,000 µs, halved
    # three calls, the second held up by another process (10x as long): priced as the
    # median call, 600 µs a call (summed, 6,000 µs of 7,200 had been that one call's)
    held = shows(optimizer.single_tensor_optimizer,
                 _cpu_adam(tmp_path, "held", "2.13.0+cpu", steps=3, slowed=1), FUSED)
    assert held.evidence["calls_ns"] == 3 * 600_000 and held.evidence["steps"] == 3
    assert third.gain_ns == 1_200_000 / 3 - 2 * FUSED_CALL
    # faster still (50 µs a call unprofiled), the fused step would save nothing: no advice, no
    # gain beyond what is there
    calls = pa.table({"rank": [0] * 3, "ts": [10_500_000 + 500_000 * s for s in (3, 4, 5)],
                      "name": [OPTIMIZER_CALL] * 3, "device": [-1] * 3,
                      "value": [50_000.0] * 3}).cast(COUNTERS)
    slowed.write_table("counters", calls)
    assert found(optimizer.single_tensor_optimizer, slowed, FUSED) is None
    # without shapes there is nothing to price the fused step with
    bare = imported(tmp_path, "bare", _optimizer("Optimizer.step#AdamW.step", SINGLE_TENSOR, 0))
    assert found(optimizer.single_tensor_optimizer, bare) is None


def test_advise_prices_the_fused_step_by_a_calibrated_profile(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`advise --profile` prices the fused step at the costs calibrate measured on the host
    (`fused_optimizer_step`); a profile calibrated before it measured them gives the defaults
    and says so; a malformed entry is a one-line error naming the file."""
    run = _cpu_adam(tmp_path, "p", "2.13.0+cpu")

    def fused(*options: str) -> dict[str, Any]:
        assert main(["advise", str(run.path), "--json", *options]) == 0
        (a,) = [a for a in orjson.loads(capsys.readouterr().out)["advice"]
                if a["rule"] == "single_tensor_optimizer"]
        return a  # type: ignore[no-any-return]

    profile = tmp_path / "cpu-profile.json"
    receive = '"loader_receive": {"batch_ns": 200000, "tensor_ns": 100000}'
    steps = ", ".join(f'"{n}": {{"call_ns": 10000, "tensor_ns": 1000, "byte_ns": 0.1}}'
                      for n in OPTIMIZERS)
    profile.write_text(f'{{{receive}, "fused_optimizer_step": {{{steps}}}}}')
    calibrated = fused("--profile", str(profile))
    assert calibrated["gain_ns"] == 1_200_000 - 2 * FUSED_CALL
    assert calibrated["gain_basis"].endswith("of CPU time, calibrated on this host "
                                             "(cpu-profile.json)")
    profile.write_text(f"{{{receive}}}")
    older = fused("--profile", str(profile))
    assert older["gain_ns"] == fused()["gain_ns"]  # the defaults'
    assert older["gain_basis"].endswith("the defaults measured on the 2-core VM (cpu-profile"
                                        ".json has none: calibrate again to measure them on "
                                        "this host)")
    for entry, why in (('{"Adam": {}}', "fused_optimizer_step needs a step cost for each of Adam, "
                                       "AdamW, SGD"),
                       (f'{{{steps.replace("10000", "-1", 1)}}}',
                        "fused_optimizer_step's Adam needs non-negative call_ns"),
                       (f'{{{steps.replace("1000,", "[],", 1)}}}',
                        "fused_optimizer_step's Adam is not a step cost")):
        profile.write_text(f'{{{receive}, "fused_optimizer_step": {entry}}}')
        assert main(["advise", str(run.path), "--profile", str(profile)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"cpu-profile.json: {why}" in err, err


def test_optimizer_stepped_with_a_closure(tmp_path: Path) -> None:
    """optimizer.step(closure) runs the forward and the backward inside the call (LBFGS,
    Lightning): its own work, all the advice prices, is what follows the closure's last
    autograd node, here computed from the raw JSON (104 aten ops a step of the 194 the whole
    call holds), in the steps advice measures: the first profiled one (3.8 ms against 1.3 and
    1.0 ms) times the profiler's start and is set aside."""
    trace = Path(__file__).parent / "data" / "closure_adam_cpu.pt.trace.json.gz"
    events = [e for e in orjson.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
              if e.get("ph") == "X"]

    def ns(us: float) -> int:
        return int(Decimal(str(us)) * 1000)

    marks = sorted((e["ts"], e["dur"]) for e in events if e["name"].startswith("ProfilerStep#"))
    assert marks[0][1] > 2 * max(d for _, d in marks[1:])  # the profiler's start
    own_ns, own_ops, all_ops = 0, 0, 0
    for call in (e for e in events if e["name"].startswith("Optimizer.step#")
                 and e["ts"] >= marks[1][0]):
        lo, hi = ns(call["ts"]), ns(call["ts"]) + ns(call["dur"])
        inside = [e for e in events if lo <= ns(e["ts"]) and ns(e["ts"]) + ns(e["dur"]) <= hi]
        own = max(ns(e["ts"]) + ns(e["dur"]) for e in inside
                  if e["name"].startswith("autograd::engine::evaluate_function: "))
        aten = [e for e in inside if e["cat"] == "cpu_op" and e["name"].startswith("aten::")]
        own_ns += hi - own
        own_ops += sum(ns(e["ts"]) >= own for e in aten)
        all_ops += len(aten)
    run = import_traces([trace], tmp_path / "c.run", ImportOptions(), ["test"])
    a = shows(optimizer.single_tensor_optimizer, run)
    assert a.evidence["steps"] == 2 and a.evidence["optimizer_ns"] == own_ns
    assert a.evidence["ops_per_step"] == own_ops / 2 == 104 and all_ops == 2 * 194


def test_foreach_and_fused_optimizers(tmp_path: Path, corpus_runs: dict[str, Run]) -> None:
    assert found(optimizer.single_tensor_optimizer, corpus_runs["nccl"]) is None  # _foreach_
    assert found(optimizer.single_tensor_optimizer, corpus_runs["non_gpu"]) is None  # FusedAdam
    foreach = ("aten::_foreach_add_",) * 30
    run = imported(tmp_path, "fe", _optimizer("Optimizer.step#AdamW.step", foreach, 0))
    assert found(optimizer.single_tensor_optimizer, run) is None


def test_zero_grad_filling_zeros(tmp_path: Path) -> None:
    run = imported(tmp_path, "zero", _optimizer("Optimizer.step#SGD.step", (), 4))
    a = shows(optimizer.zero_grad_fill, run)
    assert dict(a.evidence) == {"zero_grad_calls": 2, "zero_ops": 8, "zero_ns": 40_000}
    assert "set_to_none=True" in a.change


def test_zero_grad_set_to_none(corpus_runs: dict[str, Run]) -> None:
    assert found(optimizer.zero_grad_fill, corpus_runs["nccl"]) is None
    assert found(optimizer.zero_grad_fill, corpus_runs["non_gpu"]) is None


# -- communication, stragglers, ring order ---------------------------------------------------
def _union_ns(spans: list[tuple[int, int]]) -> int:
    out, reach = 0, None
    for s, e in sorted(spans):
        if reach is None or s > reach:
            out, reach = out + e - s, e
        elif e > reach:
            out, reach = out + e - reach, e
    return out


def test_communication_bound_on_nccl(corpus_runs: dict[str, Run]) -> None:
    """From the raw JSON (µs read as decimals, x1000): NCCL kernels are communication, other
    kernels compute; exposed is communication no compute kernel overlaps, a copy or memset
    beside it or not (analyze's comm_only: the copy engine does none of the step's compute)."""
    with gzip.open(corpus("nccl"), "rt") as f:
        raw = orjson.loads(f.read())["traceEvents"]

    def spans(*cats: str, nccl: bool | None = None) -> list[tuple[int, int]]:
        out = []
        for e in raw:
            if e.get("cat") in cats and (nccl is None or ("nccl" in e["name"]) == nccl):
                ts, dur = Decimal(str(e["ts"])) * 1000, Decimal(str(e["dur"])) * 1000
                out.append((int(ts), int(ts + dur)))
        return out

    comm, compute = spans("kernel", nccl=True), spans("kernel", nccl=False)
    memory = spans("gpu_memcpy", "gpu_memset")
    exposed = _union_ns(comm + compute) - _union_ns(compute)
    comm_ns, busy = _union_ns(comm), _union_ns(comm + compute + memory)
    assert (exposed, comm_ns, busy) == (39_559_468, 46_876_493, 157_500_014)
    # the old definition, which counted a copy beside a collective as hiding it
    assert _union_ns(comm + compute + memory) - _union_ns(compute + memory) == 39_190_669
    a = shows(distributed.communication_bound, corpus_runs["nccl"])
    assert a.evidence["collectives"] == 21
    assert (a.evidence["exposed_ns"], a.evidence["comm_ns"],
            a.evidence["device_busy_ns"]) == (exposed, comm_ns, busy)
    assert a.evidence["by_op_ns"] == {"AllReduce": 46_762_159, "Broadcast": 114_334}
    assert a.evidence["overlapped_pct"] == round(100 * (comm_ns - exposed) / comm_ns, 2) == 15.61
    assert "bucket_cap_mb" in a.change
    # The overlap model: exposed time hides under compute beside no collective, less one
    # collective a step (3 steps, 21 collectives) that waits for backward to end
    # (analyze's states are per iteration: the kernels clipped to each step)
    def clipped(spans: list[tuple[int, int]], lo: int, hi: int) -> list[tuple[int, int]]:
        return [(max(s, lo), min(e, hi)) for s, e in spans if s < hi and e > lo]

    steps = [(int(Decimal(str(e["ts"])) * 1000),
              int((Decimal(str(e["ts"])) + Decimal(str(e["dur"]))) * 1000))
             for e in raw if e.get("cat") == "user_annotation"
             and e["name"].startswith("ProfilerStep#")]
    compute_only = sum(_union_ns(clipped(compute + comm, lo, hi)) - _union_ns(clipped(comm, lo, hi))
                       for lo, hi in steps)
    assert a.evidence["compute_only_ns"] == compute_only == 108_338_822
    assert (a.evidence["overlap_model_ns"]
            == round(min(exposed - comm_ns / 21 * 3, compute_only)) == 32_862_826)
    from perfswarm.analyze.summary import analyze

    # but the steps' critical paths (analyze's) run through no collective: the host decides
    # them, so hiding the all-reduces saves nothing
    path = analyze(corpus_runs["nccl"]).critical_path
    assert path is not None and len(path.steps) == 3
    assert a.evidence["collective_on_critical_path_ns"] == sum(
        st.ns["collective"] for st in path.steps) == 0
    assert a.gain_ns == 0 and a.title.endswith("off the critical path")
    assert a.gain_basis.startswith("no time saved: no collective is on the steps' critical path")
    assert a.change.startswith("let DDP's all-reduce overlap the backward")  # it runs DDP


def test_no_collectives_no_communication_advice(corpus_runs: dict[str, Run]) -> None:
    assert found(distributed.communication_bound, corpus_runs["simple_add"]) is None


ALLREDUCE = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"


def _ranks(tmp: Path, name: str, compute_us: tuple[float, ...]) -> Run:
    paths = []
    for rank, us in enumerate(compute_us):
        events = [ev("ProfilerStep#0", 0, 4000, "user_annotation"),
                  kernel("void at::native::vectorized_elementwise_kernel<4>", 0, us),
                  kernel(ALLREDUCE, us, 3000 - us, stream=20)]
        paths.append(make_run(tmp, f"{name}{rank}", events, rank=rank, devices=(A100,)))
    return import_traces(paths, tmp / f"{name}.run", ImportOptions(), ["test"])


def test_straggler_rank(tmp_path: Path) -> None:
    a = shows(distributed.stragglers, _ranks(tmp_path, "slow", (1000, 1500)))
    # rank 1 enters the all-reduce 500 us after rank 0, which waits for it
    assert dict(a.evidence) == {"collectives": 1, "max_skew_ns": 500_000,
                                "last_count_by_rank": {"0": 0, "1": 1},
                                "held_back_ns_by_rank": {"0": 0, "1": 500_000},
                                "waited_ns_by_rank": {"0": 500_000, "1": 0},
                                "slowest_rank": 1}
    assert a.gain_ns == 500_000 and "rank 1" in a.title
    assert "a slower GPU or link" in a.change
    # ranks of CPU ops alone (gloo on CPUs): their cores, not a GPU
    paths = [make_run(tmp_path, f"cpu{rank}", [ev("ProfilerStep#0", 0, 4000, "user_annotation"),
                                               ev("aten::mm", 0, us)], rank=rank)
             for rank, us in enumerate((1000, 1500))]
    cpu = shows(distributed.stragglers,
                import_traces(paths, tmp_path / "cpu.run", ImportOptions(), ["test"]))
    assert "fewer or shared cores" in cpu.change and "GPU" not in cpu.change


def test_ranks_without_a_process_group_hold_no_one_back(tmp_path: Path) -> None:
    """tests/data/hogwild_cpu.py: two Hogwild processes, one computing about 3x as long; no
    process group (their traces have no distributedInfo), so neither waits for the other at
    any collective: no straggler (it had read "rank 2 is a straggler", HIGH, "every rank stops
    waiting for the slowest one at the collectives")."""
    data = Path(__file__).parent / "data"
    paths = [data / f"hogwild_cpu_rank{r}.pt.trace.json.gz" for r in (1, 2)]
    busy = []
    for path in paths:
        trace = orjson.loads(gzip.decompress(path.read_bytes()))
        assert "distributedInfo" not in trace
        steps = [(e["ts"], e["ts"] + e["dur"]) for e in trace["traceEvents"]
                 if e.get("name", "").startswith("ProfilerStep#")]
        mm = [e["dur"] for e in trace["traceEvents"] if e.get("cat") == "cpu_op"
              and e["name"] == "aten::addmm" and any(a <= e["ts"] < b for a, b in steps)]
        busy.append(sum(mm))
    assert busy[1] > 2 * busy[0]  # the batch of 192 against 64: the rule's ratio is 1.1
    run = import_traces(paths, tmp_path / "hogwild.run", ImportOptions(), ["test"])
    assert run.manifest()["ranks"] == [1, 2]
    assert found(distributed.stragglers, run) is None


def test_ranks_taking_turns(tmp_path: Path) -> None:
    """Rank 1 computes 2 ms in step 0 and rank 0 1 ms; in step 1 the other way round: each
    waits 1 ms once at the all-reduce. No rank is the straggler, but 2 of the 16 ms measured
    went to waiting."""
    paths = []
    for rank, (a, b) in enumerate(((1000, 2000), (2000, 1000))):
        events = [ev("ProfilerStep#0", 0, 4000, "user_annotation"),
                  kernel("void at::native::vectorized_elementwise_kernel<4>", 0, a),
                  kernel(ALLREDUCE, a, 3000 - a, stream=20),
                  ev("ProfilerStep#1", 4000, 4000, "user_annotation"),
                  kernel("void at::native::vectorized_elementwise_kernel<4>", 4000, b),
                  kernel(ALLREDUCE, 4000 + b, 3000 - b, stream=20)]
        paths.append(make_run(tmp_path, f"turns{rank}", events, rank=rank, devices=(A100,)))
    run = import_traces(paths, tmp_path / "turns.run", ImportOptions(), ["test"])
    a = shows(distributed.stragglers, run)
    assert a.title == "the ranks take turns holding the others back"
    assert a.evidence["held_back_ns_by_rank"] == {"0": 1_000_000, "1": 1_000_000}
    assert a.gain_ns == 2_000_000 and "slowest_rank" not in a.evidence


def test_balanced_ranks_and_single_rank(tmp_path: Path, corpus_runs: dict[str, Run]) -> None:
    assert found(distributed.stragglers, _ranks(tmp_path, "even", (1000, 1020))) is None
    assert found(distributed.stragglers, corpus_runs["nccl"]) is None


CROSSED = """\
\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\tNUMA Affinity
GPU0\t X \tNV4\tNV4\tSYS\t0-23\t0
GPU1\tNV4\t X \tSYS\tNV4\t0-23\t0
GPU2\tNV4\tSYS\t X \tNV4\t24-47\t1
GPU3\tSYS\tNV4\tNV4\t X \t24-47\t1

Legend:
  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes
"""


def _with_topology(tmp: Path, name: str, text: str) -> Run:
    run = _ranks(tmp, name, (1000, 1000))
    (tmp / "topo.txt").write_text(text)
    run.add_raw(tmp / "topo.txt", "nvidia-smi-topo.txt")
    return run


def test_ring_order_avoids_the_slow_links(tmp_path: Path) -> None:
    assert distributed.parse_topology(CROSSED)[1, 2] == 5.0
    a = shows(distributed.ring_order, _with_topology(tmp_path, "ring", CROSSED))
    assert a.evidence["current_order"] == [0, 1, 2, 3] and a.evidence["best_order"] == [0, 1, 3, 2]
    assert a.evidence["current_bottleneck_gbps"] == 5.0
    assert a.evidence["best_bottleneck_gbps"] == 100.0
    assert a.evidence["comm_ns"] == 4_000_000  # 2 ranks x 2 ms all-reduce
    assert a.gain_ns == 3_800_000
    assert a.change.startswith("CUDA_VISIBLE_DEVICES=0,1,3,2")


def test_ring_order_already_on_nvlink(tmp_path: Path, corpus_runs: dict[str, Run]) -> None:
    all_nv = CROSSED.replace("\tSYS\t", "\tNV4\t")
    assert "SYS\t" not in all_nv.split("Legend")[0]
    assert found(distributed.ring_order, _with_topology(tmp_path, "nv", all_nv)) is None
    assert found(distributed.ring_order, corpus_runs["nccl"]) is None  # no topology recorded


# -- memory ------------------------------------------------------------------------------------
def _memory(tmp: Path, name: str, reserved: int) -> Run:
    mark = {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1,
            "ts": 50, "s": "t", "args": {"Device Type": 1, "Device Id": 0,
                                         "Total Reserved": reserved, "Total Allocated": reserved}}
    return imported(tmp, name, [ev("ProfilerStep#0", 0, 100, "user_annotation"), mark],
                    devices=(A100,))


def test_memory_near_capacity(tmp_path: Path) -> None:
    a = shows(device.memory_capacity, _memory(tmp_path, "full", 40_000_000_000))
    assert a.evidence["devices"] == [{"rank": 0, "device": 0, "peak_bytes": 40_000_000_000,
                                      "capacity_bytes": 42_297_524_224, "used_pct": 94.57,
                                      "source": "allocator"}]
    assert a.gain_ns is None and a.severity == "medium"


def test_memory_near_capacity_from_the_gpu_sampler(tmp_path: Path) -> None:
    """`perfswarm record`'s GPU sampler writes host-wide (rank -1) `gpuN.mem_used_bytes`."""
    run = imported(tmp_path, "sampled", [ev("ProfilerStep#0", 0, 100, "user_annotation")],
                   devices=(A100,))
    run.write_table("counters", pa.table({
        "rank": [-1, -1, -1], "ts": [10, 20, 30], "device": [0, 0, 1],
        "name": ["gpu0.mem_used_bytes", "gpu0.mem_used_bytes", "gpu1.mem_used_bytes"],
        "value": [1e9, 41e9, 42e9]}))
    a = shows(device.memory_capacity, run)
    assert a.evidence["devices"] == [{"rank": 0, "device": 0, "peak_bytes": 41_000_000_000,
                                      "capacity_bytes": 42_297_524_224, "used_pct": 96.93,
                                      "source": "sampler"}]


def test_memory_with_headroom(tmp_path: Path, corpus_runs: dict[str, Run]) -> None:
    assert found(device.memory_capacity, _memory(tmp_path, "roomy", 20_000_000_000)) is None
    assert found(device.memory_capacity, corpus_runs["simple_add"]) is None


# -- the whole report ------------------------------------------------------------------------
def test_advise_ranks_by_gain_and_is_deterministic(corpus_runs: dict[str, Run]) -> None:
    report = advise(corpus_runs["nccl"])
    # communication_bound last: no collective on the critical path, nothing to gain
    assert [a.rule for a in report.advice] == ["launch_bound", "low_utilization",
                                               "host_syncs", "communication_bound"]
    assert report.to_dict() == advise(corpus_runs["nccl"]).to_dict()
    # rank 34 of a 300-rank gloo job: its first step all-reduces for 179 of its 210 ms, its
    # loop idle (no op of its own to hide it under: no gain the overlap model can claim, and
    # fewer bytes are not modelled)
    (a,) = advise(corpus_runs["cpu_only"]).advice
    _, waited = gloo_wait_ns(corpus("cpu_only"))
    assert (a.rule, a.evidence["exposed_ns"], a.evidence["compute_only_ns"]) == (
        "communication_bound", waited, 0)
    assert a.gain_ns is None and "bf16 or fp16" in a.change  # no DDP in the trace


def test_advise_cli_json(corpus_runs: dict[str, Run], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["advise", str(corpus_runs["simple_add"].path), "--json"]) == 0
    out = orjson.loads(capsys.readouterr().out)
    assert set(out) == {"path", "measured_ns", "ranks", "advice"}
    assert [a["rule"] for a in out["advice"]] == ["low_utilization", "pageable_h2d",
                                                  "fp32_gemm", "host_syncs"]
    assert set(out["advice"][0]) == {"rule", "title", "severity", "evidence", "gain_ns",
                                     "gain_pct", "gain_of_ns", "gain_of", "gain_basis",
                                     "change"}
    assert out["advice"][0]["gain_of"] == "the traced span"  # a trace without steps


def test_every_output_says_what_a_share_is_of(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """A gain is a share of its finding's `gain_of_ns`, which is not always the measured time:
    outlier_steps' 132 ms step outside the window is 84.21% of every step the run timed
    (152 ms), while the profiled steps measure 12 ms. The report had written every share as
    "% of measured time"; it, the terminal and the JSON now say the time and what it is."""
    run = imported(tmp_path, "gen", _loader_steps(500, 3500))
    ms = 1_000_000
    _add_steps(run, [(0, 3, 12 * ms, 16 * ms, "export"), (0, 4, 16 * ms, 20 * ms, "detected"),
                     (0, 5, 20 * ms, 152 * ms, "detected"),
                     (0, 6, 152 * ms, 156 * ms, "detected")])
    said = "84.21% of 152.000 ms: every step the run timed"
    assert main(["advise", str(run.path), "--json"]) == 0
    found_ = {a["rule"]: a for a in orjson.loads(capsys.readouterr().out)["advice"]}
    assert found_["outlier_steps"]["gain_of"] == "every step the run timed"
    assert main(["advise", str(run.path)]) == 0
    assert said in " ".join(capsys.readouterr().out.split())
    page = tmp_path / "r.html"
    assert main(["report", str(run.path), "-o", str(page)]) == 0
    text = re.sub(r"<[^>]+>", " ", page.read_text())
    assert said in " ".join(text.split()) and "of measured time" not in text


def test_advise_cli_text_and_bad_run(corpus_runs: dict[str, Run], tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["advise", str(corpus_runs["nccl"].path)]) == 0
    assert "collectives run beside no compute, but off the critical path" in " ".join(
        capsys.readouterr().out.split())
    assert main(["advise", str(tmp_path / "missing")]) == 2
    assert "missing: does not exist" in capsys.readouterr().err
    (tmp_path / "file").write_text("")
    assert main(["advise", str(tmp_path / "file")]) == 2
    assert "file: not a directory" in capsys.readouterr().err


BASIS = re.compile(r"^([a-z-]+ model[ (:]|measured, no model: |"
                   r"fixed factor, no model \(|no time saved: )")


def test_every_gain_basis_names_its_model(corpus_runs: dict[str, Run], tmp_path: Path) -> None:
    runs = [*corpus_runs.values(), _chain(tmp_path, "chain", between=False),
            with_manifest(imported(tmp_path, "loader", _loader_steps(6000, 4000)), cores=4),
            _memory(tmp_path, "full", 40_000_000_000)]
    seen = {a.rule: a.gain_basis for run in runs for a in advise(run).advice}
    assert {"fusion", "data_loading", "memory_capacity", "pageable_h2d"} <= set(seen)
    for rule, basis in seen.items():
        assert BASIS.match(basis), (rule, basis)


@given(st.lists(st.tuples(st.integers(0, 200), st.integers(0, 50)), max_size=30))
def test_union_matches_a_per_ns_reference(spans: list[tuple[int, int]]) -> None:
    starts = np.array([s for s, _ in spans], np.int64)
    ends = np.array([s + d for s, d in spans], np.int64)
    covered = {t for s, d in spans for t in range(s, s + d)}
    assert total(starts, ends) == len(covered)


def test_a_run_without_torch_events_is_advised_and_analyzed(tmp_path: Path) -> None:
    """A manual-SGD loop never steps torch.optim: the Run holds counters (and samples) alone.
    advise finds nothing to say instead of dividing by zero steps; analyze reads the counters."""
    from perfswarm.analyze.summary import analyze
    from perfswarm.trace.schema import EVENTS

    run = imported(tmp_path, "sgd", [ev("aten::mm", 0, 100)])
    run.write_table("events", EVENTS.empty_table())
    run.write_table("counters", pa.table({
        "rank": pa.array([-1, -1, -1], pa.int32()), "ts": [10, 20, 30],
        "device": pa.array([-1, -1, -1], pa.int32()),
        "name": ["cpu.core0.usr", "cpu.core0.usr", "cpu.core0.usr"], "value": [90.0, 95, 97]}))
    assert advise(run).advice == ()
    assert found(host.host_syncs, run) is None
    result = analyze(run)
    assert result.events == 0 and result.ranks == ()


# -- the machine, the loop, the loader -------------------------------------------------------
def _sampled(run: Run, proc: list[float], busy: float, delay: list[float] | None = None) -> Run:
    """System-sampler counters (host, rank -1) at 1, 2, ... µs: the process tree's cores,
    its run delay where given, and each of 2 cores `busy` (half user, half system)."""
    rows: dict[str, list[Any]] = {"rank": [], "ts": [], "device": [], "name": [], "value": []}
    for i, p in enumerate(proc):
        waited = [] if delay is None else [("proc.run_delay_cores", delay[i])]
        for name, value in [("proc.cpu_cores", p), *waited,
                            *((f"cpu.core{c}.{s}", busy / 2) for c in (0, 1)
                              for s in ("usr", "sys"))]:
            for key, v in zip(rows, (-1, (i + 1) * 1000, -1, name, value), strict=True):
                rows[key].append(v)
    run.write_table("counters", pa.table(rows).cast(pa.schema([
        ("rank", pa.int32()), ("ts", pa.int64()), ("device", pa.int32()), ("name", pa.string()),
        ("value", pa.float64())])))
    return run


def test_cpu_contention(tmp_path: Path) -> None:
    """Both cores 98% busy; the run got 0.3 cores on average, 0.6 at its 90th percentile (ten
    samples 0.1 ... 1.0 in the 10 ms window): alone it would have needed half the time."""
    run = with_manifest(imported(tmp_path, "busy", _loader_steps(500, 3500)), cores=2)
    proc = [0.1, 0.2, 0.1, 0.2, 0.1, 0.2, 0.3, 0.6, 0.6, 0.6]  # mean 0.3; 90th percentile 0.6
    a = shows(host.cpu_contention, _sampled(run, proc, 0.98))
    assert dict(a.evidence) == {"over": "the profiled steps", "cores": 2,
                                "host_busy_cores": 1.96, "process_cores": 0.3,
                                "process_cores_p90": 0.6, "recorder_cores": 0.0, "samples": 10,
                                "outlier_excess_ns": 0}
    assert a.gain_ns == 6_000_000 and a.gain_of_ns == 12_000_000  # 3 steps of 4 ms
    # the same process on an idle machine, or the whole machine its own: no contention
    assert found(host.cpu_contention, _sampled(run, proc, 0.4)) is None
    assert found(host.cpu_contention, _sampled(run, [1.9] * 10, 0.98)) is None
    # a loop that had both cores got 1.1 of them while others held 0.86: more than half a
    # core (each parallel region waits for the loop's descheduled thread; 5-10x slower
    # steps, measured), though the loop still had more than half of the busy cores
    a = shows(host.cpu_contention, _sampled(run, [1.0, 1.1, 1.0, 1.2, 1.1, 1.0, 1.1, 1.2, 1.2,
                                                  2.0], 0.98))
    assert a.evidence["process_cores"] == 1.19 and a.evidence["host_busy_cores"] == 1.96
    assert found(host.cpu_contention, _sampled(run, [1.5] * 10, 0.98)) is None  # 0.46 others
    # the recorder's own perf kept 1.2 cores busy over the recording: no other process took
    # the 1.66 cores the loop did not (an oversubscribed pool under perf had been "others")
    sampled = _sampled(run, proc, 0.98)
    m = sampled.manifest()
    m.setdefault("extra", {})["record"] = {"start_ns": 0, "end_ns": 10_000_000_000,
                                           "tool_cpu_ns": {"perf": 12_000_000_000}}
    sampled.write_manifest(m)
    assert found(host.cpu_contention, sampled) is None


def test_cpu_contention_from_run_delay(tmp_path: Path) -> None:
    """With the kernel's run delay sampled, the time lost is the time the run's threads sat
    runnable: a one-thread loop at 1.0 core whose 50 ms readings quantize to 0.8-1.2 (a 90th
    percentile of 1.2 had claimed 17% lost) waited 0.01 of a core: no advice; one that ran
    0.6 of a core and waited 0.4 lost 40% of its time; two threads at 1.2 cores waiting 0.8
    between them lost 0.8 / 2 of it."""
    run = with_manifest(imported(tmp_path, "busy", _loader_steps(500, 3500)), cores=2)
    steady = [0.8, 1.2, 1.0, 1.0, 0.8, 1.2, 1.0, 1.0, 1.2, 0.8]
    assert found(host.cpu_contention, _sampled(run, steady, 0.98, [0.01] * 10)) is None
    a = shows(host.cpu_contention, _sampled(run, [0.6] * 10, 0.98, [0.4] * 10))
    assert a.evidence["run_delay_cores"] == 0.4 and a.gain_ns == 0.4 * 12_000_000
    a = shows(host.cpu_contention, _sampled(run, [1.2] * 10, 0.98, [0.8] * 10))
    assert a.gain_ns == round(0.8 / 2 * 12_000_000)
    # a tree that wanted 4 cores of the 2 (more DataLoader workers than cores) waited 2.8
    # cores' worth, 2 of them for each other: the other processes' share is the 0.8 left
    a = shows(host.cpu_contention, _sampled(run, [1.2] * 10, 0.98, [2.8] * 10))
    assert a.evidence["others_delay_cores"] == 0.8 and a.gain_ns == round(0.8 / 4 * 12_000_000)


def _traced_nothing(tmp_path: Path, name: str) -> Run:
    """A Run of 2 cores whose recorder traced and timed nothing, its sampler's span 10 us and
    perf's 7.5 us of CPU in it."""
    run = with_manifest(imported(tmp_path, name, _loader_steps(500, 3500)), cores=2)
    run.write_table("events", run.table("events").slice(0, 0))
    run.write_table("steps", run.table("steps").slice(0, 0))
    m = run.manifest()
    m.setdefault("extra", {})["record"] = {"start_ns": 0, "end_ns": 10_000,
                                           "tool_cpu_ns": {"perf": 7_500}}
    run.write_manifest(m)
    return run


def test_cpu_contention_on_a_run_that_timed_no_step(tmp_path: Path) -> None:
    """A program that only exits (exit3.run: the recorder saw no step, nothing traced) on a
    busy machine: four readings of the sampler, the process at 0.3 of a core and 0.655 cores'
    worth of its threads waiting on a runqueue, both cores busy, the recorder's perf and
    py-spy starting up at 0.75 cores. It had been told "over the profiled steps" (there are
    none), 65% of the time lost to other processes and "the step times ... inflated": the
    time is the sampler's span (3 µs here), and of the 1.7 cores not the program's, the
    recorder held 0.75, so the others caused 0.95 / 1.7 of the wait: 0.366 cores' worth."""
    run = _traced_nothing(tmp_path, "exit")
    a = shows(host.cpu_contention, _sampled(run, [0.3] * 4, 1.0, [0.655] * 4))
    assert Facts.of(run).ranks == []
    assert a.evidence["over"] == a.gain_of == ("the recording (the system sampler's span: no "
                                               "step timed, nothing traced)")
    assert a.gain_of_ns == 3000 and a.evidence["recorder_cores"] == 0.75
    assert a.evidence["others_delay_cores"] == round(0.655 * 0.95 / 1.7, 3)
    assert a.gain_ns == round(3000 * 0.655 * 0.95 / 1.7)
    assert "the times measured here" in a.change and "step" not in a.change.split(": ")[-1]


def test_cpu_contention_on_a_run_that_timed_steps_and_traced_none(tmp_path: Path) -> None:
    """A program that ran its own torch profiler (the recorder traced nothing, its hooks
    timed 4 steps of 1 µs around the sampler's 4 readings): the time lost is of the timed
    steps, as the exit test's wait; it had been said of "the recording (... no step timed,
    nothing traced)"."""
    run = _traced_nothing(tmp_path, "own")
    _add_steps(run, [(0, i + 1, 500 + 1000 * i, 1500 + 1000 * i, "detected") for i in range(4)])
    a = shows(host.cpu_contention, _sampled(run, [0.3] * 4, 1.0, [0.655] * 4))
    assert Facts.of(run).ranks == []
    assert a.evidence["over"] == a.gain_of == "every timed step"
    assert a.gain_of_ns == 4000
    assert a.gain_ns == round(4000 * 0.655 * 0.95 / 1.7)
    assert "the step times measured here" in a.change


def _add_steps(run: Run, rows: list[tuple[int, int, int, int, str]]) -> None:
    """Steps (rank, step, start, end, source) the recorder timed, added to the Run's."""
    from perfswarm.trace.schema import STEPS

    hooked = pa.table({k: [r[i] for r in rows] for i, k in
                       enumerate(("rank", "step", "start", "end", "source"))}).cast(STEPS)
    run.write_table("steps", pa.concat_tables([run.table("steps"), hooked]).cast(STEPS))



def _steps_after_window(run: Run, durs: list[int]) -> list[int]:
    """Steps 4, 5, ... of `durs` ms each the recorder timed one after another from the export
    step (step 3, at 12 ms), added to the Run's; their ends, in ms."""
    ms = 1_000_000
    ends = [12 + sum(durs[:i + 1]) for i in range(len(durs))]
    _add_steps(run, [(0, 3, 12 * ms, 12 * ms, "export"),
                     *((0, 4 + i, (e - d) * ms, e * ms, "detected")
                       for i, (d, e) in enumerate(zip(durs, ends, strict=True)))])
    return ends

def test_outlier_steps_across_the_whole_run(tmp_path: Path) -> None:
    """A step of 132 ms among steps of 4 ms (a generate() in a callback), outside the window,
    counts against every timed step; the export step is no outlier."""

    run = imported(tmp_path, "gen", _loader_steps(500, 3500))
    ms = 1_000_000
    rows = [(0, 3, 12 * ms, 16 * ms, "export"), (0, 4, 16 * ms, 20 * ms, "detected"),
            (0, 5, 20 * ms, 152 * ms, "detected"), (0, 6, 152 * ms, 156 * ms, "detected")]
    _add_steps(run, rows)
    a = shows(host.outlier_steps, run)
    # timed: 0-2 and 4-6, 4 ms each but step 5; the export step 3 is left out, and the first
    # profiled step 0 too where it times the profiler's start (over twice the other profiled
    # steps: system.profiler_start), not as here, where it is as usual as they are (it had
    # been left out whatever it took: 148 ms)
    assert a.evidence["outliers"] == [{"rank": 0, "step": 5, "dur_ns": 132 * ms}]
    assert a.evidence["median_step_ns"] == 4 * ms and a.gain_ns == 128 * ms
    assert a.gain_of_ns == 152 * ms and a.gain_pct == round(100 * 128 / 152, 2)
    assert a.change.startswith("find what runs in those steps")
    # no recorder's counter of its DataLoaders' starts: not read, neither figure (the steps
    # had read 0 of them)
    assert a.evidence["loader_start_steps"] is None and a.evidence["loader_start_ns"] is None
    # perf (1 kHz) saw the loop thread on the CPU through every step but step 5 past its
    # first 4 ms: it waited (a server's requests, a sleep), which the advice says
    _perf_samples(run, 1000, 160_000, 1000)
    perf = run.table("samples")
    keep = [not 24 * ms <= t < 152 * ms for t in perf.column("ts").to_pylist()]
    run.write_table("samples", perf.filter(pa.array(keep)))
    waited = shows(host.outlier_steps, run)
    assert waited.evidence["off_cpu_excess_ns"] == 128 * ms
    assert waited.change.startswith("their loop thread was off the CPU for 100% of their time "
                                    "beyond the median step: find what they waited for")
    run.write_table("samples", perf)  # on the CPU throughout: work ran in it
    assert shows(host.outlier_steps, run).change.startswith("find what runs in those steps")
    assert found(host.outlier_steps, imported(tmp_path, "even", _loader_steps(500, 3500, 6))) \
        is None
    # the sampler saw the process at 0.1 of a core in step 5 (0.9 elsewhere), both of the
    # host's 2 cores busy: it sat descheduled, contention, no outlier of the loop's
    from perfswarm.trace.schema import COUNTERS

    readings = [(t * ms, name, value) for t in range(4, 160, 4)
                for name, value in (("proc.cpu_cores", 0.1 if 20 < t <= 152 else 0.9),
                                    ("cpu.core0.usr", 0.95), ("cpu.core1.usr", 0.95))]
    run.write_table("counters", pa.table({
        "rank": [-1] * len(readings), "ts": [t for t, _, _ in readings],
        "name": [n for _, n, _ in readings], "device": [-1] * len(readings),
        "value": [v for _, _, v in readings]}).cast(COUNTERS))
    assert found(host.outlier_steps, with_manifest(run, cores=2)) is None
    # the process kept 0.55 of its usual CPU in step 5 (0.5 of 0.9) while other processes
    # held a core more than usual: descheduled too
    readings = [(t * ms, name, value) for t in range(4, 160, 4)
                for name, value in (("proc.cpu_cores", 0.5 if 20 < t <= 152 else 0.9),
                                    ("cpu.core0.usr", 0.95 if 20 < t <= 152 else 0.45),
                                    ("cpu.core1.usr", 0.95 if 20 < t <= 152 else 0.45))]
    run.write_table("counters", pa.table({
        "rank": [-1] * len(readings), "ts": [t for t, _, _ in readings],
        "name": [n for _, n, _ in readings], "device": [-1] * len(readings),
        "value": [v for _, _, v in readings]}).cast(COUNTERS))
    assert found(host.outlier_steps, with_manifest(run, cores=2)) is None
    # the process kept its 0.9 of a core and others held no more than usual, but its threads
    # waited 1.2 cores' worth on a runqueue in step 5: 132 x 1.2 / 2.1 = 75 ms of its 128
    # beyond the median, over half: descheduled; 0.2 of a core (13 ms) would not be
    for wait, outlier in ((1.2, False), (0.2, True)):
        readings = [(t * ms, name, value) for t in range(4, 160, 4)
                    for name, value in (("proc.cpu_cores", 0.9),
                                        ("proc.run_delay_cores", wait if 20 < t <= 152 else 0.0),
                                        ("cpu.core0.usr", 0.95), ("cpu.core1.usr", 0.95))]
        run.write_table("counters", pa.table({
            "rank": [-1] * len(readings), "ts": [t for t, _, _ in readings],
            "name": [n for _, n, _ in readings], "device": [-1] * len(readings),
            "value": [v for _, _, v in readings]}).cast(COUNTERS))
        assert (found(host.outlier_steps, with_manifest(run, cores=2)) is not None) == outlier


def _window_steps(durs: list[float], ops: list[int], covered: list[float]
                  ) -> list[dict[str, Any]]:
    """Profiled steps of `durs` ms, each of `ops` aten ops sharing `covered` ms of it."""
    events, t = [], 0.0
    for i, (d, n, c) in enumerate(zip(durs, ops, covered, strict=True)):
        events.append(ev(f"ProfilerStep#{i}", t * 1000, d * 1000, "user_annotation"))
        events += [ev("aten::mm", (t + k * c / n) * 1000, c / n * 1000) for k in range(n)]
        t += d
    return events


@pytest.mark.parametrize(("ops", "covered", "outliers"), [
    # the usual ops, slower (x-transformers' window grew to 4,320 ms against 834: its last
    # steps had been outliers, HIGH, 16% of the run, "find what runs in those steps")
    ([2] * 6, [3.8] * 4 + [15.8, 3.8], [10]),
    # the usual ops and 12 ms no op covers (a checkpoint's write): the program's
    ([2] * 6, [3.8] * 6, [4, 10]),
    # an evaluation's forward: more ops than the usual step
    ([2] * 4 + [5, 2], [3.8] * 4 + [15.8, 3.8], [4, 10]),
])
def test_outlier_steps_leave_the_profilers_slow_steps(tmp_path: Path, ops: list[int],
                                                        covered: list[float],
                                                        outliers: list[int]) -> None:
    """Profiled steps of 4 ms (step 0, the profiler's start, set aside), step 4 of 16 ms; a
    generate() outside the window (step 10, 40 ms among 4 ms ones) is an outlier either way."""
    durs = [4.0, 4.0, 4.0, 4.0, 16.0, 4.0]
    run = imported(tmp_path, "grow", _window_steps(durs, ops, covered))
    ms, ends = 1_000_000, np.cumsum([36, 4, 4, 4, 40, 4, 4, 4]).tolist()
    _add_steps(run, [(0, 6, 36 * ms, 36 * ms, "export"),  # then steps 7-13, step 10 of 40 ms
                     *((0, 6 + i, b * ms, e * ms, "detected")
                       for i, (b, e) in enumerate(itertools.pairwise(ends), 1))])
    a = shows(host.outlier_steps, run)
    assert [o["step"] for o in a.evidence["outliers"]] == outliers
    assert a.evidence["profiler_only_steps"] == (4 not in outliers)


def test_loader_workers_beyond_the_cores(tmp_path: Path) -> None:
    """Four workers fetching 5 µs batches for steps of 3.5 ms of the training process's own
    and 0.5 ms of wait: with enough workers a step takes 3.5 ms, all of it the training
    process's on one of 2 cores; the loader has the other, and one worker fills it."""
    fetch = [{**ev("DataLoader worker fetch", 10 * w, 5, "user_annotation"), "pid": 100 + w}
             for w in range(4)]
    run = with_manifest(imported(tmp_path, "w4", [*_loader_steps(500, 3500), *fetch]), cores=2)
    a = shows(loader.loader_oversubscription, run)
    assert dict(a.evidence) == {"cores": 2, "workers": 4, "ranks": 1, "loader_cores": 1.0,
                                "batch_cpu_ns": 5000}
    assert a.gain_ns is None and a.change == "DataLoader(num_workers=1)"
    assert found(loader.loader_oversubscription, with_manifest(run, cores=8)) is None


def test_untraced_python_between_the_ops(tmp_path: Path) -> None:
    """Three 10 ms steps whose loop thread runs one 2 ms op each, its process at a core:
    8 of 10 ms of Python that no op shows (a simulated environment). Not when another thread
    of the process worked through the gap (a gloo all-reduce the loop waits for), nor when
    the process sat off the CPU (sleeping, reading), nor on a run with device work."""
    def steps(other_thread: bool) -> list[dict[str, Any]]:
        events = []
        for i in range(3):
            t = i * 10_000
            events += [ev(f"ProfilerStep#{i}", t, 10_000, "user_annotation"),
                       ev("aten::addmm", t + 8_000, 2_000)]
            if other_thread:
                events.append(ev("gloo:all_reduce", t + 100, 7_800, "user_annotation", tid=2))
        return events

    cpu = {"extra": {"record": {"cuda": False, "torch_version": "2.13.0+cpu"}}}
    run = with_manifest(imported(tmp_path, "env", steps(False)), cores=2, **cpu)
    a = shows(host.untraced_python, _sampled(run, [1.0] * 10, 0.6))
    assert dict(a.evidence) == {"untraced_ns": 24_000_000, "untraced_share_pct": 80.0,
                                "traced_ns": 6_000_000, "cores_per_loop_process": 1.0}
    assert a.gain_ns is None and a.severity == "medium"
    assert found(host.untraced_python, _sampled(run, [0.3] * 10, 0.3)) is None
    # perf (1 kHz) saw the loop thread on the CPU throughout: Python; once a step only (a
    # server sleeping between requests while an idle OpenMP worker spins): none
    a = shows(host.untraced_python, _perf_samples(_sampled(run, [1.0] * 10, 0.6), 1000,
                                                  30_000, 1000))
    assert a.evidence["untraced_on_cpu_ns"] == 24_000_000  # 8 samples a ms in each gap
    assert found(host.untraced_python, _perf_samples(_sampled(run, [1.0] * 10, 0.6), 10_000,
                                                     30_000, 1000)) is None
    waits = with_manifest(imported(tmp_path, "gloo", steps(True)), cores=2, **cpu)
    assert found(host.untraced_python, _sampled(waits, [1.0] * 10, 0.6)) is None
    gpu = with_manifest(imported(tmp_path, "gpu", [*steps(False), kernel("k", 100, 50)]),
                        cores=2, **cpu)
    assert found(host.untraced_python, _sampled(gpu, [1.0] * 10, 0.6)) is None


def test_untraced_wait_for_reads(tmp_path: Path) -> None:
    """Three 10 ms steps whose loop thread runs one 2 ms op each and waits off the CPU the
    other 8 ms (perf saw it only in its ops): 24 ms of 30 waited. With the host's cores on I/O
    meanwhile (iowait 0.5 cores), reads: a thread reading one batch ahead hides them under
    the 6 ms of ops. Without iowait, nothing says what it waits for: no gain claimed, and it
    takes 30% of the steps to be told. Waiting on a runqueue (run delay) is no wait of its
    own."""
    cpu = {"extra": {"record": {"cuda": False, "torch_version": "2.13.0+cpu", "perf_hz": 1000}}}
    events = []
    for i in range(3):
        t = i * 10_000
        events += [ev(f"ProfilerStep#{i}", t, 10_000, "user_annotation"),
                   ev("aten::addmm", t + 8_000, 2_000)]
    run = with_manifest(imported(tmp_path, "reads", events), cores=2, **cpu)
    _perf_samples(run, 1000, 30_000, 1000)
    perf = run.table("samples")
    on_ops = [t % 10_000_000 >= 8_000_000 for t in perf.column("ts").to_pylist()]
    run.write_table("samples", perf.filter(pa.array(on_ops)))

    def counters(iowait: float, delay: float, reads: int = 1 << 20,
                 main: float | None = None) -> Run:
        """The sampler's readings each ms: the host's cores on I/O (`iowait`), the run's
        threads on a runqueue (`delay`; `main`, its loop process's first thread's, where
        read), and `reads` bytes a ms the run read from storage."""
        rows: dict[str, list[Any]] = {"rank": [], "ts": [], "device": [], "name": [],
                                      "value": []}
        own = [] if main is None else [("proc.1.main_run_delay_cores", main)]
        for t in range(1, 30):
            for name, value in (("proc.cpu_cores", 0.2), ("proc.run_delay_cores", delay),
                                ("proc.read_bytes", float(reads * t)), *own,
                                *((f"cpu.core{c}.{k}", v) for c in (0, 1) for k, v in
                                  (("usr", 0.1), ("sys", 0.05), ("iowait", iowait / 2)))):
                for key, v in zip(rows, (-1, t * 1_000_000, -1, name, value), strict=True):
                    rows[key].append(v)
        run.write_table("counters", pa.table(rows).cast(pa.schema([
            ("rank", pa.int32()), ("ts", pa.int64()), ("device", pa.int32()),
            ("name", pa.string()), ("value", pa.float64())])))
        return run

    a = shows(host.untraced_wait, counters(0.5, 0.0))
    assert (a.evidence["waited_ns"], a.evidence["untraced_on_cpu_ns"]) == (24_000_000, 0)
    assert a.evidence["iowait_cores"] == 0.5 and a.gain_ns == 6_000_000
    assert a.evidence["read_bytes"] == 28 << 20  # 29 readings a ms apart, 1 MiB a ms
    assert a.change.startswith("where it reads its input in the loop")
    unknown = shows(host.untraced_wait, counters(0.0, 0.0))
    assert unknown.gain_ns is None and unknown.severity == "medium"
    # the host on I/O, but the run read nothing from storage: another process's reads (a
    # loop that sleeps had been told to prefetch)
    theirs = shows(host.untraced_wait, counters(0.5, 0.0, reads=0))
    assert theirs.gain_ns is None and theirs.evidence["read_bytes"] == 0
    # its threads runnable 0.6 of a core the whole time: 18 ms of the 24 queued, 6 left (20%):
    # over the 10% that a wait with the host on I/O needs, under the 30% of one without
    queued = shows(host.untraced_wait, counters(0.5, 0.6))
    assert (queued.evidence["run_delay_ns"], queued.evidence["waited_ns"]) == (18_000_000,
                                                                               6_000_000)
    assert queued.gain_ns == 6_000_000
    assert found(host.untraced_wait, counters(0.0, 0.6)) is None
    assert found(host.untraced_wait, counters(0.5, 0.6, reads=0)) is None
    # where the sampler read the loop thread's own run delay (its process's first thread,
    # pid 1, tid 1), the tree's other threads' queueing is not its wait: 24 ms waited
    # (two ranks' OpenMP threads had hidden a 400 ms sleep that way)
    own = shows(host.untraced_wait, counters(0.0, 0.6, main=0.0))
    assert (own.evidence["run_delay_ns"], own.evidence["waited_ns"]) == (0, 24_000_000)
    assert own.evidence["rank"] == 0 and own.title.startswith("the loop waits")
    # 0.75 of a core: 22.5 ms queued, 1.5 left (5%)
    assert found(host.untraced_wait, counters(0.5, 0.75)) is None


def test_communication_bound_of_a_pipelines_sends(tmp_path: Path) -> None:
    """A pipeline's hand-off on gloo (tests/data/p2p_gloo.py: rank 1 waits in its receives for
    rank 0's sends): its communication is sends and receives alone, which async_op and larger
    collectives do not shorten; the change is the pipeline's schedule."""
    data = Path(__file__).parent / "data"
    run = import_traces([data / f"p2p_gloo_rank{r}.pt.trace.json.gz" for r in (0, 1)],
                        tmp_path / "p.run", ImportOptions(), ["test"])
    a = shows(distributed.communication_bound, run)
    assert set(a.evidence["by_op_ns"]) == {"send", "recv"}
    assert a.change == ("stages of equal time (the slowest sets the pace), bf16 activations")
    assert a.gain_basis.endswith("to hide them under; stages of equal time or fewer bytes "
                                 "(bf16 activations) shorten them (not modelled)")


SENDRECV = "ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)"


@pytest.mark.parametrize(("calls", "pipeline"), [
    (("c10d::send", "c10d::recv_"), True), (("c10d::alltoall_base_",), False), ((), False)])
def test_communication_bound_of_sendrecv_kernels(tmp_path: Path, calls: tuple[str, ...],
                                                 pipeline: bool) -> None:
    """NCCL names a pipeline's send and receive kernels SendRecv, and an all-to-all's too (it
    runs one as grouped sends and receives): 2 of each 3 ms step in SendRecv, no compute beside
    it. The program's calls say which: dist.send and recv a pipeline's stages, an
    all-to-all's (or none in the trace) the collectives' change."""
    events = []
    for i in range(3):
        t = i * 3000
        events += [ev(f"ProfilerStep#{i}", t, 3000, "user_annotation"),
                   kernel("void at::native::vectorized_elementwise_kernel<4>", t, 1000),
                   *(ev(name, t + 1000 + 10 * k, 5) for k, name in enumerate(calls)),
                   kernel(SENDRECV, t + 1000, 2000, stream=20)]
    a = shows(distributed.communication_bound,
              imported(tmp_path, "sr", events, devices=(A100,)))
    assert a.evidence["by_op_ns"] == {"SendRecv": 6_000_000}
    assert a.change == ("stages of equal time (the slowest sets the pace), bf16 activations"
                        if pipeline else "fewer, larger collectives (flatten small tensors into "
                        "one), bf16 or fp16 data, or communicate every k steps")


def test_communication_bound_on_gloo(tmp_path: Path) -> None:
    """A CPU DDP rank's steps of 10 ms: its loop computes 0..6 ms (issuing each all-reduce in a
    50 us call) and steps the optimizer at 9..10; gloo's thread all-reduces two buckets,
    3..5 ms (under the backward) and 6..9 ms (the loop idle, waiting): 3 of each step's 10 ms
    exposed."""
    events = []
    for i in range(3):
        t = i * 10_000
        events += [ev(f"ProfilerStep#{i}", t, 10_000, "user_annotation"),
                   ev("backward", t, 6_000), ev("c10d::allreduce_", t + 2_950, 50),
                   ev("gloo:all_reduce", t + 3_000, 2_000, "user_annotation", tid=2),
                   ev("c10d::allreduce_", t + 5_900, 50),
                   ev("gloo:all_reduce", t + 6_000, 3_000, "user_annotation", tid=2),
                   ev("optimizer", t + 9_000, 1_000)]
    a = shows(distributed.communication_bound, imported(tmp_path, "gloo", events))
    ms = 1_000_000
    # no device: the busy time is the host's (the rank's ops and its collectives)
    assert "device_busy_ns" not in a.evidence
    assert {k: a.evidence[k] for k in ("collectives", "comm_ns", "exposed_ns", "host_busy_ns",
                                       "compute_only_ns", "waited_for_last_rank_ns")} == {
        "collectives": 6, "comm_ns": 15 * ms, "exposed_ns": 9 * ms,
        # the loop's 50 us in each call issuing an all-reduce is no compute, the backward
        # around it though
        "host_busy_ns": 30 * ms - 6 * 50_000, "compute_only_ns": 15 * ms - 6 * 50_000,
        "waited_for_last_rank_ns": 0}
    assert a.evidence["by_op_ns"] == {"all_reduce": 15 * ms}
    # one all-reduce a step (the mean, 2.5 ms) stays exposed after the backward
    assert a.gain_ns == 9 * ms - 15 * ms // 6 * 3
    # collectives the program calls itself: no DDP knob to turn
    assert a.change.startswith("issue the collectives with async_op=True")


def test_outlier_step_that_compiled_again(tmp_path: Path) -> None:
    """torch.compile compiling again in the 132 ms step (a last short batch's new shape):
    dynamo's entire_frame_compile covers 100 of its 128 ms beyond the median, so the change
    is about recompiles; 40 ms of it would not be."""
    ms = 1_000_000
    rows = [(0, 3, 12 * ms, 16 * ms, "export"), (0, 4, 16 * ms, 20 * ms, "detected"),
            (0, 5, 20 * ms, 152 * ms, "detected"), (0, 6, 152 * ms, 156 * ms, "detected")]
    for name, compiling in (("long", 100_000), ("short", 40_000)):
        run = imported(tmp_path, name, [*_loader_steps(500, 3500),
                                        ev("entire_frame_compile", 30_000, compiling)])
        _add_steps(run, rows)
        a = shows(host.outlier_steps, run)
        assert a.evidence["compile_ns"] == compiling * 1000
        assert ("TORCH_LOGS=recompiles" in a.change) == (name == "long")


def test_outlier_steps_only_under_the_profiler_or_waiting_for_the_loader(tmp_path: Path
                                                                         ) -> None:
    """Seven profiled steps of 4 ms but the 5th of 40 (its ops 10x slower under the profiler,
    as a GNN's gathers were), seven after the window of 4 ms: the profiler's, no advice; the
    same step compiling (torch.compile) is the program's. A profiled step of 40 ms whose
    DataLoader wait is 30 of its 36 beyond the median is data_loading's."""
    ms = 1_000_000

    def steps(slow: list[dict[str, Any]]) -> list[dict[str, Any]]:
        events, t = [], 0
        for i in range(7):
            long = i == 4
            events += [ev(f"ProfilerStep#{i}", t, 40_000 if long else 4000, "user_annotation")]
            events += slow if long else [ev("aten::conv2d", t + 500, 3500)]
            t += 40_000 if long else 4000
        return events

    after = [(0, 100 + i, (70 + 4 * i) * ms, (74 + 4 * i) * ms, "detected") for i in range(7)]
    run = imported(tmp_path, "prof", steps([ev("aten::conv2d", 16_000, 39_000)]))
    _add_steps(run, after)
    assert found(host.outlier_steps, run) is None
    run = imported(tmp_path, "comp", steps([ev("entire_frame_compile", 16_000, 30_000),
                                            ev("aten::conv2d", 46_000, 9000)]))
    _add_steps(run, after)
    assert shows(host.outlier_steps, run).evidence["compile_ns"] == 30 * ms
    run = imported(tmp_path, "load", steps([
        ev("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 16_000, 30_000),
        ev("aten::conv2d", 46_000, 9000)]))
    _add_steps(run, after[:2])  # fewer after the window than in it: its outliers count
    assert found(host.outlier_steps, run) is None


def test_outlier_step_after_the_window_that_compiled_is_no_loader_wait(tmp_path: Path
                                                                       ) -> None:
    """A rank whose one slow profiled step (40 ms among 4) waited 30 ms for its DataLoader:
    its slow steps after the window, where no wait is traced, are read as the same wait, but
    not one that torch.compile compiled in for 100 of its 128 ms beyond the median (the
    recorder's clock of dynamo's compiles, HOOK_COMPILE: a last short batch's recompilation,
    /tmp/p30/styles/compiled.py recorded with -c torch, had been left to data_loading)."""
    from perfswarm.trace.schema import HOOK_COMPILE

    ms = 1_000_000
    events, t = [], 0
    for i in range(7):
        long = i == 4
        events += [ev(f"ProfilerStep#{i}", t, 40_000 if long else 4000, "user_annotation")]
        events += ([ev("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", t + 1000,
                       30_000), ev("aten::conv2d", t + 31_000, 9000)] if long
                   else [ev("aten::conv2d", t + 500, 3500)])
        t += 40_000 if long else 4000
    for compiled, advised in ((0, False), (100 * ms, True)):
        run = imported(tmp_path, f"c{compiled}", events)
        _add_steps(run, [(0, 100, 70 * ms, 74 * ms, "detected"),
                         (0, 101, 74 * ms, 206 * ms, "detected")])
        hooks = [(70 * ms, 0.0), (74 * ms, 0.0), (206 * ms, float(compiled))]
        run.write_table("counters", pa.table({
            "rank": [0] * 3, "ts": [h for h, _ in hooks], "name": [HOOK_COMPILE] * 3,
            "device": [-1] * 3, "value": [v for _, v in hooks]}).cast(COUNTERS))
        a = found(host.outlier_steps, run)
        assert (a is not None) == advised
        if a is not None:
            assert [o["step"] for o in a.evidence["outliers"]] == [101]
            assert a.evidence["compile_ns"] == 100 * ms
            assert "TORCH_LOGS=recompiles" in a.change


def test_outlier_steps_leave_out_the_warm_up(tmp_path: Path) -> None:
    """The run's first two steps took 40 ms (a TorchScript model's profiling executor, a
    first call compiling), the rest 4 ms but one of 132: the warm-up runs once, no outlier;
    the 132 ms step is. Steps the profiler recorded are judged against its slowdown."""

    run = imported(tmp_path, "warm", _loader_steps(500, 3500))  # 3 marked steps of 4 ms
    ms = 1_000_000
    rows = [(0, -2, -80 * ms, -40 * ms, "detected"), (0, -1, -40 * ms, 0, "detected"),
            (0, 3, 12 * ms, 16 * ms, "export"), (0, 4, 16 * ms, 20 * ms, "detected"),
            (0, 5, 20 * ms, 152 * ms, "detected"), (0, 6, 152 * ms, 156 * ms, "detected")]
    _add_steps(run, rows)
    a = shows(host.outlier_steps, run)
    assert a.evidence["outliers"] == [{"rank": 0, "step": 5, "dur_ns": 132 * ms}]
    assert a.evidence["warmup_steps"] == 2


def test_outlier_steps_of_an_inference_loops_batches(tmp_path: Path) -> None:
    """An inference loop's requests of 8 and 64 (the recorder's STEP_BATCH at each step's
    start): a 64 takes 8x an 8 and is no outlier; an 8 that took 10x its peers is."""
    from perfswarm.trace.schema import COUNTERS, STEP_BATCH

    run = imported(tmp_path, "serve", _loader_steps(250, 750))  # 3 marked steps of 8, 1 ms
    ms = 1_000_000
    rows, sizes, t = [], [(0, 8), (ms, 8), (2 * ms, 8)], 20 * ms
    for step in range(4, 22):
        batch = 64 if step % 3 == 0 else 8
        dur = (batch // 8) * ms * (10 if step == 10 else 1)
        rows.append((0, step, t, t + dur, "detected"))
        sizes.append((t, batch))
        t += dur
    _add_steps(run, rows)
    blind = shows(host.outlier_steps, run)  # without the batches: every 64 an outlier
    assert [o["step"] for o in blind.evidence["outliers"]] == [6, 9, 10, 12, 15, 18, 21]
    run.write_table("counters", pa.table({
        "rank": [0] * len(sizes), "ts": [s for s, _ in sizes], "name": [STEP_BATCH] * len(sizes),
        "device": [-1] * len(sizes), "value": [float(b) for _, b in sizes]}).cast(COUNTERS))
    a = shows(host.outlier_steps, run)
    assert a.evidence["outliers"] == [{"rank": 0, "step": 10, "dur_ns": 10 * ms}]
    assert a.gain_ns == 9 * ms  # beyond the 1 ms its batch of 8 takes
    # a generate loop: one batch of 4 every step, its prefill of 32 tokens (128 elements,
    # 3.3 ms) every 8th step among decode steps of 1 (4 elements, 1 ms): STEP_INPUT tells
    # them apart, and no prefill is an outlier
    from perfswarm.trace.schema import STEP_INPUT

    rows, counters, t = [], [], 20 * ms
    for step in range(4, 36):
        prefill = step % 8 == 0
        dur = 3_300_000 if prefill else ms
        rows.append((0, step, t, t + dur, "detected"))
        counters += [(t, STEP_BATCH, 4.0), (t, STEP_INPUT, 128.0 if prefill else 4.0)]
        t += dur
    gen = imported(tmp_path, "gen", _loader_steps(250, 750))
    _add_steps(gen, rows)
    gen.write_table("counters", pa.table({
        "rank": [0] * len(counters), "ts": [c[0] for c in counters],
        "name": [c[1] for c in counters], "device": [-1] * len(counters),
        "value": [c[2] for c in counters]}).cast(COUNTERS))
    assert found(host.outlier_steps, gen) is None


def _loaded_after(run: Run, quiet_ms: int, until_ms: int, got: float = 1.0,
                  waited: float = 1.0) -> None:
    """System-sampler readings a ms, from 1 to `until_ms`: the process at `got` cores; after
    `quiet_ms` both cores 98% busy and its threads `waited` cores on a runqueue (before: the
    host half busy, no run delay)."""
    ms = 1_000_000
    rows: dict[str, list[Any]] = {"rank": [], "ts": [], "device": [], "name": [], "value": []}
    for t in range(1, until_ms):
        loaded = t > quiet_ms
        for name, value in (("proc.cpu_cores", got), ("proc.run_delay_cores", waited * loaded),
                            *((f"cpu.core{c}.usr", 0.98 if loaded else 0.5) for c in (0, 1))):
            for key, v in zip(rows, (-1, t * ms, -1, name, value), strict=True):
                rows[key].append(v)
    run.write_table("counters", pa.table(rows).cast(pa.schema([
        ("rank", pa.int32()), ("ts", pa.int64()), ("device", pa.int32()), ("name", pa.string()),
        ("value", pa.float64())])))


def test_cpu_contention_outside_the_window(tmp_path: Path) -> None:
    """A quiet window (its 3 steps of 4 ms, the process at its core, the host half busy), then
    10 steps of 8 ms after it while other processes held the cores: the run's threads 1.0
    core on a runqueue beside the 1.0 they ran. Over every timed step: 80 ms of 92 waited
    half their time, 40 ms (43.5%); the window alone had said nothing."""
    run = with_manifest(imported(tmp_path, "later", _loader_steps(500, 3500)), cores=2)
    ms = 1_000_000
    _add_steps(run, [(0, 3, 12 * ms, 12 * ms, "export"),
                     *((0, 4 + i, 12 * ms + 8 * ms * i, 20 * ms + 8 * ms * i, "detected")
                       for i in range(10))])
    _loaded_after(run, 12, 92)
    a = shows(host.cpu_contention, run)
    assert a.evidence["over"] == "every timed step"
    assert a.gain_of_ns == 12 * ms + 80 * ms
    assert a.evidence["run_delay_cores"] == pytest.approx(79 / 91, abs=1e-3)


def test_cpu_contention_measured_from_descheduled_steps(tmp_path: Path) -> None:
    """After a quiet window (3 steps of 4 ms), 6 quiet steps of 4 ms and 4 of 40 ms while
    other processes held both cores (the run's threads 1.0 core on a runqueue beside the 1.0
    they ran): the run-delay model says half of those 160 ms; the steps say 4 x 36 ms were
    lost beyond the usual 4 ms step, measured, 144 ms of the 196 timed."""
    run = with_manifest(imported(tmp_path, "held", _loader_steps(500, 3500)), cores=2)
    ms = 1_000_000
    starts = [12 + 4 * i for i in range(6)] + [36 + 40 * i for i in range(4)]
    ends = [12 + 4 * (i + 1) for i in range(6)] + [36 + 40 * (i + 1) for i in range(4)]
    _add_steps(run, [(0, 3, 12 * ms, 12 * ms, "export"),
                     *((0, 4 + i, a * ms, b * ms, "detected")
                       for i, (a, b) in enumerate(zip(starts, ends, strict=True)))])
    _loaded_after(run, 36, 197)
    a = shows(host.cpu_contention, run)
    assert a.evidence["over"] == "every timed step"
    assert a.evidence["descheduled_excess_ns"] == 4 * 36 * ms == a.gain_ns
    assert a.gain_of_ns == 196 * ms and a.gain_basis.startswith("measured: the steps")


def test_outlier_steps_of_bucketed_lengths(tmp_path: Path) -> None:
    """A training loop of sequences of 16 tokens, and of 128 every fourth step
    (tests/data/bucketed_eval.py), with an evaluation (no-grad forwards) in step 6: over 2x the
    median step (read from the raw JSON) are the first (the profiler's start), the long ones
    (3 and 7) and the evaluation's. The long steps did 8x the backward work (their FLOPs) at
    the usual rate and are no outliers; the evaluation, no backward work, is."""
    trace = Path(__file__).parent / "data" / "bucketed_eval_cpu.pt.trace.json.gz"
    raw = orjson.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    marks = {int(e["name"].split("#")[1]): e for e in raw
             if e.get("name", "").startswith("ProfilerStep#")}
    median = float(np.median([m["dur"] for m in marks.values()]))
    assert sorted(s for s, m in marks.items() if m["dur"] > 2 * median) == [1, 3, 6, 7]
    # the first product: attention's input projection, [T, 8, 64] (batch_first transposed)
    tokens = {s: min((e for e in raw if e.get("name") == "aten::linear"
                      and m["ts"] <= e["ts"] < m["ts"] + m["dur"]), key=lambda e: e["ts"]
                     )["args"]["Input Dims"][0][0] for s, m in marks.items()}  # [T, 8, 64]
    assert tokens == {1: 16, 2: 16, 3: 128, 4: 16, 5: 16, 6: 64, 7: 128, 8: 16, 9: 16}  # 6: eval
    run = import_traces([trace], tmp_path / "b.run", ImportOptions(), ["bucketed_eval.py"])
    a = shows(host.outlier_steps, run)
    assert [o["step"] for o in a.evidence["outliers"]] == [6]
    assert a.evidence["warmup_steps"] == 1


def test_outlier_steps_while_every_step_waits_alike(tmp_path: Path) -> None:
    """Other processes held the cores throughout: the run's threads 1.0 core on a runqueue
    beside the 1.0 they ran, in every step alike (a loop on the CPU 45% of its time, as a
    recorded checkpoint-every-5-steps loop was). A step of 16 ms among steps of 4 ms (the
    checkpoint's write) waited no more than they did: the loop's own periodic work, an
    outlier, not contention. Half its time on a runqueue had read as descheduled, and the
    checkpoints' 12 ms beyond the usual step as contention's."""
    run = with_manifest(imported(tmp_path, "saves", _loader_steps(500, 3500)), cores=2)
    ms = 1_000_000
    durs = [4, 4, 4, 4, 16, 4, 4, 4, 4]
    ends = _steps_after_window(run, durs)
    _loaded_after(run, 0, ends[-1] + 1)
    a = shows(host.outlier_steps, run)
    assert a.evidence["outliers"] == [{"rank": 0, "step": 8, "dur_ns": 16 * ms}]
    assert a.evidence["descheduled_steps"] == 0
    assert a.gain_ns == 12 * ms and a.gain_of_ns == 12 * ms + sum(durs) * ms
    assert host._descheduled_excess(Facts.of(run)) == 0  # cpu_contention's measured part


def test_cpu_contention_leaves_the_outlier_steps_excess_to_outlier_steps(tmp_path: Path
                                                                         ) -> None:
    """Other processes held the cores throughout, the run at 0.1 of a core and its threads 1.9
    cores on a runqueue in every step alike: 0.95 of its time theirs. A step of 200 ms among
    steps of 4 ms after the window waited no more than they did: the program's own work,
    outlier_steps' 196 ms of the 244 timed. Contention's share is of the rest, 48 ms: 45.6 ms
    (it had been of all 244, 231.8 ms: with outlier_steps' 196, 175% of the time)."""
    run = with_manifest(imported(tmp_path, "once", _loader_steps(500, 3500)), cores=2)
    ms = 1_000_000
    durs = [4, 4, 4, 4, 200, 4, 4, 4, 4]
    ends = _steps_after_window(run, durs)
    _loaded_after(run, 0, ends[-1] + 1, got=0.1, waited=1.9)
    outliers = shows(host.outlier_steps, run)
    assert outliers.gain_ns == 196 * ms and outliers.gain_of_ns == 244 * ms
    gain, whole, evidence, _ = host._contention(Facts.of(run), timed=True) or (0, 0, {}, "")
    assert evidence["others_delay_cores"] == 1.9 and evidence["outlier_excess_ns"] == 196 * ms
    assert whole == 244 * ms and gain == pytest.approx((244 - 196) * ms * 0.95)
    assert outliers.gain_ns + gain <= whole
    # over the profiled steps, where no outlier ran, every share of the time counts
    _, _, profiled, _ = host._contention(Facts.of(run), timed=False) or (0, 0, {}, "")
    assert profiled["outlier_excess_ns"] == 0
    # a recording from before the run delay was sampled: the run at 0.1 and 0.4 of a core in
    # turn, the time-share model's 1 - mean / 0.4 of the 48 ms (it had been of all 244): the
    # readings at 1-243 ms inside the timed steps' span (0-244 ms), 122 of 0.1 and 121 of 0.4
    rows: dict[str, list[Any]] = {"rank": [], "ts": [], "name": [], "device": [], "value": []}
    for t in range(1, ends[-1] + 1):
        for name, value in (("proc.cpu_cores", 0.1 if t % 2 else 0.4),
                            *((f"cpu.core{c}.usr", 0.98) for c in (0, 1))):
            for key, v in zip(rows, (-1, t * ms, name, -1, value), strict=True):
                rows[key].append(v)
    run.write_table("counters", pa.table(rows).cast(COUNTERS))
    assert shows(host.outlier_steps, run).gain_ns == 196 * ms
    gain, whole, evidence, _ = host._contention(Facts.of(run), timed=True) or (0, 0, {}, "")
    assert evidence["outlier_excess_ns"] == 196 * ms and "run_delay_cores" not in evidence
    assert gain == pytest.approx((244 - 196) * ms * (1 - (122 * 0.1 + 121 * 0.4) / 243 / 0.4))


def test_outlier_steps_told_from_preemptions_by_the_loop_threads_run_delay(tmp_path: Path
                                                                           ) -> None:
    """The same loaded host, two steps of 16 ms among steps of 4 ms, each of which waited
    2 ms on a runqueue. The sampler's readings say both steps waited as all did; the loop
    thread's run delay read at its hooks (HOOK_DELAY) says one waited 14 ms (a time slice
    another process took: descheduled), the other 8 ms, half of it as every step (a
    checkpoint's write: the loop's own)."""
    from perfswarm.trace.schema import COUNTERS, HOOK_DELAY

    run = with_manifest(imported(tmp_path, "slices", _loader_steps(500, 3500)), cores=2)
    ms = 1_000_000
    durs = [4, 4, 4, 4, 16, 4, 4, 4, 16]
    waits = [2, 2, 2, 2, 14, 2, 2, 2, 8]
    ends = _steps_after_window(run, durs)
    _loaded_after(run, 0, ends[-1] + 1)
    sampled = host.outlier_steps(Facts.of(run))
    assert sampled is not None and [o["step"] for o in sampled.evidence["outliers"]] == [8, 12]
    # the hooks at the window's step ends (0, 4, 8, 12 ms: 2 ms waited in each) and after
    hooks = [0, 4, 8, 12, *ends]
    waited = np.cumsum([0, 2, 2, 2, *waits])
    run.write_table("counters", pa.concat_tables([run.table("counters"), pa.table({
        "rank": [0] * len(hooks), "ts": [t * ms for t in hooks],
        "name": [HOOK_DELAY] * len(hooks), "device": [-1] * len(hooks),
        "value": [float(w * ms) for w in waited]}).cast(COUNTERS)]).cast(COUNTERS))
    a = shows(host.outlier_steps, run)
    assert a.evidence["outliers"] == [{"rank": 0, "step": 12, "dur_ns": 16 * ms}]
    assert a.evidence["descheduled_steps"] == 1 and a.gain_ns == 12 * ms
    assert host._descheduled_excess(Facts.of(run)) == 12 * ms


def test_a_step_preempted_where_every_step_mostly_waits(tmp_path: Path) -> None:
    """Steps of 10 ms that wait 8 of them on a runqueue (the loop thread's run delay read at
    its hooks), and one of 40 ms that ran 3 ms and waited 37: its running would have brought
    12 ms of waiting at the usual share, so 25 ms of its 30 beyond the median are other
    processes' time slices: descheduled. Its share of waiting (0.93) had been set against
    the usual 0.8 alone: 5 ms, an outlier of the loop's own."""
    from perfswarm.trace.schema import COUNTERS, HOOK_DELAY

    run = with_manifest(imported(tmp_path, "busy", _loader_steps(500, 3500)), cores=2)
    ms = 1_000_000
    durs, waits = [10, 10, 10, 40, 10, 10, 10], [8, 8, 8, 37, 8, 8, 8]
    ends = _steps_after_window(run, durs)
    _loaded_after(run, 0, ends[-1] + 1)
    hooks = [12, *ends]
    waited = np.cumsum([0, *waits])
    run.write_table("counters", pa.concat_tables([run.table("counters"), pa.table({
        "rank": [0] * len(hooks), "ts": [t * ms for t in hooks],
        "name": [HOOK_DELAY] * len(hooks), "device": [-1] * len(hooks),
        "value": [float(w * ms) for w in waited]}).cast(COUNTERS)]).cast(COUNTERS))
    assert found(host.outlier_steps, run) is None
    assert host._descheduled_excess(Facts.of(run)) == 30 * ms



def test_outlier_steps_without_the_system_sampler_leave_the_runqueue_waits_out(
        tmp_path: Path) -> None:
    """`record -c torch` (no system sampler) of diffusers' train_unconditional loop (a
    UNet2DModel, /tmp/p32/thirdparty2/scripts/dfu.py) on a shared host: after the window,
    steps of 147-235 ms, a DDPMPipeline sample in one (497 ms, 72 of them on a runqueue), and
    two steps of 407 and 2,227 ms that sat 225 and 2,041 ms on a runqueue (the loop thread's
    run delay read at its hooks, the Run's figures to the ms; the script's own clock timed
    them 408 and 2,259 ms). Those two waited for a core another process held: the sample's
    step alone is the loop's own (the three had read HIGH, 29.6% of every timed step, "find
    what runs in those steps")."""
    from perfswarm.trace.schema import COUNTERS, HOOK_DELAY

    run = with_manifest(imported(tmp_path, "unet", _loader_steps(2000, 168000)), cores=2)
    ms = 1_000_000
    durs = [235, 154, 188, 156, 497, 147, 156, 150, 157, 187, 176, 170, 407, 2227]
    waits = [62, 2, 33, 4, 72, 0, 0, 0, 0, 0, 0, 0, 225, 2041]
    ends = [510 + sum(durs[:i + 1]) for i in range(len(durs))]
    _add_steps(run, [(0, 3, 510 * ms, 510 * ms, "export"),
                     *((0, 4 + i, (e - d) * ms, e * ms, "detected")
                       for i, (d, e) in enumerate(zip(durs, ends, strict=True)))])
    hooks = [0, 170, 340, 510, *ends]
    waited = np.cumsum([0, 0, 0, 0, *waits])
    run.write_table("counters", pa.table({
        "rank": [0] * len(hooks), "ts": [t * ms for t in hooks],
        "name": [HOOK_DELAY] * len(hooks), "device": [-1] * len(hooks),
        "value": [float(w * ms) for w in waited]}).cast(COUNTERS))
    a = shows(host.outlier_steps, run)
    assert a.evidence["outliers"] == [{"rank": 0, "step": 8, "dur_ns": 497 * ms}]
    assert a.evidence["descheduled_steps"] == 2
    assert host._descheduled_excess(Facts.of(run)) == (407 + 2227 - 2 * 170) * ms

# -- per-sample ops ---------------------------------------------------------------------------
# tests/data/per_sample.py: 16 samples a step, two views, each made one sample at a time; of
# each sample's ops, those of a fixed count on a sample's shape (the flip runs at random, the
# random draws take no tensor)
_PER_SAMPLE = {("aten::slice", (3, 20, 20)): 1, ("aten::mul", (3, 16, 16)): 2,
               ("aten::add", (3, 16, 16)): 2, ("aten::unsqueeze", (3, 16, 16)): 1,
               ("aten::pad", (1, 3, 16, 16)): 1, ("aten::avg_pool2d", (1, 3, 18, 18)): 1,
               ("aten::select", (1, 3, 16, 16)): 1, ("aten::randn_like", (3, 16, 16)): 1,
               ("aten::clamp", (3, 16, 16)): 1}


def _profiler_steps(trace: Path) -> list[tuple[int, int, int]]:
    """(start ns, end ns, step) of each ProfilerStep span of the raw JSON, by start."""
    events = orjson.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]

    def span(e: dict[str, Any]) -> tuple[int, int]:
        start = Decimal(str(e["ts"])) * 1000
        return int(start), int(start + Decimal(str(e["dur"])) * 1000)

    return sorted((*span(e), int(e["name"].split("#")[1])) for e in events
                  if e.get("name", "").startswith("ProfilerStep#"))


def _top_level_ops(trace: Path) -> list[tuple[int, str, tuple[int, ...], int, int]]:
    """(step, name, first input's dims, start ns, end ns) of the main thread's ops that no
    other op holds, inside each ProfilerStep, from the raw JSON."""
    events = orjson.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]

    def span(e: dict[str, Any]) -> tuple[int, int]:
        start = Decimal(str(e["ts"])) * 1000
        return int(start), int(start + Decimal(str(e["dur"])) * 1000)

    steps = _profiler_steps(trace)
    main_tid = next(e["tid"] for e in events if e.get("name", "").startswith("ProfilerStep#"))
    ops = sorted((span(e), e) for e in events
                 if e.get("cat") == "cpu_op" and e["tid"] == main_tid)
    out, reach = [], 0
    for (start, end), e in ops:
        if start >= reach:
            first = (e["args"].get("Input Dims") or [[]])[0]
            step = next((n for lo, hi, n in steps if lo <= start < hi), None)
            if step is not None and all(isinstance(d, int) for d in first):
                out.append((step, e["name"], tuple(first), start, end))
        reach = max(reach, end)
    return out


def test_per_sample_ops_on_main_thread_augmentation(tmp_path: Path) -> None:
    """A real trace whose views are augmented one sample at a time: each group's calls a step
    and their time, against the raw JSON; the loop's Python between them counted at most the
    median gap each."""
    trace = Path(__file__).parent / "data" / "per_sample_cpu.pt.trace.json.gz"
    run = import_traces([trace], tmp_path / "ps.run", ImportOptions(), ["test"])
    a = shows(samples.per_sample_ops, run)
    top = _top_level_ops(trace)
    mine = [t for t in top if (t[1], t[2]) in _PER_SAMPLE]
    per_step = Counter((t[0], t[1], t[2]) for t in mine)
    assert set(per_step.values()) == {32, 64}  # 16 samples x 2 views, x 2 for mul and add
    assert all(per_step[(s, n, d)] == 32 * k for s in {t[0] for t in top}
               for (n, d), k in _PER_SAMPLE.items())
    assert a.evidence["samples_per_step"] == 16
    assert a.evidence["op_groups"] == len(_PER_SAMPLE)
    assert a.evidence["calls_per_step"] == 32 * sum(_PER_SAMPLE.values())
    assert a.evidence["per_sample_ns"] == sum(end - start for *_, start, end in mine)
    sums = Counter()
    for step, _name, _dims, start, end in mine:
        sums[step] += end - start
    assert a.evidence["per_sample_step_ns"] == int(np.median(list(sums.values())))
    # the median step itself, from the raw JSON's ProfilerStep spans (it had held the
    # per-sample calls' time in the median step)
    spans = sorted((b - a_ for a_, b, _ in _profiler_steps(trace)))
    assert a.evidence["median_step_ns"] == round(np.median(spans))
    assert a.evidence["median_step_ns"] > 2 * a.evidence["per_sample_step_ns"]
    assert a.evidence["top_1"].startswith("aten::avg_pool2d 1x3x18x18: 32 a step")
    # a whole step's ops in a row of per-sample calls, gaps capped at their median
    rows = sorted(top, key=lambda t: t[3])
    gaps = [(b[0], b[3] - a_[4]) for a_, b in itertools.pairwise(rows)
            if (a_[1], a_[2]) in _PER_SAMPLE and (b[1], b[2]) in _PER_SAMPLE and a_[0] == b[0]]
    cap = np.median([g for _, g in gaps])
    python = Counter()
    for step, gap in gaps:
        python[step] += min(gap, cap)
    assert a.evidence["python_between_step_ns"] == round(np.median(list(python.values())))
    assert 0 < a.gain_ns <= 3 * (a.evidence["per_sample_step_ns"]
                                 + a.evidence["python_between_step_ns"])
    assert "num_workers" in a.change and "whole batch" in a.change
    # the program timed four steps after the window at half the profiled median: the gain,
    # at the program's own speed, is a share of the window at that speed too (it had been of
    # the profiled window, half as large a share)
    steps = run.table("steps").to_pylist()
    median = int(np.median([s["end"] - s["start"] for s in steps]))
    end = max(s["end"] for s in steps)
    steps += [{"rank": 0, "step": 10 + i, "start": end + i * median // 2,
               "end": end + (i + 1) * median // 2, "source": "detected"} for i in range(4)]
    run.write_table("steps", pa.Table.from_pylist(steps, schema=STEPS))
    slowed = shows(samples.per_sample_ops, run)
    assert slowed.evidence["profiler_slowdown"] == pytest.approx(2.0, abs=0.01)
    facts = Facts.of(run)
    assert slowed.gain_of_ns == round(facts.wall_ns / facts.profiler_slowdown)


@pytest.mark.parametrize("name", ["nanogpt_cpu", "transformer_cpu", "mlp_adam_cpu",
                                  "loader_workers_main", "mlp16_sgd_cpu"])
def test_no_per_sample_ops_in_batched_loops(tmp_path: Path, name: str) -> None:
    """Loops whose ops take the whole batch (a layer's ops repeat once per layer, not per
    sample) have none; nor 16 layers' single-tensor SGD updates at batch 16, a bias of 64 a
    layer (16 calls a step of a [64, 64] weight's rows: MEDIUM 7.1% before)."""
    trace = Path(__file__).parent / "data" / f"{name}.pt.trace.json.gz"
    run = import_traces([trace], tmp_path / "b.run", ImportOptions(), ["test"])
    assert found(samples.per_sample_ops, run) is None


def test_outlier_steps_leave_a_bursty_loaders_unseen_waits_to_data_loading(tmp_path: Path
                                                                           ) -> None:
    """Every third step of 16 ms among steps of 2 ms (2 DataLoader workers handing batches over
    in bursts; the audit's: 41.6% outlier_steps beside data_loading's 72.9%, the same time
    twice): in the window each slow step waits 14 ms for its loader, so the three outside it,
    where no wait is traced, are data_loading's too. Where the window's slow steps compute
    more instead, all five are outliers: 5 x 14 ms beyond the median."""
    ms = 1_000_000
    loader = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"

    def window(slow: list[dict[str, Any]]) -> list[dict[str, Any]]:
        events, t = [], 0
        for i in range(6):
            long = i % 3 == 2
            events.append(ev(f"ProfilerStep#{i}", t, 16_000 if long else 2000, "user_annotation"))
            events += [{**e, "ts": e["ts"] + t} for e in slow] if long else [
                ev("aten::conv2d", t + 250, 1500)]
            t += 16_000 if long else 2000
        return events

    after = [(0, 6, 40 * ms, 42 * ms, "export")]
    t = 42 * ms
    for i in range(7, 16):
        d = 16 * ms if i % 3 == 2 else 2 * ms
        after.append((0, i, t, t + d, "detected"))
        t += d
    run = imported(tmp_path, "bursty", window([ev(loader, 0, 14_000),
                                                ev("aten::conv2d", 14_250, 1500)]))
    _add_steps(run, after)
    assert found(host.outlier_steps, run) is None
    # two convolutions where the usual step runs one: more work (the usual op slower would be
    # the profiler's, test_outlier_steps_leave_the_profilers_slow_steps)
    run = imported(tmp_path, "computes", window([ev("aten::conv2d", 250, 7750),
                                                  ev("aten::conv2d", 8000, 7750)]))
    _add_steps(run, after)
    a = shows(host.outlier_steps, run)
    assert [o["step"] for o in a.evidence["outliers"]] == [2, 5, 8, 11, 14]
    assert a.evidence["loader_steps"] == 0 and a.gain_ns == 5 * 14 * ms
