"""Iterations of runs with no op or kernel trace, and time windows for runs with none at all.

SOFA's AISI finds a program's iterations in the sequence of what it did (syscalls, in
SOFA). Here the same detection the op sequence gets (`iterations.detect`) runs on the
syscalls of the busiest thread (strace), else on the perf stack samples of the busiest
thread, each sample named by its leaf's module (voted over the SMOOTH samples around it).
A phase spans several syscalls or samples in a row, so repeats of one name in a row become
one run first. What repeats is a loop only if chance would not repeat it (CHANCE: a loop
of 40 ms sampled at 70 Hz is three samples an iteration, and three modules repeat by
chance), if it lasts (iterations.LOOP_SHARE of the span: not an import's tight loop), and, for two
symbols, which alternate whatever the program does, if each phase is steady (STEADY).
Else none is found, and the run gets time windows.

A run with no iterations found still gets per-window numbers: its span is cut into WINDOWS
equal time windows (source `window`), for the concurrency breakdown and the system load
(dominator and Pearson correlations) per window.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from perfswarm.analyze.frame import I64, Events, codes
from perfswarm.analyze.iterations import MAX_LAGS, StepWindow, detect, lasts
from perfswarm.trace.schema import NONE

WINDOWS = 10
SMOOTH = 5  # samples a leaf module is voted over
MINOR = 0.1  # a leaf module with less of the samples than this is no phase of its own
CHANCE = 0.01  # a repeating stretch is a loop only if chance would make one this rarely
STEADY = 0.5  # the spread (std / mean) of a steady phase's run lengths at most


def runs(symbols: I64, ts: I64, end: I64) -> tuple[I64, I64, I64, I64]:
    """Consecutive repeats of one symbol merged into one (symbol, first start, last end,
    how many were merged)."""
    if len(symbols) == 0:
        return symbols, ts, end, symbols
    first = np.flatnonzero(np.r_[True, symbols[1:] != symbols[:-1]])
    last = np.r_[first[1:], len(symbols)] - 1
    return symbols[first], ts[first], np.maximum.accumulate(end)[last], last - first + 1


def repeating_stretch(symbols: I64, ts: I64, end: I64) -> tuple[int, int]:
    """[first, last) of the stretch that repeats with one period (at least twice) over the
    longest time (symbol i ran from ts[i] to end[i]): a loop's syscalls follow the
    start-up's, so the loop is found where it is, not matched against the whole sequence;
    and a start-up's imports can repeat one period of calls more often than the loop does
    (a thousand `openat fstat read close` in 0.3 s, before 40 iterations of 1.6 s), so the
    stretch is the one that lasts, not the one of the most calls. The periods tried are the
    most frequent gaps between repeats of a symbol; on a tie the shortest (a multiple of
    the period covers as much)."""
    n = len(symbols)
    order = np.lexsort((np.arange(n), symbols))
    same = symbols[order][1:] == symbols[order][:-1]
    gaps = (order[1:] - order[:-1])[same]
    gaps = gaps[(gaps > 0) & (gaps <= n // 2)]
    best = (0, 0, 0, 0)  # lasted, -lag, first, covered
    values, counts = np.unique(gaps, return_counts=True)
    lags = values[np.argsort(-counts, kind="stable")[:MAX_LAGS]].tolist()
    # a few samples an iteration of a few modules repeat by chance (a loop of 40 ms sampled
    # at 70 Hz has three samples an iteration): a stretch is a loop only if chance would
    # match as many of its pairs, anywhere, at any lag tried, at odds under CHANCE
    chance, enough = _chance_match(symbols), math.log(n * max(len(lags), 1) / CHANCE)
    for lag in lags:
        eq = np.r_[False, symbols[:-lag] == symbols[lag:], False].astype(np.int8)
        edges = np.flatnonzero(np.diff(eq))
        starts, ends = edges[::2], edges[1::2]
        if len(starts) == 0:
            continue
        i = j = int(np.argmax(ends - starts))
        # one call more or fewer in an iteration (a brk) misaligns `lag` comparisons: a
        # neighbouring run across such a gap that matches a whole period itself continues it
        while i > 0 and starts[i] - ends[i - 1] <= lag + 1 and ends[i - 1] - starts[i - 1] >= lag:
            i -= 1
        while (j + 1 < len(starts) and starts[j + 1] - ends[j] <= lag + 1
               and ends[j + 1] - starts[j + 1] >= lag):
            j += 1
        covered = int(ends[j] - starts[i]) + lag
        first = int(starts[i])
        lasted = int(np.max(end[first:first + covered])) - int(ts[first])
        matched = int(eq[first + 1:first + covered - lag + 1].sum())
        if (covered >= 2 * lag and _surprise(matched, covered - lag, chance) >= enough
                and (lasted, -lag) > best[:2]):
            best = (lasted, -lag, first, covered)
    return best[2], best[2] + best[3]


def _steady(names: I64, sizes: I64, least: int = 1) -> bool:
    """Whether each of (at most) two alternating symbols repeats a steady number of times a
    run (calls, or samples of CPU time), the first and last runs left out (the recording
    attached, or stopped, inside them): a loop of two phases does the same work each time
    (compress, then hash: 15 samples each, within 2%), where two modules a program switches
    between as it goes do not (a scikit-learn loop's numpy and BLAS samples: 1 to 58 a run,
    their spread 0.7-1.1 of their mean). Each phase lasts `least` on average: of sampled
    modules, more than the smoother's reach (a 2 s spin's clock reads in the kernel, 1-5
    samples a run among libpython's, had made 5 iterations of a program with no loop)."""
    inner_names, inner = names[1:-1], sizes[1:-1]
    if len(inner) < 4:
        return False
    phases = [inner[inner_names == v] for v in np.unique(inner_names)]
    return bool(max(p.std() / p.mean() for p in phases) <= STEADY
                and min(p.mean() for p in phases) >= least)


def _chance_match(symbols: I64) -> float:
    """How often two symbols some lag apart match by chance: 1/(k-1), k the effective number
    of symbols (1/sum of their squared frequencies; a symbol never follows itself here, so
    1/(k-1), not 1/k); 1 for two symbols or fewer (they alternate whatever the program does)."""
    _, counts = np.unique(symbols, return_counts=True)
    distinct = 1.0 / float(np.sum((counts / len(symbols)) ** 2)) if len(symbols) else 0.0
    return 1.0 if distinct <= 2.0 else 1.0 / (distinct - 1.0)


def _surprise(matched: int, compared: int, chance: float) -> float:
    """-log of the odds that at least `matched` of `compared` pairs match when each does at
    `chance` (Chernoff's bound, exp(-compared * KL(matched/compared || chance)): at most the
    true odds' surprise, so a stretch it calls no chance is none)."""
    rate = matched / compared
    if rate <= chance:
        return 0.0
    miss = 0.0 if rate == 1.0 else (1 - rate) * math.log((1 - rate) / (1 - chance))
    return compared * (rate * math.log(rate / chance) + miss)


def _windows(symbols: I64, ts: I64, end: I64, least: int = 1) -> list[StepWindow]:
    names, starts, ends, sizes = runs(symbols, ts, end)
    if len(np.unique(names)) <= 2:  # two phases alternate whatever the program does
        lo, hi = (0, len(names)) if _steady(names, sizes, least) else (0, 0)
    else:
        lo, hi = repeating_stretch(names, starts, ends)
    # a tight loop inside one call (an import's mmap/munmap pairs, 1,562 "iterations" of
    # 78 us in 122 ms of a 4.2 s program) repeats too: it is not the program's loop
    if hi == lo or not lasts(int(starts[lo]), int(ends[lo:hi].max()), starts, ends):
        return []
    return [StepWindow(i, a, b, "detected") for i, (a, b) in enumerate(detect(
        names[lo:hi], starts[lo:hi], ends[lo:hi], after_last_op=False))]


def _busiest(tids: I64) -> I64:
    """Mask of the rows of the thread with the most rows (the lowest tid on a tie)."""
    values, counts = np.unique(tids, return_counts=True)
    return np.asarray(tids == values[np.argmax(counts)])


def syscall_steps(ev: Events) -> dict[int, list[StepWindow]]:
    """Iterations detected in each rank's busiest thread's syscalls."""
    out: dict[int, list[StepWindow]] = {}
    calls = ev.of_kind("syscall")
    for rank in ev.ranks:
        rows = np.arange(len(ev))[ev.rank_slice(rank)]
        rows = rows[calls[rows]]
        if len(rows) == 0:
            continue
        rows = rows[_busiest(ev.tid[rows])]
        rows = rows[np.argsort(ev.ts[rows], kind="stable")]
        if found := _windows(ev.name[rows], ev.ts[rows], ev.end[rows]):
            out[rank] = found
    return out


def leaf_modules(stacks: pa.Table, stack_ids: I64, smooth: int = SMOOTH) -> I64:
    """Per sample (its stack id, in time order), a code for its leaf's module (the library the
    time went to). A module with under MINOR of the samples (the interpreter between two calls,
    a libc copy, a page fault in the kernel) takes the module of the sample before it: on a
    loaded machine such strays fall at phase boundaries and inside phases alike, and a phase
    they split no longer repeats. Then each sample takes the most common of the `smooth`
    samples around it, so a stray of a major module inside another's phase does not split it
    either. Native stacks of an interpreter unwind unevenly (no frame pointers), so the leaf is
    what every sample has."""
    sid = np.asarray(stacks.column("stack_id").to_numpy(), np.int64)
    leaf = np.asarray(stacks.column("depth").to_numpy(), np.int64) == 0
    module, _ = codes(stacks.column("module"))
    raw = _lookup(sid[leaf], module[leaf], np.asarray(stack_ids, np.int64))
    values, counts = np.unique(raw, return_counts=True)
    major = np.isin(raw, values[counts >= MINOR * len(raw)])
    if major.any():  # each minor sample takes the last major one's module (the first's, first)
        last = np.maximum.accumulate(np.where(major, np.arange(len(raw)), -1))
        raw = raw[np.where(last >= 0, last, np.flatnonzero(major)[0])]
    return _vote(raw, smooth // 2)


def _lookup(keys: I64, values: I64, wanted: I64) -> I64:
    """The value of each wanted key (the last given for it), NONE where it has none."""
    if len(keys) == 0:
        return np.full(len(wanted), NONE, np.int64)
    order = np.argsort(keys, kind="stable")
    keys, values = keys[order], values[order]
    last = np.append(keys[1:] != keys[:-1], True)
    keys, values = keys[last], values[last]
    at = np.minimum(np.searchsorted(keys, wanted), len(keys) - 1)
    return np.where(keys[at] == wanted, values[at], NONE).astype(np.int64)


def _vote(raw: I64, half: int) -> I64:
    """Each sample takes the value that holds a strict majority of the samples within `half`
    of it (fewer at the ends), if one does: every window at once, a few columns wide."""
    n, width = len(raw), 2 * half + 1
    if n == 0:
        return raw.copy()
    padded = np.concatenate([np.zeros(half, np.int64), raw, np.zeros(half, np.int64)])
    real = np.concatenate([np.zeros(half, bool), np.ones(n, bool), np.zeros(half, bool)])
    window = np.lib.stride_tricks.sliding_window_view(padded, width)
    inside = np.lib.stride_tricks.sliding_window_view(real, width)
    same = (window[:, :, None] == window[:, None, :]) & inside[:, None, :] & inside[:, :, None]
    counts = same.sum(axis=2)  # per sample and window place: how many share its value
    best = counts.argmax(axis=1)
    size = inside.sum(axis=1)
    rows = np.arange(n)
    return np.where(counts[rows, best] > size // 2, window[rows, best], raw).astype(np.int64)


def sample_steps(samples: pa.Table, stacks: pa.Table) -> dict[int, list[StepWindow]]:
    """Iterations detected in each rank's busiest thread's perf samples (py-spy's are
    aggregated, without times)."""
    perf = samples.filter(pc.equal(samples.column("source").cast(pa.string()), "perf"))
    out: dict[int, list[StepWindow]] = {}
    if perf.num_rows == 0:
        return out
    rank = np.asarray(perf.column("rank").to_numpy(), np.int64)
    for r in np.unique(rank).tolist():
        rows = np.flatnonzero(rank == r)
        rows = rows[_busiest(np.asarray(perf.column("tid").to_numpy(), np.int64)[rows])]
        ts = np.asarray(perf.column("ts").to_numpy(), np.int64)[rows]
        order = np.argsort(ts, kind="stable")
        rows, ts = rows[order], ts[order]
        sid = np.asarray(perf.column("stack_id").to_numpy(), np.int64)[rows]
        # a phase of samples must outlast the smoother's reach to be told from strays
        if found := _windows(leaf_modules(stacks, sid), ts, ts, SMOOTH // 2 + 1):
            out[int(r)] = found
    return out


def time_windows(ev: Events, counters: pa.Table,
                 count: int = WINDOWS) -> dict[int, list[StepWindow]]:
    """`count` equal windows over the span of the work (Events.work, the span concurrency
    breaks down: not the profiler's own range and closing instant, which can last a second
    past the last op) and the counter readings, for every rank with events (the host, rank
    -1, when there are none)."""
    read = np.asarray(counters.column("ts").to_numpy(), np.int64)
    work = ev.work
    starts = [t.min() for t in (ev.ts[work], read) if len(t)]
    # spans end where the last work ends, just past the last reading (so it falls inside)
    ends = [t.max() + extra for t, extra in ((ev.end[work], 0), (read, 1)) if len(t)]
    if not starts or max(ends) <= min(starts) + count:
        return {}
    lo, span = int(min(starts)), int(max(ends)) - int(min(starts))
    edges = [lo + span * i // count for i in range(count + 1)]  # exact: epoch ns exceed floats
    windows = [StepWindow(i, int(lo), int(hi), "window")
               for i, (lo, hi) in enumerate(itertools.pairwise(edges))]
    return dict.fromkeys(ev.ranks or [NONE], windows)


def without_iterations(ev: Events, samples: pa.Table, stacks: pa.Table
                       ) -> Mapping[int, Sequence[StepWindow]]:
    """Iterations from syscalls, else from stack samples ({} when neither repeats)."""
    return syscall_steps(ev) or sample_steps(samples, stacks)
