"""Swarm diff on two real perf recordings of one program with its two phases swapped."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import orjson
import pytest

from perfswarm.analyze.swarm_diff import swarm_diff
from perfswarm.cli.main import main
from perfswarm.recorder.session import RecordOptions, record
from perfswarm.trace.store import Run

MIX = textwrap.dedent("""
    import hashlib, sys, time, zlib
    data = bytes(range(256)) * 4096
    time.sleep(1.0)  # perf attaches once the program runs: 50 ms to most of a second when busy
    def busy(fn, seconds):
        t = time.process_time()
        while time.process_time() - t < seconds:
            fn(data)
    busy(lambda d: zlib.compress(d, 6), float(sys.argv[1]))
    busy(lambda d: hashlib.sha256(d).digest(), float(sys.argv[2]))
""")


def _leaf_modules(run: Run) -> list[str]:
    """Each perf sample's leaf module, from the Run's tables."""
    stacks = run.table("stacks").to_pydict()
    leaf = {s: m for s, d, m in zip(stacks["stack_id"], stacks["depth"], stacks["module"],
                                    strict=True) if d == 0}
    return [str(leaf[s]) for s in run.table("samples").to_pydict()["stack_id"]]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Run, Run]:
    root = tmp_path_factory.mktemp("swarms")
    return tuple(record([sys.executable, "-c", MIX, *times], root / f"{name}.run",  # type: ignore[return-value]
                        RecordOptions(collectors=("perf",))).run
                 for name, times in (("a", ("0.6", "0.2")), ("b", ("0.2", "0.6"))))


@pytest.mark.skipif(not Path("/usr/bin/perf").exists(), reason="needs perf")
def test_swarms_grow_and_shrink(runs: tuple[Run, Run], capsys: pytest.CaptureFixture[str]) -> None:
    a, b = runs
    d = swarm_diff(a, b)
    mods = [_leaf_modules(a), _leaf_modules(b)]
    # every sample of each side is in one swarm
    assert sum(s.samples[0] for s in d.swarms) == len(mods[0])
    assert sum(s.samples[1] for s in d.swarms) == len(mods[1])
    period = round(1e9 / 99)  # perf's default 99 Hz: ns per sample
    for s in d.swarms:
        assert s.ns == (s.weight[0] * period, s.weight[1] * period)
    # hashing (libcrypto) grew the most, compressing (libz) shrank the most: the swarms of the
    # two libraries hold their samples. Swarms cluster whole stacks and are captioned by their
    # heaviest leaf, so a sample whose leaf is elsewhere (the kernel or libc under a compress
    # call) may join a library's swarm: a few, never a tenth
    grew = max(d.swarms, key=lambda s: s.delta_ns or 0)
    shrank = min(d.swarms, key=lambda s: s.delta_ns or 0)
    for swarm, lib in ((grew, "libcrypto"), (shrank, "libz")):
        assert lib in swarm.caption.split(":")[0]
        same = [s for s in d.swarms if lib in s.caption.split(":")[0]]
        for side in (0, 1):
            held, leaf = sum(s.samples[side] for s in same), sum(lib in m for m in mods[side])
            assert abs(held - leaf) <= max(2, leaf // 10), (lib, side, held, leaf)
    assert grew.samples[1] > 2 * grew.samples[0] and shrank.samples[0] > 2 * shrank.samples[1]
    assert main(["diff", str(a.path), str(b.path), "--swarms", "--json"]) == 0
    out = orjson.loads(capsys.readouterr().out)
    assert out["swarms"] == orjson.loads(orjson.dumps(d.to_dict()))
    assert d.source == "perf"
    for s in d.swarms:  # Poisson counts of 1-sample weights: 2 sqrt(n) periods
        assert s.noise_ns == round(2 * period * (s.samples[0] + s.samples[1]) ** 0.5)
    assert grew.beyond_noise and shrank.beyond_noise


@pytest.mark.skipif(not Path("/usr/bin/perf").exists(), reason="needs perf")
def test_one_sample_source_is_counted(runs: tuple[Run, Run], tmp_path: Path) -> None:
    """py-spy samples the same time perf does: beside perf's they are not counted (summed,
    a run's swarms had held 1.6x its CPU time)."""
    import shutil

    import pyarrow as pa

    from perfswarm.trace.schema import SAMPLES

    a, b = runs
    both = Run(shutil.copytree(a.path, tmp_path / "a.run"))
    perf = both.table("samples")
    spy = perf.set_column(perf.column_names.index("source"), "source",
                          pa.array(["py-spy"] * perf.num_rows))
    both.write_table("samples", pa.concat_tables([perf, spy.cast(SAMPLES)]).cast(SAMPLES))
    d, alone = swarm_diff(both, b), swarm_diff(a, b)
    assert d.source == "perf"
    assert sum(s.samples[0] for s in d.swarms) == sum(s.samples[0] for s in alone.swarms)


@pytest.mark.skipif(not Path("/usr/bin/perf").exists(), reason="needs perf")
def test_a_side_recorded_without_samplers_is_no_swarm_diff(
        runs: tuple[Run, Run], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A Run recorded without perf and py-spy (`record -c torch`) has no samples: against it,
    every swarm of the other side had read as gone, beyond its noise (a GIN's default
    recording against its `-c torch` one: `_joinrealpath` 20,900 -> 0 ms, perf's and py-spy's
    samples summed)."""
    a, _b = runs
    bare = record([sys.executable, "-c", MIX, "0.2", "0.2"], tmp_path / "bare.run",
                  RecordOptions(collectors=("system",))).run
    assert swarm_diff(a, bare).unsampled == ("B",) and not swarm_diff(a, bare).swarms
    assert swarm_diff(bare, a).unsampled == ("A",)
    assert main(["diff", str(a.path), str(bare.path), "--swarms"]) == 0
    assert "B has no sampled stacks (recorded without perf and py-spy): no swarm diff" in \
        capsys.readouterr().out
    assert main(["diff", str(bare.path), str(bare.path), "--swarms", "--json"]) == 0
    assert orjson.loads(capsys.readouterr().out)["swarms"] == {
        "k": 0, "source": None, "unsampled": ["A", "B"], "swarms": []}


def test_the_whole_diff_says_a_side_is_unsampled(trainer_run: Run, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """The whole diff (ops, then swarms) of a recording against the same Run without its
    samples, as `record -c torch` leaves it: the swarm part says B has none (it had listed
    every swarm of A as gone); a diff of two such Runs stays silent on swarms."""
    import shutil

    bare = Run(shutil.copytree(trainer_run.path, tmp_path / "bare.run"))
    bare.write_table("samples", bare.table("samples").slice(0, 0))
    assert trainer_run.table("samples").num_rows
    assert main(["diff", str(trainer_run.path), str(bare.path)]) == 0
    out = capsys.readouterr().out
    assert "B has no sampled stacks (recorded without perf and py-spy): no swarm diff" in out
    assert "function swarms" not in out
    assert main(["diff", str(bare.path), str(bare.path)]) == 0
    assert "sampled stacks" not in capsys.readouterr().out
