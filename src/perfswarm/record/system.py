"""System sampler (psutil): per-core usr/sys/iowait, memory, disk and network bytes, process tree.

CPU values are fractions of one core over the interval since the previous
reading; byte counters are cumulative since the recording began.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any

import psutil

from perfswarm.record.base import Clock, Sampler


def cpu_fractions(prev: list[Any], now: list[Any]) -> dict[str, float]:
    """Per-core user/system/iowait shares between two psutil.cpu_times(percpu=True) readings."""
    out: dict[str, float] = {}
    for core, (a, b) in enumerate(zip(prev, now, strict=True)):
        total = sum(b) - sum(a)
        if total <= 0:
            continue
        for field in ("user", "system", "iowait"):
            short = {"user": "usr", "system": "sys"}.get(field, field)
            delta = getattr(b, field, 0.0) - getattr(a, field, 0.0)
            out[f"cpu.core{core}.{short}"] = round(max(0.0, delta) / total, 6)
    return out


def tree_pids(root: int) -> list[int]:
    """`root` and its descendants, from /proc/PID/task/TID/children: a walk of the tree only.

    psutil's children(recursive=True) reads every process on the machine (milliseconds
    per call on a busy host), which at 20 Hz would cost more than the 1%-of-a-core budget.
    """
    out: list[int] = []
    todo = [root]
    while todo:
        pid = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        out.append(pid)
        for tid in tasks:
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/children") as f:
                todo.extend(int(c) for c in f.read().split())
    return out


class SystemSampler(Sampler):
    name = "system"

    def __init__(self, raw: Path, hz: float, clock: Clock | None = None) -> None:
        super().__init__(raw, hz, clock or time.time_ns)
        self._cpu = psutil.cpu_times(percpu=True)
        self._disk0 = psutil.disk_io_counters()
        self._net0 = psutil.net_io_counters()
        self._tree_cpu: dict[int, float] = {}
        self._tree_at = 0.0
        self._procs: dict[int, psutil.Process] = {}

    def read(self) -> dict[str, float]:
        cpu = psutil.cpu_times(percpu=True)
        values = cpu_fractions(self._cpu, cpu)
        self._cpu = cpu
        mem = psutil.virtual_memory()
        values["mem.used_bytes"] = float(mem.used)
        values["mem.available_bytes"] = float(mem.available)
        disk = psutil.disk_io_counters()
        if disk is not None and self._disk0 is not None:
            values["disk.read_bytes"] = float(disk.read_bytes - self._disk0.read_bytes)
            values["disk.write_bytes"] = float(disk.write_bytes - self._disk0.write_bytes)
        net = psutil.net_io_counters()
        values["net.rx_bytes"] = float(net.bytes_recv - self._net0.bytes_recv)
        values["net.tx_bytes"] = float(net.bytes_sent - self._net0.bytes_sent)
        values.update(self._tree())
        return values

    def _tree(self) -> dict[str, float]:
        """The child's process tree: CPU (cores busy since last reading), RSS, process count."""
        procs = []
        for pid in tree_pids(self.pid):
            with contextlib.suppress(psutil.Error):
                if pid not in self._procs:
                    self._procs[pid] = psutil.Process(pid)
                procs.append(self._procs[pid])
        if not procs:
            return {}
        cpu_s: dict[int, float] = {}
        rss = 0
        for p in procs:
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                cpu_s[p.pid] = t.user + t.system
                rss += p.memory_info().rss
        now = time.monotonic()
        busy = sum(v - self._tree_cpu.get(pid, v) for pid, v in cpu_s.items())
        elapsed = now - self._tree_at if self._tree_at else 0.0
        self._tree_cpu, self._tree_at = cpu_s, now
        out = {"proc.rss_bytes": float(rss), "proc.count": float(len(procs))}
        if elapsed > 0:
            out["proc.cpu_cores"] = round(max(0.0, busy) / elapsed, 6)
        return out
