"""The torch collector: puts inject/ on the child's PYTHONPATH so its sitecustomize profiles
the training loop (see inject/sitecustomize.py). Files appear per process and rank."""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

import orjson

from perfswarm.recorder.base import Collector

INJECT = Path(__file__).resolve().parent / "inject"
# backwards (or forwards, with no backward) an optimizer the program built may wait for its first
# step before the loop's own steps drive the window (inject/sitecustomize.py): more
# than gradient accumulation's micro-steps (nanoGPT's GPT-2 config: 40)
PATIENCE = 64
# optimizer calls repeating one cycle that make it the loop's whatever else was built (a spare
# optimizer never stepped is none of it): more than a WGAN's critic calls before its
# generator's first (5 in WGAN-GP); the window waits for twice as many, an optimizer that
# first steps before then (a critic's warm-up) learning the cycle again
SETTLE = 12
_LIVE = re.compile(r"^steps-rank(\d+)-pid(\d+)\.live$")


def read_live(data: bytes) -> list[int]:
    """Hook times of a `steps-….live` file: one decimal ns per line; a torn last line (the
    process is writing it, or was killed mid-write) is left for the next read."""
    return [int(line) for line in data[:data.rfind(b"\n") + 1].split()]


class TorchCollector(Collector):
    name = "torch"
    unit = "traces"

    def __init__(self, raw: Path, skip: int, count: int, execution_trace: bool = True,
                 reserve_mib: int = 0) -> None:
        super().__init__(raw)
        self.skip, self.window = skip, count
        self.execution_trace = execution_trace
        self.reserve_mib = reserve_mib
        self._live: Path | None = None
        self._live_pos = 0
        self._live_ns: list[int] = []

    def env(self) -> dict[str, str]:
        path = os.environ.get("PYTHONPATH", "")
        return {
            "PYTHONPATH": str(INJECT) + (os.pathsep + path if path else ""),
            "PERFSWARM_RECORD_DIR": str(self.raw),
            "PERFSWARM_STEPS": f"{self.skip}:{self.window}",
            "PERFSWARM_ET": "1" if self.execution_trace else "0",
            "PERFSWARM_HEAP_RESERVE": str(self.reserve_mib),
            "PERFSWARM_PATIENCE": str(PATIENCE),
            "PERFSWARM_SETTLE": str(SETTLE),
            # Kineto keeps CUPTI subscribed after a window unless told to tear it down: on an
            # H200, nanoGPT's steps after the window then ran 1.6x their bare time (CUDA 12.6 on
            # tears down safely; torch itself sets 0 where CUDA graphs need it). The user's own
            # setting stands.
            "TEARDOWN_CUPTI": os.environ.get("TEARDOWN_CUPTI", "1"),
        }

    def files(self) -> list[str]:
        return [p.name for p in self.raw.iterdir()
                if p.name.startswith(("torch-", "et-", "steps-"))
                and p.suffix in (".json", ".live")]

    def count(self) -> int:
        return sum(1 for f in self.files() if f.startswith("torch-"))

    def step_ns(self) -> tuple[int, ...]:
        """Optimizer-step hook times so far of the first process that steps (lowest rank, then
        pid), read from its live file while it runs; only the new bytes are read each call."""
        if self._live is None:
            found = sorted((int(m[1]), int(m[2]), p) for p in self.raw.iterdir()
                           if (m := _LIVE.match(p.name)))
            if not found:
                return ()
            self._live = found[0][2]
        try:
            with self._live.open("rb") as f:
                f.seek(self._live_pos)
                data = f.read()
        except FileNotFoundError:  # it exited: the .json replaced the live file
            return tuple(self._live_ns)
        whole = data[:data.rfind(b"\n") + 1]
        self._live_pos += len(whole)
        self._live_ns += read_live(whole)
        return tuple(self._live_ns)

    def aside_at(self) -> int | None:
        """The step at which a process's own torch profiler took over (its window stood
        aside: inject/sitecustomize.py), the first of those the steps files tell."""
        found = []
        for f in self.files():
            if f.startswith("steps-") and f.endswith(".json"):
                with contextlib.suppress(OSError, ValueError, AttributeError):
                    at = orjson.loads((self.raw / f).read_bytes()).get("aside_at")
                    if isinstance(at, int) and not isinstance(at, bool):
                        found.append(at)
        return min(found, default=None)

    def stop(self) -> None:
        aside = self.aside_at()
        waited = self._unstepped()
        if not any(f.startswith("steps-") for f in self.files()) and waited:
            self.unavailable(f"an optimizer was built and never stepped; the loop's {waited} "
                             f"were under the {PATIENCE} that take the window without it "
                             "(build the optimizer where it is used, or run more iterations)")
        elif not any(f.startswith("steps-") for f in self.files()):
            self.unavailable("no step seen (no torch.optim optimizer step, autograd backward or"
                             " module forward, or the process was killed)")
        elif not any(f.startswith("torch-") for f in self.files()) and aside is not None:
            self.unavailable(f"the program started its own torch profiler at step {aside}, "
                             "before this window opened (torch runs one at a time: its trace "
                             "is the program's)")
        elif not any(f.startswith("torch-") for f in self.files()):
            if self._unsettled():
                self.unavailable(f"several optimizers were built, and the cycle of their steps "
                                 f"was not known by the end: it needs every one built to step, "
                                 f"or {2 * SETTLE} calls, the last {SETTLE} repeating one cycle, "
                                 f"or {PATIENCE} calls "
                                 "(build only the optimizers the loop steps, or run more "
                                 "iterations)")
            elif self._most_steps() > self.skip:
                self.failed(f"the window opened after step {self.skip}, but the process ended "
                            "before it closed (os._exit, or killed): the trace was not written")
            else:
                self.failed(f"no profiling window completed (fewer than {self.skip} steps, or "
                            "the process died first)")

    def _unstepped(self) -> str:
        """What a process that built an optimizer and never stepped it ran instead ('20
        forwards'), from the file its window leaves at exit; '' where none did."""
        for p in sorted(self.raw.glob(".unstepped-*.json")):
            with contextlib.suppress(OSError, ValueError, AttributeError):
                waited = orjson.loads(p.read_bytes())
                return " and ".join(f"{n} {kind}s" for kind, n in waited.items()
                                    if isinstance(n, int) and n > 0)
        return ""

    def _unsettled(self) -> bool:
        """Whether a process's window waited for the cycle of its optimizers to the end
        (inject/sitecustomize.py, _Window.settled)."""
        for f in self.files():
            if f.startswith("steps-") and f.endswith(".json"):
                with contextlib.suppress(OSError, ValueError, AttributeError):
                    if orjson.loads((self.raw / f).read_bytes()).get("unsettled") is True:
                        return True
        return False

    def _most_steps(self) -> int:
        """The most steps one stepping process timed (its .live file, or its .json)."""
        most = 0
        for f in self.files():
            if f.startswith("steps-"):
                with contextlib.suppress(OSError, ValueError, AttributeError, TypeError):
                    data = (self.raw / f).read_bytes()
                    hooks = (read_live(data) if f.endswith(".live")
                             else orjson.loads(data).get("hook_ns", []))
                    most = max(most, len(hooks))
        return most
