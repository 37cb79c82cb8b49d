"""A program with no loop and no torch, recorded for tests/data/perf_noloop (a helper's audit):
four phases of about 2 s, a busy spin reading the clock, half asleep (20 x 50 ms spin and
50 ms sleep), an O_DIRECT disk write and read of 128 MiB, and an idle sleep. It writes each
phase's start and end (time_ns, its CPU time, /proc/stat's CPU line, the disk's bytes) to the
path given.

    perfswarm record -- python noloop.py truth.json
"""

import json
import mmap
import os
import sys
import time
from typing import Any


def host_cpu() -> list[int]:
    with open("/proc/stat") as f:
        return list(map(int, f.readline().split()[1:9]))


def disk_bytes() -> tuple[int, int] | None:
    with open("/proc/diskstats") as f:
        for line in f:
            fields = line.split()
            if fields[2] == "vda":
                return int(fields[5]) * 512, int(fields[9]) * 512
    return None


def snap() -> dict[str, Any]:
    return {"ns": time.time_ns(), "cpu": time.process_time(), "host": host_cpu(),
            "disk": disk_bytes()}


def spin_for(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def main(out: str) -> None:
    log = []
    start = snap()
    spin_for(2.0)
    log.append(("busy", start, start := snap()))
    for _ in range(20):
        spin_for(0.05)
        time.sleep(0.05)
    log.append(("half", start, start := snap()))
    buf = mmap.mmap(-1, 8 << 20)
    buf.write(os.urandom(8 << 20))
    fd = os.open(out + ".data", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT)
    for _ in range(16):
        os.write(fd, buf)
    os.fsync(fd)
    os.close(fd)
    fd = os.open(out + ".data", os.O_RDONLY | os.O_DIRECT)
    while os.readv(fd, [buf]) > 0:
        pass
    os.close(fd)
    os.unlink(out + ".data")
    log.append(("disk", start, start := snap()))
    time.sleep(2.0)
    log.append(("idle", start, snap()))
    with open(out, "w") as f:
        json.dump(log, f)


if __name__ == "__main__":
    main(sys.argv[1])
