"""The recipes' last step: a trace they exported, gzipped as the traces here are stored (mtime
0: the same trace gives the same bytes), and the JSON removed; and the profiled loop of the
recipes that run on several ranks."""
import gzip
import os
import shutil
from collections.abc import Callable
from typing import Any

import torch


def gzip_trace(out: str) -> None:
    """`out` (a trace's JSON) as `out`.gz, and `out` removed."""
    with open(out, "rb") as src, open(out + ".gz", "wb") as raw, \
            gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as dst:
        shutil.copyfileobj(src, dst)
    os.remove(out)


def profile_steps(step: Callable[[], None], out: str, **options: Any) -> None:
    """`step` run 4 times under the profiler (1 warm-up, 3 profiled steps; `options`: the
    profiler's own, e.g. record_shapes), its trace written gzipped to `out`.gz."""
    with torch.profiler.profile(schedule=torch.profiler.schedule(wait=0, warmup=1, active=3,
                                                                 repeat=1),
                                on_trace_ready=lambda p: p.export_chrome_trace(out),
                                **options) as prof:
        for _ in range(4):
            step()
            prof.step()
    gzip_trace(out)
