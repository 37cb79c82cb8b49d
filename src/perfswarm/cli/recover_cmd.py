"""`perfswarm recover [DIR]`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from perfswarm.cli.app import app


@app.command("recover")
def recover_command(
    root: Annotated[Path, typer.Argument(metavar="DIR", help="Directory holding the Runs.")] = Path("."),
) -> None:
    """Make incomplete Runs of the recordings a killed `record` left in DIR (.NAME.*.recording)."""
    from perfswarm.cli.output import console
    from perfswarm.errors import PerfswarmError
    from perfswarm.recorder.recover import leftovers, recover

    if not root.is_dir():
        raise PerfswarmError(f"{root}: {'not a directory' if root.exists() else 'no such directory'}")
    found = leftovers(root)
    for raw in found:
        run = recover(raw)
        console.print(f"recovered {run.path} (complete: false) from {raw.name}")
    if not found:
        console.print(f"no recording left to recover in {root}")
