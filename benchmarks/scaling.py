"""Growth with the trace: import, analyze, report and predict of synthetic traces of several
sizes on one rank, and of the largest size split over several ranks, beside a bare parse.

Each command runs as a fresh process (CPU seconds, user + system, and peak RSS), once per
--rounds (the median is shown). Per size: the cost per million events and, against the smallest
size, the growth divided by the growth in events (1.00 is linear; goal: each command linear).
The report file's size is shown too (goal: a few MB whatever the trace). The ranks' traces are
synthetic.py's: one job whose ranks meet at a collective every step.

    python benchmarks/scaling.py [--events 250000,1000000] [--ranks 8] [--rounds 1]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from startup import usage_rounds

BARE = ("import gzip, sys, orjson\n"
        "for p in sys.argv[1:]: orjson.loads(gzip.decompress(open(p, 'rb').read()))")
WRITE = ("import sys; from pathlib import Path; from perfswarm.trace import synthetic; "
         "synthetic.write(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[3]))")


def generate(path: Path, events: int, rank: int) -> Path:
    """One rank's synthetic trace (seed = rank), written by a child so this process stays small."""
    if not path.exists():
        subprocess.run([sys.executable, "-c", WRITE, str(path), str(events), str(rank)],
                       check=True)
    return path


def measure(traces: list[Path], tmp: Path, label: str, rounds: int) -> dict[str, float]:
    py = sys.executable
    cli = [py, "-m", "perfswarm.cli.main"]
    run, html = tmp / f"{label}.run", tmp / f"{label}.html"
    paths = [str(t) for t in traces]
    contenders = {
        "bare parse": [py, "-c", BARE, *paths],
        "import": [*cli, "import", *paths, "--out", str(run), "--force", "--streaming",
                   "never", "--workers", "0", "-q"],
        "import --streaming": [*cli, "import", *paths, "--out", str(tmp / "s.run"), "--force",
                               "--streaming", "always", "-q"],
        "analyze": [*cli, "analyze", str(run)],
        "report": [*cli, "report", str(run), "-o", str(html)],
        "predict": [*cli, "predict", str(run)],
    }
    cpu, rss = usage_rounds(contenders, rounds)
    for name in contenders:
        print(f"  {label:14s} {name:19s} {cpu[name]:8.2f} CPU s  {rss[name] / 1e6:8.1f} MB  "
              f"{cpu[name] / cpu['bare parse']:5.2f}x parse")
    print(f"  {label:14s} report file {html.stat().st_size / 1e6:.2f} MB")
    return cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", default="250000,1000000")
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    sizes = sorted(int(n) for n in args.events.split(","))
    with tempfile.TemporaryDirectory(prefix="perfswarm-scaling-") as tmp_name:
        tmp = Path(tmp_name)
        results = {}
        for n in sizes:
            trace = generate(tmp / f"one-{n}.json.gz", n, 0)
            results[n] = measure([trace], tmp, f"{n:,} x 1", args.rounds)
        largest = sizes[-1]
        if args.ranks > 1:
            traces = [generate(tmp / f"rank{r}-{largest // args.ranks}.json.gz",
                               largest // args.ranks, r) for r in range(args.ranks)]
            ranked = measure(traces, tmp, f"{largest // args.ranks:,} x {args.ranks}",
                             args.rounds)
        print(f"growth / events growth (1.00 = linear), against {sizes[0]:,} events:")
        for n in sizes[1:]:
            growth = {k: (v / results[sizes[0]][k]) / (n / sizes[0])
                      for k, v in results[n].items()}
            print(f"  {n:,}: " + ", ".join(f"{k} {g:.2f}" for k, g in growth.items()))
        if args.ranks > 1:
            print(f"{args.ranks} ranks / one rank, same events: " + ", ".join(
                f"{k} {v / results[largest][k]:.2f}" for k, v in ranked.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
