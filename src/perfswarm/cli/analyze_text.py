"""`perfswarm analyze RUN`'s terminal output: its tables and lines, in rich (imported only
when a command prints them: `analyze --json` loads no rich)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final, TypeVar

from rich.table import Table
from rich.text import Text

from perfswarm.analyze.analysis import Analysis
from perfswarm.analyze.concurrency import STATES
from perfswarm.analyze.critical_path import CriticalPath
from perfswarm.cli.output import console
from perfswarm.model.opstats import OpCosts
from perfswarm.report.text import ms, short_caption, size

T = TypeVar("T")
# Per-step lines up to this many steps; of more, the fastest, the median and the slowest
# three (the rest are in --json: a 200-step Run printed 1,000 lines, a third of the command).
STEP_LINES: Final = 8
SHORT = {"overlapped": "overlap", "compute_only": "compute", "comm_only": "comm",
         "memory": "memory", "host_busy_device_idle": "host only", "idle": "idle"}


def _shown(steps: Sequence[T], size: Callable[[T], int]) -> tuple[list[T], int]:
    """The steps to print (in step order) and how many are left out: all up to STEP_LINES,
    else the smallest by `size`, the median and the three largest."""
    if len(steps) <= STEP_LINES:
        return list(steps), 0
    order = sorted(range(len(steps)), key=lambda i: size(steps[i]))
    keep = sorted({order[0], order[len(order) // 2], *order[-3:]})
    return [steps[i] for i in keep], len(steps) - len(keep)


def _left_out(count: int) -> str:
    return f"  ... {count:,} more steps (every step: --json)" if count else ""


def _ran_device_ops(result: Analysis) -> bool:
    return bool(result.ops.categories)


def _concurrency_table(result: Analysis) -> Table:
    # A run without device work (CPU training) has two states: the host busy or idle; and
    # of the busy time, how much ran ops (the rest: annotations or Python frames around no
    # op, a DataLoader's wait)
    device = _ran_device_ops(result)
    states = STATES if device else ("host_busy_device_idle", "idle")
    # no device to idle: the time no traced span covers is Python between the ops or a wait
    # (the report's breakdown calls it untraced)
    names = SHORT if device else {**SHORT, "host_busy_device_idle": "host busy",
                                  "idle": "untraced"}
    table = Table("rank", "step", "span", *(names[s] for s in states),
                  *(("comm hidden",) if device else ("of it ops",)),
                  title="concurrency (share of span)", title_justify="left")
    left = 0
    for rank in result.concurrency.ranks:
        shown, more = _shown(rank.iterations, lambda i: i.breakdown.span_ns)
        left += more
        for label, b in (("all", rank.total), *((str(i.step), i.breakdown) for i in shown)):
            table.add_row(str(rank.rank), label, ms(b.span_ns),
                          *(f"{100 * b.share(s):.1f}%" for s in states),
                          f"{b.comm_overlap_pct:.1f}%" if device else
                          f"{100 * b.host_ops_ns / b.span_ns if b.span_ns else 0:.1f}%")
    if left:
        table.caption = _left_out(left).strip() + "; shown: the shortest, median and longest"
    return table


def _op_cost_table(costs: OpCosts) -> Table:
    where = f"roofline on {costs.device}" if costs.device else "no device spec: rates only"
    share = 100 * costs.modelled_ns / costs.op_ns if costs.op_ns else 0.0
    table = Table("op", "shapes", "count", "time", "FLOP/B", "GFLOP/s", "GB/s", "bound", "of roofline",
                  title=f"op cost ({where}; ops with a cost model: {share:.0f}% of op time)",
                  title_justify="left")
    for o in costs.to_dict()["ops"][:12]:
        table.add_row(o["name"][:40], o["shapes"][:36], f"{o['count']:,}", ms(o["time_ns"]),
                      f"{o['intensity']:.2f}", f"{o['achieved_gflops']:,.1f}",
                      f"{o['achieved_gbps']:,.1f}", o["bound"] or "-",
                      f"{100 * o['efficiency']:.1f}%" if o["efficiency"] is not None else "-")
    return table


def print_analysis(result: Analysis, costs: OpCosts, origin: int | None,
                   windowed_run: bool = False) -> None:
    """The analysis and its op costs as the terminal shows them (`origin`: the Run's first
    time, which a memory peak's time is given from; `windowed_run`: from the window's)."""
    console.print(Text.assemble((str(result.path), "bold"),
                                f": {result.events:,} events, ranks {list(result.ranks)}"))
    its = result.iterations
    counts = {r: len(s) for r, s in its.steps.items()}
    console.print(f"iterations ({its.used or 'none found'}): {counts}")
    for a in its.agreement:
        if not a.detected_count:
            console.print(f"  rank {a.rank}: {a.marker_count} marked, no repetition detected")
            continue
        if not a.count_matches:  # steps paired by position would not be the same steps
            console.print(f"  rank {a.rank}: {a.marker_count} marked, {a.detected_count} "
                          "detected: the counts differ, boundaries not compared")
            continue
        console.print(f"  rank {a.rank}: {a.marker_count} marked, {a.detected_count} detected, "
                      f"max boundary error {ms(a.max_boundary_error_ns)} "
                      f"({a.max_error_pct:.2f}% of mean step)")
    if result.concurrency.ranks:
        console.print(_concurrency_table(result))
    for rank in result.concurrency.ranks:
        if rank.host_comm is not None:  # a CPU process group (gloo): its threads' collectives
            h = rank.host_comm
            console.print(f"  rank {rank.rank} collectives on host threads: "
                          f"{ms(h.comm_ns)} ({100 * h.comm_ns / rank.total.span_ns:.1f}% of "
                          f"the span), {h.comm_overlap_pct:.1f}% of it hidden under the "
                          "rank's ops")
    if _ran_device_ops(result):  # a CPU-only run has no device ops: no device tables
        _print_device(result)
    if costs.ops:
        console.print(_op_cost_table(costs))
    for f in costs.fusion[:3]:
        console.print(f"  fusion candidate: {' + '.join(f.ops)} saves "
                      f"{f.saving_s * 1e6:,.3f} us per step on the roofline")
    cp = result.critical_path
    if cp is not None:
        device = _ran_device_ops(result)  # no device ops to count on a CPU run
        console.print(f"critical path {_path_text(cp, device)}")
        shown, left = _shown(cp.steps, lambda p: p.length_ns)
        split = len({s.step for s in cp.steps}) < len(cp.steps)  # ranks waiting for no other
        for step in shown:
            hands = ", ".join(f"{h.from_tid}->{h.to_tid} at +{ms(h.at - step.start)}"
                              for h in step.handovers)
            of = f" rank {', '.join(map(str, step.ranks))}" if split else ""
            console.print(f"  step {step.step}{of}: {_path_text(step, device)}"
                          + (f" ({hands})" if hands else ""))
        if left:
            console.print(_left_out(left))
    # a window's timeline starts empty: what was alive at its start is in no total
    within = " of what the window allocated" if windowed_run else ""
    for m in result.memory:
        held = ", ".join(f"{c} {size(v)}" for c, v in sorted(m.peak.by_category.items(),
                                                            key=lambda kv: -kv[1]) if v)
        peaks, left = _shown(m.steps, lambda sp: sp[1].total_bytes)
        steps = ", ".join(f"{s}: {size(p.total_bytes)}" for s, p in peaks) + (
            f", {left:,} more in --json" if left else "")
        reserved = ("" if m.reserved is None else f"; reserved {size(m.reserved.at_peak_bytes)} "
                    f"then, at most {size(m.reserved.peak_bytes)}")
        console.print(f"memory rank {m.rank}: peak {size(m.peak.total_bytes)}{within} at "
                      f"+{ms(m.peak.ts - (m.t[0] if origin is None else origin))} from the "
                      f"{'window' if windowed_run else 'Run'}'s start ({held}){reserved}"
                      + (f"; per step {steps}" if steps else ""))
    if result.swarms.swarms and result.swarms.scope == "steps":
        which, out = (("the steps timed outside the profiler's window, the program "
                       "unprofiled", "the start-up, the profiler's window")
                      if result.swarms.unprofiled else ("the steps", "the start-up"))
        console.print(f"function swarms of the samples in {which} ({result.swarms.left_out:,} "
                      f"others left out: {out}, after the loop, and py-spy's, which carry no "
                      "time)")
    for sw in result.swarms.swarms[:10]:
        console.print(f"  swarm {100 * sw.share:5.1f}%  {short_caption(sw.caption)} "
                      f"({sw.samples:,} samples)")
    for system in result.system:
        dominators = [f"{w.step}:{w.dominator}" for w in system.windows if w.dominator]
        corr = ", ".join(f"{k} r={v:+.2f}" for k, v in system.gpu_correlation.items())
        console.print(f"rank {system.rank} system: dominators {' '.join(dominators) or '-'}"
                      + (f"; device utilization vs {corr}" if corr else ""))
    st = result.stragglers
    if st.instances:
        console.print(f"collectives across ranks: {st.instances} instances, max skew "
                      f"{ms(st.max_skew_ns)}, straggler rank {st.straggler}")


def _path_text(cp: CriticalPath, device: bool) -> str:
    parts = ", ".join(f"{c} {100 * v / cp.length_ns:.1f}%" for c, v in cp.ns.items()
                      if v and cp.length_ns)
    return (f"{ms(cp.length_ns)}: {parts}; {f'{cp.device_ops} device ops, ' if device else ''}"
            f"{cp.rank_switches} rank switches, {cp.thread_switches} thread switches")


def _print_device(result: Analysis) -> None:
    cats = Table("category", "ops", "time", "share", title="device time by category",
                 title_justify="left")
    for c in result.ops.categories:
        cats.add_row(c.category, f"{c.count:,}", ms(c.total_ns), f"{100 * c.share:.1f}%")
    console.print(cats)
    kernels = Table("kernel", "category", "count", "total", "mean", title="top device ops",
                    title_justify="left")
    for k in result.ops.kernels[:10]:
        kernels.add_row(k.name[:70], k.category, f"{k.count:,}", ms(k.total_ns), ms(k.mean_ns))
    console.print(kernels)
    launch = Table("rank", "launched", "delay p50", "delay p90", "shorter than launch",
                   "queue max", "idle host-wait", "idle kernel-wait", "idle other",
                   title="launches", title_justify="left")
    for s in result.launch:
        launch.add_row(str(s.rank), f"{s.launched:,}/{s.device_ops:,}", ms(s.delay_ns.p50),
                       ms(s.delay_ns.p90), f"{s.shorter_than_launch:,}", str(s.queue.max),
                       ms(s.idle.host_wait_ns), ms(s.idle.kernel_wait_ns), ms(s.idle.other_ns))
    console.print(launch)
