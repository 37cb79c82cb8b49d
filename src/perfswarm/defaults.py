"""Defaults, ranges and choices of the library's parameters that commands' options show (as a
default, a bound, a type or in their help), each defined here once, in a module that imports
nothing but `typing`: `perfswarm NAME --help` reads them without loading the library behind
them (numpy, pyarrow, DuckDB, optuna...; tests/test_startup.py). The library's modules import
them from here.
"""

from __future__ import annotations

from typing import Final, Literal

# record: the collectors run unless --collectors says otherwise, and their sampling rates
DEFAULT_COLLECTORS: Final = ("torch", "system", "gpu", "perf", "pystacks")
SAMPLER_HZ: Final = 20.0  # the system and GPU samplers' default rate
PERF_HZ: Final = 99  # 499 Hz slowed a CPU training step by 2-5%, 99 Hz by nothing measurable
# py-spy's CPU against a job of 6.3 CPU-s (realworld_loop.py workers, 3 processes): 5.0 s
# at 100 Hz, 1.7 s at 20 Hz (manifest extra.record.tool_cpu_ns and job_cpu_ns)
PYSTACKS_HZ: Final = 20
# A CPU transformer's profiling window displaced 56 MiB of tensors a step at most (d_model 256):
# what --heap-reserve, opt-in, needs per profiled step to take all of them.
RESERVE_PER_STEP_MIB: Final = 64

# calibrate --collectives: passes over every size, in shuffled orders; a point keeps its
# fastest sample
SWEEP_PASSES: Final = 12

# project: the device counts projected onto, and the collective schemes
DEFAULT_DEVICES: Final = (1, 2, 4, 8, 16, 32, 64, 128, 256)
Scheme = Literal["ring", "tree", "ps"]

# tune: how a trial is measured, and the step lines `--measure stdout` reads:
# `step 3 12.5 ms`, `step 3: 0.0125 s`, `step=3 time=12.5ms`: a step number, then a time and unit.
Measure = Literal["record", "stdout"]
STEP_PATTERN: Final = r"(?i)\bstep\D*?(\d+)\D*?(\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)\s*(ns|us|µs|ms|s)\b"

# sql: what a query may be given: seconds of wall clock, and MiB of memory (trace.sql.Limits)
TIMEOUT_S: Final = (0.1, 86400)
MEMORY_MB: Final = (256, 1 << 20)
