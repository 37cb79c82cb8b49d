"""`perfswarm project RUN --devices 1,2,4,... [--interconnect NAME|--bandwidth GB/s] [--scheme ...] [--memory-gb G] [--json]`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from perfswarm.cli.app import app
from perfswarm.defaults import DEFAULT_DEVICES, Scheme


def _devices(text: str) -> list[int]:
    from perfswarm.errors import PerfswarmError

    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise PerfswarmError(f"--devices: expected comma-separated integers, got {text!r}") from None


@app.command("project")
def project_command(
    run_dir: Annotated[Path, typer.Argument(metavar="RUN", help="Run directory.")],
    devices: Annotated[str, typer.Option("--devices", help="Device counts, comma-separated.")] = ",".join(map(str, DEFAULT_DEVICES)),
    interconnect: Annotated[str, typer.Option("--interconnect", help="Inter-node network (see model/interconnects.yaml).")] = "ib-ndr",
    bandwidth: Annotated[float | None, typer.Option("--bandwidth", help="Override the network's achieved bandwidth, GB/s.")] = None,
    scheme: Annotated[Scheme, typer.Option("--scheme", help="ring, tree or ps (parameter server).")] = "ring",
    intra: Annotated[str | None, typer.Option("--intra", help="Intra-node link (default: NVSwitch of the Run's GPUs, else pcie4; a CPU Run's: host-loopback).")] = None,
    device: Annotated[str | None, typer.Option("--device", help="Predict the compute on this GPU (a bundled spec, as perfswarm predict --device) instead of using the measured one.")] = None,
    intra_profile: Annotated[Path | None, typer.Option("--intra-profile", help="Intra-node link measured by `perfswarm calibrate --collectives` (its profile JSON), instead of --intra.")] = None,
    per_node: Annotated[int | None, typer.Option("--per-node", "--gpus-per-node", help="Ranks per node (default: 8 devices; a CPU Run's processes: the host's cores over each rank's threads, else 1).")] = None,
    servers: Annotated[int, typer.Option("--servers", help="Parameter servers (scheme ps).")] = 1,
    grad_bytes: Annotated[int | None, typer.Option("--grad-bytes", help="Gradient bytes per step when the Run has no all-reduce kernels (default: its layers' shapes).")] = None,
    memory_gb: Annotated[float | None, typer.Option("--memory-gb", help="Memory per device for the layouts, GB (default: --device's, else the Run's devices').")] = None,
    html_out: Annotated[Path | None, typer.Option("--html", help="Also write the table and the throughput and efficiency plots as an HTML page.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON (keys in docs/cli.md).")] = False,
) -> None:
    """Throughput and scaling efficiency on more devices, other interconnects and schemes."""
    from rich.table import Table
    from rich.text import Text

    from perfswarm.cli.json_output import print_json
    from perfswarm.cli.output import console
    from perfswarm.model.collective_fit import link_of_profile
    from perfswarm.optimize.project import project
    from perfswarm.report.text import size
    from perfswarm.trace.store import Run, write_output
    from perfswarm.userfiles import read_json

    measured = None
    if intra_profile is not None:
        measured = link_of_profile(read_json(intra_profile), str(intra_profile))
    result = project(Run.open(run_dir), _devices(devices), interconnect=interconnect,
                     bandwidth_gbps=bandwidth, scheme=scheme, intra=intra, per_node=per_node,
                     servers=servers, grad_bytes=grad_bytes, intra_link=measured, device=device,
                     memory_gb=memory_gb)
    data = result.to_dict()
    if html_out is not None:
        from perfswarm.report import html  # jinja2 and plotly: only for the page

        page = html.render_projection(f"perfswarm projection: {run_dir.name}", data)
        write_output(html_out, page.encode())
    if as_json:
        print_json(data)
        return
    prof, unit = data["profile"], data["rank_units"]
    console.print(Text.assemble((str(run_dir), "bold"), f": {prof['steps']} step(s) on rank(s) {prof['ranks']} of world {prof['world']}; "
                  f"compute {prof['compute_ms']:.3f} ms/step ({prof['compute_source']}), gradients {size(prof['grad_bytes'])} "
                  f"({prof['grad_bytes_source']}), {prof['overlap_fraction']:.0%} of collective time overlapped"))
    console.print(f"intra-node {result.intra.name}, inter-node {result.inter.name}, {unit} a node: {result.per_node} "
                  f"({result.per_node_source}), scheme {result.scheme}")
    table = Table(unit, "step ms", "comm ms", "exposed ms", "efficiency", "throughput/s", title_justify="left",
                  title=f"projection (weak scaling: per-{result.rank_unit} batch fixed)")
    for p in data["points"]:
        table.add_row(str(p["devices"]), f"{p['step_ms']:.3f}", f"{p['comm_ms']:.3f}", f"{p['exposed_comm_ms']:.3f}",
                      f"{p['efficiency']:.1%}", f"{p['throughput_per_s']:,.1f}")
    console.print(table)
    largest = data["points"][-1]["devices"]
    options = Table("interconnect", "scheme", f"efficiency at {largest}", title_justify="left", title="alternatives")
    for c in data["options"]:
        options.add_row(c["interconnect"], c["scheme"], f"{c['efficiency']:.1%}")
    console.print(options)
    rec = data["recommended"]
    console.print(Text.assemble(("choose", "bold"), f" {rec['interconnect']} with {rec['scheme']}: {rec['efficiency']:.1%} efficiency at {largest} {unit}"))
    lay = result.layouts
    if lay is None:
        console.print(f"layouts: {result.layouts_note}")
    else:
        m = lay.source
        shape = (f"{m.blocks.layers} layers, hidden {m.blocks.hidden}, {m.blocks.heads} heads, sequence {m.blocks.seq}"
                 if m.blocks else f"data parallel only ({m.blocks_source})")
        one = result.rank_unit
        batch = f"batch {m.batch} a {one}" if m.blocks else f"the Run's batch a {one}"
        memory = "unknown (--memory-gb)" if lay.memory_bytes is None else f"{lay.memory_bytes / 1e9:.1f} GB"
        console.print(f"layouts at {lay.devices} {unit}: {m.params:,} parameters ({m.params_source}), {shape}, "
                      f"{batch}; memory per {one} {memory}")
        if lay.best is None:
            console.print(Text.assemble(("no layout fits", "bold"), f" the {one} memory"))
        else:
            b = lay.best
            console.print(Text.assemble(("best layout", "bold"), f" {b.layout.describe()}: {b.step_s * 1e3:.3f} ms a step, "
                                        f"{b.memory_bytes / 1e9:.2f} GB a {one}, bubble {b.bubble:.3f}"))
    if html_out is not None:
        console.print(f"plots: {html_out}")
