"""Conv pairs for `fuse`: layer specs, pairs found in a recorded CPU trace, the pair roofline,
and a CPU's ceilings from a calibrate profile."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from perfswarm.errors import PerfswarmError
from perfswarm.model.fusion import ConvLayer, ConvPair
from perfswarm.model.opstats import op_sequence
from perfswarm.model.profile import Profile
from perfswarm.model.specs import cpu_spec
from perfswarm.optimize.fuse.layers import parse_pair, run_pairs
from perfswarm.trace.ingest import ImportOptions, import_traces

DATA = Path(__file__).parent / "data"
# a MobileNet-like block (conv3x3/s2, dw3x3, pw, dw3x3/s2, pw; batch norms and ReLUs between)
# recorded on the CPU with torch.profiler(record_shapes=True)
CNN = DATA / "cnn_cpu_trace.json"


def test_layer_spec() -> None:
    pair = parse_pair("dw3x3:C=128,H=56,W=56 -> pw:K=128")
    assert pair == ConvPair(1, 56, 56, ConvLayer("dw", 128, 128, 3), ConvLayer("pw", 128, 128, 1))
    assert (pair.kind, pair.mid_size, pair.out_size) == ("dw->pw", (56, 56), (56, 56))
    pair = parse_pair("conv3x3/s2:N=8,C=3,H=224,K=32 -> dw3x3:C=32,H=112", batch=None)
    assert (pair.kind, pair.batch, pair.width, pair.mid_size) == ("conv->dw", 8, 224, (112, 112))
    assert parse_pair("pw:C=24,H=56,K=144 -> dw5x5:S=2", batch=4).out_size == (28, 28)
    assert parse_pair("conv3x3:C=8,H=9,K=8 -> pw:K=4").kind == "conv->conv"


@pytest.mark.parametrize(("spec", "why"), [
    ("dw3x3:C=128,H=56", "expected two layers"),
    ("dw3x4:C=8,H=8 -> pw:K=8", "only square kernels"),
    ("dwx:C=8,H=8 -> pw:K=8", "is not a layer"),
    ("dw3x3:C=8,H=eight -> pw:K=8", "is not KEY=INT"),
    ("dw3x3:C=8 -> pw:K=8", "needs C= and H="),
    ("dw3x3:C=8,H=8 -> pw", "needs K="),
    ("dw3x3:C=8,H=8 -> pw:C=16,K=8", "shapes do not chain"),
    ("dw3x3/s2:C=8,H=8 -> pw:H=8,K=8", "shapes do not chain"),
    ("dw3x3:C=8,H=8 -> dw3x3", "not a fusible pair"),
    ("dw3x3:C=8,H=8,K=16 -> pw:K=8", "keeps its 8 channels"),
])
def test_bad_layer_spec(spec: str, why: str) -> None:
    with pytest.raises(PerfswarmError, match=why) as err:
        parse_pair(spec)
    assert "\n" not in str(err.value)


def test_pairs_of_a_recorded_cpu_run(tmp_path: Path) -> None:
    run = import_traces([CNN], tmp_path / "cnn.run", ImportOptions(), ["test"])
    # independently from the raw JSON: the innermost convs' input and weight shapes, in order
    events = orjson.loads(CNN.read_bytes())["traceEvents"]
    convs = sorted((e for e in events if e.get("name") == "aten::mkldnn_convolution"),
                   key=lambda e: e["ts"])
    dims = [e["args"]["Input Dims"][:2] for e in convs]
    assert dims[0] == [[2, 3, 32, 32], [8, 3, 3, 3]]
    pairs = run_pairs(op_sequence(run, 0))
    assert [(p.label, p.kind) for p in pairs] == [
        ("conv3x3/s2 -> dw3x3 N=2 C=3 H=32 W=32 K=8", "conv->dw"),
        ("dw3x3 -> pw N=2 C=8 H=16 W=16 K=16", "dw->pw"),
        ("pw -> dw3x3/s2 N=2 C=8 H=16 W=16 K=16", "pw->dw"),
        ("dw3x3/s2 -> pw N=2 C=16 H=16 W=16 K=24", "dw->pw")]
    # each pair's intermediate is the next conv's recorded input
    for pair, (x, _) in zip(pairs, dims[1:], strict=True):
        assert [pair.batch, pair.first.out_channels, *pair.mid_size] == x


def test_pair_roofline() -> None:
    llc = 32e6
    spec = cpu_spec("cpu", 100e9, 10e9, 40e9, llc, 1, "test")
    pair = parse_pair("dw3x3:C=128,H=56 -> pw:K=128")
    pixels = 56 * 56
    mid = 4.0 * 128 * pixels  # fits the cache: written and read back at 40 GB/s
    dw_flops, pw_flops = 2.0 * 128 * pixels * 9, 2.0 * 128 * pixels * 128
    dw_bytes = 4.0 * (128 * pixels + 128 * 9) + mid
    pw_bytes = mid + 4.0 * (128 * 128 + 128 * pixels)
    p = pair.predict(spec)
    first = max(dw_flops / 100e9, (dw_bytes - mid) / 10e9 + mid / 40e9)
    second = max(pw_flops / 100e9, (pw_bytes - mid) / 10e9 + mid / 40e9)
    assert p.separate_s == pytest.approx(first + second)
    outer = dw_bytes + pw_bytes - 2 * mid
    assert p.fused_s == pytest.approx(max((dw_flops + pw_flops) / 100e9, outer / 10e9))
    assert p.fused_intensity == pytest.approx((dw_flops + pw_flops) / outer)
    assert (p.intermediate_bytes, p.round_trips_memory) == (mid, False)
    # past the cache the map goes to memory and back: 2 x 1.6 MB at 10 GB/s more
    small = cpu_spec("cpu", 100e9, 10e9, 40e9, 1e6, 1, "test")
    q = pair.predict(small)
    assert q.round_trips_memory
    assert q.separate_s == pytest.approx(max(dw_flops / 100e9, dw_bytes / 10e9)
                                         + max(pw_flops / 100e9, pw_bytes / 10e9))
    assert q.fused_s == p.fused_s
    assert q.gains and q.speedup == pytest.approx(q.separate_s / q.fused_s)


def _point(op: str, dims: list[list[int]], seconds: float) -> dict[str, object]:
    return {"op": op, "dims": dims, "seconds": seconds}


def test_ceilings_from_a_profile() -> None:
    family = {"coef": [0.0, 1e-10, 1e-11], "chosen": "roofline", "gmae_held_out": 0.1}
    conv = [_point("aten::conv2d", [[1, 16, 8, 8], [16, 16, 3, 3]], 1e-4),
            _point("aten::conv2d", [[1, 16, 16, 16], [16, 16, 3, 3]], 2e-4)]
    copy = [_point("aten::copy_", [[1000], [1000]], 1e-6)]
    warm = [_point("aten::copy_", [[1000], [1000]], 2e-7)]
    profile = Profile.from_dict({"device": "cpu", "families": {
        "conv": {**family, "sweep": conv}, "copy": {**family, "sweep": copy}},
        "warm": {"copy": {**family, "sweep": warm}}})
    # the best rate of each sweep: 2*256*16*16*9 FLOPs in 2e-4 s; copy_ reads 1000 floats and
    # writes them into its first input (counted once): 8000 bytes
    assert profile.ceilings == {"flops": pytest.approx(2 * 256 * 16 * 16 * 9 / 2e-4),
                                "memory_bandwidth": pytest.approx(8000 / 1e-6),
                                "cache_bandwidth": pytest.approx(8000 / 2e-7)}
