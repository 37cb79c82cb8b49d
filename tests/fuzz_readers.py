"""The record side's readers (perf script, py-spy raw, strace, sampler JSON lines) and the Run
manifest, each as `read(path)` from one file to what perfswarm builds from it, with mutations
of real samples (tests/data/) for fuzzing them. Used by tests/test_fuzz.py and
benchmarks/fuzz.py.

A reader must return or raise the typed error (PerfswarmError: exit 2, one line naming the
file); `outcome` says which and lets anything else through.
"""

from __future__ import annotations

import copy
import json
import random
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fuzz_cases import ODD_VALUES, mutate_bytes
from perfswarm.errors import PerfswarmError
from perfswarm.recorder.build import Stacks, perf_samples, pyspy_samples
from perfswarm.report import perfetto
from perfswarm.trace.info import run_info
from perfswarm.trace.readers import perf, pyspy, sampler, strace
from perfswarm.trace.readers.fields import Placement
from perfswarm.trace.store import Run

DATA = Path(__file__).resolve().parent / "data"
EPOCH_OFFSET_NS = 1_700_000_000_000_000_000  # a monotonic -> epoch offset, as record measures


def read_perf(path: Path) -> None:
    stacks = Stacks()
    samples = perf.parse_script(path.read_text(errors="replace"), path)
    perf_samples(samples, EPOCH_OFFSET_NS, {}, stacks)
    stacks.table()


def read_pystacks(path: Path) -> None:
    stacks = Stacks()
    pyspy_samples(pyspy.read(path), EPOCH_OFFSET_NS, {}, stacks)
    stacks.table()


def read_strace(path: Path) -> None:
    strace.read(path, Placement())


def read_sampler(path: Path) -> None:
    sampler.read(path, Placement())


def read_manifest(path: Path) -> None:
    """Everything that reads a manifest: opening the Run, `info`, the Chrome trace export."""
    run = Run.open(path.parent)
    run_info(run)
    b"".join(perfetto.chrome_trace(run))


_NUMBER = re.compile(rb"\d+")
ODD_NUMBERS = (b"9" * 25, b"18446744073709551616", b"9223372036854775808", b"4611686018427387904",
               b"-1", b"0x", b"0xffffffffffffffffff", "\u0661\u0662".encode(), b"", b"0" * 30,
               b"1" * 5000)
ODD_BYTES = b'\t()[]{};:<>"\\ =.,+-\xff\x00\n'


def mutate_text(rng: random.Random, data: bytes) -> bytes:
    """One to three line-level edits of a tool's text output (numbers first: they are parsed)."""
    lines = data.split(b"\n")
    for _ in range(rng.randrange(1, 4)):
        choice = rng.random()
        i = rng.randrange(len(lines))
        numbers = list(_NUMBER.finditer(lines[i]))
        if choice < 0.4 and numbers:
            m = rng.choice(numbers)
            lines[i] = lines[i][:m.start()] + rng.choice(ODD_NUMBERS) + lines[i][m.end():]
        elif choice < 0.55:
            del lines[i]
        elif choice < 0.65:
            lines.insert(i, lines[rng.randrange(len(lines))])
        elif choice < 0.8 and lines[i]:
            j = rng.randrange(len(lines[i]))
            lines[i] = lines[i][:j] + bytes([rng.choice(ODD_BYTES)]) + lines[i][j + 1:]
        elif choice < 0.9:
            lines[i] = lines[i][:rng.randrange(len(lines[i]) + 1)]
        else:
            lines.insert(i, rng.choice((b"", b"\t", b" " * 100, b"\t0 x ()", b"process 1:\"\";")))
        if not lines:
            lines = [b""]
    return b"\n".join(lines)


def _nodes(value: Any, out: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """(container, key) of every value nested in `value`."""
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for key, child in items:
        out.append((value, key))
        if isinstance(child, dict | list) and child:
            _nodes(child, out)
    return out


def mutate_json(rng: random.Random, data: bytes) -> bytes:
    """Delete, retype or rename one value anywhere in a JSON document, or mangle its bytes."""
    if rng.random() < 0.25:
        return mutate_bytes(rng, data)
    doc = copy.deepcopy(json.loads(data))
    container, key = rng.choice(_nodes(doc, []))
    choice = rng.random()
    if choice < 0.3 and isinstance(container, dict):
        del container[key]
    elif choice < 0.4 and isinstance(container, dict):
        container[rng.choice(("", "0:x", "a:b:c", "-1:-1", "\u0000"))] = container.pop(key)
    else:
        container[key] = rng.choice(ODD_VALUES)
    return json.dumps(doc).encode()


@dataclass(frozen=True)
class Reader:
    name: str
    file_name: str  # what the reader's file is called in a recording or a Run
    read: Callable[[Path], None]
    mutate: Callable[[random.Random, bytes], bytes]


READERS = {r.name: r for r in (
    Reader("perf", "perf_script.txt", read_perf, mutate_text),
    Reader("pystacks", "pystacks.txt", read_pystacks, mutate_text),
    Reader("strace", "strace.txt", read_strace, mutate_text),
    Reader("sampler", "system.jsonl", read_sampler, mutate_text),
    Reader("manifest", "manifest.json", read_manifest, mutate_json),
)}
SAMPLES = {"perf": DATA / "perf_script.txt", "pystacks": DATA / "pyspy_raw.txt",
           "strace": DATA / "strace.txt", "sampler": DATA / "system.jsonl"}


def text_cases(reader: Reader, sample: bytes, count: int, seed: int = 0) -> Iterator[bytes]:
    rng = random.Random(seed)
    for _ in range(count):
        yield reader.mutate(rng, sample)


def outcome(reader: Reader, path: Path) -> str:
    """'ok' or 'typed' (a well-formed typed error); anything else propagates or fails here."""
    try:
        reader.read(path)
    except PerfswarmError as exc:
        message = str(exc)
        assert exc.exit_code == 2, message
        assert "\n" not in message, message
        assert str(path) in message, message
        return "typed"
    return "ok"
