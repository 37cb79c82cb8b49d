"""Writes p2p_gloo_busy_rank1.pt.trace.json.gz and p2p_gloo_late_rank0.pt.trace.json.gz from
p2p_gloo.py's traces (python p2p_gloo_variants.py, here):

- busy: rank 1 computing while its third receive completes, as a pipeline that posts irecv,
  computes, then waits: an aten::mm on its thread from 0.1 ms after that receive's gloo:recv
  range starts to 0.1 ms before it ends, and the range ending 3.3 ms earlier, inside it;
- late: rank 0's profiler starting a step later: its events before its ProfilerStep#2 dropped
  (its first send with them), so rank 1's first receive has no send in the trace."""
import gzip
import json
from typing import Any

from trace_gz import gzip_trace


def read(rank: int) -> dict[str, Any]:
    with gzip.open(f"p2p_gloo_rank{rank}.pt.trace.json.gz") as f:
        trace: dict[str, Any] = json.load(f)
    return trace


def write(trace: dict[str, Any], out: str) -> None:
    with open(out, "w") as f:
        json.dump(trace, f)
    gzip_trace(out)


busy = read(1)
third = sorted((e for e in busy["traceEvents"] if e.get("name") == "gloo:recv"),
               key=lambda e: e["ts"])[2]
busy["traceEvents"].append({
    "ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": third["pid"], "tid": third["tid"],
    "ts": third["ts"] + 100, "dur": third["dur"] - 200,
    "args": {"External id": 999999, "Input Dims": [[16, 256], [256, 256]],
             "Input type": ["float", "float"], "Concrete Inputs": ["", ""]}})
third["dur"] -= 3300
write(busy, "p2p_gloo_busy_rank1.pt.trace.json")

late = read(0)
second = next(e["ts"] for e in late["traceEvents"] if e.get("name") == "ProfilerStep#2")
late["traceEvents"] = [e for e in late["traceEvents"] if e["ph"] == "M" or e["ts"] >= second]
write(late, "p2p_gloo_late_rank0.pt.trace.json")
