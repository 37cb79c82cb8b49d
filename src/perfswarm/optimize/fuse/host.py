"""This CPU's roofline ceilings: from a `calibrate` profile when there is one, else measured in a
fraction of a second here (a GEMM for the FLOP rate, copies past and within the cache for the
bandwidths), with the last-level cache's size from sysfs."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np

from perfswarm.model.profile import Profile
from perfswarm.model.specs import DeviceSpec, cpu_spec
from perfswarm.trace.store import host_info

_SYSFS = Path("/sys/devices/system/cpu/cpu0/cache")


def last_level_cache_bytes(root: Path = _SYSFS) -> float:
    """The size of cpu0's highest cache level (0 when sysfs does not say)."""
    best = (0, 0.0)
    for index in sorted(root.glob("index*")):
        try:
            level = int((index / "level").read_text())
            text = (index / "size").read_text().strip().upper()
        except (OSError, ValueError):
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit() and (level, 0.0) > best:
            best = (level, float(int(digits) * scale))
    return best[1]


def best_rate(work: float, run: Callable[[], object], repeats: int = 5) -> float:
    """work / the fastest of `repeats` calls of run()."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return work / max(min(times), 1e-9)


def measured_ceilings(threads: int) -> tuple[float, float, float]:
    """(FLOP/s, memory bytes/s, cache bytes/s) measured now with `threads` BLAS threads."""
    from threadpoolctl import threadpool_limits

    a = np.ones((768, 768), np.float32)
    big = np.ones(16 << 20, np.float32)   # 64 MiB, past any cache here
    small = np.ones(1 << 20, np.float32)  # 4 MiB: past a core's L2, within the LLC
    big_out, small_out = np.empty_like(big), np.empty_like(small)
    with threadpool_limits(threads):
        flops = best_rate(2.0 * 768**3, lambda: a @ a)
    memory = best_rate(2.0 * big.nbytes, partial(np.copyto, big_out, big), 3)
    cache = best_rate(2.0 * small.nbytes, partial(np.copyto, small_out, small), 9)
    return flops, memory, cache


def cpu_device_spec(profile: Profile | None, profile_name: str, threads: int) -> DeviceSpec:
    """This CPU as a DeviceSpec: the profile's ceilings where it has them, else measured."""
    llc = last_level_cache_bytes()
    name = str(host_info().get("cpu_model") or "cpu")
    ceilings = dict(profile.ceilings) if profile is not None else {}
    if all(ceilings.get(k, 0.0) > 0 for k in ("flops", "memory_bandwidth")):
        return cpu_spec(f"{name} (calibrated)", ceilings["flops"], ceilings["memory_bandwidth"],
                        ceilings.get("cache_bandwidth", 0.0), llc, profile.threads if profile
                        else threads, f"calibrate profile {profile_name}")
    flops, memory, cache = measured_ceilings(threads)
    return cpu_spec(f"{name} (measured)", flops, memory, cache, llc, threads,
                    "measured by fuse (no calibrate profile)")
