"""`perfswarm advise RUN [--json]`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from perfswarm.cli.app import app
from perfswarm.cli.profile_option import Profile

_STYLE = {"high": "bold red", "medium": "yellow", "low": "dim"}


@app.command("advise")
def advise_command(
    run_dir: Annotated[Path, typer.Argument(metavar="RUN", help="Run directory.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON (keys in docs/cli.md).")] = False,
    profile: Profile = None,
) -> None:
    """What to change, with the evidence from the run and the estimated gain, largest first."""
    from rich.table import Table
    from rich.text import Text

    from perfswarm.cli.json_output import print_json
    from perfswarm.cli.output import console
    from perfswarm.model.hostcosts import host_costs
    from perfswarm.optimize.advise import advise
    from perfswarm.report.text import evidence_text, ms
    from perfswarm.trace.store import Run

    report = advise(Run.open(run_dir), costs=host_costs(profile))
    if as_json:
        print_json(report.to_dict())
        return
    over = (f"over {ms(report.measured_ns)} measured on rank(s) {list(report.ranks)}"
            if report.ranks else "(no traced rank: each gain says what it is of)")
    console.print(Text.assemble((str(report.path), "bold"),
                                f": {len(report.advice)} finding(s) {over}"))
    for a in report.advice:
        gain = ("no time gain" if a.gain_ns is None else f"~{ms(a.gain_ns)}" + (
            "" if a.gain_pct is None
            else f" ({a.gain_pct:.2f}% of {ms(a.gain_of_ns)}: {a.gain_of})"))
        console.print(Text.assemble("\n", (a.severity.upper(), _STYLE[a.severity]), " ",
                                    (a.title, "bold"), f" ({a.rule}): {gain}"))
        evidence = Table("evidence", "value", show_header=False, box=None, padding=(0, 2))
        for key, value in a.evidence.items():
            evidence.add_row(key, evidence_text(key, value))
        console.print(evidence)
        console.print(f"  gain: {a.gain_basis}")
        console.print(f"  change: {a.change}", soft_wrap=True)
