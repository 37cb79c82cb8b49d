"""Injected into the recorded command via PYTHONPATH: profiles torch without changing the script.

Nothing happens until the script imports torch.optim; then a global
optimizer-step hook counts iterations. After SKIP steps torch.profiler starts
(shapes recorded, one ProfilerStep#N marker per iteration, N = the iteration
index), an ExecutionTraceObserver covers the first profiled step, and after
COUNT steps the trace is exported. Every hook time is kept, so the steps
outside the window are known too: appended to `steps-….live` as it happens (one
decimal ns per line, unbuffered, so a watcher such as `perfswarm tune` sees the
steps live and a killed process keeps them), then written whole to
`steps-….json` at exit. Files are per process: RANK and pid in the name.
Configuration comes from PERFSWARM_* variables set by `perfswarm record`.
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import time
from types import ModuleType
from typing import Any

_DIR = os.environ.get("PERFSWARM_RECORD_DIR", "")
_HERE = os.path.dirname(os.path.abspath(__file__))


class _Window:
    """The per-process profiling state machine, driven by optimizer.step() post-hooks."""

    def __init__(self, out: str, skip: int, count: int, with_et: bool) -> None:
        self.out, self.skip, self.count, self.with_et = out, skip, count, with_et
        self.pid = os.getpid()
        self.rank = int(os.environ.get("RANK", "0") or 0)
        self.stem = f"rank{self.rank}-pid{self.pid}"
        self.hook_ns: list[int] = []
        self.step_done_ns: dict[int, int] = {}
        self.prof: Any = None
        self.et: Any = None
        self.live = os.path.join(out, f"steps-{self.stem}.live")
        self.live_fd = -1  # opened at the first step: most Python processes never step

    def on_step(self, *_: object) -> None:
        if os.getpid() != self.pid:  # a forked child (DataLoader worker) stepping on its own
            return
        now = time.time_ns()
        self.hook_ns.append(now)
        if self.live_fd < 0:
            self.live_fd = os.open(self.live, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.write(self.live_fd, b"%d\n" % now)
        done = len(self.hook_ns)
        if done == self.skip:
            self._start()
        elif self.prof is not None:
            if done == self.skip + self.count:
                self._stop()
            else:
                self.prof.step()
                # when step() returned: ProfilerStep#N ended between this and hook_ns[-1]
                self.step_done_ns[done - 1] = time.time_ns()
            if self.et is not None:  # after the marker, so the ET's file write is not in it
                self._stop_et()

    def _start(self) -> None:
        import torch
        from torch.profiler import ProfilerAction, ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        # A schedule (always RECORD) is what makes torch emit ProfilerStep#N markers.
        self.prof = profile(activities=activities, record_shapes=True,
                            schedule=lambda _step: ProfilerAction.RECORD)
        self.prof.step_num = self.skip  # ProfilerStep#N names the iteration index
        if self.with_et:
            from torch.profiler import ExecutionTraceObserver

            self.et = ExecutionTraceObserver()
            self.et.register_callback(os.path.join(self.out, f"et-{self.stem}.json"))
            self.et.start()
        self.prof.start()

    def _stop_et(self) -> None:
        self.et.stop()
        self.et.unregister_callback()
        self.et = None

    def _stop(self) -> None:
        prof, self.prof = self.prof, None
        prof.stop()
        tmp = os.path.join(self.out, f".torch-{self.stem}.tmp")
        prof.export_chrome_trace(tmp)
        os.replace(tmp, os.path.join(self.out, f"torch-{self.stem}.pt.trace.json"))

    def flush(self) -> None:
        """At exit (also after Ctrl-C): close an open window, then write the step times."""
        if os.getpid() != self.pid:
            return
        if self.et is not None:
            self._stop_et()
        if self.prof is not None:
            self._stop()
        path = os.path.join(self.out, f"steps-{self.stem}.json")
        with open(path + ".tmp", "w") as f:
            json.dump({"rank": self.rank, "pid": self.pid, "hook_ns": self.hook_ns,
                       "step_done_ns": self.step_done_ns}, f)
        os.replace(path + ".tmp", path)
        if self.live_fd >= 0:  # the .json holds every hook time now
            os.close(self.live_fd)
            os.unlink(self.live)


def _install(window: _Window) -> None:
    from torch.optim.optimizer import register_optimizer_step_post_hook

    register_optimizer_step_post_hook(window.on_step)
    atexit.register(window.flush)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs `_install` right after torch.optim.optimizer has been executed."""

    def __init__(self, window: _Window) -> None:
        self.window = window

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != "torch.optim.optimizer":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        exec_module = loader.exec_module
        window = self.window

        def exec_then_install(module: ModuleType) -> None:
            exec_module(module)
            _install(window)

        loader.exec_module = exec_then_install  # type: ignore[method-assign]
        return spec


def _chain() -> None:
    """Run the sitecustomize this one shadows, if any, so the user's own keeps working."""
    others = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


def _main() -> None:
    if _DIR:
        skip, _, count = os.environ.get("PERFSWARM_STEPS", "5:10").partition(":")
        window = _Window(_DIR, int(skip), int(count), os.environ.get("PERFSWARM_ET") == "1")
        sys.meta_path.insert(0, _AfterImport(window))
    _chain()


_main()
