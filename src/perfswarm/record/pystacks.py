"""py-spy on the process tree (`--subprocesses`), raw (folded) format with thread ids.

Raw output is aggregated: one line per distinct (process, thread, stack) with a
sample count. It carries no times, so each becomes one `samples` row at the
moment sampling began, weighted by its count.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from perfswarm.record.tools import ToolCollector

# One record per stack; the quoted command line may span lines (python -c scripts).
_LINE = re.compile(r'^process (\d+):".*?";thread \((\w+)\)(?:: [^;\n]*)?(?:;([^\n]*))? (\d+)$',
                   re.MULTILINE | re.DOTALL)
_FRAME = re.compile(r"^(.*) \((.*?)(?::(\d+))?\)$")


class PyStacksCollector(ToolCollector):
    name = "pystacks"
    tool = "py-spy"
    output = "pystacks.txt"

    def argv(self, pid: int) -> list[str]:
        assert self.exe is not None
        return [self.exe, "record", "--pid", str(pid), "--subprocesses", "--threads",
                "--format", "raw", "--rate", str(self.hz),
                "--output", str(self.raw / self.output)]


@dataclass(frozen=True)
class Folded:
    pid: int
    tid: int
    frames: tuple[tuple[str, str, int], ...]  # leaf first: function, file, line
    count: int


def parse_raw(text: str) -> list[Folded]:
    out: list[Folded] = []
    for m in _LINE.finditer(text):
        pid, tid, stack, count = m.groups()
        frames = []
        for item in reversed(stack.split(";") if stack else []):
            f = _FRAME.match(item)
            frames.append((f.group(1), f.group(2), int(f.group(3) or -1)) if f
                          else (item, "", -1))
        out.append(Folded(int(pid), int(tid, 0), tuple(frames), int(count)))
    return out
