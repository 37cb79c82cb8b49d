"""py-spy's raw (folded) output (recorder/pystacks.py): one line per distinct (process, thread,
stack) with a sample count, and no times."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from perfswarm.trace.readers.fields import int64_field

# process PID:"CMDLINE";thread (TID)[: NAME][;frame;frame;...] COUNT   (TID decimal or 0x-hex);
# one record per stack, and the quoted command line may span lines (python -c scripts); with
# --subprocesses a child's stack names its parents first (process P:"...";process C:"...";
# thread ...): the process is the last one named
_LINE = re.compile(r'^(process \d+:".*?");thread \((0x[0-9a-fA-F]+|\d+)\)(?:: [^;\n]*)?'
                   r'(?:;([^\n]*))? (\d+)$', re.MULTILINE | re.DOTALL | re.ASCII)
_PROCESS = re.compile(r'(?:^|";)process (\d+):"', re.ASCII)
_FRAME = re.compile(r"^(.*) \((.*?)(?::(\d+))?\)$", re.ASCII)


@dataclass(frozen=True)
class Folded:
    pid: int
    tid: int
    frames: tuple[tuple[str, str, int], ...]  # leaf first: function, file, line
    count: int


def _frame(item: str, source: Path, line: int) -> tuple[str, str, int]:
    f = _FRAME.match(item)
    if not f:
        return item, "", -1
    number = int64_field(f.group(3), source, line, "line number") if f.group(3) else -1
    return f.group(1), f.group(2), number


def parse_raw(text: str, source: Path) -> list[Folded]:
    """Stacks of py-spy's raw output; other lines are skipped, numbers that cannot be what
    py-spy writes are a TraceFormatError naming `source` and the line."""
    out: list[Folded] = []
    n, counted = 1, 0  # the line a record starts on, and up to where newlines are counted
    for m in _LINE.finditer(text):
        n += text.count("\n", counted, m.start())
        counted = m.start()
        processes, tid, stack, count = m.groups()
        pid = _PROCESS.findall(processes)[-1]
        frames = tuple(_frame(item, source, n) for item in reversed(stack.split(";"))
                       ) if stack else ()
        out.append(Folded(int64_field(pid, source, n, "pid"), int64_field(tid, source, n, "tid"),
                          frames, int64_field(count, source, n, "count")))
    return out


def read(path: Path) -> list[Folded]:
    return parse_raw(path.read_text(errors="replace"), path)
