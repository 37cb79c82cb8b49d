"""The typer application that every command module registers itself on."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="perfswarm",
    help="Record, ingest, analyze, model, optimize and report ML workload performance.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
