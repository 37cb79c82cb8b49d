"""Whole-process cost of import, analyze, report, predict and export beside a bare parse.

For each trace (default: the corpus's largest, and a synthetic one of --events events), every
contender runs as a fresh process, interleaved, several rounds; figures are median CPU seconds
(user + system: a busy shared machine disturbs them less than wall time) and the peak RSS.
The peer is `python -c` gunzip + orjson.loads of the same file, whole process too. Goals:

- import (in memory) <= 1.5x the peer; import --streaming always is printed beside it
- analyze <= 1x, report <= 2x, predict <= 2x the peer; advise (which the report runs) and
  export (the Perfetto trace, gzipped) are printed beside them
- `libraries alone` (numpy and pyarrow.parquet imported, nothing done) is the floor every
  command starts from: on a trace whose parse costs less than it, no command meets its goal
- peak RSS of each <= 4x the JSON size; the report file's size (a few MB whatever the input)
- import + analyze + report at least 5x faster than HolisticTraceAnalysis's load plus its
  analyses of the same trace (HTA runs from .venv-hta, made on first use as ingest.py makes
  it: its pins are not ours; --no-hta leaves it out)

    python benchmarks/commands.py [--events 200000] [--rounds 3] [--only report,predict,export]
                                  [--no-hta] [TRACE ...]

--only runs the bare parse and the named commands alone (the Run is imported first, untimed).
"""

from __future__ import annotations

import argparse
import gzip
import subprocess
import sys
import tempfile
from pathlib import Path

from ingest import generate, hta_python
from startup import usage_rounds

REPO = Path(__file__).resolve().parents[1]
LARGEST = REPO.parent / "shared" / "corpus" / "hta" / "nccl_parser_config" / "nccl_data.json.gz"
BARE = ("import gzip, sys, orjson\n"
        "orjson.loads(gzip.decompress(open(sys.argv[1], 'rb').read()))")
# The libraries every command reads or writes a Run's tables with, imported and nothing done:
# the least any of them costs, whatever the trace (on a small one, more than its goal allows)
LIBRARIES = "import numpy, pyarrow.parquet"
PEERS = ("bare parse", "libraries alone")  # the measures, held to no goal
# HTA's load and the analyses a trace of one rank supports, plotting off; an analysis the
# trace lacks the data for raises and is skipped (its cost until then still counts).
HTA = """import logging, shutil, sys, tempfile
logging.disable(logging.CRITICAL)
from hta.trace_analysis import TraceAnalysis
with tempfile.TemporaryDirectory() as d:
    shutil.copy(sys.argv[1], d)
    t = TraceAnalysis(trace_dir=d)
    for f in (lambda: t.get_temporal_breakdown(visualize=False),
              lambda: t.get_idle_time_breakdown(visualize=False),
              lambda: t.get_gpu_kernel_breakdown(visualize=False),
              lambda: t.get_comm_comp_overlap(visualize=False),
              lambda: t.get_memory_bw_summary(),
              lambda: t.get_queue_length_summary(),
              lambda: t.get_cuda_kernel_launch_stats(visualize=False),
              lambda: t.get_potential_stragglers(),
              lambda: t.get_aten_op_kernels_and_delay()):
        try:
            f()
        except Exception:
            pass
"""
GOALS = {"import": 1.5, "import --streaming": None, "analyze": 1.0, "report": 2.0,
         "predict": 2.0, "advise": None, "export": None}
RSS_GOAL = 4.0  # peak RSS over the JSON's size, every command


def json_size(trace: Path) -> int:
    """The trace's uncompressed size, inflated a MiB at a time: this process stays small, so
    each child's peak RSS is its own (ru_maxrss carries over a fork: a child of a process that
    had held 1M events' JSON, 557 MB, read no less than that)."""
    with gzip.open(trace) as f:
        return sum(len(chunk) for chunk in iter(lambda: f.read(1 << 20), b""))


def bench(trace: Path, tmp: Path, rounds: int, only: list[str] | None = None,
          hta: Path | None = None) -> None:
    py = sys.executable
    cli = [py, "-m", "perfswarm.cli.main"]
    size = json_size(trace)
    run = tmp / f"{trace.name}.run"
    html = tmp / f"{trace.name}.html"
    contenders = {
        "bare parse": [py, "-c", BARE, str(trace)],
        "libraries alone": [py, "-c", LIBRARIES],
        "import": [*cli, "import", str(trace), "--out", str(run), "--force",
                   "--streaming", "never"],
        "import --streaming": [*cli, "import", str(trace), "--out", str(tmp / "s.run"),
                               "--force", "--streaming", "always"],
        "analyze": [*cli, "analyze", str(run)],
        "report": [*cli, "report", str(run), "-o", str(html)],
        "predict": [*cli, "predict", str(run)],
        "advise": [*cli, "advise", str(run)],
        "export": [*cli, "export", str(run), "-o", str(tmp / "trace.json.gz")],
    }
    if only is not None:
        unknown = sorted(set(only) - set(contenders))
        if unknown:
            raise SystemExit(f"--only: no command {', '.join(unknown)} (of {', '.join(GOALS)})")
        if "import" not in only:  # the Run the others read, made once
            subprocess.run(contenders["import"], check=True, stdout=subprocess.DEVNULL)
        contenders = {k: v for k, v in contenders.items()
                      if k in PEERS or k in only}
    elif hta is not None:
        contenders["HTA load + analyses"] = [str(hta), "-c", HTA, str(trace)]
    cpu, rss = usage_rounds(contenders, rounds)
    print(f"{trace.name}: {size / 1e6:.1f} MB JSON; median of {rounds} rounds")
    for name in contenders:
        goal = GOALS.get(name)
        ratio = cpu[name] / cpu["bare parse"]
        verdict = "" if goal is None else (f" (goal <= {goal}x) "
                                           f"{'OK' if ratio <= goal else 'MISSED'}")
        memory = rss[name] / size
        held = "" if name in PEERS else (f" (goal <= {RSS_GOAL:g}x) "
                                                f"{'OK' if memory <= RSS_GOAL else 'MISSED'}")
        print(f"  {name:19s} {cpu[name]:7.2f} CPU s  {ratio:5.2f}x parse{verdict:22s} "
              f"peak RSS {rss[name] / 1e6:7.1f} MB = {memory:5.2f}x JSON{held}")
    if html.exists():
        print(f"  report file: {html.stat().st_size / 1e6:.2f} MB")
    if "HTA load + analyses" in cpu:
        ours = cpu["import"] + cpu["analyze"] + cpu["report"]
        speedup = cpu["HTA load + analyses"] / ours
        print(f"  HTA load + analyses / (import + analyze + report): {speedup:.2f}x "
              f"(goal >= 5x) {'OK' if speedup >= 5 else 'MISSED'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="*", type=Path)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", type=lambda text: text.split(","), default=None,
                        metavar="CMD,...", help="only these commands beside the bare parse")
    parser.add_argument("--no-hta", action="store_true", help="leave HTA out")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="perfswarm-commands-") as tmp_name:
        tmp = Path(tmp_name)
        traces = args.traces or [LARGEST, generate(tmp / "synthetic.json.gz", args.events, 0)]
        hta = None if args.only is not None or args.no_hta else hta_python()
        for trace in traces:
            bench(trace, tmp, args.rounds, args.only, hta)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
