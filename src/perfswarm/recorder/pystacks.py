"""py-spy on the process tree (`--subprocesses`), raw (folded) format with thread ids.

Raw output is aggregated: one line per distinct (process, thread, stack) with a
sample count. It carries no times, so each becomes one `samples` row at the
moment sampling began, weighted by its count.
"""

from __future__ import annotations

from perfswarm.recorder.tools import ToolCollector


class PyStacksCollector(ToolCollector):
    name = "pystacks"
    tool = "py-spy"
    output = "pystacks.txt"
    ptrace = True

    def argv(self, pid: int) -> list[str]:
        assert self.exe is not None
        # --nonblocking: read the stacks without stopping the process for each sample (a
        # stop per sample slowed a training step by a third at 100 Hz)
        return [self.exe, "record", "--pid", str(pid), "--subprocesses", "--threads",
                "--nonblocking", "--format", "raw", "--rate", str(self.hz),
                "--output", str(self.raw / self.output)]
