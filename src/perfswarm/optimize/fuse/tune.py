"""Schedule search and side-by-side measurement of a fused conv pair on this CPU.

For one pair: random search over the schedule space (a sensible default first, then distinct
random points, deterministic by seed) within a trial count and a deadline, for the fused kernel
and for each op run alone by the same generator (our own separately tuned kernels); every
schedule's result checked against PyTorch's two separate ops; then PyTorch separate, fused and
our own separate kernels timed round-robin, each round one call of each (the order rotating), so
a burst of load on the shared machine hits all three alike; on one thread the times are the
process's CPU seconds (what a call preempted by other processes really ran), else wall time.
Times are reported as the minimum and the median over the rounds; the speedups are ratios of
minima (the least disturbed runs). Each round also gives a paired speedup (PyTorch's call over
the fused call of the same round): a pair is recommended only when the distribution-free
confidence interval of their median lies above 1, and a pair whose interval straddles 1 is
measured again for as many rounds, pooled. A pair whose interval is above 1 is measured once
more after the other pairs (`confirm_pair`: the process and the machine in another state; a
gain within one block of rounds moved by up to 20% between passes) and is recommended only if
that independent interval is above 1 too.

Tuned schedules are kept in a JSON cache keyed by pair, threads and CPU, so a second run
measures them again without searching.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, Literal, cast

import numpy as np

from perfswarm.errors import PerfswarmError
from perfswarm.model.fusion import ConvLayer, ConvPair, PairPrediction
from perfswarm.recorder.inject._perfswarm_heap import steady_heap
from perfswarm.userfiles import read_json, write_json

Split = Literal["blocked", "interleaved", "serial"]
Gemm = Literal["blas", "loops"]
MAX_REL_ERROR = 1e-4       # max |fused - reference| / max |reference|
CONFIDENCE = 0.95          # of the paired speedup's interval
CACHE_VERSION = 1
Progress = Callable[[str], None]  # called once per trial or round, with what it was


@dataclass(frozen=True)
class Schedule:
    """How the generated kernel walks its output: tiles of tile_rows x tile_cols pixels (the
    intermediate of one tile kept in the thread's own buffer), split over threads, the dense
    stage by BLAS or by vectorized loops, the depthwise stage and the intermediate planar
    (NCHW) or channels-last (the channels innermost: one vector pass per tap over all of
    them)."""

    tile_rows: int
    tile_cols: int
    split: Split
    gemm: Gemm
    channels_last: bool = False

    @classmethod
    def from_dict(cls, data: Any) -> Schedule:
        return cls(int(data["tile_rows"]), int(data["tile_cols"]),
                   cast(Split, str(data["split"])), cast(Gemm, str(data["gemm"])),
                   bool(data.get("channels_last", False)))


def channels_last_fits(first: ConvLayer, second: ConvLayer | None = None) -> bool:
    """Whether the kernels have a channels-last path: a depthwise op alone, dw -> pw, or a
    dense op -> dw."""
    if second is None:
        return first.kind == "dw"
    if first.kind == "dw":
        return second.kind == "pw" and second.stride == 1
    return second.kind == "dw"


def schedule_space(height: int, width: int, threads: int, channels_last: bool = False
                   ) -> list[Schedule]:
    """Every schedule for an output of height x width: row tiles of 1..32 rows or the whole
    map, column tiles of 8, 16, 32 or whole rows, each split, each GEMM, planar; and with
    `channels_last`, the same with a channels-last depthwise stage (BLAS only)."""
    rows = sorted({min(r, height) for r in (1, 2, 4, 8, 16, 32, height)})
    cols = sorted({min(c, width) for c in (8, 16, 32, width)})
    splits: tuple[Split, ...] = ("blocked", "interleaved", "serial") if threads > 1 \
        else ("serial",)
    gemms: tuple[Gemm, ...] = ("blas", "loops")
    layouts = [(g, False) for g in gemms] + ([("blas", True)] if channels_last else [])
    return [Schedule(r, c, s, g, cl) for r in rows for c in cols for s in splits
            for g, cl in layouts]


def _defaults(space: list[Schedule], width: int) -> list[Schedule]:
    """The first trials: 4-row tiles of whole rows, BLAS, threads in blocks; planar, then
    channels-last where the space has it."""
    def near(s: Schedule) -> tuple[bool, int, bool, bool]:
        return (s.tile_cols != width, abs(s.tile_rows - 4), s.split != "blocked",
                s.gemm != "blas")
    return [min((s for s in space if s.channels_last == cl), key=near)
            for cl in (False, True) if any(s.channels_last == cl for s in space)]


def search(run: Callable[[Schedule], float | None], space: list[Schedule],
           first: list[Schedule], trials: int, deadline: float, progress: Progress,
           seed: int = 0) -> tuple[Schedule, float]:
    """The fastest schedule of up to `trials` (the `first` ones, then random distinct ones)
    tried before `deadline` (time.monotonic); run returns seconds, or None for a wrong
    result."""
    rest = [s for s in space if s not in first]
    order = [*first, *random.Random(seed).sample(rest, min(len(rest), max(trials - 1, 0)))]
    best: tuple[Schedule, float] | None = None
    for i, schedule in enumerate(order[:max(trials, len(first))]):
        if i and time.monotonic() > deadline:
            break
        seconds = run(schedule)
        progress(f"trial {i + 1}")
        if seconds is not None and (best is None or seconds < best[1]):
            best = (schedule, seconds)
    if best is None:
        raise PerfswarmError("fuse: no schedule gave a correct result")
    return best


def _kind(layer: ConvLayer) -> int:
    from perfswarm.optimize.fuse.kernels import DENSE, DEPTHWISE

    return DEPTHWISE if layer.kind == "dw" else DENSE


def cpu_timed(threads: int) -> bool:
    """Whether calls on `threads` threads are timed in the process's CPU seconds: on one, so a
    call the shared machine's other processes preempted counts only the time it ran (on an idle
    machine, its wall time); on more, wall time (CPU seconds would add the threads up)."""
    return threads == 1


def _best_of(call: Callable[[], object], repeats: int, clock: Callable[[], float]) -> float:
    times = []
    for _ in range(repeats):
        start = clock()
        call()
        times.append(clock() - start)
    return min(times)


def _error(got: np.ndarray, want: np.ndarray) -> float:
    scale = float(np.abs(want).max())
    return float(np.abs(got - want).max()) / scale if scale > 0 else float(np.abs(got).max())


class PairBench:
    """One pair's operands (seeded normal input, weights scaled by 1/sqrt(fan-in)), PyTorch's
    separate ops as the reference, and the generated kernels under a schedule."""

    def __init__(self, pair: ConvPair, threads: int) -> None:
        import torch

        from perfswarm.optimize.fuse import kernels

        self.pair, self.threads, self._kernels = pair, threads, kernels
        self.clock: Callable[[], float] = time.process_time if cpu_timed(threads) \
            else time.perf_counter
        gen = torch.Generator().manual_seed(0)

        def weight(layer: ConvLayer) -> Any:
            shape = layer.weight_shape()
            return torch.randn(shape, generator=gen) / math.sqrt(math.prod(shape[1:]))

        self.x = torch.randn((pair.batch, pair.first.in_channels, pair.height, pair.width),
                             generator=gen)
        self.w1, self.w2 = weight(pair.first), weight(pair.second)
        self.mid_ref = self.torch_first().numpy()
        self.ref = self.torch_separate().numpy()
        # PyTorch allocates its intermediate and output every call, the generated kernels write
        # into buffers of their own: PyTorch's come from a heap kept between calls, not from
        # fresh mmaps that fault on every page each call (MobileNet-V1's stem pair at batch 8:
        # 12,500-15,600 faults and 41-46 ms a call, none and 8.4 ms after), whatever other
        # pairs this process ran before (34.7 ms in one pass, 8.5 in the next)
        steady_heap()
        self.torch_separate()
        self._np = [np.ascontiguousarray(t.numpy()) for t in (self.x, self.w1, self.w2)]
        self.out = np.empty_like(self.ref)
        self.mid = np.empty_like(self.mid_ref)

    def _conv(self, x: Any, w: Any, layer: ConvLayer) -> Any:
        import torch

        with torch.no_grad():
            return torch.conv2d(x, w, None, layer.stride, layer.padding, 1, layer.groups)

    def torch_first(self) -> Any:
        return self._conv(self.x, self.w1, self.pair.first)

    def torch_separate(self) -> Any:
        return self._conv(self.torch_first(), self.w2, self.pair.second)

    def _args(self, s: Schedule) -> tuple[int, int, int, bool, bool, bool]:
        workers = 1 if s.split == "serial" else self.threads
        return (s.tile_rows, s.tile_cols, workers, s.split == "interleaved", s.gemm == "blas",
                s.channels_last)

    def fused(self, s: Schedule) -> np.ndarray:
        a, b = self.pair.first, self.pair.second
        x, w1, w2 = self._np
        self._kernels.run_pair(x, w1, w2, self.out, _kind(a), a.kernel, a.stride, _kind(b),
                               b.kernel, b.stride, *self._args(s))
        out: np.ndarray = self.out
        return out

    def single(self, which: int, s: Schedule) -> np.ndarray:
        """Op `which` (0 first, 1 second) alone: the first reads x, the second our own
        intermediate."""
        layer = (self.pair.first, self.pair.second)[which]
        src, dst = (self._np[0], self.mid) if which == 0 else (self.mid, self.out)
        assert isinstance(dst, np.ndarray)
        self._kernels.run_single(src, self._np[1 + which], dst, _kind(layer), layer.kernel,
                                 layer.stride, *self._args(s))
        return dst

    def own_separate(self, first: Schedule, second: Schedule) -> np.ndarray:
        self.single(0, first)
        return self.single(1, second)

    def timed(self, call: Callable[[Schedule], np.ndarray], want: np.ndarray, repeats: int = 3
              ) -> Callable[[Schedule], float | None]:
        """A search objective: seconds of call(schedule), None when its result is wrong."""
        def run(s: Schedule) -> float | None:
            if _error(call(s), want) > MAX_REL_ERROR:
                return None
            return _best_of(lambda: call(s), repeats, self.clock)
        return run


@dataclass(frozen=True)
class Timing:
    min_ms: float
    median_ms: float

    @classmethod
    def of(cls, seconds: Iterable[float]) -> Timing:
        values = list(seconds)
        return cls(min(values) * 1e3, statistics.median(values) * 1e3)


def median_interval(values: Sequence[float], confidence: float = CONFIDENCE
                    ) -> tuple[float, float, float]:
    """(low, high, coverage): the distribution-free interval of the median of `values` from
    their order statistics (the sign test's: the k-th smallest and k-th largest, k the largest
    with P(Binomial(n, 1/2) < k) <= (1 - confidence) / 2), with the coverage it really has;
    under 6 values no k reaches 95% and the interval is the whole range, its coverage said."""
    xs = sorted(values)
    n = len(xs)

    def tail(k: int) -> float:  # P(B < k)
        return float(sum(math.comb(n, j) for j in range(k))) / 2.0**n

    k = 1
    while k < (n + 1) // 2 and tail(k + 1) <= (1 - confidence) / 2:
        k += 1
    return xs[k - 1], xs[n - k], 1 - 2 * tail(k)


@dataclass(frozen=True)
class FuseResult:
    """One pair measured here: PyTorch separate, fused (tuned), our own separate (tuned)."""

    pair: ConvPair
    prediction: PairPrediction
    schedule: Schedule
    first_schedule: Schedule
    second_schedule: Schedule
    torch_separate: Timing
    fused: Timing
    own_separate: Timing
    max_rel_error: float
    reused: bool  # the schedules came from the cache
    threads: int
    paired: tuple[float, ...] = ()  # per round: PyTorch's time over the fused kernel's
    remeasured: bool = False  # borderline: measured again and pooled
    confirmation: tuple[float, ...] = ()  # paired speedups of the confirming measurement

    @property
    def timer(self) -> str:
        """What the times are: the process's CPU seconds (one thread) or wall seconds."""
        return "cpu" if cpu_timed(self.threads) else "wall"

    @property
    def rounds(self) -> int:
        return len(self.paired)

    @property
    def rounds_won(self) -> int:
        return sum(r > 1 for r in self.paired)

    @property
    def interval(self) -> tuple[float, float, float]:
        """(low, high, coverage) of the median paired speedup."""
        return median_interval(self.paired) if self.paired else (0.0, math.inf, 0.0)

    @property
    def borderline(self) -> bool:
        """The interval straddles 1: more rounds could decide it."""
        low, high, _ = self.interval
        return self.correct and low <= 1 < high

    @property
    def speedup(self) -> float:
        """PyTorch's separate ops over the fused kernel (minima)."""
        return self.torch_separate.min_ms / self.fused.min_ms

    @property
    def speedup_vs_own(self) -> float:
        return self.own_separate.min_ms / self.fused.min_ms

    @property
    def correct(self) -> bool:
        return self.max_rel_error <= MAX_REL_ERROR

    @property
    def gains(self) -> bool:
        """Correct, and the interval of its paired speedup above 1 (a burst of load on the
        shared machine falls on both calls of a round alike, so a gain that holds round by
        round is not a lucky minimum)."""
        return self.correct and self.interval[0] > 1

    @property
    def recommended(self) -> bool:
        """Fuse this pair: it gains, and it gained again when measured after the others."""
        return self.gains and bool(self.confirmation) and \
            median_interval(self.confirmation)[0] > 1

    def to_dict(self) -> dict[str, Any]:
        return {"pair": self.pair.label, "kind": self.pair.kind,
                "prediction": self.prediction.to_dict(), "schedule": asdict(self.schedule),
                "own_schedules": [asdict(self.first_schedule), asdict(self.second_schedule)],
                "torch_separate_ms": asdict(self.torch_separate), "fused_ms": asdict(self.fused),
                "own_separate_ms": asdict(self.own_separate), "speedup": self.speedup,
                "speedup_vs_own": self.speedup_vs_own, "max_rel_error": self.max_rel_error,
                "correct": self.correct, "recommended": self.recommended,
                "paired_speedup": statistics.median(self.paired) if self.paired else None,
                "speedup_interval": list(self.interval[:2]) if self.paired else None,
                "interval_coverage": self.interval[2], "rounds_won": self.rounds_won,
                "rounds": self.rounds, "remeasured": self.remeasured,
                "confirmation_paired_speedup": (statistics.median(self.confirmation)
                                                if self.confirmation else None),
                "confirmation_interval": (list(median_interval(self.confirmation)[:2])
                                          if self.confirmation else None),
                "reused_schedule": self.reused, "threads": self.threads, "timer": self.timer}


class ScheduleCache:
    """Tuned schedules and last measurements per pair, threads and CPU, in one JSON file."""

    def __init__(self, path: Path, cpu: str) -> None:
        self.path, self.cpu = path, cpu
        data = read_json(path) if path.exists() else {"version": CACHE_VERSION, "pairs": {}}
        if not isinstance(data, dict) or not isinstance(data.get("pairs"), dict):
            raise PerfswarmError(f"{path}: not a fuse schedule cache")
        self.data: dict[str, Any] = data

    def key(self, pair: ConvPair, threads: int) -> str:
        return f"{pair.label} threads={threads} cpu={self.cpu}"

    def schedules(self, pair: ConvPair, threads: int
                  ) -> tuple[Schedule, Schedule, Schedule] | None:
        entry = self.data["pairs"].get(self.key(pair, threads))
        try:
            return (Schedule.from_dict(entry["fused"]), Schedule.from_dict(entry["first"]),
                    Schedule.from_dict(entry["second"]))
        except (KeyError, TypeError, ValueError):
            return None

    def store(self, result: FuseResult) -> None:
        self.data["pairs"][self.key(result.pair, result.threads)] = {
            "fused": asdict(result.schedule), "first": asdict(result.first_schedule),
            "second": asdict(result.second_schedule), "result": result.to_dict()}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise PerfswarmError(f"{self.path}: cannot write ({exc.strerror or exc})") from None
        write_json(self.path, self.data)

    def results(self, cpu: str) -> list[dict[str, Any]]:
        """The stored measurements made on `cpu` (for advice). One stored before a gain had to
        hold again in a separate measurement (no `confirmation_interval`) is left out: its
        `recommended` was judged on one block of rounds alone."""
        return [e["result"] for key, e in self.data["pairs"].items()
                if key.endswith(f"cpu={cpu}") and isinstance(e, dict)
                and isinstance(e.get("result"), dict) and "confirmation_interval" in e["result"]]


@contextmanager
def _bench(pair: ConvPair, threads: int) -> Iterator[PairBench]:
    """A pair's bench, with torch and the kernels on `threads` threads (the caller's torch
    setting given back after)."""
    import torch
    from threadpoolctl import threadpool_limits

    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        bench = PairBench(pair, threads)  # imports the kernels, and with them their BLAS
        with threadpool_limits(1, user_api="blas"):  # the kernels' own threads split the work
            yield bench
    finally:
        torch.set_num_threads(saved)


def fuse_pair(pair: ConvPair, prediction: PairPrediction, threads: int, trials: int,
              deadline: float, rounds: int, cache: ScheduleCache, progress: Progress
              ) -> FuseResult:
    """Tune (or reuse) the fused and the separate schedules of a pair, check them, and time
    PyTorch separate, fused and own separate round-robin over `rounds` rounds."""
    with _bench(pair, threads) as bench:
        return _fuse_pair(bench, prediction, trials, deadline, rounds, cache, progress)


def confirm_pair(result: FuseResult, rounds: int, cache: ScheduleCache, progress: Progress
                 ) -> FuseResult:
    """A gaining pair timed again, its schedules as they are, `rounds` more paired rounds kept
    apart from the first ones (a replication, not a pool)."""
    with _bench(result.pair, result.threads) as bench:
        times = _rounds(bench, (result.schedule, result.first_schedule,
                                result.second_schedule), rounds, progress)
    confirmed = replace(result, confirmation=tuple(
        t / f for t, f in zip(times[0], times[1], strict=True)))
    cache.store(confirmed)
    return confirmed


def _rounds(bench: PairBench, schedules: tuple[Schedule, Schedule, Schedule], rounds: int,
            progress: Progress, times: list[list[float]] | None = None) -> list[list[float]]:
    """PyTorch separate, fused and own separate, one call of each a round (each first in
    turn), their times appended to `times` (new lists if None)."""
    contenders: list[Callable[[], object]] = [
        bench.torch_separate, partial(bench.fused, schedules[0]),
        partial(bench.own_separate, schedules[1], schedules[2])]
    times = times if times is not None else [[], [], []]
    for r in range(rounds):
        for i in [(r + i) % 3 for i in range(3)]:
            times[i].append(_best_of(contenders[i], 1, bench.clock))
        progress(f"round {len(times[0])}")
    return times


def _fuse_pair(bench: PairBench, prediction: PairPrediction, trials: int, deadline: float,
               rounds: int, cache: ScheduleCache, progress: Progress) -> FuseResult:
    pair, threads = bench.pair, bench.threads
    found = cache.schedules(pair, threads)
    if found is None:
        h, w = pair.out_size
        space = schedule_space(h, w, threads, channels_last_fits(pair.first, pair.second))
        fused, _ = search(bench.timed(bench.fused, bench.ref), space, _defaults(space, w),
                          trials, deadline, progress)
        own = []
        for which, (rows, cols) in enumerate((pair.mid_size, pair.out_size)):
            layer = (pair.first, pair.second)[which]
            one = schedule_space(rows, cols, threads, channels_last_fits(layer))
            # the second op alone reads the reference intermediate
            bench.mid[...] = bench.mid_ref
            own.append(search(bench.timed(partial(bench.single, which),
                                          bench.mid_ref if which == 0 else bench.ref),
                              one, _defaults(one, cols), max(2, trials // 2), deadline,
                              progress)[0])
        schedules = (fused, own[0], own[1])
    else:
        schedules = found
    error = max(_error(bench.fused(schedules[0]), bench.ref),
                _error(bench.own_separate(*schedules[1:]), bench.ref))
    times: list[list[float]] = [[], [], []]

    def measure() -> FuseResult:
        _rounds(bench, schedules, rounds, progress, times)
        return FuseResult(pair, prediction, schedules[0], schedules[1], schedules[2],
                          Timing.of(times[0]), Timing.of(times[1]), Timing.of(times[2]), error,
                          found is not None, threads,
                          tuple(t / f for t, f in zip(times[0], times[1], strict=True)),
                          len(times[0]) > rounds)

    result = measure()
    if result.borderline:
        result = measure()
    cache.store(result)
    return result
