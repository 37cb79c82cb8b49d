"""`perfswarm layouts --params N --layers L --hidden H --heads A --seq S --batch B --devices D
[--device GPU] [...] [--json]`."""

from __future__ import annotations

from typing import Annotated

import typer

from perfswarm.cli.app import app


@app.command("layouts")
def layouts_command(
    params: Annotated[float, typer.Option("--params", max=1e16, help="Parameters (e.g. 175e9).")],
    layers: Annotated[int, typer.Option("--layers", max=1_000_000, help="Transformer layers.")],
    hidden: Annotated[int, typer.Option("--hidden", max=2**24, help="Hidden size.")],
    heads: Annotated[int, typer.Option("--heads", max=2**16, help="Attention heads.")],
    seq: Annotated[int, typer.Option("--seq", max=2**31 - 1, help="Sequence length.")],
    batch: Annotated[int, typer.Option("--batch", max=2**31 - 1, help="Global batch, sequences per step.")],
    devices: Annotated[int, typer.Option("--devices", max=2**24, help="Device count.")],
    micro_batch: Annotated[int, typer.Option("--micro-batch", max=2**31 - 1, help="Sequences per micro-batch.")] = 1,
    device: Annotated[str, typer.Option("--device", help="GPU (a bundled spec): its fp16 peak and memory.")] = "A100-80GB",
    intra: Annotated[str, typer.Option("--intra", help="Intra-node link (model/interconnects.yaml).")] = "nvswitch-a100",
    inter: Annotated[str, typer.Option("--interconnect", help="Inter-node network.")] = "ib-hdr",
    per_node: Annotated[int, typer.Option("--gpus-per-node", max=2**16, help="Devices per node.")] = 8,
    efficiency: Annotated[float, typer.Option("--efficiency", help="Share of the fp16 peak the GEMMs reach.")] = 0.5,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON (keys in docs/cli.md).")] = False,
) -> None:
    """Data, tensor and pipeline parallel layouts with ZeRO 0-3 of a transformer: memory per
    device, traffic per step, step time, and the fastest layout that fits."""
    from rich.table import Table

    from perfswarm.cli.json_output import print_json
    from perfswarm.cli.output import console
    from perfswarm.errors import PerfswarmError
    from perfswarm.model.parallelism import best_layout, memory_bound_s, transformer
    from perfswarm.model.specs import load_spec
    from perfswarm.model.topology import interconnect

    sizes = {"--params": params, "--layers": layers, "--hidden": hidden, "--heads": heads,
             "--seq": seq, "--batch": batch, "--micro-batch": micro_batch}
    for name, value in sizes.items():
        if not value > 0:  # nan too
            raise PerfswarmError(f"{name} {value}: must be positive")
    if devices < 1 or per_node < 1 or not 0 < efficiency <= 1:
        raise PerfswarmError("--devices and --gpus-per-node must be at least 1, --efficiency "
                             "in (0, 1]")
    spec = load_spec(device)
    model = transformer(params, layers, hidden, heads, seq, batch, micro_batch)
    memory = memory_bound_s(model, spec.memory_bandwidth)
    work = model.training_flops() / (spec.peak_for("fp16") * efficiency) + memory
    best, every = best_layout(model, devices, per_node=per_node, intra=interconnect(intra),
                              inter=interconnect(inter), work_s=work, memory_s=memory,
                              memory_bytes=spec.memory_bytes)
    if not every:
        raise PerfswarmError(f"no layout of {devices} devices divides {layers} layers and a "
                             f"batch of {batch} (micro-batch {micro_batch})")
    if as_json:
        print_json({"device": spec.name, "memory_gb": spec.memory_bytes / 1e9,
                    "best": best.to_dict() if best else None,
                    "layouts": [e.to_dict() for e in every]})
        return
    table = Table("layout", "step s", "memory GB", "bubble", "dp GB", "tp GB", "pp GB",
                  title=f"{devices} x {spec.name} ({spec.memory_bytes / 1e9:.0f} GB), "
                        "fastest first", title_justify="left")
    for e in every[:15]:
        fits = "" if e.memory_bytes <= spec.memory_bytes else " (does not fit)"
        table.add_row(e.layout.describe() + fits, f"{e.step_s:.2f}", f"{e.memory_bytes / 1e9:.1f}",
                      f"{e.bubble:.3f}", *(f"{e.comm_bytes[k] / 1e9:.1f}" for k in ("dp", "tp", "pp")))
    console.print(table)
    console.print(f"best that fits: {best.layout.describe()}, {best.step_s:.2f} s a step"
                  if best else "no layout fits the device memory")
