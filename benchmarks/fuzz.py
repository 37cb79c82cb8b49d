"""Benchmark-mode fuzzing of the trace readers: N mutated corpus traces (default 10,000).

Every case must import or fail with the typed error (exit code 2, one line, no
partial Run). Prints the counts and any other outcome with its case, and exits 1
if there was one.

    python benchmarks/fuzz.py [--cases 10000] [--seed 0] [--streaming-every 20]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from fuzz_cases import cases  # noqa: E402
from perfswarm.errors import PerfswarmError  # noqa: E402
from perfswarm.trace.ingest import ImportOptions, import_traces  # noqa: E402

CORPUS = REPO.parent / "shared" / "corpus" / "hta"
SOURCES = ["critical_path/cuda_event_sync/event_sync_trace.json.gz",
           "trace_compare/base/base.json.gz", "trace_file_list/inference_rank_1.json.gz",
           "triton_example/triton_example.json.gz",
           "amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
           "execution_trace/benchmark_simple_add_trace.json.gz"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--streaming-every", type=int, default=20,
                        help="every Nth case also through the streaming reader")
    args = parser.parse_args()
    ok = typed = 0
    bad: list[str] = []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        for n, (name, data) in enumerate(cases([CORPUS / s for s in SOURCES], args.cases,
                                               args.seed)):
            path = tmp / name
            path.write_bytes(data)
            modes = ["never", "always"] if n % args.streaming_every == 0 else ["never"]
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
            path.unlink()
            for run in tmp.glob("*.run"):
                __import__("shutil").rmtree(run)
    elapsed = time.perf_counter() - start
    print(f"{args.cases:,} cases in {elapsed:.0f} s: {ok:,} imported, {typed:,} typed errors "
          f"(exit 2), {len(bad)} other outcomes")
    for line in bad[:50]:
        print("  " + line)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
