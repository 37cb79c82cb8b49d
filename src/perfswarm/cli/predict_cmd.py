"""`perfswarm predict RUN [--device NAME] [--batch-size N] [--dim OLD=NEW]... [--json]`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from perfswarm.cli.app import app

if TYPE_CHECKING:
    from perfswarm.model.predict import Prediction

MAX_SIZE = 2**31 - 1  # a batch or a tensor dimension


def _dims(pairs: list[str]) -> tuple[tuple[int, int], ...]:
    from perfswarm.errors import PerfswarmError

    out = []
    for pair in pairs:
        old, sep, new = pair.partition("=")
        if not (sep and old.strip().isdigit() and new.strip().isdigit()
                and 0 < int(old) <= MAX_SIZE and 0 < int(new) <= MAX_SIZE):
            raise PerfswarmError(f"--dim {pair}: expected OLD=NEW with integers from 1 to "
                                 f"{MAX_SIZE:,}, e.g. 512=1024")
        out.append((int(old), int(new)))
    return tuple(out)


def _print(result: Prediction) -> None:
    from rich.table import Table
    from rich.text import Text

    from perfswarm.cli.output import console
    from perfswarm.report.text import ms

    data = result.to_dict()
    console.print(Text.assemble(
        (str(data["path"]), "bold"), f": {data['platform']} run, "
        f"{len(data['steps'])} iteration(s); device {data['source_device']}"
        + (f" -> {data['target_device']}" if data["target_device"] != data["source_device"] else "")))
    change = [f"batch {data['batch']['recorded']} -> {data['batch']['predicted']}"
              if data["batch"] else "",
              *(f"dim {a} -> {b}" for a, b in data["change"]["dims"].items())]
    if any(change):
        console.print("change: " + ", ".join(c for c in change if c))
    table = Table("", "iteration", data["active_label"],
                  title="iteration time (median)", title_justify="left")
    active = data["device_active_ns"]
    table.add_row("measured", ms(data["measured_ns"]), ms(active["measured"]))
    steady = data["steady"]
    if 0 < steady["steps"] < len(data["steps"]):
        table.add_row(f"measured, {steady['steps']} steady of {len(data['steps'])}",
                      ms(steady["measured_ns"]), "")
    if data["unprofiled_ns"]:
        table.add_row("measured, outside the profiler's window", ms(data["unprofiled_ns"]), "")
    table.add_row("replayed", ms(data["replayed_ns"]), ms(active["replayed"]))
    table.add_row("predicted", ms(data["predicted_ns"]), ms(active["predicted"]))
    if 0 < steady["steps"] < len(data["steps"]):
        table.add_row(f"predicted, the {steady['steps']} steady", ms(steady["predicted_ns"]), "")
    own_predicted = data["predicted_unprofiled_ns"]
    if own_predicted is not None:
        table.add_row("predicted, outside the profiler's window", ms(own_predicted), "")
    compared = data["compare"]
    if compared:
        table.add_row(f"measured ({compared['path']})", ms(compared["measured_ns"]),
                      ms(compared["device_active_ns"]))
        if compared["unprofiled_ns"]:
            table.add_row("  outside its profiler's window", ms(compared["unprofiled_ns"]), "")
    console.print(table)
    console.print(f"replay error {100 * data['replay_error']:.2f}% (GMAE over iterations)")
    if data["predicted_error"] is not None:
        measured = (data["compare"] or steady)["measured_ns"]
        subset = 0 < steady["steps"] < len(data["steps"])
        whose = f"the {steady['steps']} steady steps' predicted median" if subset else "predicted"
        against = "the compared run's" if data["compare"] else (
            "their measured median" if subset else "the measured")
        signed = (f"{whose} {round(100 * (steady['predicted_ns'] / measured - 1), 1) + 0.0:+.1f}% "
                  f"of {against} {ms(measured)}; " if measured else "")
        console.print(f"prediction error {100 * data['predicted_error']:.2f}% ({signed}"
                      f"steady steps spread {100 * steady['spread']:.2f}%)")
    own, base = ((compared["unprofiled_ns"], compared["measured_ns"]) if compared
                 else (data["unprofiled_ns"], steady["measured_ns"]))
    if own and base and abs(base / own - 1) > UNPROFILED_NOTE:
        # against the program's own step of the same configuration only: the recorded one's
        # is no measure of a prediction at another batch, width or device
        changed = bool(data["batch"] or data["change"]["dims"]
                       or data["target_device"] != data["source_device"])
        against = ("" if changed and not compared else
                   f", {100 * (steady['predicted_ns'] / own - 1):+.1f}% of the program's own")
        console.print(
            f"note: {'the compared' if compared else 'this'} run's profiled steps ran "
            f"x{base / own:.2f} its steps outside the profiler's window ({ms(own)}; the "
            "window's own cost: its per-op overhead, its buffers growing the heap so that large "
            f"tensors page-fault); the prediction is of a profiled step{against}")
    if own_predicted is not None and compared and compared["unprofiled_ns"]:
        console.print(
            f"outside the profiler's window: predicted {ms(own_predicted)}, "
            f"{100 * (own_predicted / compared['unprofiled_ns'] - 1):+.1f}% of the compared "
            f"run's own step {ms(compared['unprofiled_ns'])} (this run's own step, "
            f"x{data['unprofiled_ns'] / steady['measured_ns']:.2f} its profiled ones, held)")
    parts = ", ".join(f"{k} {ms(v)}" for k, v in data["breakdown_ns"].items())
    console.print(f"predicted breakdown: {parts}")
    kernels = ", ".join(f"{k} {v:,}" for k, v in sorted(data["kernels"].items()))
    console.print(f"kernel times: {kernels or 'as measured'}")
    for note in data["notes"]:
        console.print(f"note: {note}")


UNPROFILED_NOTE = 0.1  # profiled steps this far from the program's own: said


@app.command("predict")
def predict_command(
    run_dir: Annotated[Path, typer.Argument(metavar="RUN", help="Run directory.")],
    device: Annotated[str | None, typer.Option("--device", help="Predict on this GPU: a bundled spec's name (H100-SXM), short name (H100) or the exact name torch.cuda.get_device_name() gives it ('NVIDIA H100 80GB HBM3'); docs/cli.md lists them.")] = None,
    batch_size: Annotated[int | None, typer.Option("--batch-size", max=MAX_SIZE, help="Predict at this batch size.")] = None,
    recorded_batch_size: Annotated[int | None, typer.Option("--recorded-batch-size", max=MAX_SIZE, help="The Run's batch size, when its command line does not say.")] = None,
    dim: Annotated[list[str] | None, typer.Option("--dim", help="OLD=NEW: every recorded tensor dimension OLD becomes NEW (layer widths), and the parameters' whole multiples of it with it (fused QKV 3W, MLP 4W), and in attention ops the head (W / heads); repeatable.")] = None,
    profile: Annotated[Path | None, typer.Option("--profile", help="Kernel-model profile from `perfswarm calibrate` (needed for shape changes on CPU runs).")] = None,
    overheads: Annotated[Path | None, typer.Option("--overheads", help="CPU-overhead model (JSON from --save-overheads) to price every op's host time at its type's mean, instead of as this Run measured it.")] = None,
    save_overheads: Annotated[Path | None, typer.Option("--save-overheads", help="Write this prediction's CPU-overhead model as JSON.")] = None,
    compare: Annotated[Path | None, typer.Option("--compare", help="A Run recorded at the target configuration: its measured iteration is shown beside the prediction.")] = None,
    source_device: Annotated[str | None, typer.Option("--source-device", help="The GPU the Run was recorded on, when its trace does not tell.")] = None,
    gpu_model: Annotated[Path | None, typer.Option("--gpu-model", help="GPU kernel model from `perfswarm calibrate --dataset` (default: the bundled one).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON (keys in docs/cli.md).")] = False,
) -> None:
    """Measured, replayed and predicted iteration time of a Run, at its configuration or another."""
    from perfswarm.cli.json_output import print_json
    from perfswarm.errors import PerfswarmError
    from perfswarm.model.gpu.learned import KernelModel
    from perfswarm.model.overheads import OverheadModel
    from perfswarm.model.predict import Change, predict
    from perfswarm.model.profile import read_profile
    from perfswarm.trace.store import Run
    from perfswarm.userfiles import write_json

    if batch_size is not None and batch_size < 1:
        raise PerfswarmError("--batch-size: must be at least 1")
    if recorded_batch_size is not None and recorded_batch_size < 1:
        raise PerfswarmError("--recorded-batch-size: must be at least 1")
    change = Change(batch_size, recorded_batch_size, _dims(dim or []), device)
    result = predict(Run.open(run_dir), change,
                     profile=read_profile(profile) if profile else None,
                     overheads=OverheadModel.load(overheads) if overheads else None,
                     compare=Run.open(compare) if compare else None,
                     source_device=source_device,
                     gpu_model=KernelModel.load(gpu_model) if gpu_model else None)
    if save_overheads is not None:
        write_json(save_overheads, result.overheads.to_dict())
    if as_json:
        print_json(result.to_dict())
    else:
        _print(result)
