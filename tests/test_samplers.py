"""The system and GPU samplers' pure parts: procfs parsing (against psutil on the same files),
CPU shares, and NVML readings through a fake NVML."""

from __future__ import annotations

import itertools
import os
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import psutil
import pynvml
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from perfswarm.recorder import system
from perfswarm.recorder.gpu import NO_GPU, GpuSampler
from perfswarm.trace.readers.sampler import (
    SHARES,
    cpu_fractions,
    cpu_rows,
    parse_cpu_lines,
    read_jsonl,
    value_rows,
)

PROC_FILES = ("stat", "meminfo", "diskstats", "net/dev", "cpuinfo")


@pytest.fixture
def frozen_proc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of this host's procfs system files, with psutil pointed at it too."""
    root = tmp_path / "proc"
    (root / "net").mkdir(parents=True)
    for name in PROC_FILES:
        (root / name).write_bytes(Path("/proc", name).read_bytes())
    monkeypatch.setattr(psutil, "PROCFS_PATH", str(root))
    psutil.disk_io_counters.cache_clear()  # type: ignore[attr-defined]
    psutil.net_io_counters.cache_clear()  # type: ignore[attr-defined]
    return root


def test_procfs_parsers_agree_with_psutil(frozen_proc: Path) -> None:
    text = {name: (frozen_proc / name).read_bytes() for name in PROC_FILES}
    mem = psutil.virtual_memory()
    assert system.parse_meminfo(text["meminfo"]) == (mem.used, mem.available)
    disk = psutil.disk_io_counters()
    assert disk is not None
    disks = system.parse_diskstats(text["diskstats"], system.whole_disks())
    assert (disks.read, disks.written) == (disk.read_bytes, disk.write_bytes)
    net = psutil.net_io_counters()
    assert system.parse_net_dev(text["net/dev"]) == (net.bytes_recv, net.bytes_sent)
    stats = psutil.cpu_stats()
    assert system.parse_stat_totals(text["stat"]) == (
        stats.ctx_switches, stats.interrupts, stats.soft_interrupts)
    per_disk = psutil.disk_io_counters(perdisk=True)
    for name, (ios, ms, _inflight, _weighted) in disks.io.items():
        d = per_disk[name]
        assert (ios, ms) == (d.read_count + d.write_count, d.read_time + d.write_time)
    if not Path("/sys/devices/system/cpu/cpu0/cpufreq").exists():  # psutil reads cpuinfo too
        assert list(system.parse_cpuinfo_mhz(text["cpuinfo"]).values()) == [
            f.current for f in psutil.cpu_freq(percpu=True)]
    rows = parse_cpu_lines(system.cpu_lines(text["stat"]).decode())
    tick = os.sysconf("SC_CLK_TCK")
    theirs = psutil.cpu_times(percpu=True)
    assert rows[:, 0].tolist() == list(range(len(theirs)))  # every core online here
    for row, t in zip(rows, theirs, strict=True):
        assert row[1] / tick == pytest.approx(t.user) and row[3] / tick == pytest.approx(t.system)
        assert row[5] / tick == pytest.approx(t.iowait)


def test_parse_pid_stat_counts_fields_after_the_name() -> None:
    # comm may hold spaces and parentheses; utime, stime are fields 14, 15 and rss field 24
    fields = " ".join(str(n) for n in range(3, 53))
    line = f"4242 (a) b (c) {fields}\n".encode()
    # ppid field 4, cutime and cstime fields 16 and 17
    assert system.parse_pid_stat(line) == (14 + 15, 16 + 17, 24, 4)
    mine = system.parse_pid_stat(Path("/proc/self/stat").read_bytes())
    times = os.times()
    tick = os.sysconf("SC_CLK_TCK")
    assert mine.ticks / tick == pytest.approx(times.user + times.system, abs=0.05)
    assert mine.reaped / tick == pytest.approx(times.children_user + times.children_system,
                                               abs=0.05)
    assert mine.ppid == os.getppid()


def test_meminfo_without_memavailable() -> None:
    text = b"MemTotal: 100 kB\nMemFree: 10 kB\nBuffers: 5 kB\nCached: 20 kB\nSReclaimable: 1 kB\n"
    assert system.parse_meminfo(text) == (64 * 1024, 36 * 1024)


def _stat(cores: dict[int, list[int]]) -> str:
    return "\n".join(f"cpu{c} " + " ".join(map(str, t)) for c, t in cores.items())


def test_cpu_rows_shares_of_each_interval() -> None:
    a = {0: [100, 0, 50, 800, 50, 0, 0, 0, 7, 0], 3: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0]}
    b = {0: [130, 0, 60, 840, 60, 0, 0, 10, 9, 0], 3: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0]}
    rows = cpu_rows([{"ts": 1, "values": {}, "stat": _stat(a)},
                            {"ts": 2, "values": {}},  # a reading without the raw lines
                            {"ts": 3, "values": {}, "stat": _stat(b)}])
    # core 0: 100 ticks (guest's 2 already inside user); core 3 had none: no shares
    assert rows == [(3, "cpu.core0.usr", -1, 0.3), (3, "cpu.core0.sys", -1, 0.1),
                    (3, "cpu.core0.iowait", -1, 0.1), (3, "cpu.core0.steal", -1, 0.1)]
    offline = {0: b[0]}  # a core went offline: no common interval
    assert cpu_rows([{"ts": 1, "stat": _stat(a)}, {"ts": 2, "stat": _stat(offline)}]) == []


@given(st.lists(st.lists(st.integers(0, 10_000), min_size=10, max_size=10), min_size=1,
                max_size=6))
@example([[23, 0, 0, 0, 0, 0, 4697, 10000, 0, 0]])  # 23/14720: numpy's round gave .001562
def test_cpu_shares_are_fractions(increments: list[list[int]]) -> None:
    before = {c: [1000 * (c + 1)] * 10 for c in range(len(increments))}
    after = {c: [v + d for v, d in zip(before[c], inc, strict=True)]
             for c, inc in enumerate(increments)}
    prev = parse_cpu_lines(_stat(before))
    shares = cpu_fractions(prev, parse_cpu_lines(_stat(after)))
    for c, inc in enumerate(increments):
        span = sum(inc[:8])
        got = [shares.get(f"cpu.core{c}.{k}") for k in SHARES]
        if span == 0:
            assert got == [None] * len(SHARES)
        else:
            # user with nice, system with irq and softirq, iowait, steal
            parts = (inc[0] + inc[1], inc[2] + inc[5] + inc[6], inc[4], inc[7])
            assert got == [round(part / span, 6) for part in parts]
            assert sum(g or 0.0 for g in got) <= 1.0 + 3e-6


def test_system_sampler_on_a_fake_procfs(frozen_proc: Path, tmp_path: Path) -> None:
    """Readings from files the test writes: byte counters relative to the first reading,
    the process tree from its stat files, the clock injected."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        task = frozen_proc / str(child.pid) / "task" / str(child.pid)
        task.mkdir(parents=True)
        (task / "children").write_text("")
        (task / "schedstat").write_text("1000 5000000 3\n")
        pid_stat = frozen_proc / str(child.pid) / "stat"
        pid_stat.write_bytes(b"1 (x) S " + b"0 " * 10 + b"200 100 " + b"0 " * 8 + b"50 0\n")
        net = frozen_proc / "net" / "dev"
        header = b"Inter-|\n face |\n"
        net.write_bytes(header + b"  lo: 1000 0 0 0 0 0 0 0 2000 0 0 0 0 0 0 0\n")
        ticks = iter(range(10, 100, 10))
        sampler = system.SystemSampler(tmp_path, 20.0, clock=lambda: next(ticks),
                                       procfs=str(frozen_proc))
        sampler.pid = child.pid
        with sampler.path.open("wb") as out:
            sampler.sample_once(out)
            net.write_bytes(header + b" eth0:4294967296000 0 0 0 0 0 0 0 7 0 0 0 0 0 0 0\n"
                                   b"  lo: 1500 0 0 0 0 0 0 0 2100 0 0 0 0 0 0 0\n")
            pid_stat.write_bytes(b"1 (x) S " + b"0 " * 10 + b"300 150 " + b"0 " * 8 + b"60 0\n")
            (task / "schedstat").write_text("2000 30000000 5\n")
            time.sleep(0.05)
            sampler.sample_once(out)
        sampler.stop()
    finally:
        child.kill()
        child.wait()
    items = read_jsonl(sampler.path)
    assert [i["ts"] for i in items] == [10, 20] and all("stat" in i for i in items)
    first, second = (i["values"] for i in items)
    assert (first["net.rx_bytes"], first["net.tx_bytes"]) == (0.0, 0.0)
    assert (second["net.rx_bytes"], second["net.tx_bytes"]) == (4294967296000 + 500, 107.0)
    page = os.sysconf("SC_PAGE_SIZE")
    assert (first["proc.count"], first["proc.rss_bytes"]) == (1.0, 50.0 * page)
    assert "proc.cpu_cores" not in first and second["proc.rss_bytes"] == 60.0 * page
    tick = os.sysconf("SC_CLK_TCK")
    assert second["proc.cpu_cores"] * 0.05 <= 150 / tick  # 150 ticks over >= 50 ms
    # its thread waited 25 ms on a runqueue between the readings, >= 50 ms apart
    assert 0 < second["proc.run_delay_cores"] <= 0.025 / 0.05
    assert second["disk.read_bytes"] == 0.0 and second["mem.used_bytes"] > 0


CONTENDED = textwrap.dedent("""
    import os, sys, time
    os.sched_setaffinity(0, {int(sys.argv[1])})
    t = time.monotonic()
    while time.monotonic() - t < 1.5:
        pass
""")


def test_run_delay_of_a_process_sharing_its_core(tmp_path: Path) -> None:
    """Two busy processes pinned to one core: each runs at most half the time and waits on
    the runqueue the rest (schedstat's own figures, not a model). A spinning thread is always
    runnable, so its CPU and its run delay add up to one core whatever else shares it."""
    core = min(os.sched_getaffinity(0))
    procs = [subprocess.Popen([sys.executable, "-c", CONTENDED, str(core)]) for _ in range(2)]
    try:
        sampler = system.SystemSampler(tmp_path, 20.0)
        sampler.pid = procs[0].pid
        time.sleep(0.3)  # the children pinned and spinning
        with sampler.path.open("wb") as out:
            for _ in range(12):
                sampler.sample_once(out)
                time.sleep(0.05)
        sampler.stop()
    finally:
        for p in procs:
            p.kill()
            p.wait()
    readings = [i["values"] for i in read_jsonl(sampler.path)][2:]
    delay = float(np.mean([r["proc.run_delay_cores"] for r in readings]))
    cpu = float(np.mean([r["proc.cpu_cores"] for r in readings]))
    assert delay > 0.3 and abs(delay + cpu - 1.0) < 0.15
    # its one thread is its first: the loop's own run delay is the whole tree's here
    main = [r[f"proc.{procs[0].pid}.main_run_delay_cores"] for r in readings]
    assert main == [r["proc.run_delay_cores"] for r in readings]


SPAWNER = textwrap.dedent("""
    import subprocess, sys, time
    spin = "import time\\nt = time.thread_time()\\nwhile time.thread_time() - t < 0.12: pass"
    t = time.monotonic()
    while time.monotonic() - t < 1.6:  # short-lived children, each 120 ms of CPU
        subprocess.run([sys.executable, "-c", spin], check=True)
    print("done", flush=True)
    time.sleep(5)
""")


def test_cpu_of_short_lived_children(tmp_path: Path) -> None:
    """A parent that runs one short CPU-bound child after another (each alive for a fraction
    of a second, most between two walks of the tree): the tree's cores are its own and its
    children's, which its reaped-children ticks (cutime, cstime) hold once they exit, as the
    parent's /proc/PID/stat says at the end. Counting only live processes had read 0.63
    cores for 1.56."""
    parent = subprocess.Popen([sys.executable, "-c", SPAWNER], stdout=subprocess.DEVNULL)
    try:
        sampler = system.SystemSampler(tmp_path, 20.0)
        sampler.pid = parent.pid
        stat = Path(f"/proc/{parent.pid}/stat")
        with sampler.path.open("wb") as out:
            sampler.sample_once(out)
            before = system.parse_pid_stat(stat.read_bytes())
            start = time.monotonic()
            while time.monotonic() - start < 2.2:  # the children done by then
                time.sleep(0.05)
                sampler.sample_once(out)
            after = system.parse_pid_stat(stat.read_bytes())
        sampler.stop()
    finally:
        parent.kill()
        parent.wait()
    truth = (after.ticks + after.reaped - before.ticks - before.reaped) / os.sysconf("SC_CLK_TCK")
    items = read_jsonl(sampler.path)
    measured = sum(cur["values"].get("proc.cpu_cores", 0.0) * (int(cur["ts"]) - int(prev["ts"]))
                   for prev, cur in itertools.pairwise(items)) / 1e9
    assert truth > 0.3  # about 13 children of 120 ms: 1.56 s on an idle machine, less under load
    assert measured == pytest.approx(truth, rel=0.15)
    # a child's CPU shows when it is reaped: what is beyond the cores is told later, so no
    # reading is over them (one had read 13.9 cores on 2)
    cores = os.cpu_count() or 1
    assert max(i["values"].get("proc.cpu_cores", 0.0) for i in items) <= cores + 1e-6


def _diskstats(ios: int, ms: int, inflight: int, weighted: int) -> bytes:
    """A whole disk `sdz` (reads and writes split 1:3) and a partition of it."""
    r, w = ios // 4, ios - ios // 4
    line = f"8 0 sdz {r} 0 {8 * r} {ms // 2} {w} 0 {8 * w} {ms - ms // 2} {inflight} 9 {weighted}"
    return (line + " 0 0 0 0\n" + "8 1 sdz1 5 0 40 7 5 0 40 7 0 9 14 0 0 0 0\n").encode()


def test_system_sampler_events_disk_latency_and_clocks(tmp_path: Path) -> None:
    """Context switches, interrupts and softirqs since the first reading; per-disk await,
    queue and requests in flight (iostat's formulas); core clocks from cpufreq."""
    proc, block, cpus = tmp_path / "proc", tmp_path / "block", tmp_path / "cpu"
    (proc / "net").mkdir(parents=True)
    (block / "sdz").mkdir(parents=True)
    for core, khz in ((0, 2_400_000), (1, 800_500)):
        (cpus / f"cpu{core}" / "cpufreq").mkdir(parents=True)
        (cpus / f"cpu{core}" / "cpufreq" / "scaling_cur_freq").write_text(f"{khz}\n")
    (proc / "meminfo").write_bytes(b"MemTotal: 100 kB\nMemAvailable: 60 kB\n")
    (proc / "net" / "dev").write_bytes(b"h\nh\n  lo: 1 0 0 0 0 0 0 0 2 0 0 0 0 0 0 0\n")

    def stat(ctxt: int, intr: int, softirq: int) -> bytes:
        return (f"cpu  1 0 1 8 0 0 0 0 0 0\ncpu0 1 0 1 8 0 0 0 0 0 0\nintr {intr} 3 4\n"
                f"ctxt {ctxt}\nbtime 1\nsoftirq {softirq} 1 2\n").encode()

    (proc / "stat").write_bytes(stat(1000, 500, 300))
    (proc / "diskstats").write_bytes(_diskstats(100, 400, 0, 500))
    start = time.monotonic_ns()
    sampler = system.SystemSampler(tmp_path, 20.0, clock=iter(range(1, 9)).__next__,
                                   procfs=str(proc), sysfs_block=str(block), sysfs_cpu=str(cpus))
    sampler.pid = 2**22 + 1  # no such process: no tree
    (proc / "stat").write_bytes(stat(1250, 540, 333))
    (proc / "diskstats").write_bytes(_diskstats(140, 1400, 3, 20500))
    with sampler.path.open("wb") as out:
        sampler.sample_once(out)
    elapsed_ms = (time.monotonic_ns() - start) / 1e6
    sampler.stop()
    (item,) = read_jsonl(sampler.path)
    values = item["values"]
    assert (values["sys.ctxt"], values["sys.intr"], values["sys.softirq"]) == (250, 40, 33)
    assert values["disk.sdz.inflight"] == 3.0 and "disk.sdz1.inflight" not in values
    assert values["disk.sdz.await_ms"] == 25.0  # 1000 ms over 40 I/Os
    assert values["disk.sdz.queue"] >= round(20000 / elapsed_ms, 6)  # 20 s weighted / elapsed
    assert (values["cpu.core0.mhz"], values["cpu.core1.mhz"]) == (2400.0, 800.5)
    assert item["stat"] == "cpu0 1 0 1 8 0 0 0 0 0 0"


def test_disk_rates_are_iostats() -> None:
    prev = {"sdz": (100, 400, 0, 500)}
    now = {"sdz": (140, 1400, 3, 20500), "new": (1, 1, 1, 1)}
    assert system.disk_rates(prev, now, 2_000_000_000) == {
        "disk.sdz.inflight": 3.0, "disk.sdz.await_ms": 25.0, "disk.sdz.queue": 10.0,
        "disk.new.inflight": 1.0}
    idle = {"sdz": (140, 1400, 0, 20500)}  # nothing completed: no await
    assert system.disk_rates(idle, idle, 1_000_000) == {"disk.sdz.inflight": 0.0,
                                                         "disk.sdz.queue": 0.0}
    assert system.parse_diskstats(_diskstats(0, 0, 0, 0), frozenset({b"sdz"})).io == {}


def test_system_sampler_without_procfs(tmp_path: Path) -> None:
    sampler = system.SystemSampler(tmp_path, 20.0, procfs=str(tmp_path / "nowhere"))
    assert sampler.status()["status"].startswith("unavailable: cannot read ")
    sampler.start(os.getpid())
    sampler.stop()
    assert sampler.files() == []


# -- GPU through a fake NVML ------------------------------------------------------------------
class FakeNvml:
    """The slice of pynvml the sampler uses, with pynvml's own constants and structures.

    GPU 0: instant power, 32-bit PCIe byte counters, NVLink links 0 and 2 active. GPU 1: an old
    driver without field values (power and PCIe throughput fall back to the older calls)."""

    def __init__(self) -> None:
        for name in dir(pynvml):
            if name.startswith("NVML_"):
                setattr(self, name, getattr(pynvml, name))
        self.NVML_NVLINK_MAX_LINKS = 4
        self.reading = 0
        self.throughput_calls = 0

    def nvmlInit(self) -> None:
        return None

    def nvmlShutdown(self) -> None:
        return None

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        if h == 1 or link == 3:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return 1 if link in (0, 2) else 0

    def nvmlDeviceGetFieldValues(self, h: int, fields: list[tuple[int, int]]) -> list[Any]:
        if h == 1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        r = self.reading
        raw = {(186, 0): (pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, 250_000 + r),  # mW
               (197, 0): (pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, [2**32 - 300, 200, 1200][r]),
               (198, 0): (pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, 5000 * r),
               (138, 0): (pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, 10 + 5 * r),
               (139, 0): (pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, 0),
               (138, 2): (pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, 100 + 10 * r),
               (139, 2): (pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, 7)}
        out = []
        for fid, scope in fields:
            fv = pynvml.c_nvmlFieldValue_t()
            fv.fieldId, fv.scopeId = fid, scope
            if (fid, scope) in raw:
                fv.valueType, value = raw[fid, scope]
                member = {1: "uiVal", 3: "ullVal"}[fv.valueType]
                setattr(fv.value, member, value)
                fv.nvmlReturn = pynvml.NVML_SUCCESS
            else:
                fv.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
            out.append(fv)
        return out

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        return SimpleNamespace(gpu=90 - h, memory=40)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        return SimpleNamespace(used=(h + 1) * 2**30)

    def nvmlDeviceGetClockInfo(self, h: int, which: int) -> int:
        return 1980 if which == pynvml.NVML_CLOCK_SM else 2619

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return 300_500

    def nvmlDeviceGetPcieThroughput(self, h: int, which: int) -> int:
        self.throughput_calls += 1
        return 1234 if which == pynvml.NVML_PCIE_UTIL_TX_BYTES else 99


def test_gpu_sampler_with_fake_nvml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '\tGPU0\tGPU1'\necho 'GPU0\t X \tNV18'\n")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    nv = FakeNvml()
    ticks = iter(range(1, 10))
    sampler = GpuSampler(tmp_path, 20.0, clock=lambda: next(ticks), nvml=nv)
    assert sampler.status()["status"] == "ok"
    assert (tmp_path / "nvidia-smi-topo.txt").read_text().startswith("\tGPU0\tGPU1\n")
    with sampler.path.open("wb") as out:
        for r in range(3):
            nv.reading = r
            sampler.sample_once(out)
    readings = [i["values"] for i in read_jsonl(sampler.path)]
    assert readings[0] == {
        "gpu0.sm_util": 90.0, "gpu0.mem_util": 40.0, "gpu0.mem_used_bytes": 2.0**30,
        "gpu0.sm_clock_mhz": 1980.0, "gpu0.mem_clock_mhz": 2619.0, "gpu0.power_w": 250.0,
        "gpu0.pcie_tx_bytes": 0.0, "gpu0.pcie_rx_bytes": 0.0,
        "gpu0.nvlink_tx_bytes": 0.0, "gpu0.nvlink_rx_bytes": 0.0,
        "gpu1.sm_util": 89.0, "gpu1.mem_util": 40.0, "gpu1.mem_used_bytes": 2.0**31,
        "gpu1.sm_clock_mhz": 1980.0, "gpu1.mem_clock_mhz": 2619.0, "gpu1.power_w": 300.5,
        "gpu1.pcie_tx_kbps": 1234.0, "gpu1.pcie_rx_kbps": 99.0,
    }
    # the 32-bit PCIe counter wrapped between the first two readings
    assert [r["gpu0.pcie_tx_bytes"] for r in readings] == [0.0, 500.0, 1500.0]
    assert [r["gpu0.pcie_rx_bytes"] for r in readings] == [0.0, 5000.0, 10000.0]
    # NVLink: KiB counters of links 0 and 2 added up
    assert [r["gpu0.nvlink_tx_bytes"] for r in readings] == [0.0, 15 * 1024.0, 30 * 1024.0]
    assert readings[2]["gpu0.power_w"] == 250.002
    # the 20 ms throughput calls: once a second at 20 Hz, so only in the first reading
    assert nv.throughput_calls == 2 and "gpu1.pcie_tx_kbps" not in readings[1]
    rows = value_rows(read_jsonl(sampler.path))
    assert {(name[:4], device) for _, name, device, _ in rows} == {("gpu0", 0), ("gpu1", 1)}


def test_gpu_sampler_without_nvml(tmp_path: Path) -> None:
    class Broken:
        def nvmlInit(self) -> None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    sampler = GpuSampler(tmp_path, 20.0, nvml=Broken())
    assert sampler.status()["status"] == f"unavailable: {NO_GPU}"
    sampler.start(os.getpid())
    sampler.stop()
    assert sampler.files() == [] and not list(tmp_path.iterdir())


def test_parse_cpu_lines_is_one_row_per_core() -> None:
    rows = parse_cpu_lines("cpu0 1 2 3 4 5 6 7 8 9 10\ncpu12 0 0 0 0 0 0 0 0 0 0")
    assert rows.shape == (2, 11) and rows[:, 0].tolist() == [0, 12]
    assert np.array_equal(rows[0, 1:], np.arange(1, 11))


READER = textwrap.dedent("""
    import mmap, os, sys
    fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECT)
    buf = mmap.mmap(-1, 1 << 20)
    print("ready", flush=True)
    sys.stdin.readline()  # after the sampler's first reading
    for i in range(16):
        os.preadv(fd, [buf], i << 20)
    print("done", flush=True)
    sys.stdin.readline()
""")


def test_the_trees_reads_from_storage(tmp_path: Path) -> None:
    """A child reading 16 MiB with O_DIRECT (no page cache between it and the disk) after the
    sampler's first reading: `proc.read_bytes` rises by its /proc/PID/io read_bytes: the 16
    MiB, and no more than a few MiB besides (untraced_wait tells the run's own waits on storage
    from another process's)."""
    data = tmp_path / "data.bin"
    data.write_bytes(os.urandom(16 << 20))
    try:
        os.close(os.open(data, os.O_RDONLY | os.O_DIRECT))
    except OSError:
        pytest.skip("no O_DIRECT on this file system")
    child = subprocess.Popen([sys.executable, "-c", READER, str(data)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    assert child.stdin is not None and child.stdout is not None
    try:
        assert child.stdout.readline() == "ready\n"
        sampler = system.SystemSampler(tmp_path, 20.0)
        sampler.pid = child.pid
        with sampler.path.open("wb") as out:
            sampler.sample_once(out)
            child.stdin.write("go\n")
            child.stdin.flush()
            assert child.stdout.readline() == "done\n"
            sampler.sample_once(out)
        sampler.stop()
    finally:
        child.kill()
        child.wait()
    first, last = (i["values"]["proc.read_bytes"] for i in read_jsonl(sampler.path))
    # its 16 MiB, and what else it made the storage layer fetch meanwhile: pages of its own
    # code or libraries read back in on a fault, if a busy machine had evicted them (seen once)
    assert first == 0.0 and 16 << 20 <= last < 20 << 20
