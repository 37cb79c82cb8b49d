"""`perfswarm calibrate`: fit kernel models on the local CPU, or collective models (--collectives)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from perfswarm.cli.app import app
from perfswarm.defaults import SWEEP_PASSES

if TYPE_CHECKING:
    from rich.table import Table

    from perfswarm.model.bandwidth_matrix import BandwidthMatrix


@app.command("calibrate")
def calibrate_command(
    device: Annotated[str, typer.Option("--device", help="Device to calibrate kernel models on: cpu or cuda:N.")] = "cpu",
    budget: Annotated[float, typer.Option("--budget", help="Minutes for the kernel sweeps (GEMM, conv2d and conv1d and their backward, embedding_bag, elementwise, reduction, copy, and on the CPU flash attention and the LSTM layer (oneDNN's), each with its backward; elementwise, reduction and copy also warm, on inputs reused); time left after a pass buys up to two more. On the CPU, about a second more measures what taking a batch from a DataLoader worker costs (for `advise --profile`).")] = 0.5,
    threads: Annotated[int, typer.Option("--threads", help="Intra-op threads on the CPU (record the workload with the same count).")] = 1,
    collectives: Annotated[bool, typer.Option("--collectives", help="Sweep all-reduce, all-gather, reduce-scatter, all-to-all and broadcast over 1 KB-64 MB with real torch.distributed (gloo on CPU, NCCL on GPUs) and fit latency-bandwidth models; with 2 or more GPUs also the host/device copy bandwidth matrix.")] = False,
    world_size: Annotated[int, typer.Option("--world-size", max=64, help="Local processes in the sweep (2-64: one machine's process group).")] = 2,
    backend: Annotated[str, typer.Option("--backend", help="auto | gloo | nccl")] = "auto",
    passes: Annotated[int, typer.Option("--passes", help="Passes over the sizes (more: steadier figures on a busy machine, longer sweep).")] = SWEEP_PASSES,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Profile JSON to write (default: cpu-profile.json, cudaN-profile.json or collectives-profile.json); with --dataset, the model (default: gpu-kernel-model.npz).")] = None,
    dataset: Annotated[Path | None, typer.Option("--dataset", help="Retrain the GPU kernel model from a folder of GPU measurements laid out like shared/gpu-kernels (device_configs/, train/<op>/<GPU>.csv.gz, test/, labels/<GPU>/<case>.csv.gz: whole models' nodes, trained on beside the sweeps); prints leave-one-GPU-out GMAE per family and writes the model (default gpu-kernel-model.npz) for `predict --gpu-model`.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the profile as JSON.")] = False,
) -> None:
    """Calibrate kernel models on this CPU, collective models with --collectives, or the GPU
    kernel model from measurements with --dataset."""
    if dataset is not None:
        _gpu_model(dataset, out or Path("gpu-kernel-model.npz"), as_json)
        return
    if not collectives:
        default = "cpu-profile.json" if device == "cpu" else f"{device.replace(':', '')}-profile.json"
        _kernels(device, budget, threads, out or Path(default), as_json)
        return
    from rich.table import Table

    from perfswarm.cli.json_output import print_json
    from perfswarm.cli.output import console, spinner
    from perfswarm.errors import PerfswarmError
    from perfswarm.model.collective_fit import calibration
    from perfswarm.recorder.bench.bandwidth import gpu_matrix
    from perfswarm.recorder.bench.collectives import sweep
    from perfswarm.trace.store import check_output
    from perfswarm.userfiles import write_json

    out = out or Path("collectives-profile.json")
    check_output(out)  # before minutes of sweeps
    if backend not in ("auto", "gloo", "nccl"):
        raise typer.BadParameter("must be auto, gloo or nccl", param_hint="--backend")
    with spinner() as bar:
        bar.add_task(f"sweeping collectives across {world_size} processes")
        result = sweep(world_size=world_size, backend=backend,  # type: ignore[arg-type]
                       passes=passes)
    profile = calibration(result)
    matrix: BandwidthMatrix | None = None
    try:  # SOFA's traffic matrix, beside the sweep: host<->device and device<->device copies
        matrix = gpu_matrix()
        profile["bandwidth_matrix"], profile["bandwidth_matrix_note"] = matrix.to_dict(), ""
    except PerfswarmError as exc:
        profile["bandwidth_matrix"], profile["bandwidth_matrix_note"] = None, str(exc)
    write_json(out, profile)
    if as_json:
        print_json(profile)
        return
    table = Table("op", "latency us", "bandwidth GB/s by size", "GMAE held out", "in sample",
                  title=f"collective models, {result.backend}, world size {world_size}",
                  title_justify="left")
    for op, model in sorted(profile["models"].items()):
        regimes = "; ".join(
            ("flat" if r["bandwidth_gbps"] is None else f"{r['bandwidth_gbps']:.2f}")
            + (f" to {r['up_to_bytes']:,} B" if r["up_to_bytes"] else " above")
            for r in model["regimes"])
        table.add_row(op, f"{model['latency_us']:.1f}", regimes,
                      f"{100 * profile['gmae_held_out'][op]:.1f}%",
                      f"{100 * profile['gmae_in_sample'][op]:.1f}%")
    console.print(table)
    if matrix is None:
        console.print(f"{profile['bandwidth_matrix_note']} (not measured)")
    else:
        console.print(matrix_table(matrix))
    console.print(f"profile: {out}")


def matrix_table(matrix: BandwidthMatrix) -> Table:
    """The bandwidth matrix as a table: copies from each row's node to each column's."""
    from rich.table import Table

    table = Table("from \\ to", *matrix.nodes, title_justify="left",
                  title=f"copy bandwidth GB/s ({matrix.nbytes / 2**20:g} MiB copies, best of "
                        "several)")
    for node, row in zip(matrix.nodes, matrix.gbps, strict=True):
        table.add_row(node, *("-" if v is None else f"{v:.1f}" for v in row))
    return table


def _gpu_model(folder: Path, out: Path, as_json: bool) -> None:
    from rich.table import Table

    from perfswarm.cli.json_output import print_json
    from perfswarm.cli.output import console, progress_bar
    from perfswarm.model.gpu.dataset import load_dataset
    from perfswarm.model.gpu.learned import steps, train
    from perfswarm.trace.store import check_output

    check_output(out)  # before minutes of sweeps
    data = load_dataset(folder)
    with progress_bar() as bar:
        task = bar.add_task("GPU kernel model", total=steps(data))
        model, holdouts = train(data, lambda what: bar.update(task, description=what,
                                                                advance=1))
    model.save(out)
    result = {"model": str(out), "gpus": list(model.gpus),
              "families": sorted(model.families), "holdout": [h.to_dict() for h in holdouts]}
    if as_json:
        print_json(result)
        return
    table = Table("family", "left out", "rows", "GMAE model", "GMAE roofline", "kernel rows",
                  "kernel GMAE model", "kernel GMAE roofline",
                  title=f"GPU kernel model, leave-one-GPU-out ({folder}; latency as measured, "
                        "and kernel time: the latency less the GPU's floor)",
                  title_justify="left")
    def pct(values: list[float]) -> str:  # the mean of those scored ("-": no row scored)
        scored = [v for v in values if not math.isnan(v)]
        return f"{100 * sum(scored) / len(scored):.1f}%" if scored else "-"

    for h in holdouts:
        table.add_row(h.family, h.gpu, str(h.rows), pct([h.gmae]), pct([h.gmae_roofline]),
                      str(h.kernel_rows), pct([h.gmae_kernel]), pct([h.gmae_kernel_roofline]))
    console.print(table)
    for family in model.families:
        mine = [h for h in holdouts if h.family == family]
        if mine:
            console.print(f"{family}: mean leave-one-GPU-out GMAE {pct([h.gmae for h in mine])}"
                          f", kernel time {pct([h.gmae_kernel for h in mine])}")
    console.print(f"model: {out}")


def _kernels(device: str, budget_min: float, threads: int, out: Path, as_json: bool) -> None:
    from rich.table import Table

    from perfswarm.cli.json_output import print_json
    from perfswarm.cli.output import console, err_console, spinner
    from perfswarm.errors import PerfswarmError
    from perfswarm.model.fusedstep import KEY as FUSED_KEY
    from perfswarm.model.profile import UNUSABLE_GMAE
    from perfswarm.model.receive import KEY as RECEIVE_KEY
    from perfswarm.recorder.bench.kernels import calibrate as kernel_calibration
    from perfswarm.trace.store import check_output
    from perfswarm.userfiles import write_json

    if not 0 < budget_min < math.inf:  # nan too: a sweep without an end
        raise PerfswarmError("calibrate: --budget must be a positive number of minutes")
    if threads < 1:
        raise PerfswarmError("calibrate: --threads must be at least 1")
    check_output(out)  # before minutes of sweeps
    with spinner() as bar:
        task = bar.add_task(f"kernel sweeps on {device} ({budget_min:g} min budget)")
        profile = kernel_calibration(
            budget_min * 60.0, threads, device,
            lambda family: bar.update(task, description=f"kernel sweeps on {device}: {family}"))
    write_json(out, profile)
    if as_json:
        print_json(profile)
        return
    table = Table("op type", "points", "roofline", "learned", "chosen (held out)",
                  title=f"kernel models, {profile['device_name']}", title_justify="left")
    rows = [*profile["families"].items(),
            *((f"{family} (warm)", fitted) for family, fitted in profile["warm"].items())]
    for family, fitted in rows:
        table.add_row(family, str(fitted["points"]),
                      f"{100 * fitted['gmae_roofline_held_out']:.1f}%",
                      f"{100 * fitted['gmae_learned_held_out']:.1f}%",
                      f"{fitted['chosen']} {100 * fitted['gmae_held_out']:.1f}%")
    console.print(table)
    console.print(f"first write of a fresh page (host): {1e6 * profile['page_s']:.2f} µs")
    if RECEIVE_KEY in profile:
        got = profile[RECEIVE_KEY]
        console.print(f"taking a batch from a DataLoader worker (the training process's CPU): "
                      f"{got['batch_ns'] / 1e6:.3f} ms + {got['tensor_ns'] / 1e6:.3f} ms a "
                      "tensor (`advise --profile`)")
    if FUSED_KEY in profile:
        steps = "; ".join(f"{name} {got['call_ns'] / 1e3:,.1f} µs + {got['tensor_ns'] / 1e3:,.2f} "
                          f"µs a tensor + {got['byte_ns'] * 1e3:,.2f} µs a MB"
                          for name, got in profile[FUSED_KEY].items())
        console.print(f"a fused optimizer step (fused=True): {steps} (`advise --profile`)")
    console.print(f"profile: {out}")
    if profile["unusable"]:
        err_console.print(
            f"warning: held-out error above {100 * UNUSABLE_GMAE:.0f}% for "
            f"{', '.join(profile['unusable'])}: the sweep timed other load more than the ops; "
            "predictions from this profile are not usable. Calibrate again when the machine is "
            "quieter, or with a larger --budget")
