"""The --profile option `advise`, `report` and `board` share: the host's costs the advice prices
(model/hostcosts.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

Profile = Annotated[Path | None, typer.Option(
    "--profile", help="CPU profile from `perfswarm calibrate` on the host: what taking a batch "
    "from a DataLoader worker costs there (data_loading) and what a fused optimizer step costs "
    "(single_tensor_optimizer) (default: figures measured on a 2-core VM).")]
