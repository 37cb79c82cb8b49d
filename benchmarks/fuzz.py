"""Benchmark-mode fuzzing of every reader: N mutated cases each (default 10,000).

Kineto traces (mutated corpus traces, through the in-memory reader and every Nth also the
streaming one) must import or fail with the typed error (exit code 2, one line, no partial
Run). perf script, py-spy raw, strace and sampler files (mutated real samples from
tests/data/) and the manifest of a corpus Run must read or fail the same way. Prints the
counts per reader and any other outcome with its case, and exits 1 if there was one.

    python benchmarks/fuzz.py [--cases 10000] [--seed 0] [--reader all] [--streaming-every 20]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from fuzz_cases import cases  # noqa: E402
from fuzz_readers import READERS, SAMPLES, outcome, text_cases  # noqa: E402
from perfswarm.errors import PerfswarmError  # noqa: E402
from perfswarm.trace.ingest import ImportOptions, import_traces  # noqa: E402

CORPUS = REPO.parent / "shared" / "corpus" / "hta"
SOURCES = ["critical_path/cuda_event_sync/event_sync_trace.json.gz",
           "trace_compare/base/base.json.gz", "trace_file_list/inference_rank_1.json.gz",
           "triton_example/triton_example.json.gz",
           "amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
           "execution_trace/benchmark_simple_add_trace.json.gz"]
ET = ("execution_trace/benchmark_simple_add_trace.json.gz",
      "execution_trace/benchmark_simple_add_et.json.gz")


Outcomes = tuple[int, int, list[str]]  # read, typed errors, anything else


def fuzz_kineto(tmp: Path, count: int, seed: int, streaming_every: int) -> Outcomes:
    ok = typed = 0
    bad: list[str] = []
    for n, (name, data) in enumerate(cases([CORPUS / s for s in SOURCES], count, seed)):
        path = tmp / name
        path.write_bytes(data)
        modes = ["never", "always"] if n % streaming_every == 0 else ["never"]
        for mode in modes:
            out = tmp / f"{name}.{mode}.run"
            try:
                import_traces([path], out, ImportOptions(streaming=mode),  # type: ignore[arg-type]
                              ["fuzz"])
                ok += 1
            except PerfswarmError as exc:
                typed += 1
                if exc.exit_code != 2 or "\n" in str(exc) or out.exists():
                    bad.append(f"{name} ({mode}): malformed typed error: {exc!r}")
            except Exception:
                bad.append(f"{name} ({mode}): {traceback.format_exc().splitlines()[-1]}")
            shutil.rmtree(out, ignore_errors=True)
        path.unlink()
    return ok, typed, bad


def fuzz_reader(tmp: Path, name: str, count: int, seed: int) -> Outcomes:
    reader = READERS[name]
    if name == "manifest":
        trace, et = (CORPUS / p for p in ET)
        run = import_traces([trace], tmp / "manifest.run", ImportOptions(execution_traces=(et,)),
                            ["fuzz"])
        where, sample = run.path, run.manifest_path.read_bytes()
    else:
        where, sample = tmp, SAMPLES[name].read_bytes()
    path = where / reader.file_name
    seen = {"ok": 0, "typed": 0}
    bad: list[str] = []
    for n, data in enumerate(text_cases(reader, sample, count, seed)):
        path.write_bytes(data)
        try:
            seen[outcome(reader, path)] += 1
        except Exception:
            bad.append(f"{name} case {n}: {traceback.format_exc().splitlines()[-1]}")
    return seen["ok"], seen["typed"], bad


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=10_000, help="cases per reader")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--reader", choices=["all", "kineto", *READERS], default="all")
    parser.add_argument("--streaming-every", type=int, default=20,
                        help="every Nth Kineto case also through the streaming reader")
    args = parser.parse_args()
    names = ["kineto", *READERS] if args.reader == "all" else [args.reader]
    failed = False
    for name in names:
        start = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp_name:
            tmp = Path(tmp_name)
            if name == "kineto":
                ok, typed, bad = fuzz_kineto(tmp, args.cases, args.seed, args.streaming_every)
            else:
                ok, typed, bad = fuzz_reader(tmp, name, args.cases, args.seed)
        elapsed = time.perf_counter() - start
        print(f"{name:9} {args.cases:,} cases in {elapsed:.0f} s: {ok:,} read, {typed:,} typed "
              f"errors (exit 2), {len(bad)} other outcomes", flush=True)
        for line in bad[:50]:
            print("  " + line)
        failed |= bool(bad)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
