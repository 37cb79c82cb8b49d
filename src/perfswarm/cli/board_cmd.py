"""`perfswarm board [DIR] [--host 127.0.0.1] [--port N] [--profile cpu-profile.json]`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from perfswarm.cli.app import app
from perfswarm.cli.profile_option import Profile


@app.command("board")
def board_command(
    root: Annotated[Path, typer.Argument(metavar="DIR", help="Directory holding Run directories.")] = Path("."),
    host: Annotated[str, typer.Option("--host", help="Address to bind (local only by default).")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="Port (0 picks a free one).")] = 8765,
    profile: Profile = None,
) -> None:
    """A read-only local web app: lists the runs in DIR, opens their reports, compares two."""
    from perfswarm.cli.output import console
    from perfswarm.model.hostcosts import host_costs
    from perfswarm.optimize.advise import advise
    from perfswarm.optimize.project import report_projection
    from perfswarm.report.board import BoardServer, list_runs

    costs = host_costs(profile)
    server = BoardServer(root, host, port,
                         advice=lambda run: advise(run, costs=costs).to_dict()["advice"],
                         projection=report_projection)
    console.print(f"perfswarm board: {len(list_runs(server.root))} runs in {server.root} "
                  f"at {server.url} (Ctrl-C stops it)")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        console.print("stopped")
    finally:
        server.server_close()
