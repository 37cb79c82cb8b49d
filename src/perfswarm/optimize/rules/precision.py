"""Rule: compute in float64 where float32 would do (a model cast with .double(), numpy's
float64 data, torch.set_default_dtype(torch.float64)).

Which ops are float64 is what the trace recorded of their inputs (record_shapes' `Input type`:
an op's first floating-point input of `double`). What float32 saves is the hardware's: on a
CPU, a vector register holds half as many doubles as floats, so GEMMs, convolutions and
elementwise math do twice the work per instruction in float32, and every op moves half the
bytes; on a GPU, the device spec's FP64 and FP32 peaks and its bandwidth, per kernel: FP64 at
half an H100's FP32 rate, a 32nd of a T4's, a 64th of an A10's, L4's or L40S's, but an A100's and
an H100's DGEMMs on FP64 tensor cores at their SGEMMs' rate (float32 saves a GEMM's bytes
there, not its FLOPs).
"""

from __future__ import annotations

import functools
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from perfswarm.analyze.annotations import host_calls
from perfswarm.analyze.dependencies import enclosing_rows
from perfswarm.analyze.frame import Events
from perfswarm.model.opcost import (
    FLOAT_TYPES,
    MATRIX_FAMILIES,
    REDUCED_DTYPES,
    VIEW_OPS,
    OpCost,
    Shapes,
    gemm_dims,
    shapes_from_args,
)
from perfswarm.model.opstats import costed_ops
from perfswarm.model.specs import DeviceSpec
from perfswarm.optimize.fuse.host import best_rate, measured_ceilings
from perfswarm.optimize.rules.base import Advice, advice, pct
from perfswarm.optimize.rules.facts import Facts, col, where
from perfswarm.optimize.rules.threads import ran_with
from perfswarm.trace.store import host_info

_MIN_SHARE: Final = 10.0  # % of the measured time in float64 work below which it is left alone
# float32's time over float64's of the same work on a CPU: half the bytes moved, twice the
# values per vector instruction (AVX2: 8 floats or 4 doubles a register; AVX-512 16 or 8; NEON
# 4 or 2), for GEMMs (MKL/oneDNN sgemm vs dgemm peak), convolutions and elementwise ops alike;
# on a GPU, a memory-bound kernel's (half the bytes)
_HALF: Final = 0.5
# Kernels of float64 work by their name, where no modelled op launched them (cuBLAS dgemm,
# ATen's templates instantiated for double, cutlass/xmma f64)
_FP64_KERNEL: Final = r"(?i)(\bdouble\b|dgemm|dgemv|f64)"


def is_float64(shapes: Shapes | None) -> bool:
    """Whether an op's recorded inputs make it float64 work: its first shaped floating-point
    input is `double` (an index, a mask or a scalar argument does not count)."""
    if shapes is None:
        return False
    return next((t == "double" for d, t in zip(shapes.dims, shapes.types, strict=False)
                 if d and t in FLOAT_TYPES), False)


def float64_ops(facts: Facts) -> Advice | None:
    """Ops that compute in float64 take a real share of the measured time: float32 does the
    same work in about half the time on a CPU, and in a 32nd to a 64th on many GPUs."""
    if facts.device_events.num_rows:
        return _on_device(facts)
    return _on_cpu(facts)


_CHANGE: Final = (
    "compute in float32: cast the model with model.float() (or build it after "
    "torch.set_default_dtype(torch.float32), dropping any set_default_dtype(torch.float64)) and "
    "make the data float32 where it is made (torch.from_numpy(x).float(), np.float32 arrays: "
    "numpy's default is float64; dtype=torch.float32 in torch.tensor/randn); where float64 is "
    "intended (scientific code that needs its precision or range, an ill-conditioned solve), "
    "keep it in the ops that need it and run the rest in float32")


def _fp64_rows(facts: Facts, ops: pa.Table) -> pa.Table:
    """The rows of `ops` whose recorded inputs make them float64 work (is_float64)."""
    texts = facts.with_text(ops, "detail")
    texts = texts.filter(pc.match_substring(texts.column("detail"), "double"))
    keep = [is_float64(shapes_from_args(t)) for t in texts.column("detail").to_pylist()]
    return where(texts, np.array(keep, bool)).drop_columns(["detail"])


def _top_names(facts: Facts, frame: pa.Table, ns: npt.NDArray[np.int64]) -> dict[str, int]:
    """The three names of `frame`'s rows with the most time `ns` (one a row), and their time."""
    return dict(facts.by_name(frame, ns)[:3])


def _top(facts: Facts, frame: pa.Table, ns: npt.NDArray[np.int64]) -> list[str]:
    """The three names with the most time, as `name 1.234 ms`."""
    return [f"{n} {t / 1e6:,.3f} ms" for n, t in _top_names(facts, frame, ns).items()]


def _parameters(facts: Facts) -> bool | None:
    """Whether the optimizer updated float64 parameters (its ops' inputs); None without an
    optimizer step in the window."""
    _, ops = facts.optimizer_steps
    return None if ops.num_rows == 0 else _fp64_rows(facts, ops).num_rows > 0


def _on_cpu(facts: Facts) -> Advice | None:
    """CPU ops: each float64 op's own time (less the ops inside it) less the fixed cost every
    call of its name pays (dispatch, allocation, a kernel's setup: _work) halves in float32;
    the fixed cost stays, as does the time of an op without a cost model."""
    ops = facts.in_window(facts.kind("cpu_op"))
    views = facts.named_as(ops, [f"aten::{op}" for op in VIEW_OPS])
    fp64 = _fp64_rows(facts, where(ops, ~views))  # a view of a double tensor computes nothing
    if fp64.num_rows == 0:
        return None
    own = np.asarray(host_calls(Events.load(facts.run)).cpu_self[col(fp64, "row")], np.int64)
    fp64_ns = int(own.sum())
    share = pct(fp64_ns, facts.wall_ns)
    if share < _MIN_SHARE:
        return None
    costs = _innermost_costs(facts, col(fp64, "row"))
    flops, moved, basis = _ceilings(facts, costs, own)
    work, fixed = _work(facts.name_texts(fp64), costs, own, flops, moved)
    gain = float(work.sum()) * (1 - _HALF)
    evidence: dict[str, Any] = {
        "fp64_ops": fp64.num_rows, "fp64_ns": fp64_ns, "fp64_share_pct": share,
        "modelled_ops": sum(c is not None for c in costs), "work_ns": round(float(work.sum())),
        "fixed_ns": {n: round(fixed[n]) for n in _top_names(facts, fp64, own) if n in fixed},
        "gflops_fp64": round(flops / 1e9, 3), "bandwidth_gbs": round(moved / 1e9, 3),
        "fp32_estimate_ns": round(fp64_ns - gain),
        "parameters_fp64": _parameters(facts), "top_ops": _top(facts, fp64, own)}
    return advice(facts, "float64_ops", f"{share:g}% of the time computes in float64",
                  evidence, gain,
                  "vector-width model of the CPU: each float64 op's own time less the fixed cost "
                  "its calls pay (the median own time of its name's calls whose work, "
                  f"model/opcost.py's FLOPs and bytes at {basis}, is under {_TINY:.0%} of it) "
                  "halves in float32 (twice the values per vector instruction, half the bytes); "
                  "the fixed cost stays, as does an op without a cost model",
                  _CHANGE)


_TINY: Final = 0.05  # a call whose work at the ceilings is under this share of its own time is
# its fixed cost: 30 float64 layers of 8 (0.3-1.7% there) ran as fast as in float32, where
# a 256 x 512 tanh (11-22%: its transcendental math is no FLOP count) ran twice as fast


def _work(names: list[str], costs: list[OpCost | None], own: npt.NDArray[np.int64],
          flops: float, moved: float) -> tuple[npt.NDArray[np.float64], dict[str, float]]:
    """Each op's work time (ns), the part of its own time that float32 halves, and each name's
    fixed cost: a call mostly fixed cost (its work at the ceilings, `flops` FLOP/s and `moved`
    bytes/s, under _TINY of its own time) does that work alone; another, its own time less its
    name's fixed cost (the median own time of those calls of the name, else of all names'),
    no less than its work at the ceilings (a ceiling of 0, unknown, bounds nothing); an op
    without a cost model, none."""
    roof = np.array([0.0 if c is None else 1e9 * max(c.flops / flops if flops else 0.0,
                                                      c.bytes / moved if moved else 0.0)
                     for c in costs])
    modelled = np.array([c is not None for c in costs], bool)
    tiny = modelled & (roof < _TINY * own)
    label = np.array(names, object)
    fixed = {str(n): float(np.median(own[tiny & (label == n)]))
             for n in np.unique(label[tiny]).tolist()}
    usual = float(np.median(own[tiny])) if tiny.any() else 0.0
    base = np.array([fixed.get(n, usual) for n in names], np.float64)
    work = np.where(tiny, roof, np.clip(own - base, roof, own))
    return np.where(modelled, np.minimum(work, own), 0.0), fixed


def _innermost_costs(facts: Facts, rows: npt.NDArray[np.int64]) -> list[OpCost | None]:
    """Each row's cost model (model.opstats.costed_ops), None for an op without one or with
    one of its family inside it (aten::linear around its addmm: its own time is the call
    around the work, not the work; addmm's copy of its bias is not its GEMM)."""
    ev = Events.load(facts.run)
    costed = costed_ops(facts.run, ev)
    ordered = np.fromiter(sorted(costed), np.int64, len(costed))
    outer = {o for i, o in zip(*enclosing_rows(ev, ordered, ordered), strict=True)
             if costed[int(i)][0].family == costed[int(o)][0].family}
    return [costed[r][0] if r in costed and r not in outer else None for r in rows.tolist()]


def _ceilings(facts: Facts, costs: list[OpCost | None], own: npt.NDArray[np.int64]
              ) -> tuple[float, float, str]:
    """(float64 FLOP/s, bytes/s, what they are) of the CPU that ran `facts`: where the run was
    recorded on this host (its name and CPU model), measured here (fuse.host.measured_ceilings:
    a float32 GEMM's rate, halved for doubles, or the best GEMM rate the run's largest tenth of
    calls reached where higher, and the memory's copy bandwidth, with the run's intra-op
    threads), else the best rates the run's largest tenth of calls reached (`own` ns each). A
    ceiling too low would count a tiny op's fixed cost as work: 30 float64 layers of 8 ran as
    fast as in float32."""
    large = float(np.quantile(own, 0.9))
    reached = [(c.flops / o if c.family == "gemm" else 0.0, c.bytes / o)
               for c, o in zip(costs, own.tolist(), strict=True)
               if c is not None and o >= large and o > 0]
    flops = max((f for f, _ in reached), default=0.0) * 1e9
    moved = max((b for _, b in reached), default=0.0) * 1e9
    threads = _threads_here(facts)
    if threads is not None:
        gemm, memory, _ = _measured(threads)
        return (max(flops, gemm * _HALF), memory,
                f"this host's ceilings, measured here with {threads} thread(s) (a float32 "
                "GEMM's rate, halved for doubles; the memory's copy bandwidth)")
    return flops, moved, ("the best rates the run's largest tenth of calls reached (recorded "
                          "on another host)")


_measured = functools.cache(measured_ceilings)


def _threads_here(facts: Facts) -> int | None:
    """The Run's intra-op threads (ran_with; else this host's cores) where it was recorded on
    this host (its name and CPU model), so that what is timed here is of its CPU; else None."""
    host, here = facts.manifest.get("host", {}), host_info()
    if (host.get("hostname"), host.get("cpu_model")) != (here["hostname"], here["cpu_model"]):
        return None
    found = ran_with(facts)
    return found.threads if found is not None else int(here["cores"])


def _peaks(spec: DeviceSpec, gemm: bool) -> tuple[float, float] | None:
    """(FP64, FP32) FLOP/s of a GEMM (tensor or matrix cores where they take full-precision
    FP64 or FP32: an A100's DGEMM at 19.5 TFLOP/s, not its 9.7 vector rate) or of other work;
    None where the spec gives no FP64 rate."""
    peaks = spec.peak_flops
    if "fp64" not in peaks:
        return None
    keys64, keys32 = (("fp64", "fp64_matrix"), ("fp32", "fp32_matrix")) if gemm else (
        ("fp64",), ("fp32",))
    return (max(peaks.get(k, 0.0) for k in keys64), max(peaks.get(k, 0.0) for k in keys32))


def _fp32_ratio(cost: OpCost, spec: DeviceSpec) -> float | None:
    """Roofline time of a float64 op's work in float32 (half its bytes, at the FP32 peak) over
    its roofline time in float64; None without an FP64 rate in the spec."""
    peaks = _peaks(spec, cost.family == "gemm")
    if peaks is None:
        return None
    p64, p32 = peaks
    fp64 = max(cost.flops / p64, cost.bytes / spec.memory_bandwidth)
    fp32 = max(cost.flops / p32, cost.bytes / 2 / spec.memory_bandwidth)
    return fp32 / fp64 if fp64 > 0 else None


def _bound(name: str, spec: DeviceSpec | None) -> float:
    """float32's time over float64's of a kernel whose work is not modelled: the larger of its
    memory-bound ratio (half the bytes) and its compute-bound one (the peaks', a GEMM's by its
    name), the smaller gain; half without a spec's FP64 rate."""
    peaks = _peaks(spec, "gemm" in name.lower()) if spec is not None else None
    return _HALF if peaks is None else max(_HALF, peaks[0] / peaks[1])


def _on_device(facts: Facts) -> Advice | None:
    """Device kernels: a float64 op's kernels (or a kernel named for doubles) keep the share
    of their roof they reached, at the device's FP32 peak and half the bytes."""
    kernels = facts.in_window(facts.kind("kernel"))
    if kernels.num_rows == 0:
        return None
    costs = facts.costs_of(facts.launching_ops(kernels))
    named = facts.named_like(kernels, _FP64_KERNEL).tolist()
    keep = [(c.dtype == "fp64") if c is not None else n for c, n in zip(costs, named, strict=True)]
    fp64 = where(kernels, np.array(keep, bool))
    costs = [c for c, k in zip(costs, keep, strict=True) if k]
    fp64_ns = facts.total_ns(fp64)
    share = pct(fp64_ns, facts.wall_ns)
    if fp64.num_rows == 0 or share < _MIN_SHARE:
        return None
    spec = facts.spec
    ratio = functools.cache(lambda cost: _fp32_ratio(cost, spec) if spec else None)
    ratios = [ratio(c) if c is not None else None for c in costs]
    fp32_ns = sum(d * (r if r is not None else _bound(n, spec)) for d, r, n in zip(
        col(fp64, "dur").tolist(), ratios, facts.name_texts(fp64), strict=True))
    count = sum(r is not None for r in ratios)
    evidence: dict[str, Any] = {
        "fp64_kernels": fp64.num_rows, "fp64_ns": fp64_ns, "fp64_share_pct": share,
        "modelled_kernels": count, "fp32_estimate_ns": round(fp32_ns),
        "top_kernels": _top(facts, fp64, col(fp64, "dur"))}
    if spec is not None and "fp64" in spec.peak_flops:
        p64, p32 = _peaks(spec, False) or (0.0, 0.0)
        g64, g32 = _peaks(spec, True) or (0.0, 0.0)
        evidence["peak_tflops"] = {"fp64": p64 / 1e12, "fp32": p32 / 1e12,
                                   "fp64_gemm": g64 / 1e12, "fp32_gemm": g32 / 1e12}
        basis = (f"roofline model (model/opcost.py) of {count} kernels' recorded shapes on "
                 f"{spec.name} (FP64 {p64 / 1e12:g} vs FP32 {p32 / 1e12:g} TFLOP/s, GEMMs "
                 f"{g64 / 1e12:g} vs {g32 / 1e12:g}; {spec.memory_bandwidth / 1e9:g} GB/s, half "
                 "the bytes in float32), each kernel keeping the share of its roof it reached")
        if count < fp64.num_rows:
            basis += (f"; the {fp64.num_rows - count} without recorded shapes at the smaller of "
                      "their memory-bound and compute-bound gains")
    else:
        devices = sorted({str(d.get("name")) for d in facts.manifest["devices"]}) or ["it"]
        basis = (f"fixed factor, no model (no device spec with an FP64 rate for "
                 f"{', '.join(devices)}): float32 moves half the bytes, {_HALF:g}x the "
                 "kernels' time")
    return advice(facts, "float64_ops", f"{share:g}% of the time computes in float64 on the "
                  "device", evidence, fp64_ns - fp32_ns, basis, _CHANGE)


_SIMILAR: Final = 2.0  # the Run's float32 ops of FLOPs within this factor compare with an op


def reduced_precision_ops(facts: Facts) -> Advice | None:
    """Matrix products and convolutions computing in bf16 or fp16 on the CPU (autocast's) take
    a real share of the measured time and ran slower per FLOP than float32 does at their
    sizes: the Run's own float32 ops of the family and similar FLOPs, else, for a GEMM of a
    Run recorded on this host, float32 GEMMs of its shape timed here. A CPU without bf16 units
    (avx512_bf16, AMX) converts each to float32 and back: oneDNN's bf16 GEMMs ran at 0.4
    GFLOP/s on an AVX2 CPU, 5x slower a step than float32."""
    if facts.device_events.num_rows:
        return None
    ops = facts.in_window(facts.kind("cpu_op"))
    rows = col(ops, "row")
    costs = _innermost_costs(facts, rows)
    picked = [(i, c) for i, c in enumerate(costs)
              if c is not None and c.family in MATRIX_FAMILIES and c.dtype in REDUCED_DTYPES]
    if not picked:
        return None
    own_all = np.asarray(host_calls(Events.load(facts.run)).cpu_self[rows], np.int64)
    reduced = np.isin(np.arange(ops.num_rows), [i for i, _ in picked])
    own = own_all[reduced]  # (picked is in row order, as `reduced` keeps them)
    reduced_ns = int(own.sum())
    share = pct(reduced_ns, facts.wall_ns)
    if share < _MIN_SHARE:
        return None
    fp32 = [(c, int(o)) for c, o in zip(costs, own_all.tolist(), strict=True)
            if c is not None and c.family in MATRIX_FAMILIES and c.dtype == "fp32" and o > 0]
    details = facts.with_text(where(ops, reduced), "detail").column("detail").to_pylist()
    estimates = [_fp32_ns(facts, c, shapes_from_args(d), fp32)
                 for (_, c), d in zip(picked, details, strict=True)]
    judged = np.array([e is not None for e, _ in estimates], bool)
    if not judged.any():
        return None
    flops = np.array([c.flops for _, c in picked], np.float64)
    slow_ns, fp32_ns = float(own[judged].sum()), sum(e for e, _ in estimates if e is not None)
    if slow_ns <= fp32_ns:
        return None
    rate, fp32_rate = float(flops[judged].sum()) / slow_ns, float(flops[judged].sum()) / fp32_ns
    sources = sorted({s for e, s in estimates if e is not None})
    units = facts.manifest.get("host", {}).get("reduced_precision_units")
    dtypes = "/".join(sorted({c.dtype for _, c in picked}))
    hardware = ("the recording host's CPU has no bf16 or fp16 units (no avx512_bf16 or "
                "amx_bf16 flag): it converts them to float32 and back" if units == [] else
                f"the recording host's CPU has {', '.join(units)}" if units else
                "the recording did not keep the CPU's flags")
    evidence: dict[str, Any] = {
        "reduced_ops": len(picked), "dtypes": dtypes, "reduced_ns": reduced_ns,
        "reduced_share_pct": share, "judged_ops": int(judged.sum()),
        "gflops_reduced": round(rate, 3), "gflops_fp32": round(fp32_rate, 3),
        "fp32_estimate_ns": round(fp32_ns), "fp32_sources": sources,
        "cpu_units": units, "top_ops": _top(facts, where(ops, reduced), own)}
    return advice(facts, "reduced_precision_cpu",
                  f"{share:g}% of the time runs {dtypes} matrix work at {rate:.3g} GFLOP/s, "
                  f"slower than float32's {fp32_rate:.3g} here",
                  evidence, slow_ns - fp32_ns,
                  f"measured float32 rates at the same work: {'; '.join(sources)}; each judged "
                  f"op's FLOPs (model/opcost.py) at that rate against its own time ({hardware})",
                  "run these ops in float32 on this CPU: drop torch.autocast(\"cpu\", "
                  "dtype=torch.bfloat16) (or .half()/.bfloat16() casts of the model and data), "
                  "or enable it only where the CPU has bf16 units (avx512_bf16, amx_bf16 in "
                  "/proc/cpuinfo's flags: oneDNN's bf16 kernels run on them)")


def _fp32_ns(facts: Facts, cost: OpCost, shapes: Shapes | None,
             fp32: list[tuple[OpCost, int]]) -> tuple[float | None, str]:
    """An op's time in float32, measured, and where it comes from: its FLOPs at the rate the
    Run's own float32 ops of its family and FLOPs within _SIMILAR of its reached (their FLOPs
    over their own time), else, for a GEMM of a Run recorded on this host, a float32 GEMM of
    its shape timed here with the Run's intra-op threads; None where neither is there."""
    alike = [(c.flops, o) for c, o in fp32 if c.family == cost.family
             and cost.flops / _SIMILAR <= c.flops <= cost.flops * _SIMILAR]
    if alike and cost.flops > 0:
        work, ns = map(sum, zip(*alike, strict=True))
        return cost.flops * ns / work, "the Run's own float32 ops of the family and similar FLOPs"
    dims = gemm_dims(cost.op, shapes.dims) if shapes is not None and cost.family == "gemm" \
        else None
    threads = _threads_here(facts)
    if dims is None or threads is None:
        return None, ""
    return (1e9 * cost.flops / _sgemm_rate(dims, threads),
            f"float32 GEMMs of the ops' shapes timed on this host (numpy's BLAS, {threads} "
            "thread(s))")


@functools.cache
def _sgemm_rate(dims: tuple[int, int, int, int], threads: int) -> float:
    """FLOP/s of a float32 GEMM of (batch, m, k, n) on this host with `threads` BLAS threads,
    the best of a few calls."""
    from threadpoolctl import threadpool_limits

    batch, m, k, n = dims
    a, b = np.ones((batch, m, k), np.float32), np.ones((batch, k, n), np.float32)
    with threadpool_limits(threads):
        return best_rate(2.0 * batch * m * k * n, lambda: a @ b, 20)
