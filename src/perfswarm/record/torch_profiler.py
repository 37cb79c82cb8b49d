"""The torch collector: puts inject/ on the child's PYTHONPATH so its sitecustomize profiles
the training loop (see inject/sitecustomize.py). Files appear per process and rank."""

from __future__ import annotations

import os
from pathlib import Path

from perfswarm.record.base import Collector

INJECT = Path(__file__).resolve().parent / "inject"


class TorchCollector(Collector):
    name = "torch"
    unit = "traces"

    def __init__(self, raw: Path, skip: int, count: int, execution_trace: bool = True) -> None:
        super().__init__(raw)
        self.skip, self.window = skip, count
        self.execution_trace = execution_trace

    def env(self) -> dict[str, str]:
        path = os.environ.get("PYTHONPATH", "")
        return {
            "PYTHONPATH": str(INJECT) + (os.pathsep + path if path else ""),
            "PERFSWARM_RECORD_DIR": str(self.raw),
            "PERFSWARM_STEPS": f"{self.skip}:{self.window}",
            "PERFSWARM_ET": "1" if self.execution_trace else "0",
        }

    def files(self) -> list[str]:
        return [p.name for p in self.raw.iterdir()
                if p.name.startswith(("torch-", "et-", "steps-")) and p.suffix == ".json"]

    def count(self) -> int:
        return sum(1 for f in self.files() if f.startswith("torch-"))

    def stop(self) -> None:
        if not any(f.startswith("steps-") for f in self.files()):
            self.unavailable("no optimizer step seen (no torch.optim optimizer stepped, or the"
                             " process was killed)")
        elif not any(f.startswith("torch-") for f in self.files()):
            self.failed(f"no profiling window completed (fewer than {self.skip} steps, or the"
                        " process died first)")
