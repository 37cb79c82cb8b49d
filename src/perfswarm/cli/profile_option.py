"""The --profile option `advise`, `report` and `board` share: the host's receive cost (model/receive.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

Profile = Annotated[Path | None, typer.Option(
    "--profile", help="CPU profile from `perfswarm calibrate` on the host: what taking a batch "
    "from a DataLoader worker costs there, for the data_loading advice (default: figures "
    "measured on a 2-core VM).")]
