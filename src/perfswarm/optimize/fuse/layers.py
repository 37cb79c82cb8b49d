"""Conv pairs to fuse: parsed from layer specs (``dw3x3:C=128,H=56,W=56 -> pw:K=128``) or found
in a Run's recorded ops.

A spec is two layers joined by ``->``. A layer is ``pw``, ``dwKxK`` or ``convKxK`` with an
optional ``/sS`` stride, then ``:`` and comma-separated ``KEY=INT`` settings: the first layer
takes the input (N batch, default 1; C channels; H height; W width, default H), ``K`` output
channels (pw and conv) and ``S`` stride; the second takes ``K`` and ``S``, and may restate ``C``,
``H`` or ``W`` of what it reads, which must then match what the first makes.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from itertools import pairwise

from perfswarm.errors import ParameterError, PerfswarmError
from perfswarm.model.fusion import ConvKind, ConvLayer, ConvPair
from perfswarm.model.opcost import OpCost, Shapes

_LAYER = re.compile(r"^(pw|dw(\d+)x(\d+)|conv(\d+)x(\d+))(?:/s(\d+))?$")
_KEYS = {"N", "C", "H", "W", "K", "S"}
# ops that may stand between two convs of a block without breaking the pair: batch norm folds
# into the first conv's weights at inference and an activation is the fused kernel's epilogue
_BETWEEN = frozenset({"norm", "elementwise"})


def _settings(spec: str, text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        key, sep, value = item.partition("=")
        key = key.strip().upper()
        if not sep or key not in _KEYS or not value.strip().isdigit():
            raise ParameterError("layers", "is not KEY=INT with KEY one of N, C, H, W, K, S",
                                 value=spec, detail=repr(item))
        out[key] = int(value)
    return out


def _layer(spec: str, text: str, in_channels: int) -> tuple[ConvLayer, dict[str, int]]:
    head, _, rest = text.strip().partition(":")
    match = _LAYER.match(head.strip().lower())
    if match is None:
        raise ParameterError("layers", "is not a layer; expected pw, dwKxK or convKxK (e.g. "
                             "dw3x3, conv3x3/s2)", value=spec, detail=repr(head.strip()))
    found = _settings(spec, rest)
    kind: ConvKind = "pw" if match[1] == "pw" else "dw" if match[2] else "conv"
    rows, cols = (1, 1) if kind == "pw" else (int(match[2] or match[4]),
                                             int(match[3] or match[5]))
    if rows != cols:
        raise ParameterError("layers", "only square kernels", value=spec, detail=head.strip())
    stride = found.get("S", int(match[6] or 1))
    if kind == "dw":
        out_channels = found.get("K", in_channels)
    elif "K" in found:
        out_channels = found["K"]
    else:
        raise ParameterError("layers", "needs K=, its output channels", value=spec,
                             detail=head.strip())
    return ConvLayer(kind, in_channels, out_channels, rows, stride), found


def parse_pair(spec: str, batch: int | None = None) -> ConvPair:
    """A ConvPair from one ``--layer`` spec; `batch` (when given) replaces its N."""
    parts = spec.split("->")
    if len(parts) != 2:
        raise ParameterError("layers", "expected two layers joined by '->', e.g. "
                             "'dw3x3:C=128,H=56,W=56 -> pw:K=128'", value=spec)
    first_text = parts[0].partition(":")[2]
    given = _settings(spec, first_text)
    if "C" not in given or "H" not in given:
        raise ParameterError("layers", "the first layer needs C= and H= (its input)", value=spec)
    first, _ = _layer(spec, parts[0], given["C"])
    second, restated = _layer(spec, parts[1], first.out_channels)
    pair = ConvPair(batch or given.get("N", 1), given["H"], given.get("W", given["H"]), first,
                    second)
    makes = {"C": first.out_channels, "H": pair.mid_size[0], "W": pair.mid_size[1]}
    for key, value in makes.items():
        if key in restated and restated[key] != value:
            raise ParameterError("layers", f"shapes do not chain: the first layer makes "
                                 f"{key}={value}, the second reads {key}={restated[key]}",
                                 value=spec)
    return pair


def _layer_of(shapes: Shapes, out_h: int) -> ConvLayer | None:
    """The ConvLayer of a recorded conv (input [N, C, H, W], weight [K, C/g, k, k]) whose output
    is out_h rows high: the stride that gives that height (traces before torch 2.1 record
    none)."""
    if len(shapes.dims) < 2 or len(shapes.dims[0]) != 4 or len(shapes.dims[1]) != 4:
        return None
    (_, c, h, _), (k, c_group, kh, kw) = shapes.dims[0], shapes.dims[1]
    if kh != kw or c_group not in (1, c):
        return None
    kind: ConvKind = "dw" if c_group == 1 and k == c > 1 else "pw" if kh == 1 else "conv"
    if c_group == 1 and kind != "dw" and c > 1:
        return None  # grouped but not depthwise
    for stride in (1, 2, 3, 4):
        if (h + 2 * (kh // 2) - kh) // stride + 1 == out_h and (kind != "pw" or stride == 1):
            return ConvLayer(kind, c, k, kh, stride)
    return None


def run_pairs(ops: Sequence[tuple[OpCost, Shapes]]) -> list[ConvPair]:
    """Conv pairs of a recorded op sequence: two convs with only norms and activations between
    whose second reads what the first makes (channels, batch, the size a stride gives), in
    order, each distinct pair once."""
    convs = [i for i, (cost, _) in enumerate(ops) if cost.family in ("conv", "depthwise_conv")]
    found: list[ConvPair] = []
    for a, b in pairwise(convs):
        if any(ops[i][0].family not in _BETWEEN for i in range(a + 1, b)):
            continue
        xa, xb = ops[a][1].dims[0], ops[b][1].dims[0]
        if len(xa) != 4 or len(xb) != 4 or xa[0] != xb[0]:
            continue
        first = _layer_of(ops[a][1], xb[2])
        later = [c for c in convs if c > b]
        next_h = ops[later[0]][1].dims[0][2] if later and len(ops[later[0]][1].dims[0]) == 4 \
            else xb[2]
        second = _layer_of(ops[b][1], next_h) or _layer_of(ops[b][1], xb[2])
        if first is None or second is None or first.out_channels != second.in_channels:
            continue
        try:
            pair = ConvPair(xa[0], xa[2], xa[3], first, second)
        except PerfswarmError:
            continue  # not a fusible kind (depthwise twice) or not chained
        if pair not in found:
            found.append(pair)
    return found
