"""System sampler: per-core usr/sys/iowait/steal and frequency, memory, context switches,
interrupts and softirqs, disk and network bytes, per-disk latency and queue, the process tree.

CPU values are fractions of one core over the interval since the previous
reading (`proc.run_delay_cores`: the cores' worth of the tree's threads that waited on a
runqueue, runnable but not running: schedstat's run delay, the time other processes took);
byte and event counters (`sys.ctxt`, `sys.intr`, `sys.softirq`) are cumulative
since the recording began. Per disk (whole disks that have done any I/O):
`disk.<name>.inflight` is the requests in flight at the reading,
`disk.<name>.await_ms` the mean time a read or write completed in the interval
took (iostat's r/w await: queue and service), `disk.<name>.queue` the mean
number of requests in flight over the interval (iostat's aqu-sz).
`cpu.core<N>.mhz` is each core's clock (cpufreq, else /proc/cpuinfo), read at
most once a second. `proc.read_bytes` is what the tree made the storage layer fetch
(/proc/PID/io read_bytes: reads that missed the page cache, direct reads), cumulative from each
process's first reading.

Readings come straight from procfs (the same files and formulas psutil uses,
tested against it): each file is opened once and re-read with one `os.pread`
per reading, the process tree's `/proc/PID/stat` files stay open while their
processes live, and the per-core lines of /proc/stat are stored unparsed (the
shares are derived when the Run is built), so the cost does not grow with the
core count. The budget is 1% of a core at 20 Hz, 0.5 ms per reading, with the
caches cold after 50 ms of sleep: through psutil a reading cost about 1 ms.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from perfswarm.recorder.base import Clock, Sampler
from perfswarm.trace.schema import HOST_AVAILABLE

SECTOR = 512  # /proc/diskstats counts 512-byte sectors whatever the device's block size
RESCAN_NS = 1_000_000_000  # how often the process tree is walked for new processes
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_CORES = os.cpu_count() or 1

FREQ_NS = 1_000_000_000  # how often the core clocks are read


def cpu_lines(text: bytes) -> bytes:
    """The per-core lines of /proc/stat (`cpuN ...`), as they are."""
    start = text.index(b"\ncpu") + 1
    end = text.find(b"\n", text.rfind(b"\ncpu") + 1)
    return text[start:end if end > 0 else len(text)]


def _kib_field(text: bytes, key: bytes) -> int | None:
    """A `Key:   N kB` field of /proc/meminfo in bytes; None where the file has none."""
    at = text.find(key)
    if at < 0:
        return None
    start = at + len(key)
    return int(text[start:text.index(b"\n", start)].split()[0]) * 1024


def parse_meminfo(text: bytes) -> tuple[int, int]:
    """(used, available) bytes from /proc/meminfo, as psutil and `free` compute them:
    used = MemTotal - MemAvailable. Two fields found, not every line parsed (a reading
    20 times a second)."""
    total = _kib_field(text, b"MemTotal:")
    if total is None:
        raise ValueError("no MemTotal in meminfo")
    available = _kib_field(text, b"\nMemAvailable:")
    if available is None:  # kernels before 3.14
        available = sum(_kib_field(text, key) or 0 for key in (
            b"\nMemFree:", b"\nBuffers:", b"\nCached:", b"\nSReclaimable:"))
    available = min(max(available, 0), total)
    return total - available, available


def _width(text: bytes) -> int:
    """Fields per line of a table where every line has as many (the first tells)."""
    return len(text.split(b"\n", 1)[0].split())


_TOTALS = re.compile(rb"^(ctxt|intr|softirq) (\d+)", re.MULTILINE)


def parse_stat_totals(text: bytes) -> tuple[int, int, int]:
    """(context switches, interrupts, softirqs) since boot, from the `ctxt`, `intr` and
    `softirq` lines of /proc/stat (the first number of `intr` and `softirq` is their total)."""
    found = {key: int(value) for key, value in _TOTALS.findall(text)}
    return found.get(b"ctxt", 0), found.get(b"intr", 0), found.get(b"softirq", 0)


DiskIO = tuple[int, int, int, int]  # I/Os completed, ms spent on them, in flight, weighted ms


class Disks(NamedTuple):
    """What a reading takes of /proc/diskstats, over whole disks (names in /sys/block, not
    partitions)."""

    read: int  # bytes read, summed over the disks
    written: int  # bytes written
    io: dict[str, DiskIO]  # per disk that has completed any I/O


def parse_diskstats(text: bytes, disks: frozenset[bytes]) -> Disks:
    """Bytes read and written, and per whole disk that has completed any I/O: reads + writes
    completed, ms reading + ms writing, I/Os in flight now, and the weighted ms doing I/O
    (fields 1+5, 4+8, 9 and 11 of Documentation/admin-guide/iostats.rst). One split of the
    text (every line has as many fields)."""
    if not text:
        return Disks(0, 0, {})
    tokens = text.split()
    width = _width(text)
    read = written = 0
    io: dict[str, DiskIO] = {}
    for at in range(0, len(tokens) - width + 1, width):
        if tokens[at + 2] not in disks:
            continue
        f = tokens[at:at + width]
        read += int(f[5])
        written += int(f[9])
        ios = int(f[3]) + int(f[7])
        if ios and width >= 14:
            io[f[2].decode(errors="replace")] = (ios, int(f[6]) + int(f[10]), int(f[11]),
                                                 int(f[13]))
    return Disks(read * SECTOR, written * SECTOR, io)


def disk_rates(prev: dict[str, DiskIO], now: dict[str, DiskIO],
               elapsed_ns: int) -> dict[str, float]:
    """`disk.<name>.inflight` now; over the interval since `prev`, `disk.<name>.await_ms`
    (ms per completed I/O; none without one) and `disk.<name>.queue` (weighted ms / ms)."""
    out: dict[str, float] = {}
    for name, (ios, ms, inflight, weighted) in now.items():
        out[f"disk.{name}.inflight"] = float(inflight)
        before = prev.get(name)
        if before is None or elapsed_ns <= 0:
            continue
        done = ios - before[0]
        if done > 0:
            out[f"disk.{name}.await_ms"] = round((ms - before[1]) / done, 6)
        out[f"disk.{name}.queue"] = round(max(0, weighted - before[3]) / (elapsed_ns / 1e6), 6)
    return out


def parse_cpuinfo_mhz(text: bytes) -> dict[int, float]:
    """Core -> `cpu MHz` from /proc/cpuinfo (x86; other architectures print none)."""
    out: dict[int, float] = {}
    core = -1
    for line in text.split(b"\n"):
        key, _, value = line.partition(b":")
        key = key.strip()
        if key == b"processor":
            core = int(value)
        elif key == b"cpu MHz" and core >= 0:
            out[core] = float(value)
    return out


def core_mhz(sysfs_cpu: str = "/sys/devices/system/cpu", procfs: str = "/proc") -> dict[int, float]:
    """Each core's current clock in MHz: cpufreq's scaling_cur_freq (kHz) where the kernel
    has a cpufreq driver, else /proc/cpuinfo; {} when neither tells."""
    out: dict[int, float] = {}
    with contextlib.suppress(OSError):
        for name in os.listdir(sysfs_cpu):
            if name.startswith("cpu") and name[3:].isdigit():
                with contextlib.suppress(OSError, ValueError), open(
                        f"{sysfs_cpu}/{name}/cpufreq/scaling_cur_freq", "rb") as f:
                    out[int(name[3:])] = int(f.read()) / 1000.0
    if out:
        return out
    try:
        with open(f"{procfs}/cpuinfo", "rb") as f:
            return parse_cpuinfo_mhz(f.read())
    except (OSError, ValueError):
        return {}


def parse_net_dev(text: bytes) -> tuple[int, int]:
    """(received, sent) bytes summed over every interface, loopback included."""
    # Two header lines, then `name: 16 counters`; a wide counter runs into the colon.
    body = text.split(b"\n", 2)[2].replace(b":", b" ")
    tokens = body.split()
    width = _width(body)
    return sum(map(int, tokens[1::width])), sum(map(int, tokens[9::width]))


class PidStat(NamedTuple):
    """What the sampler reads of /proc/PID/stat."""

    ticks: int  # utime + stime: its own CPU
    reaped: int  # cutime + cstime: its children's it waited for, when they exited
    pages: int  # resident
    ppid: int


def parse_pid_stat(text: bytes) -> PidStat:
    """/proc/PID/stat's CPU ticks, resident pages and parent. The command name (field 2) may
    hold spaces and parentheses, so fields are counted from its closing parenthesis."""
    fields = text[text.rindex(b")") + 2:].split()
    return PidStat(int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14]),
                   int(fields[21]), int(fields[1]))


def _run_delay(tasks: dict[int, list[int]], main: int) -> tuple[int, int]:
    """The ns the threads waited on a runqueue, runnable but not running, since their last
    reading (schedstat's second field; a thread's first reading counts nothing; threads that
    exited are closed and dropped), and of them the thread `main`'s (the process's first)."""
    waited = own = 0
    for tid, task in list(tasks.items()):
        try:
            delay = int(os.pread(task[0], 128, 0).split()[1])
        except (OSError, ValueError, IndexError):
            os.close(task[0])
            del tasks[tid]
            continue
        if task[1] >= 0:
            waited += max(0, delay - task[1])
            own += max(0, delay - task[1]) if tid == main else 0
        task[1] = delay
    return waited, own


def tree_pids(root: int, procfs: str = "/proc") -> list[int]:
    """`root` and its descendants, from /proc/PID/task/TID/children: a walk of the tree only.

    psutil's children(recursive=True) reads every process on the machine (milliseconds
    per call on a busy host), which at 20 Hz would cost more than the 1%-of-a-core budget.
    """
    out: list[int] = []
    todo = [root]
    while todo:
        pid = todo.pop()
        try:
            tasks = os.listdir(f"{procfs}/{pid}/task")
        except OSError:
            continue
        out.append(pid)
        for tid in tasks:
            with contextlib.suppress(OSError), open(f"{procfs}/{pid}/task/{tid}/children",
                                                    "rb") as f:
                todo.extend(int(c) for c in f.read().split())
    return out


def whole_disks(sysfs_block: str = "/sys/block") -> frozenset[bytes]:
    """Block devices that are disks, not partitions (psutil's rule: listed in /sys/block)."""
    try:
        return frozenset(os.fsencode(name.replace("!", "/")) for name in os.listdir(sysfs_block))
    except OSError:
        return frozenset()


@dataclass
class _Proc:
    fd: int
    ticks: int  # own and reaped children's CPU at the last reading; -1 before the first
    reaped: int = 0  # the reaped children's part of it
    ppid: int = -1
    # its threads' /proc/PID/task/TID/schedstat: tid -> [fd, run_delay ns at the last reading]
    tasks: dict[int, list[int]] = field(default_factory=dict)
    io: int = -1  # its /proc/PID/io (-1: unreadable)
    read_bytes: int = -1  # what it had read from storage at the last reading; -1 before


def parse_read_bytes(text: bytes) -> int:
    """/proc/PID/io's read_bytes: what the process made the storage layer fetch (buffered
    reads that missed the page cache, direct reads)."""
    at = text.index(b"\nread_bytes: ") + len(b"\nread_bytes: ")
    return int(text[at:text.index(b"\n", at)])


def _pread(fd: int, size: int) -> bytes:
    """The whole file: procfs regenerates it on a read at offset 0."""
    data = os.pread(fd, size, 0)
    while len(data) == size:  # grown beyond the buffer: read again, larger
        size *= 2
        data = os.pread(fd, size, 0)
    return data


class SystemSampler(Sampler):
    name = "system"

    def __init__(self, raw: Path, hz: float, clock: Clock | None = None,
                 procfs: str = "/proc", sysfs_block: str = "/sys/block",
                 sysfs_cpu: str = "/sys/devices/system/cpu") -> None:
        super().__init__(raw, hz, clock or time.time_ns)
        self.procfs = procfs
        self.sysfs_cpu = sysfs_cpu
        self._freq_at = -FREQ_NS
        self._fds: dict[str, int] = {}
        self._procs: dict[int, _Proc] = {}
        self._unmatched: dict[int, int] = {}  # exited children's ticks their parent has not shown
        self._carry = 0.0  # ticks beyond the cores in an interval, told in the next ones
        self._read_bytes = 0  # the tree's reads from storage since each process's first reading
        self._scanned_ns = 0
        self._tree_at = 0
        try:
            for name in ("stat", "meminfo", "diskstats", "net/dev"):
                self._fds[name] = os.open(f"{procfs}/{name}", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            self.unavailable(f"cannot read {e.filename} ({e.strerror})")
            return
        self._disks = whole_disks(sysfs_block)
        # the kernel renders the whole of /proc/stat whatever is read, so it is read whole
        # (its interrupt line can be 100s of KB: the buffer grows once and stays)
        self._stat_size = 256 * (os.cpu_count() or 1) + 4096
        diskstats = self._read("diskstats")
        self._disk0 = parse_diskstats(diskstats, self._disks)
        self._io = self._disk0.io
        self._io_at = time.monotonic_ns()
        self._net0 = parse_net_dev(self._read("net/dev"))
        self._stat0 = parse_stat_totals(self._read("stat"))
        self._stat = b""

    def _read(self, name: str) -> bytes:
        if name == "stat":
            data = _pread(self._fds[name], self._stat_size)
            self._stat_size = max(self._stat_size, len(data) + 1)
            return data
        return _pread(self._fds[name], 1 << 16)

    def read_text(self) -> dict[str, str]:
        """The per-core lines of /proc/stat (read by `read`), unparsed: shares are derived
        when the Run is built (`cpu_rows`), so a reading costs the same on 2 cores as on
        200."""
        return {"stat": cpu_lines(self._stat).decode()}

    def start(self, pid: int) -> None:
        if self._fds:
            super().start(pid)

    def read(self) -> dict[str, float]:
        used, available = parse_meminfo(self._read("meminfo"))
        values = {"mem.used_bytes": float(used), HOST_AVAILABLE: float(available)}
        self._stat = self._read("stat")
        for key, total, first in zip(("sys.ctxt", "sys.intr", "sys.softirq"),
                                     parse_stat_totals(self._stat), self._stat0, strict=True):
            values[key] = float(total - first)
        disks, now = parse_diskstats(self._read("diskstats"), self._disks), time.monotonic_ns()
        values["disk.read_bytes"] = float(disks.read - self._disk0.read)
        values["disk.write_bytes"] = float(disks.written - self._disk0.written)
        io = disks.io
        values.update(disk_rates(self._io, io, now - self._io_at))
        self._io, self._io_at = io, now
        if now - self._freq_at >= FREQ_NS:
            self._freq_at = now
            values.update({f"cpu.core{core}.mhz": mhz
                           for core, mhz in core_mhz(self.sysfs_cpu, self.procfs).items()})
        rx, tx = parse_net_dev(self._read("net/dev"))
        values["net.rx_bytes"] = float(rx - self._net0[0])
        values["net.tx_bytes"] = float(tx - self._net0[1])
        values.update(self._tree())
        return values

    def _tree(self) -> dict[str, float]:
        """The child's process tree: CPU (cores busy since last reading), RSS, process count.

        Processes stay open until a read fails (they exited); the tree is walked for new ones
        at most once a second, so a new process counts from at most a second after it began.
        """
        now = time.monotonic_ns()
        if now - self._scanned_ns >= RESCAN_NS or not self._procs:
            # a process found after the first walk began since the one before: all its CPU
            # counts (the first walk's had run before the recording)
            first = -1 if not self._scanned_ns else 0
            self._scanned_ns = now
            for pid in tree_pids(self.pid, self.procfs):
                if pid not in self._procs:
                    with contextlib.suppress(OSError):
                        self._procs[pid] = _Proc(os.open(f"{self.procfs}/{pid}/stat",
                                                         os.O_RDONLY | os.O_CLOEXEC), first)
                        with contextlib.suppress(OSError):  # another user's: no io
                            self._procs[pid].io = os.open(f"{self.procfs}/{pid}/io",
                                                          os.O_RDONLY | os.O_CLOEXEC)
            for pid, proc in self._procs.items():
                self._open_tasks(pid, proc)
        busy = rss = waited = 0
        mains: dict[int, int] = {}  # pid -> its first thread's run delay since last reading
        # A process's ticks are its own CPU and its reaped children's: a child's, counted
        # while it lived, is counted again in its parent's once it is reaped, and one that
        # began and ended between two walks of the tree only there (a short-lived subprocess
        # a step had been lost: 0.63 cores read for 1.56)
        gone: dict[int, int] = {}  # parent pid -> ticks counted of its children that exited
        grew: dict[int, int] = {}  # pid -> its reaped children's ticks gained since last read
        for pid, proc in list(self._procs.items()):
            try:
                stat = parse_pid_stat(os.pread(proc.fd, 4096, 0))
            except (OSError, ValueError):  # exited (ESRCH), or its pid was reused
                for fd, _ in proc.tasks.values():
                    os.close(fd)
                os.close(proc.fd)
                if proc.io >= 0:
                    os.close(proc.io)
                del self._procs[pid]
                gone[proc.ppid] = gone.get(proc.ppid, 0) + max(0, proc.ticks)
                continue
            ticks = stat.ticks + stat.reaped
            if proc.ticks >= 0:
                busy += max(0, ticks - proc.ticks)
                grew[pid] = max(0, stat.reaped - proc.reaped)
            proc.ticks, proc.reaped, proc.ppid = ticks, stat.reaped, stat.ppid
            rss += stat.pages
            tree, mains[pid] = _run_delay(proc.tasks, pid)
            waited += tree
            if proc.io >= 0:
                with contextlib.suppress(OSError, ValueError):
                    read = parse_read_bytes(os.pread(proc.io, 1024, 0))
                    if proc.read_bytes >= 0:
                        self._read_bytes += max(0, read - proc.read_bytes)
                    proc.read_bytes = read
        # a child reaped between the reading of its parent and its own: its parent's gain
        # comes at the next reading, matched there
        left: dict[int, int] = {}
        for now_gone, (ppid, counted) in [*((False, u) for u in self._unmatched.items()),
                                          *((True, g) for g in gone.items())]:
            matched = min(counted, grew.get(ppid, 0))
            busy -= matched
            grew[ppid] = grew.get(ppid, 0) - matched
            if now_gone and counted > matched:
                left[ppid] = counted - matched
        self._unmatched = left
        if not self._procs:
            return {}
        elapsed, self._tree_at = (now - self._tree_at if self._tree_at else 0), now
        out = {"proc.rss_bytes": float(rss * _PAGE), "proc.count": float(len(self._procs)),
               "proc.read_bytes": float(self._read_bytes)}
        if elapsed > 0:
            # a child's CPU shows whole when its parent reaps it, though it ran over its
            # life: what is beyond the machine's cores in one interval is told in the next
            # ones (a reading of 13.9 cores on 2 had shown it)
            shown = busy + self._carry
            cap = _CORES * _TICK * elapsed / 1e9
            self._carry = max(0.0, shown - cap)
            out["proc.cpu_cores"] = round(min(shown, cap) / _TICK / (elapsed / 1e9), 6)
            out["proc.run_delay_cores"] = round(waited / elapsed, 6)
            # each process's first thread's (a Python program's loop runs there): what the
            # loop itself waited on a runqueue, where the tree's is of every thread
            out.update({f"proc.{pid}.main_run_delay_cores": round(own / elapsed, 6)
                        for pid, own in mains.items()})
        return out

    def _open_tasks(self, pid: int, proc: _Proc) -> None:
        """Open the schedstat of each thread of `pid` not open yet."""
        with contextlib.suppress(OSError):
            for name in os.listdir(f"{self.procfs}/{pid}/task"):
                tid = int(name)
                if tid not in proc.tasks:
                    with contextlib.suppress(OSError):
                        proc.tasks[tid] = [os.open(f"{self.procfs}/{pid}/task/{tid}/schedstat",
                                                   os.O_RDONLY | os.O_CLOEXEC), -1]

    def stop(self) -> None:
        super().stop()
        for fd in [*self._fds.values(), *(p.fd for p in self._procs.values()),
                   *(p.io for p in self._procs.values() if p.io >= 0),
                   *(t[0] for p in self._procs.values() for t in p.tasks.values())]:
            os.close(fd)
        self._fds.clear()
        self._procs.clear()
