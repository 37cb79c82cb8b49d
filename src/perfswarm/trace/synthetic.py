"""Synthetic Kineto traces shaped like real torch.profiler output, for benchmarks and tests.

Each step is a forward/backward/optimizer pass: nested cpu_ops with shapes,
runtime launches with ac2g flows, kernels on two streams, copies, an NCCL
all-reduce and a device synchronize (the loss read back). Steps keep one schedule
on every rank (STEP_NS apart), so traces of several ranks (seeds) behave like one
job: each rank enters the all-reduce when its own work is done, and every rank's
all-reduce ends together, when the last one arrived. Everything derives from a
seed, so the same arguments give the same bytes.
"""

from __future__ import annotations

import gzip
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from perfswarm.trace.timebase import us_json

BASE_TIME_NS = 1_711_964_646_000_000_000
_OPS = ("aten::linear", "aten::addmm", "aten::relu", "aten::conv2d", "aten::add", "aten::mul",
        "aten::softmax", "aten::layer_norm", "aten::embedding_bag", "aten::copy_")
_KERNELS = (
    "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>(Params)",
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>",
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps>>",
    "void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 512, true, 1>",
    "ampere_sgemm_128x64_nn",
)
_ALLREDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
OPS_PER_STEP = 200
# A step's length on every rank: a rank's 200 ops and kernels take 5.5 +- 0.13 ms (at most 6.0
# in 3,200 steps of 16 seeds); one that runs later still gets a 10 us all-reduce.
STEP_NS = 6_500_000


class _Writer:
    def __init__(self, seed: int, pid: int, tid: int) -> None:
        self.rng = random.Random(seed)
        self.pid, self.tid = pid, tid
        self.external = 0
        self.correlation = 0
        self.last_end = 0  # of the last op, host or device
        self.host_end = 0  # of the last cpu_op

    def ops(self, t: int, count: int, step: int) -> Iterator[dict[str, Any]]:
        """`count` cpu_ops from time t, each launching one kernel; yields events."""
        rng = self.rng
        for _ in range(count):
            self.external += 1
            self.correlation += 1
            name = _OPS[rng.randrange(len(_OPS))]
            dur = rng.randrange(8_000, 40_000)
            dims = [[rng.choice((32, 64, 128, 256)), rng.choice((256, 512, 1024))],
                    [rng.choice((256, 512, 1024)), 1024]]
            yield {"ph": "X", "cat": "cpu_op", "name": name, "pid": self.pid, "tid": self.tid,
                   "ts": us_json(t), "dur": us_json(dur),
                   "args": {"External id": self.external, "Record function id": self.external,
                            "Sequence number": step, "Input Dims": dims,
                            "Input type": ["float", "float"],
                            "Input Strides": [[dims[0][1], 1], [dims[1][1], 1]],
                            "Concrete Inputs": ["", ""], "Fwd thread id": 0,
                            "Module Hierarchy": "model.encoder.layers.3.mlp.fc1",
                            "Call stack": "torch/nn/modules/linear.py(116): forward",
                            "Ev Idx": self.external}}
            launch_ts = t + dur // 3
            launch_dur = rng.randrange(3_000, 9_000)
            yield {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel",
                   "pid": self.pid, "tid": self.tid, "ts": us_json(launch_ts),
                   "dur": us_json(launch_dur),
                   "args": {"External id": self.external, "cbid": 211,
                            "correlation": self.correlation, "Ev Idx": self.external}}
            yield {"ph": "s", "id": self.correlation, "pid": self.pid, "tid": self.tid,
                   "ts": us_json(launch_ts), "cat": "ac2g", "name": "ac2g"}
            k_ts = launch_ts + launch_dur + rng.randrange(2_000, 30_000)
            stream = 7 if rng.random() < 0.8 else 20
            kernel = _KERNELS[rng.randrange(len(_KERNELS))]
            yield {"ph": "X", "cat": "kernel", "name": kernel, "pid": 0, "tid": stream,
                   "ts": us_json(k_ts), "dur": us_json(rng.randrange(2_000, 60_000)),
                   "args": {"External id": self.external, "queued": 0, "device": 0,
                            "context": 1, "stream": stream, "correlation": self.correlation,
                            "registers per thread": 64, "shared memory": 0,
                            "blocks per SM": round(rng.random() * 4, 6),
                            "warps per SM": round(rng.random() * 64, 6),
                            "grid": [rng.randrange(1, 512), 1, 1], "block": [256, 1, 1],
                            "est. achieved occupancy %": rng.randrange(10, 100)}}
            yield {"ph": "f", "id": self.correlation, "pid": 0, "tid": stream, "ts": us_json(k_ts),
                   "cat": "ac2g", "name": "ac2g", "bp": "e"}
            t += dur + rng.randrange(1_000, 5_000)
            self.host_end = t
            self.last_end = max(self.last_end, t, k_ts + 60_000)

    def step(self, t: int, step: int, ops: int) -> tuple[list[dict[str, Any]], int]:
        events = list(self.ops(t + 5_000, ops, step))
        end = t + STEP_NS
        arrive = self.last_end + 50_000
        self.correlation += 1
        events.append({"ph": "X", "cat": "kernel", "name": _ALLREDUCE, "pid": 0, "tid": 20,
                       "ts": us_json(arrive), "dur": us_json(max(end - 60_000 - arrive, 10_000)),
                       "args": {"External id": self.external, "device": 0, "stream": 20,
                                "correlation": self.correlation}})
        events.append({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)",
                       "pid": 0, "tid": 7, "ts": us_json(t + 1_000), "dur": us_json(3_000),
                       "args": {"device": 0, "stream": 7, "correlation": self.correlation + 1,
                                "bytes": 4_194_304, "memory bandwidth (GB/s)": 1.4}})
        self.correlation += 2
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaDeviceSynchronize",
                       "pid": self.pid, "tid": self.tid, "ts": us_json(self.host_end),
                       "dur": us_json(max(end - 20_000, arrive + 20_000) - self.host_end),
                       "args": {"cbid": 165, "correlation": self.correlation}})
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}",
                       "pid": self.pid, "tid": self.tid, "ts": us_json(t), "dur": us_json(end - t),
                       "args": {"External id": 0, "Record function id": 0}})
        return events, end


def trace(events: int = 200_000, seed: int = 0, rank: int = 0) -> dict[str, Any]:
    """A Kineto-shaped trace with about `events` events (each op adds five, flows included)."""
    steps = max(1, events // (OPS_PER_STEP * 5 + 4))
    writer = _Writer(seed, pid=4242 + rank, tid=4242 + rank)
    out: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "ts": us_json(0), "pid": writer.pid, "tid": 0,
         "args": {"name": "python3"}},
        {"name": "thread_name", "ph": "M", "ts": us_json(0), "pid": 0, "tid": 7,
         "args": {"name": "stream 7"}},
    ]
    t = 1_000_000_000
    for s in range(steps):
        step_events, t = writer.step(t, s, OPS_PER_STEP)
        out += step_events
        t += 50_000
    return {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "NVIDIA A100-SXM4-80GB", "totalGlobalMem":
                              85_899_345_920, "computeMajor": 8, "computeMinor": 0,
                              "numSms": 108}],
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 1},
        "traceEvents": out,
        "traceName": "synthetic",
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": BASE_TIME_NS,
    }


def dumps(data: dict[str, Any]) -> bytes:
    """Kineto's layout: one event per line inside `traceEvents`, metadata around it."""
    head = {k: v for k, v in data.items() if k not in ("traceEvents", "baseTimeNanoseconds")}
    lines = b",\n".join(orjson.dumps(e) for e in data["traceEvents"])
    tail = orjson.dumps(data.get("baseTimeNanoseconds"))
    return (orjson.dumps(head)[:-1] + b', "traceEvents": [\n' + lines
            + b'\n], "baseTimeNanoseconds": ' + tail + b"}\n")


def write(path: Path, events: int = 200_000, seed: int = 0, rank: int = 0) -> Path:
    """Write a synthetic trace as `.json` or `.json.gz` (by suffix); returns the path."""
    data = dumps(trace(events, seed, rank))
    if path.suffix == ".gz":
        data = gzip.compress(data, compresslevel=3, mtime=0)
    path.write_bytes(data)
    return path
