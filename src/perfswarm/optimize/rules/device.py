"""Rules about the accelerator: idle time, launch overhead, FP32 GEMMs, fusion, memory headroom."""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Any, Final

import numpy as np
import orjson
import pyarrow as pa

from perfswarm.analyze.ops import TENSOR_CORE
from perfswarm.model.fusion import fusion_candidates
from perfswarm.model.opcost import OpCost, roofline
from perfswarm.model.specs import DeviceSpec
from perfswarm.optimize.rules.base import Advice, advice, pct
from perfswarm.optimize.rules.facts import Facts, col, groups, like, where
from perfswarm.trace.schema import MEMORY_RESERVED, NONE

_SMALL_KERNEL_NS = 10_000
_GRAPH_LAUNCH_NS = 1_000  # per kernel, replayed from a captured CUDA graph
_GEMM = r"(?i)gemm"
# Without recorded shapes: TF32 tensor cores peak 8x FP32 on A100; GEMMs typically reach a
# quarter of that.
_TF32_SPEEDUP = 2.0
_NEAR_CAPACITY = 0.9
_MIN_FUSION_PCT = 1.0  # modelled saving, % of the measured time, below which fusion is noise


def low_utilization(facts: Facts) -> Advice | None:
    """The device is idle for most of the measured time (analyze's device idle): it could take
    more work per step. A larger batch costs the host the same ops (it dispatches the same
    kernels; only loading the batch grows with it) and the device at most proportionally
    more time, so the same samples take less time."""
    if facts.device_events.num_rows < 10:
        return None
    util = facts.device_busy
    low = sorted(r for r, u in util.items() if u < 0.5)
    if not low:
        return None
    device = {r: int(col(mine, "device").min())
              for (r,), mine in groups(facts.device_events, ["rank"])}
    loader = facts.busy_ns(facts.loader_calls)
    capacity = device_capacity(facts)
    peaks = peak_memory(facts, set(low))
    rows, gain, tight = [], 0.0, []
    for r in low:
        window = facts.window(r)[2]
        idle, span = facts.device_idle[r]
        busy = span - idle
        blocked, load = facts.host_blocked_ns.get(r, 0), loader.get((r,), 0)
        # A step at twice the batch: the host's own work (its time not blocked on the device)
        # with the batch's loading twice over, against the device's busy time doubled (small
        # kernels grow less: a bound); the same samples take half of it.
        doubled = max(window - blocked + load, 2 * busy) / 2
        gain += max(0.0, window - doubled)
        row = {"rank": r, "device": device[r], "busy_pct": round(100 * util[r], 2),
               "idle_ns": round((1 - util[r]) * window),
               "host_work_ns": window - blocked, "loader_ns": load, "device_busy_ns": busy,
               "per_sample_at_2x_batch_ns": round(doubled)}
        peak = peaks.get((r, device[r]))
        if peak is not None and (r, device[r]) in capacity:
            row["peak_bytes"], row["capacity_bytes"] = round(peak[0]), capacity[r, device[r]]
            if 2 * peak[0] > capacity[r, device[r]]:
                tight.append(r)
        rows.append(row)
    basis = ("batch model from this run's times: at twice the batch a step takes the longer "
             "of the host's own work (not blocked on the device; the batch's loading doubled) "
             "and twice the device's busy time, and carries twice the samples")
    if tight:
        basis += (f"; twice the peak memory exceeds the device on rank(s) {tight} (weights and "
                  "optimizer state do not grow with the batch: it may still fit)")
    return advice(facts, "low_utilization", "the device is idle most of the time",
                  {"devices": rows}, gain, basis,
                  "give the device more work per step: a larger batch (scale the learning "
                  "rate with it); the other findings name why the host cannot keep it busy "
                  "(launches, syncs, data loading)")


def launch_bound(facts: Facts) -> Advice | None:
    """The host launches kernels slower than the device runs them: the device waits on the
    host (most of its idle time is analyze's host wait, and no more than that can be won).
    Small kernels make it plain, but a step of 20 µs kernels whose ops cost the host 100 µs
    each is as bound (nanoGPT on an H200)."""
    kernels = facts.in_window(facts.kind("kernel"))
    launches = facts.in_window(facts.kernel_launches)
    if kernels.num_rows < 100 or launches.num_rows == 0:
        return None
    busy = min(facts.device_busy.values(), default=0.0)
    idle = sum(s.idle.total_ns for s in facts.launch)
    host_wait = sum(s.idle.host_wait_ns for s in facts.launch)
    if busy >= 0.7 or host_wait * 2 <= idle:
        return None
    # What a captured CUDA graph takes off the host: the ops that launch its kernels (their
    # aten dispatch and launch calls, outermost op first), but the calls that wait for the
    # device, which cannot be captured. The host pays one launch per step instead; the device
    # still starts each kernel about a microsecond after the previous one.
    # (the ops' time outside the blocking calls: their union with those calls, less them)
    host_ops = pa.concat_tables([facts.in_window(facts.launch_scopes), launches,
                                 *facts.host_blocking])
    captured = {k[0]: v - facts.host_blocked_ns.get(k[0], 0)
                for k, v in facts.busy_ns(host_ops).items()}
    ranks, counts = np.unique(col(kernels, "rank"), return_counts=True)
    kernels_by_rank = dict(zip(ranks.tolist(), counts.tolist(), strict=True))
    host_per_kernel = sum(captured.values()) / kernels.num_rows
    mean_kernel = facts.total_ns(kernels) / kernels.num_rows
    if host_per_kernel <= mean_kernel:
        return None
    gain = 0
    for rank in facts.ranks:
        window = facts.window(rank)[2]
        host_after = window - captured.get(rank, 0)
        device_idle, span = facts.device_idle.get(rank, (0, 0))
        device_after = span - device_idle + kernels_by_rank.get(rank, 0) * _GRAPH_LAUNCH_NS
        gain += max(0, window - max(host_after, device_after))
    gain = min(gain, host_wait)
    small = int((col(kernels, "dur") < _SMALL_KERNEL_NS).sum())
    mean_launch = facts.total_ns(launches) / launches.num_rows
    evidence = {"kernels": kernels.num_rows, "small_kernels": small,
                "kernel_mean_ns": round(mean_kernel), "host_per_kernel_ns": round(host_per_kernel),
                "launches": launches.num_rows, "launch_mean_ns": round(mean_launch),
                "device_busy_pct": round(100 * busy, 2),
                "idle_host_wait_pct": round(100 * host_wait / idle, 2),
                # analyze's launch queue: at its longest, and how long the host blocked on it
                "launch_queue_max": max(s.queue.max for s in facts.launch),
                "launch_queue_full_ns": sum(s.queue.full_ns for s in facts.launch)}
    title = ("many small kernels: launch overhead dominates" if small * 2 >= kernels.num_rows
             else "the host launches kernels slower than the device runs them")
    return advice(facts, "launch_bound", title, evidence, gain,
                  "launch model from this run's times: a step becomes the slower of the host "
                  f"without the ops that launch its kernels ({round(host_per_kernel):,} ns of "
                  f"host per kernel, launch calls of {round(mean_launch):,} ns included; the "
                  "calls that wait for the device stay) and the device's busy time plus "
                  f"{_GRAPH_LAUNCH_NS:,} ns per kernel replayed from a CUDA graph, at most the "
                  "device's idle time waiting on the host",
                  "capture the step in a CUDA graph (torch.cuda.graphs / "
                  "torch.compile(mode='reduce-overhead')) or fuse ops with torch.compile")


def _tensor_core_devices(facts: Facts) -> list[str]:
    return sorted({str(d.get("name")) for d in facts.manifest["devices"]
                   if "NVIDIA" in str(d.get("name", "")) and int(d.get("computeMajor", 0)) >= 8})


def _tf32_time_ratio(cost: OpCost | None, spec: DeviceSpec | None) -> float | None:
    """Roofline time at the TF32 peak over the roofline time at the FP32 peak of the GEMM or
    convolution that launched a kernel; None without recorded shapes or a device spec."""
    if spec is None or cost is None or cost.family not in ("gemm", "conv") or cost.dtype != "fp32":
        return None
    fp32 = roofline(cost, spec).time_s
    return roofline(replace(cost, dtype="tf32"), spec).time_s / fp32 if fp32 > 0 else None


def fp32_gemm(facts: Facts) -> Advice | None:
    """GEMMs run on the FP32 (SIMT) path of a device whose tensor cores take TF32/BF16."""
    devices = _tensor_core_devices(facts)
    gemms = facts.in_window(facts.named(_GEMM, "kernel"))
    if not devices or gemms.num_rows == 0:
        return None
    fp32 = where(gemms, ~facts.named_like(gemms, TENSOR_CORE))
    fp32_ns, gemm_ns = facts.total_ns(fp32), facts.total_ns(gemms)
    if fp32.num_rows == 0 or fp32_ns < gemm_ns / 10:
        return None
    spec = facts.spec
    ratio = functools.cache(lambda cost: _tf32_time_ratio(cost, spec))  # per distinct op cost
    ratios = [ratio(cost) for cost in facts.costs_of(facts.launching_ops(fp32))]
    durs = col(fp32, "dur").tolist()
    modelled = [(d, r) for d, r in zip(durs, ratios, strict=True) if r is not None]
    rest_ns = sum(d for d, r in zip(durs, ratios, strict=True) if r is None)
    tf32_ns = sum(d * r for d, r in modelled) + rest_ns / _TF32_SPEEDUP
    evidence = {"devices": devices, "fp32_gemms": fp32.num_rows, "gemms": gemms.num_rows,
                "fp32_gemm_ns": fp32_ns, "fp32_share_of_gemm_pct": pct(fp32_ns, gemm_ns),
                "top_kernels": [n for n, _ in facts.by_name(fp32, col(fp32, "dur"))[:3]],
                "modelled_gemms": len(modelled), "tf32_estimate_ns": round(tf32_ns)}
    fixed = f"TF32 tensor-core GEMMs run about {_TF32_SPEEDUP:g}x faster than FP32 ones"
    if modelled and spec is not None:
        basis = (f"roofline model (model/opcost.py) of {len(modelled)} kernels' recorded shapes on "
                 f"{spec.name} ({spec.peak_for('fp32') / 1e12:g} FP32 vs "
                 f"{spec.peak_for('tf32') / 1e12:g} TF32 TFLOP/s, "
                 f"{spec.memory_bandwidth / 1e9:g} GB/s), each kernel keeping the share of its "
                 "roof it reached in FP32")
        if rest_ns:
            basis += f"; the {fp32.num_rows - len(modelled)} without recorded shapes: {fixed}"
    else:
        why = "no device spec for " + ", ".join(devices) if spec is None else (
            "no recorded shapes (record_shapes=True) for these GEMMs")
        basis = f"fixed factor, no model ({why}): {fixed}"
    return advice(facts, "fp32_gemm", "FP32 GEMMs on a tensor-core device", evidence,
                  fp32_ns - tf32_ns, basis,
                  "torch.backends.cuda.matmul.allow_tf32 = True and torch.backends.cudnn."
                  "allow_tf32 = True (or torch.set_float32_matmul_precision('high')); or run the "
                  "forward pass under torch.autocast('cuda', dtype=torch.bfloat16)")


def _op_sequence(facts: Facts, kernels: pa.Table) -> list[tuple[OpCost | None, int]]:
    """Kernels in time order as (launching op's cost, measured ns): one entry per op, its
    kernels' time summed; a kernel without a modelled op is an entry of its own."""
    seq: list[tuple[int, int]] = []  # (op row, ns)
    ordered = kernels.take(pa.array(np.lexsort((col(kernels, "correlation"),
                                                col(kernels, "ts")))))
    for op, dur in zip(facts.launching_ops(ordered).tolist(), col(ordered, "dur").tolist(),
                       strict=True):
        if op >= 0 and seq and seq[-1][0] == op:
            seq[-1] = (op, seq[-1][1] + dur)
        else:
            seq.append((op, dur))
    ops = np.fromiter((op for op, _ in seq), np.int64, len(seq))
    return list(zip(facts.costs_of(ops), (dur for _, dur in seq), strict=True))


def fusion(facts: Facts) -> Advice | None:
    """Runs of memory-bound pointwise and row-wise ops, each its own kernel: a fused kernel would
    read the inputs and write the result once (model/fusion.py)."""
    spec = facts.spec
    if spec is None:
        return None
    saved = unfused_roof = fused_roof = measured = 0.0
    chains: dict[str, int] = {}
    ran = facts.kind("kernel", columns=("row", "rank", "ts", "dur", "correlation"))
    for _, kernels in groups(facts.in_window(ran), ["rank"]):
        seq = _op_sequence(facts, kernels)
        costs = [cost for cost, _ in seq]
        for c in fusion_candidates(costs, spec):
            ns = sum(dur for _, dur in seq[c.start:c.end])
            measured += ns
            saved += ns * (1 - c.fused_s / c.unfused_s) if c.unfused_s > 0 else 0.0
            unfused_roof += c.unfused_s * 1e9
            fused_roof += c.fused_s * 1e9
            chain = " -> ".join(c.ops)
            chains[chain] = chains.get(chain, 0) + 1
    if not chains or pct(saved, facts.wall_ns) < _MIN_FUSION_PCT:
        return None
    top = sorted(chains.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
    evidence = {"candidates": sum(chains.values()), "kernel_ns": round(measured),
                "roofline_unfused_ns": round(unfused_roof),
                "roofline_fused_ns": round(fused_roof),
                "top_chains": [{"ops": k, "count": v} for k, v in top],
                # analyze's frequent kernel sequences that a fuser folds: the chains' kernels
                "fusable_sequences": [{"kernels": list(q.names), "runs": q.count,
                                       "total_ns": q.total_ns}
                                      for q in facts.sequences if q.fusable][:3]}
    return advice(facts, "fusion", "chains of memory-bound ops could be one kernel each",
                  evidence, saved,
                  f"roofline model (model/fusion.py) on {spec.name} "
                  f"({spec.memory_bandwidth / 1e9:g} GB/s): a fused chain moves its largest "
                  "tensor once; each chain's measured kernel time shrinks by its fused / unfused "
                  "roofline time",
                  "torch.compile the model (inductor fuses pointwise and reduction chains into "
                  "one kernel), or use fused ops (F.scaled_dot_product_attention, fused "
                  "LayerNorm/GELU, fused optimizers)")


def device_capacity(facts: Facts) -> dict[tuple[int, int], int]:
    """(rank, device) -> the device's memory in bytes (the manifest's `totalGlobalMem`)."""
    return {(int(d.get("rank", 0)), int(d.get("id", 0))): int(d["totalGlobalMem"])
            for d in facts.manifest["devices"] if d.get("totalGlobalMem")}


def peak_memory(facts: Facts, ranks: set[int]) -> dict[tuple[int, int], tuple[float, str]]:
    """Peak bytes per (rank, device): the allocator's reserved bytes (the trace's `[memory]`
    events, a memory snapshot's `memory_reserved` on its one device), else sampled usage. The
    recorder's GPU sampler is host-wide (rank -1): its devices count for every rank in `ranks`
    that has them."""
    peaks: dict[tuple[int, int], tuple[float, str]] = {}
    instants = facts.kind("instant")
    marks = facts.with_text(where(instants, facts.named_as(instants, ["[memory]"])), "args")
    for rank, args in zip(col(marks, "rank").tolist(), marks.column("args").to_pylist(),
                          strict=True):
        a = orjson.loads(args)
        if a.get("Device Type") != 1:  # 1 = CUDA in Kineto's memory events
            continue
        key = (int(rank), int(a.get("Device Id", 0)))
        value = float(a.get("Total Reserved", a.get("Total Allocated", 0)))
        if value > peaks.get(key, (0.0, ""))[0]:
            peaks[key] = (value, "allocator")
    counters = facts.counters
    snapshots = where(counters, (col(counters, "name") == MEMORY_RESERVED)
                      & (col(counters, "device") >= 0))
    for (rank, device), group in groups(snapshots, ["rank", "device"]):
        key, value = (rank, device), float(col(group, "value").max())
        if value > peaks.get(key, (0.0, ""))[0]:
            peaks[key] = (value, "snapshot")
    sampled = where(counters, like(counters, "name", r"^gpu\d+\.mem_used_bytes$"))
    names, at = np.unique(col(sampled, "name"), return_inverse=True)
    gpu = np.array([int(str(n)[3:].split(".")[0]) for n in names.tolist()], np.int64)[at]
    for (rank, device), group in groups(sampled.append_column("gpu", pa.array(gpu)),
                                        ["rank", "gpu"]):
        value = float(col(group, "value").max())
        for key in ([(r, device) for r in sorted(ranks)] if rank == NONE
                    else [(int(rank), device)]):
            if value > peaks.get(key, (0.0, ""))[0]:
                peaks[key] = (value, "sampler")
    return dict(sorted(peaks.items()))


def memory_capacity(facts: Facts) -> Advice | None:
    """Peak device memory within 10% of capacity: the next larger batch or fragmentation OOMs."""
    capacity = device_capacity(facts)
    near = [{"rank": r, "device": dev, "peak_bytes": round(peak),
             "capacity_bytes": capacity[r, dev],
             "used_pct": pct(peak, capacity[r, dev]), "source": source}
            for (r, dev), (peak, source) in peak_memory(facts, {r for r, _ in capacity}).items()
            if (r, dev) in capacity and peak >= _NEAR_CAPACITY * capacity[r, dev]]
    if not near:
        return None
    return advice(facts, "memory_capacity", "device memory is nearly full", {"devices": near},
                  None, "no time saved: headroom against out-of-memory and allocator retries",
                  "activation checkpointing, a smaller micro-batch with gradient accumulation, "
                  "bf16 autocast, or PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")


_ACTIVATIONS: Final = ("activation", "autograd_detail", "temporary")
_MEMORY_SHARE: Final = {"activations": 0.5, "optimizer_state": 0.3}
_MEMORY_CHANGE: Final = {
    "activations": "activation checkpointing (torch.utils.checkpoint) on the largest blocks, a "
                   "smaller micro-batch with gradient accumulation, or bf16 autocast",
    "optimizer_state": "shard the optimizer state across data-parallel ranks (ZeRO-1: "
                       "ZeroRedundancyOptimizer, or FSDP), an 8-bit optimizer, or a factored "
                       "one (Adafactor)"}


def memory_breakdown(facts: Facts) -> Advice | None:
    """A memory timeline's peak held mostly by activations (activation, autograd detail and
    temporaries: at least half) or by optimizer state (at least 30%): what frees memory for a
    larger batch or model is then known."""
    found = []
    for m in facts.memory:
        held = m.peak.by_category
        groups = {"activations": sum(held.get(c, 0) for c in _ACTIVATIONS),
                  "optimizer_state": held.get("optimizer_state", 0)}
        total = m.peak.total_bytes
        found += [(part / total, -m.rank, group, part, m) for group, part in groups.items()
                  if total and part >= _MEMORY_SHARE[group] * total]
    if not found:
        return None
    _share, _, group, part, m = max(found, key=lambda f: f[:2])
    evidence = {"rank": m.rank, "peak_bytes": m.peak.total_bytes, "group": group,
                "group_bytes": part, "used_pct": pct(part, m.peak.total_bytes),
                "held_bytes": {c: v for c, v in m.peak.by_category.items() if v}}
    title = ("activations hold" if group == "activations" else "optimizer state holds")
    return advice(facts, "memory_breakdown", f"{title} {evidence['used_pct']:.0f}% of the peak "
                  "memory", evidence, None, "no time saved: memory for a larger batch or model "
                  "(the memory timeline's peak, by category)", _MEMORY_CHANGE[group])


_GROWING_STEPS: Final = 4  # steps each beginning with more alive, at least: a leak
_GROWTH_MIN: Final = 1 << 20  # bytes a step: allocator rounding and caches grow by less


def memory_growth(facts: Facts) -> Advice | None:
    """A memory timeline whose steps each begin with more alive than the step before (four or
    more, the first aside, which builds the optimizer's state, by a MiB or more each): tensors
    kept from step to step, a leak that ends in an out-of-memory error; its growth a step and
    the categories it grows in (a loss appended with its graph grows the activations). A
    step's peak alone would call a growing batch a leak: what a step frees by its end is not
    kept."""
    found = []
    for m in facts.memory:
        kept = np.array([sum(b.values()) for b in m.step_starts[1:]], np.int64)
        if len(kept) < _GROWING_STEPS:
            continue
        rises = np.diff(kept)
        per_step = int(np.median(rises))
        if not np.all(rises > 0) or per_step < _GROWTH_MIN:
            continue
        first, last = m.step_starts[1], m.step_starts[-1]
        grew = {c: last.get(c, 0) - first.get(c, 0) for c in {*first, *last}}
        found.append((per_step, -m.rank, {
            "rank": m.rank, "steps": len(kept), "growth_bytes_per_step": per_step,
            "first_start_bytes": int(kept[0]), "last_start_bytes": int(kept[-1]),
            "grew_bytes": {c: v for c, v in sorted(grew.items()) if v > 0}}))
    evidence = _largest(found)
    if evidence is None:
        return None
    return advice(facts, "memory_growth", f"memory grows {evidence['growth_bytes_per_step']:,} "
                  "bytes a step", evidence, None, "no time saved: memory the steps keep "
                  "(each step begins with more alive than the one before, the memory "
                  "timeline's), until it runs out",
                  "find what keeps tensors across steps: a list or dict they are appended to (a "
                  "loss kept with its graph: append loss.item() or loss.detach(); outputs kept "
                  "for metrics: .detach().cpu()), a cache keyed by step, a hook holding "
                  "activations; a memory snapshot's stacks name where the kept blocks were "
                  "allocated")


def _largest(found: list[tuple[int, int, dict[str, Any]]]) -> dict[str, Any] | None:
    """The evidence of the largest of (size, -rank, evidence) findings, the lowest rank on a
    tie; None without any."""
    return max(found, key=lambda f: f[:2])[2] if found else None


_CACHED_SHARE: Final = 0.3  # of the reserved bytes, unallocated when the allocated bytes peak
_CACHED_MIN: Final = 16 << 20  # bytes: less is not worth a setting


def allocator_cache(facts: Facts) -> Advice | None:
    """A memory snapshot's allocator holding ≥ 30% (and ≥ 16 MiB) of its reserved bytes
    unallocated at the allocated peak: memory no tensor uses when memory is scarcest, which
    fragmentation of its segments (or blocks cached from other sizes) keeps from use."""
    found = []
    for m in facts.memory:
        if m.reserved is None:
            continue
        held = m.reserved.at_peak_bytes
        idle = held - m.peak.total_bytes
        if idle >= max(_CACHED_MIN, _CACHED_SHARE * held):
            found.append((idle, -m.rank, {
                "rank": m.rank, "peak_bytes": m.peak.total_bytes, "reserved_at_peak_bytes": held,
                "reserved_peak_bytes": m.reserved.peak_bytes, "unallocated_bytes": idle,
                "unallocated_pct": pct(idle, held)}))
    evidence = _largest(found)
    if evidence is None:
        return None
    return advice(facts, "allocator_cache", f"{evidence['unallocated_pct']:.0f}% of the reserved "
                  "memory is unallocated at the peak", evidence, None, "no time saved: memory "
                  "the caching allocator holds but no tensor uses (the memory snapshot's "
                  "segments at the allocated peak)", "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:"
                  "True (segments grow in place instead of new ones being cut), or free the "
                  "cache (torch.cuda.empty_cache()) after a phase whose block sizes do not recur")
