"""Mutations of real corpus traces for fuzzing the readers (used by tests and benchmarks/fuzz.py).

Each case is (file name, bytes). Structural mutations replace, drop or retype one
field of one event or of the top level; byte mutations truncate, flip or splice.
"""

from __future__ import annotations

import copy
import gzip
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ODD_VALUES: tuple[Any, ...] = (None, "", "x", "0x1f", -1, -(2**63), 2**64, 1e308, -1e308, 0.5,
                               [], [1, "a"], {}, {"a": {"b": []}}, True, "NaN", "\u0000<script>")


def _mutate_structure(rng: random.Random, trace: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(trace)
    events = out.get("traceEvents") or []
    choice = rng.random()
    if choice < 0.1:
        key = rng.choice([*out.keys(), "baseTimeNanoseconds", "distributedInfo"])
        out[key] = rng.choice(ODD_VALUES)
    elif events:
        event = rng.choice(events)
        if not isinstance(event, dict):
            return out
        key = rng.choice([*event.keys(), "ph", "ts", "dur", "args", "id", "pid", "tid"])
        if choice < 0.3:
            event.pop(key, None)
        elif choice < 0.5 and isinstance(event.get("args"), dict):
            arg = rng.choice([*event["args"].keys(), "correlation", "External id", "stream",
                              "device", "Record function id", "name"])
            event["args"][arg] = rng.choice(ODD_VALUES)
        elif choice < 0.6:
            event["ph"] = rng.choice(["X", "i", "B", "E", "s", "f", "C", "M", "Z", ""])
        else:
            event[key] = rng.choice(ODD_VALUES)
    return out


def mutate_bytes(rng: random.Random, data: bytes) -> bytes:
    choice = rng.random()
    if choice < 0.4:
        return data[: rng.randrange(len(data))]
    buf = bytearray(data)
    for _ in range(rng.randrange(1, 8)):
        i = rng.randrange(len(buf))
        buf[i] = rng.choice(b'{}[],:"\\0x \xff')
    return bytes(buf)


def cases(sources: list[Path], count: int, seed: int = 0) -> Iterator[tuple[str, bytes]]:
    rng = random.Random(seed)
    traces = [json.loads(gzip.decompress(p.read_bytes())) for p in sources]
    for n in range(count):
        trace = traces[n % len(traces)]
        if rng.random() < 0.6:
            data = json.dumps(_mutate_structure(rng, trace)).encode()
        else:
            data = mutate_bytes(rng, json.dumps(trace).encode())
        if rng.random() < 0.3:
            data = gzip.compress(data, mtime=0)
            if rng.random() < 0.3:
                data = mutate_bytes(rng, data)
            yield f"case{n}.json.gz", data
        else:
            yield f"case{n}.json", data
