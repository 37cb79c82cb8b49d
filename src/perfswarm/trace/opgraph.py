"""An op graph written as the Kineto trace torch.profiler(record_shapes=True) would write of it:
each iteration a `ProfilerStep#N` around its ops, every op a `cpu_op` with its `Input Dims`
and `Input type`, the backward ops of one autograd node inside
`autograd::engine::evaluate_function: <node>` and `<node>` (as the autograd engine records
them). Recorded on a CPU, that is all; recorded on a GPU (`device` given), every op also
launches its kernels (`cudaLaunchKernel` inside the op, the kernel on stream 7 after the
launch latency and the kernel before it, joined by correlation id), and each iteration ends
in a `cudaDeviceSynchronize` that waits for its last kernel (the loss read back), so the
step's end is the device's (or, without it, the host runs ahead of the device).

A forecast reads such a Run as it reads a recorded one (`perfswarm predict RUN --device`):
the way a whole-model measurement that comes as an op graph with shapes (NeuSight's labels,
benchmarks/gpu_label_runs.py) becomes a Run.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from perfswarm.trace.synthetic import BASE_TIME_NS, dumps
from perfswarm.trace.timebase import us_json

PID: Final = 1
MAIN_TID: Final = 1
STREAM: Final = 7
OP_NS: Final = 20_000  # an op's host time, its launches included
LAUNCH_NS: Final = 5_000  # a launch call
LAUNCH_LAG_NS: Final = 3_000  # launch call start -> its kernel on an idle stream
STEP_GAP_NS: Final = 50_000  # between iterations


@dataclass(frozen=True)
class TraceOp:
    name: str  # aten::...
    dims: tuple[tuple[int, ...], ...]  # its inputs' shapes (Input Dims)
    types: tuple[str, ...]  # and types (Input type: float, c10::Half, ...)
    grad_fn: str = ""  # a backward op: the autograd node that runs it (AddmmBackward0)
    kernels: tuple[tuple[str, int], ...] = ()  # recorded on a GPU: (kernel name, ns) it launched


class _Writer:
    def __init__(self) -> None:
        self.t = 1_000_000
        self.device_free = 0  # when stream 7 finishes its last kernel
        self.correlation = 0
        self.external = 0

    def op(self, op: TraceOp, step: int) -> Iterator[dict[str, Any]]:
        self.external += 1
        start = self.t
        dur = max(OP_NS, len(op.kernels) * (LAUNCH_NS + 1_000) + 2_000)
        args = {"External id": self.external, "Record function id": self.external,
                "Sequence number": step, "Input Dims": [list(d) for d in op.dims],
                "Input type": list(op.types)}
        yield _event("cpu_op", op.name, MAIN_TID, start, dur, args)
        launch = start + 1_000
        for kernel, ns in op.kernels:
            self.correlation += 1
            yield _event("cuda_runtime", "cudaLaunchKernel", MAIN_TID, launch, LAUNCH_NS,
                         {"External id": self.external, "correlation": self.correlation})
            begin = max(launch + LAUNCH_LAG_NS, self.device_free)
            yield {"ph": "X", "cat": "kernel", "name": kernel, "pid": 0, "tid": STREAM,
                   "ts": us_json(begin), "dur": us_json(ns),
                   "args": {"External id": self.external, "device": 0, "stream": STREAM,
                            "correlation": self.correlation}}
            self.device_free = begin + ns
            launch += LAUNCH_NS + 1_000
        self.t = start + dur

    def step(self, ops: Sequence[TraceOp], step: int, sync: bool) -> list[dict[str, Any]]:
        start = self.t
        events: list[dict[str, Any]] = []
        self.t += 1_000
        i = 0
        while i < len(ops):
            node = ops[i].grad_fn
            j = i + 1
            while node and j < len(ops) and ops[j].grad_fn == node:
                j += 1  # the ops one autograd node runs
            if node:
                outer = self.t
                self.t += 2_000
                inner: list[dict[str, Any]] = []
                for op in ops[i:j]:
                    inner += self.op(op, step)
                self.t += 1_000
                events += [_event("cpu_op", f"autograd::engine::evaluate_function: {node}",
                                  MAIN_TID, outer, self.t - outer, {}),
                           _event("cpu_op", node, MAIN_TID, outer + 1_000,
                                  self.t - outer - 2_000, {}), *inner]
                self.t += 1_000
            else:
                events += self.op(ops[i], step)
            i = j
        if sync:
            self.correlation += 1
            end = max(self.t + LAUNCH_NS, self.device_free + LAUNCH_LAG_NS)
            events.append(_event("cuda_runtime", "cudaDeviceSynchronize", MAIN_TID, self.t,
                                 end - self.t, {"correlation": self.correlation}))
            self.t = end
        self.t += 1_000
        events.append(_event("user_annotation", f"ProfilerStep#{step}", MAIN_TID, start,
                             self.t - start, {}))
        self.t += STEP_GAP_NS
        return events


def _event(cat: str, name: str, tid: int, ts: int, dur: int, args: dict[str, Any]
           ) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": PID, "tid": tid, "ts": us_json(ts),
            "dur": us_json(dur), "args": args}


def trace(steps: Sequence[Sequence[TraceOp]], device: Mapping[str, Any] | None = None,
          sync: bool = True) -> dict[str, Any]:
    """The trace of `steps` (each an iteration's ops in order), recorded on `device` (its
    deviceProperties entry: `name` as torch.cuda.get_device_name() gives it, `totalGlobalMem`,
    `numSms`; its kernels as the ops give them) or, without one, on a CPU. On a GPU, `sync`:
    each iteration ends waiting for its last kernel (else the host runs ahead)."""
    writer = _Writer()
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "ts": us_json(0), "pid": PID, "tid": 0,
         "args": {"name": "python3"}}]
    for i, ops in enumerate(steps):
        events += writer.step(ops, i, sync and device is not None)
    out: dict[str, Any] = {"schemaVersion": 1, "traceEvents": events,
                           "traceName": "op graph", "displayTimeUnit": "ms",
                           "baseTimeNanoseconds": BASE_TIME_NS}
    if device is not None:
        out["deviceProperties"] = [{"id": 0, **device}]
    return out


def write(path: Path, steps: Sequence[Sequence[TraceOp]],
          device: Mapping[str, Any] | None = None, sync: bool = True) -> Path:
    """Write the trace of `steps` (see `trace`) as Kineto's JSON; returns the path."""
    path.write_bytes(dumps(trace(steps, device, sync)))
    return path
