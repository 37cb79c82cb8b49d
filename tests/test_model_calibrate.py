"""Kernel-model calibration: the two model forms (model/profile.py), the profile's round trip,
a real tiny sweep (recorder/bench/kernels.py)."""

from __future__ import annotations

import math
import time
from collections import Counter

import pytest

from perfswarm.errors import PerfswarmError
from perfswarm.model.kernels import ProfileScaler
from perfswarm.model.opcost import (
    RNN_FAMILIES,
    Shapes,
    column_major,
    data_cost,
    lstm_shape,
    op_cost,
)
from perfswarm.model.profile import (
    FAMILIES,
    LANES,
    UNUSABLE_GMAE,
    WARM_FAMILIES,
    FamilyModel,
    LearnedModel,
    Point,
    Profile,
    fit,
    fit_family,
    model_gmae,
    shape_features,
    split,
)
from perfswarm.recorder.bench.kernels import (
    GEMM_RANGE,
    RNN_RANGE,
    RNN_WORK,
    Case,
    _runner,
    _sweep,
    calibrate,
)


def _mm(m: int, k: int, seconds: float | None = None) -> Point:
    dims = ((m, k), (k, m))
    cost = op_cost("aten::mm", [list(d) for d in dims], ["float", "float"])
    assert cost is not None
    t = 2e-6 + cost.bytes * 1e-10 + cost.flops * 5e-12 if seconds is None else seconds
    return Point(cost, t, dims)


def test_fit_recovers_the_roofline_of_its_own_form() -> None:
    points = [_mm(m, k) for m in (16, 64, 256, 1024) for k in (8, 128, 512)]
    model = fit(points)
    assert model_gmae(model, points) == pytest.approx(0.0, abs=1e-9)
    assert model.coef == pytest.approx((2e-6, 1e-10, 5e-12), rel=1e-6)


def test_learned_correction_fits_what_the_roofline_cannot() -> None:
    # 30% slower whenever k is small: a shape effect, not a size one
    points = [_mm(m, k) for m in (16, 32, 64, 128, 256, 512, 1024) for k in (8, 16, 256, 512)]
    points = [Point(p.cost, p.seconds * (1.3 if p.dims[0][1] < 64 else 1.0), p.dims)
              for p in points]
    roofline = fit(points)
    learned = LearnedModel(roofline, tuple(points))
    assert model_gmae(learned, points) < 0.5 * model_gmae(roofline, points)
    # far outside the sweep the correction fades and the roofline's trend remains
    huge = _mm(1 << 16, 512)
    assert learned.predict(huge.cost, huge.dims) == pytest.approx(roofline.predict(huge.cost),
                                                                  rel=0.35)


def _conv(batch: int, c: int, hw: tuple[int, ...], seconds: float | None = None) -> Point:
    dims = ((batch, c, *hw), (c, c, *(3 for _ in hw)), (c,))
    cost = op_cost("aten::conv2d", [list(d) for d in dims], ["float"] * 3)
    assert cost is not None
    return Point(cost, 1e-5 + cost.flops * 1e-11 if seconds is None else seconds, dims)


def test_learned_correction_is_held_at_the_sweep_edge() -> None:
    """Past the sweep the correction stays what it was at the sweep's edge, so doubling the
    channels there costs what the roofline says."""
    # twice the roofline's time at the widest channels swept: a correction rising with them
    points = [_conv(b, c, (hw, hw)) for b in (4, 16) for c in (16, 32, 64, 128)
              for hw in (8, 32)]
    points = [Point(p.cost, p.seconds * (2.0 if p.dims[1][0] == 128 else 1.0), p.dims)
              for p in points]
    roofline = fit(points)
    learned = LearnedModel(roofline, tuple(points))
    wide, wider = _conv(32, 256, (64, 64)), _conv(32, 512, (64, 64))
    ratio = learned.predict(wider.cost, wider.dims) / learned.predict(wide.cost, wide.dims)
    assert ratio == pytest.approx(roofline.predict(wider.cost) / roofline.predict(wide.cost))
    edge = _conv(16, 128, (32, 32))
    assert learned.correction(wide.cost, wide.dims) == pytest.approx(
        learned.correction(edge.cost, edge.dims))


def test_a_1d_convolution_is_read_as_a_2d_one_over_one_row() -> None:
    """A 1-D convolution's features are the 2-D convolution's over one row that oneDNN runs
    ([N, C, L] as [N, C, 1, L]), forward and backward, so its length and output channels do
    not stand where 2-D points have their heights and widths. Fitted on 2-D points at the
    roofline's time and 1-D ones 60 us slower (a fixed time per call), the learned model
    prices a 1-D layer between the swept ones with that fixed time and the 2-D ones without."""
    from perfswarm.model.profile import _layout, shape_features

    def features(dims: tuple[tuple[int, ...], ...], op: str = "aten::conv2d") -> list[float]:
        cost = op_cost(op, [list(d) for d in dims], ["float"] * len(dims))
        assert cost is not None
        assert _layout(cost, dims) == (4, 4)
        return shape_features(cost, dims, 16)

    assert features(((8, 40, 15), (80, 40, 3), (80,)), "aten::conv1d") == features(
        ((8, 40, 1, 15), (80, 40, 1, 3), (80,)))
    assert features(((8, 80, 15), (8, 40, 15), (80, 40, 3)), "aten::convolution_backward") == \
        features(((8, 80, 1, 15), (8, 40, 1, 15), (80, 40, 1, 3)), "aten::convolution_backward")
    plain = [_conv(b, c, (hw, hw)) for b in (4, 16) for c in (16, 32, 64) for hw in (8, 32)]
    rows = [_conv(b, c, (length,)) for b in (4, 16) for c in (16, 32, 64) for length in (16, 256)]
    points = plain + [Point(p.cost, p.seconds + 6e-5, p.dims) for p in rows]
    learned = LearnedModel(fit(points), tuple(points))
    for probe, fixed in ((_conv(8, 32, (64,)), 6e-5), (_conv(8, 32, (16, 16)), 0.0)):
        truth = 1e-5 + probe.cost.flops * 1e-11 + fixed
        assert learned.predict(probe.cost, probe.dims) == pytest.approx(truth, rel=0.15)


def test_a_cpu_sweep_is_learned_at_onednns_channel_blocks() -> None:
    """A CPU profile's conv sweep of 1-D layers at 32, 40 and 48 channels ([B, C, 61] -> C,
    3 taps), each timed at 2e-11 s a FLOP of the 48 channels in and out that oneDNN computes
    for 40 (channel_blocked): read back, the learned model prices the trace's
    mkldnn_convolution [8, 40, 1, 61] at that law, as the sweep timed it. Learned on the
    channels as given, the 40-channel points had held their blocks in the correction, and the
    recorded op, priced at 48 channels, read more than its sweep's time."""
    sweep = []
    for batch in (4, 16, 64):
        for c in (32, 40, 48, 32):
            blocks = 16 * -(-c // 16)
            sweep.append({"op": "conv1d", "dims": [[batch, c, 61], [c, c, 3], [c]],
                          "seconds": 2e-11 * 2 * batch * blocks * 61 * blocks * 3,
                          "concrete": ["", "", "", "[1]", "[1]", "[1]", "1"]})
    entry = {"coef": [0.0, 0.0, 1e-11], "points": len(sweep), "chosen": "learned",
             "gmae_held_out": 0.01, "sweep": sweep}
    recorded = Shapes(((8, 40, 1, 61), (40, 40, 1, 3), (40,)), ("float",) * 3, (),
                      ("", "", "", "[0, 1]", "[1, 1]", "[1, 1]", "1"))
    cost = data_cost("aten::mkldnn_convolution", recorded)
    assert cost is not None and cost.flops == 2 * 8 * 40 * 61 * 40 * 3
    law = 2e-11 * 2 * 8 * 48 * 61 * 48 * 3

    def priced(device: str) -> float | None:
        profile = Profile.from_dict({"device": device, "families": {"conv": entry}})
        return ProfileScaler(profile).model_time(cost, recorded.dims)

    assert priced("cpu") == pytest.approx(law, rel=0.01)
    as_given = priced("cuda:0")  # a GPU's sweep is learned as given (no oneDNN there)
    assert as_given is not None and as_given > 1.1 * law


def test_scalar_arguments_and_a_bias_leave_the_layout_alone() -> None:
    """A recorded op lists its scalar arguments as inputs without dimensions (attention's
    dropout and is_causal, a convolution's stride lists) and may have a bias past the features:
    it is read with the sweep's learned correction all the same, not the sweep's mean one.
    Here the correction rises with the channels, so the two differ."""
    points = [_conv(b, c, (hw, hw)) for b in (4, 16) for c in (16, 32, 64, 128)
              for hw in (8, 32)]
    points = [Point(p.cost, p.seconds * (2.0 if p.dims[1][0] == 128 else 1.0), p.dims)
              for p in points]
    learned = LearnedModel(fit(points), tuple(points))
    probe = _conv(16, 128, (16, 16))
    swept = learned.correction(probe.cost, probe.dims)
    recorded = (*probe.dims, (), (), ())  # conv2d's stride, padding and dilation
    no_bias = (*probe.dims[:2], (), (), (), ())
    assert learned.correction(probe.cost, recorded) == pytest.approx(swept)
    assert learned.correction(probe.cost, no_bias) == pytest.approx(swept)
    mean = sum(math.log(p.seconds / learned.roofline.predict(p.cost)) for p in points) / len(points)
    assert abs(swept - mean) > 0.1

def test_gemm_layout_is_swept_and_learned() -> None:
    """The three operand layouts (row-major, B column-major, A column-major) are swept and held
    out alike, and the learned model tells them apart: here a column-major B costs a pass over
    it (packing), which small m cannot hide."""
    cases = list(_sweep("gemm", 1))
    held = split(cases)[1]

    def layouts(chosen: list[Case]) -> Counter[tuple[bool, bool]]:
        return Counter((column_major(dims, strides, 0), column_major(dims, strides, 1))
                       for _, dims, _, strides, _ in chosen)

    assert len(cases) == 256 and set(layouts(cases)) == {(False, False), (False, True),
                                                         (True, False)}
    assert min(layouts(cases).values()) >= 80 and min(layouts(held).values()) >= 18
    # every dimension a multiple of 8, most of them no power of two (real layers' widths)
    sizes = [x for _, dims, _, _, _ in cases for x in (dims[0][0], dims[0][1], dims[1][1])]
    assert all(x % 8 == 0 for x in sizes)
    assert sum(x & (x - 1) != 0 for x in sizes) > 0.8 * len(sizes)
    # a cut budget's first 32 points still span each dimension's range
    for axis, (low, high) in enumerate(zip(*GEMM_RANGE, strict=True)):
        first = [(dims[0][0], dims[0][1], dims[1][1])[axis] for _, dims, _, _, _ in cases[:32]]
        assert min(first) < 2 * low and max(first) > high / 2

    def point(m: int, k: int, n: int, transposed: bool) -> Point:
        dims, strides = ((m, k), (k, n)), ((k, 1), (1, k)) if transposed else ()
        cost = op_cost("aten::mm", [list(d) for d in dims], ["float"] * 2, strides=strides)
        assert cost is not None and cost.b_transposed == transposed
        t = 2e-6 + cost.flops * 5e-12 + (k * n * 4e-10 if transposed else 0.0)
        return Point(cost, t, dims, strides)

    points = [point(m, k, n, t) for m in (8, 32, 128, 512) for k in (64, 256, 1024)
              for n in (64, 512) for t in (False, True)]
    learned = LearnedModel(fit(points), tuple(points))
    packed, plain = point(16, 512, 256, True), point(16, 512, 256, False)
    assert learned.predict(packed.cost, packed.dims) == pytest.approx(packed.seconds, rel=0.1)
    assert learned.predict(plain.cost, plain.dims) == pytest.approx(plain.seconds, rel=0.1)


def test_gemm_partial_vector_is_learned() -> None:
    """A GEMM whose n leaves its last vector partly filled costs the whole vector: n = 40 as
    much as n = 48 (LANES 16). Learned from sweep points of other n (multiples of 8), it is
    priced so at n = 40 and 48, neither of them swept; on log n alone the model slid
    between 32 and 56 instead."""
    def point(m: int, k: int, n: int) -> Point:
        cost = op_cost("aten::mm", [[m, k], [k, n]], ["float"] * 2)
        assert cost is not None
        return Point(cost, 1e-6 + 2 * m * k * (-(-n // 16) * 16) * 1e-11, ((m, k), (k, n)))

    points = [point(m, k, n) for m in (64, 256, 1024) for k in (64, 256)
              for n in (16, 24, 32, 56, 64, 72, 88, 96, 104, 128)]
    learned = LearnedModel(fit(points), tuple(points))
    for probe in (point(256, 128, 40), point(256, 128, 48)):
        assert learned.predict(probe.cost, probe.dims) == pytest.approx(probe.seconds,
                                                                         rel=0.05)


def test_embedding_sweep_spans_cache_and_pooling() -> None:
    """Tables from cache-resident to far past the cache, 8 and 32 ids a bag, and the held-out
    quarter still sees every table size (per lookup, a 100,000-row table cost 5-6x a 1,000-row
    one: a model fitted without one of them misses that)."""
    cases = list(_sweep("embedding_bag", 1))
    rows = {dims[0][0] for _, dims, _, _, _ in cases}
    pooling = {dims[1][0] // dims[2][0] for _, dims, _, _, _ in cases}
    assert len(cases) == 54 and rows == {1000, 20_000, 100_000} and pooling == {8, 32}
    assert {dims[0][0] for _, dims, _, _, _ in split(cases)[1]} == rows


def test_calibrate_tiny_budget_profile_round_trip() -> None:
    data = calibrate(0.5)
    families = data["families"]
    assert list(families) == list(FAMILIES) and data["device"] == "cpu"
    for entry in families.values():
        assert entry["points"] >= 8 and len(entry["coef"]) == 3 and min(entry["coef"]) >= 0
        assert entry["chosen"] in ("roofline", "learned")
        chosen = entry[f"gmae_{entry['chosen']}_held_out"]
        assert math.isfinite(chosen) and chosen == entry["gmae_held_out"]
        assert chosen == min(entry["gmae_roofline_held_out"], entry["gmae_learned_held_out"])
    assert list(data["warm"]) == list(WARM_FAMILIES)
    assert all(entry["points"] >= 8 for entry in data["warm"].values())
    profile = Profile.from_dict(data)
    assert set(profile.models) == set(FAMILIES) and set(profile.warm) == set(WARM_FAMILIES)
    # a fresh page's fault and zeroing: between 50 ns and 50 us on any machine
    assert 5e-8 < data["page_s"] == profile.page_s < 5e-5
    gemm = op_cost("aten::mm", [[64, 64], [64, 64]], ["float", "float"])
    assert gemm is not None and profile.models["gemm"].predict(gemm, ((64, 64), (64, 64))) > 0
    assert isinstance(profile.models["gemm"], FamilyModel | LearnedModel)
    assert data["unusable"] == sorted(
        [f for f, e in families.items() if e["gmae_held_out"] > UNUSABLE_GMAE]
        + [f"{f} (warm)" for f, e in data["warm"].items() if e["gmae_held_out"] > UNUSABLE_GMAE])
    assert profile.unusable() == sorted(f for f, e in families.items()
                                        if e["gmae_held_out"] > UNUSABLE_GMAE)


def test_a_profile_with_held_out_errors_past_use_is_flagged() -> None:
    """A sweep that timed other load (held-out errors in the thousands of percent, as a busy
    machine gave) reads back flagged (predict says so beside its figures)."""
    points = [_mm(m, k) for m in (16, 64, 256, 1024) for k in (8, 128)]
    entry = {"coef": [2e-6, 1e-10, 5e-12], "points": len(points), "chosen": "roofline",
             "gmae_held_out": 38.3, "sweep": [{"op": "mm", "dims": [list(d) for d in p.dims],
                                               "seconds": p.seconds} for p in points]}
    profile = Profile.from_dict({"device": "cpu", "families": {"gemm": entry,
                                                               "copy": dict(entry,
                                                                            gmae_held_out=0.1)}})
    assert profile.unusable() == ["gemm"]


def test_sweep_passes_keep_each_points_fastest(monkeypatch: pytest.MonkeyPatch) -> None:
    """Budget left after a pass buys passes over the same points, up to PASSES: a point
    disturbed in one pass keeps its time from another."""
    import perfswarm.recorder.bench.kernels as calibration

    calls: list[str] = []
    order: dict[str, int] = {}

    def fake_runner(op: str, dims: list[list[int]], *_args: object) -> str:
        return repr(dims)

    def fake_time(run: str, **_kwargs: object) -> float:
        calls.append(run)
        order.setdefault(run, len(order))
        seen = calls.count(run)  # the pass
        return 1e-6 * (3 if seen == 2 and order[run] % 2 else 7 - seen)

    monkeypatch.setattr(calibration, "_runner", fake_runner)
    monkeypatch.setattr(calibration, "time_op", fake_time)
    points = calibration.measure("elementwise", 60.0)
    assert len(points) == len(list(_sweep("elementwise", 1))) == len(order)
    assert len(calls) == calibration.PASSES * len(points) == 3 * len(points)
    # 6 us in the first pass, 5 us (3 us every other point) in the second, 4 us in the third
    assert [p.seconds for p in points] == [3e-6 if i % 2 else 4e-6 for i in range(len(points))]


def test_warm_runner_reuses_its_inputs_and_the_cold_one_cycles() -> None:
    """A clone returns its input: the warm runner reads one tensor call after call (so it stays
    in cache where it fits); the cold one a new copy each call, 16 of them for half a MiB (16 MiB
    in all, past a core's cache), then the first again."""
    import torch

    warm = _runner("aten::clone", [[128, 1024]], "cpu", warm=True)
    cold = _runner("aten::clone", [[128, 1024]], "cpu")
    first = warm()
    assert all(torch.equal(first, warm()) for _ in range(3))
    seen = [cold() for _ in range(17)]
    assert not any(torch.equal(seen[0], x) for x in seen[1:16])
    assert torch.equal(seen[0], seen[16])


@pytest.mark.parametrize("broken", [{}, {"device": "cpu", "families": {"gemm": {}}},
                                    {"device": "cpu", "families": {"gemm": {
                                        "coef": [1, 2], "chosen": "roofline", "sweep": [],
                                        "gmae_held_out": 0.1}}},
                                    {"device": "cpu", "families": {}, "page_s": -1e-6},
                                    {"device": "cpu", "families": {}, "page_s": "fast"},
                                    {"device": "cpu", "families": {}, "warm": {"copy": {}}},
                                    {"device": "cpu", "families": {}, "warm": 5}])
def test_profile_rejects_what_is_not_one(broken: dict[str, object]) -> None:
    with pytest.raises(PerfswarmError, match="not a kernel-model profile"):
        Profile.from_dict(broken)


def test_attention_is_swept_on_the_cpu_as_it_runs() -> None:
    """CPU flash attention, forward and backward, over head sizes that are and are not a
    multiple of the vector width: each point priced as predict prices the recorded op (the
    backward by the products inside it), and each call the op itself (the backward's first
    result is q's gradient)."""
    import torch

    for family in ("sdpa", "sdpa_backward"):
        cases = list(_sweep(family, 1))
        assert len(cases) == 458 == len({(tuple(map(tuple, c[1])), c[3]) for c in cases})
        heads = Counter(c[1][0][3] for c in cases)
        assert set(heads) == {8, 10, 16, 20, 24, 32, 40, 48, 64, 80, 96, 128}
        assert set(Counter(c[1][0][0] for c in cases)) == {1, 2, 4, 8, 16, 32}
        spreads = []
        for op, dims, types, strides, _ in cases:
            cost = data_cost(op, Shapes(tuple(map(tuple, dims)), tuple(types), strides))
            assert cost is not None and cost.family == family
            batch, heads_, _, head = dims[0]
            # contiguous, or views of [L, B, E]: rows B x E apart, up to a page
            assert cost.row_spread in (1.0, max(1.0, min(batch * heads_ * head * 4, 4096)
                                                / (head * 4)))
            spreads.append(cost.row_spread)
        assert max(spreads) == 128.0  # a head of 8, rows a page apart
        strided = next(c for c in cases if c[3][0][2] != c[1][0][3])
        for op, dims, _types, strides, _ in (cases[0], strided):
            out = _runner(op, dims, "cpu", strides)()
            first = out[0] if isinstance(out, tuple) else out
            assert isinstance(first, torch.Tensor) and list(first.shape) == dims[0]
            if family == "sdpa":  # the forward's output takes q's layout: what the call ran on
                assert first.stride() == tuple(strides[0])


def test_lstm_layer_is_swept_as_torch_runs_it() -> None:
    """oneDNN's LSTM layer (torch's CPU nn.LSTM), forward and backward: 104 (T, B, I, H) points
    inside the sweep's bounds and work, I and H in multiples of 8, each priced as predict
    prices the recorded op, each call the op itself (the backward's first result the input's
    gradient); fitted as every family is. The learned model reads a layer as its (T, B, I,
    H), whatever else a recorded backward holds (its outputs, gradients and oneDNN's
    workspace)."""
    import torch

    for family in RNN_FAMILIES:
        cases = list(_sweep(family, 1))
        assert len(cases) == 104
        layers = [lstm_shape(op.removeprefix("aten::"), dims) for op, dims, *_ in cases]
        assert all(s is not None and s[2] % 8 == 0 == s[3] % 8 for s in layers)
        for axis, (low, high) in enumerate(zip(*RNN_RANGE, strict=True)):
            values = [s[axis] for s in layers if s is not None]
            assert low <= min(values) < 2 * low and high / 4 < max(values) <= high
        assert max(t * b * h * (i + h) for t, b, i, h in filter(None, layers)) <= RNN_WORK
        points = []
        for op, dims, types, _, _ in cases:
            cost = data_cost(op, Shapes(tuple(map(tuple, dims)), tuple(types)))
            assert cost is not None and cost.family == family
            # a fixed time a call, a time a step, and a rate: the sweep's kind of curve
            steps = dims[0][0]
            points.append(Point(cost, 2e-4 + 3e-6 * steps + 2e-11 * cost.flops,
                                tuple(map(tuple, dims))))
        op, dims, *_ = min(cases, key=lambda c: math.prod(c[1][0]) * c[1][2][1])
        steps, batch, inputs = dims[0]
        first = _runner(op, dims, "cpu")()
        assert isinstance(first, tuple) and isinstance(first[0], torch.Tensor)
        assert list(first[0].shape) == [steps, batch, inputs if family == "rnn_backward"
                                        else dims[2][1]]
        # fitted as every family is, and read back from the profile's sweep
        entry = fit_family(points)
        assert entry["points"] == 104 and entry["gmae_held_out"] < 0.05
        profile = Profile.from_dict({"device": "cpu", "families": {family: entry}})
        assert profile.models[family].predict(points[0].cost, points[0].dims) \
            == pytest.approx(points[0].seconds, rel=0.05)
    # the backward as a trace records it (output, hy, cy, gradients, workspace): its features
    # the layer's (T, B, I, H), as the sweep's points have them
    recorded = ((35, 8, 40), (160, 40), (160, 40), (160,), (160,), (8, 40), (8, 40),
                (35, 8, 40), (8, 40), (8, 40), (35, 8, 40), (), (), (757760,))
    cost = data_cost("aten::mkldnn_rnn_layer_backward", Shapes(recorded, ("float",) * 14))
    assert cost is not None
    assert shape_features(cost, recorded, LANES)[:8] == [
        *(math.log(x) for x in (35, 8, 40, 40)), 0.0, 0.0, 0.0, 0.0]


def test_convolution_backward_is_swept_as_autograd_records_it() -> None:
    """The convolution sweep's shapes once more as `aten::convolution_backward` takes them (the
    output's gradient, the input, the weight), priced as predict prices the recorded op, each
    call the op itself: the input's and the weight's gradients, but a network's first layer's
    (an image's 3 channels; one in 1-D: the test below) the weight's only, as autograd asks it:
    the 2-D sweep's [4, 3, 8, 8] -> 16 3x3 at 2 x 4 x 16 x 8 x 8 x 3 x 9 FLOPs, its output_mask
    [False, True, False], where a [4, 16, 8, 8] -> 32 layer's both are twice its FLOPs."""
    import torch

    cases = list(_sweep("conv_backward", 1))
    assert len(cases) == 84 and len(list(_sweep("conv", 1))) == 84
    first = [c for c in cases if c[1][1][1] <= 3]
    assert len(first) == 15 and all(c[4][10] == "[False, True, False]" for c in first)
    for op, dims, types, strides, concrete, flops, asked in (
            (*next(c for c in first if c[1][1] == [4, 3, 8, 8]), 2 * 4 * 16 * 64 * 3 * 9, False),
            (*next(c for c in cases if c[1][1] == [4, 16, 8, 8]), 2 * 2 * 4 * 32 * 64 * 16 * 9,
             True)):
        cost = data_cost(op, Shapes(tuple(map(tuple, dims)), tuple(types), strides, concrete))
        assert cost is not None and cost.family == "conv_backward" and cost.flops == flops
        grad_input, grad_weight, _ = _runner(op, dims, "cpu", concrete=concrete)()
        assert (isinstance(grad_input, torch.Tensor) and list(grad_input.shape) == dims[1]
                if asked else grad_input is None)
        assert list(grad_weight.shape) == dims[2]


def test_convolution_sweeps_hold_1d_layers() -> None:
    """Both convolution sweeps hold 1-D layers (24 of 84 points each) among the 2-D ones from
    their start, so a cut budget still times some. Strided ones run and are priced at their
    output length: the raw-audio front end [4, 1, 4000], 80 taps at stride 16, at 246 outputs
    (FLOPs 2 x 4 x 32 x 246 x 80), a [4, 8, 2000] -> 16 layer of 9 taps at stride 4, backward,
    at 500 (2 x 2 x 4 x 16 x 500 x 8 x 9, both gradients); the front end's backward as a first
    layer's, the weight's gradient only (its output_mask [False, True, False]: 2 x 4 x 32 x 246
    x 80, and no input's gradient from the call); a profile's sweep keeps the geometry."""
    from perfswarm.model.profile import _sweep_point

    for family, x, flops, shape in (
            ("conv", [4, 1, 4000], 2 * 4 * 32 * 246 * 80, [4, 32, 246]),
            ("conv_backward", [4, 8, 2000], 2 * 2 * 4 * 16 * 500 * 8 * 9, [4, 8, 2000]),
            ("conv_backward", [4, 1, 4000], 2 * 4 * 32 * 246 * 80, None)):
        cases = list(_sweep(family, 1))
        rows = [c for c in cases if len(c[1][1]) == 3]
        assert len(rows) == 24
        assert 3 <= sum(len(c[1][1]) == 3 for c in cases[:12]) <= 4
        op, dims, types, strides, concrete = next(
            c for c in rows if c[1][0 if family == "conv" else 1] == x)
        cost = data_cost(op, Shapes(tuple(map(tuple, dims)), tuple(types), strides, concrete))
        assert cost is not None and cost.family == family and cost.flops == flops
        out = _runner(op, dims, "cpu", concrete=concrete)()
        first = out if family == "conv" else out[0]  # type: ignore[index]
        assert (first is None if shape is None
                else list(first.shape) == shape)  # type: ignore[union-attr]
        point = Point(cost, 1e-4, tuple(map(tuple, dims)), strides, concrete)
        entry = fit_family([point] * 8)["sweep"][0]
        assert entry["concrete"] == list(concrete) and _sweep_point(entry).cost == cost


def test_each_sweep_keeps_its_share_of_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """The families are fitted after every sweep is done: a learned model's fit (seconds on a
    busy machine) had taken the next family's share of the budget (the forward attention's: 8
    points at the default budget, and a held-out error past the unusable mark)."""
    from perfswarm.recorder.bench import kernels

    shares: list[float] = []

    def measure(family: str, budget_s: float, device: str = "cpu", warm: bool = False
                ) -> list[Point]:
        shares.append(budget_s)
        time.sleep(0.05)
        return []

    def slow_fit(points: object, lanes: int) -> dict[str, object]:
        time.sleep(0.2)
        return {"gmae_held_out": 0.0}

    monkeypatch.setattr(kernels, "measure", measure)
    monkeypatch.setattr(kernels, "fit_family", slow_fit)
    monkeypatch.setattr(kernels, "first_touch_s", lambda: 1e-6)
    monkeypatch.setattr(kernels, "reserve_heap", lambda mib: None)
    profile = calibrate(budget_s=1.4)
    assert len(shares) == 14 and min(shares) > 0.04  # 0.1 s each, less the last sweep's 0.05
    assert set(profile["families"]) == set(FAMILIES)
    # measured beside the budget, on a real DataLoader (about a second): what taking a batch
    # from a worker costs, a batch and a tensor of it (advise --profile)
    got = profile["loader_receive"]
    assert got["next_cpu_ns"]["4"] > got["next_cpu_ns"]["1"] > 0 and got["tensor_ns"] > 0
    # and a fused optimizer step's costs (advise --profile), at the sweeps' threads
    assert set(profile["fused_optimizer_step"]) == {"Adam", "AdamW", "SGD"}


def test_fused_step_cost_fits_a_call_a_tensor_and_a_byte(monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    """calibrate's fused optimizer step (recorder/bench/optimizer.py): the steps timed over its
    grid of tensor counts and sizes are fitted as a cost a call + a tensor + a byte of
    parameters; steps timed as exactly that give those three back, per optimizer."""
    from perfswarm.model.fusedstep import OPTIMIZERS
    from perfswarm.recorder.bench import optimizer

    truth = {"Adam": (150e-6, 5e-6, 0.2e-9), "AdamW": (140e-6, 6e-6, 0.25e-9),
             "SGD": (100e-6, 2e-6, 0.1e-9)}

    def step_s(name: str, tensors: int, elements: int, evict: object) -> float:
        call, tensor, byte = truth[name]
        return call + tensors * tensor + 4 * tensors * elements * byte

    monkeypatch.setattr(optimizer, "_step_s", step_s)
    got = optimizer.fused_step_cost(1 << 20)
    assert set(got) == set(OPTIMIZERS)
    for name, (call, tensor, byte) in truth.items():
        assert (got[name]["call_ns"], got[name]["tensor_ns"]) == (round(call * 1e9),
                                                                   round(tensor * 1e9))
        assert got[name]["byte_ns"] == pytest.approx(byte * 1e9, abs=1e-4)
        assert [(p["tensors"], p["elements"]) for p in got[name]["points"]] == list(
            optimizer.GRID)


def test_first_touch_from_each_writes_least_disturbed_trial(monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    """A page's first write less its second, each the fastest of the trials: a second write
    slowed by other load in one trial (1.2 s where it takes 0.5) had made the least of the
    trials' differences negative, and the fault free (page_s 0.0 under load)."""
    from perfswarm.recorder.bench import kernels

    # per trial: start, after the first write, after the second (1 MiB: 256 pages)
    clock = iter([0.0, 1.0, 1.5, 10.0, 11.0, 12.2, 20.0, 21.3, 21.8])
    monkeypatch.setattr(kernels.time, "perf_counter", lambda: next(clock))
    assert kernels.first_touch_s((1,), repeats=3) == pytest.approx((1.0 - 0.5) / 256)


def test_a_torch_without_a_fused_cpu_step_calibrates_without_one(monkeypatch: pytest.MonkeyPatch
                                                                 ) -> None:
    """torch before 2.4 has no fused optimizer step on the CPU (`fused=True` raises there):
    calibrate leaves `fused_optimizer_step` out rather than fail, and the advice, which reads
    the recorded torch version the same way (fusedstep.on_cpu), tells no fused step."""
    import torch

    from perfswarm.model.fusedstep import on_cpu
    from perfswarm.recorder.bench import kernels

    assert not on_cpu("2.3.1+cpu") and on_cpu("2.4.0") and on_cpu("2.13.0+cpu")
    monkeypatch.setattr(kernels, "measure", lambda *a, **k: [])
    monkeypatch.setattr(kernels, "fit_family", lambda points, lanes: {"gmae_held_out": 0.0})
    monkeypatch.setattr(kernels, "first_touch_s", lambda: 1e-6)
    monkeypatch.setattr(kernels, "reserve_heap", lambda mib: None)
    monkeypatch.setattr(torch, "__version__", "2.3.1+cpu")
    profile = calibrate(budget_s=0.1)
    assert "fused_optimizer_step" not in profile and "loader_receive" in profile
