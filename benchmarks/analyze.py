"""Full `analyze` of a 200k-event run: goal <= 2 s after import.

Builds a synthetic Kineto trace (perfswarm.trace.synthetic), imports it once (not
timed), then times `analyze` in fresh processes over several rounds and prints the
median, each analysis's share, and the ratio to the goal (<= 1.0 meets it).

    python benchmarks/analyze.py [--events 200000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from perfswarm.trace import synthetic
from perfswarm.trace.ingest import ImportOptions, import_traces

GOAL_S = 2.0

CHILD = """import json, sys, time
from perfswarm.analyze import summary
from perfswarm.analyze.frame import Events
from perfswarm.analyze.concurrency import concurrency
from perfswarm.analyze.critical_path import critical_path
from perfswarm.analyze.dependencies import sync_events
from perfswarm.analyze.iterations import iterations
from perfswarm.analyze.launch import launch_stats
from perfswarm.analyze.ops import op_breakdown
from perfswarm.analyze.stragglers import stragglers
from perfswarm.analyze.kernels import kernel_breakdown
from perfswarm.analyze.bandwidth import bandwidth
from perfswarm.trace.store import Run
run = Run.open(sys.argv[1])
t = time.perf_counter()
summary.analyze(run).to_dict()
total = time.perf_counter() - t
parts = {}
t = time.perf_counter(); ev = Events.load(run); parts['load'] = time.perf_counter() - t
t = time.perf_counter(); its = iterations(run, ev); parts['iterations'] = time.perf_counter() - t
for name, f in (('concurrency', lambda: concurrency(ev, its.steps)),
                ('ops', lambda: op_breakdown(ev, its.steps)), ('launch', lambda: launch_stats(ev)),
                ('stragglers', lambda: stragglers(ev)),
                ('critical_path', lambda: critical_path(ev, sync_events(run, ev), its.steps)),
                ('kernels', lambda: kernel_breakdown(ev)),
                ('bandwidth', lambda: bandwidth(run, ev))):
    t = time.perf_counter(); f(); parts[name] = time.perf_counter() - t
print(json.dumps({'total': total, 'parts': parts, 'events': len(ev)}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        # The generator counts flow points too; three in five of its events become rows.
        trace = synthetic.write(Path(tmp) / "synthetic.json.gz", args.events * 5 // 3 + 2_000)
        run = import_traces([trace], Path(tmp) / "run", ImportOptions(), ["bench"])
        results = []
        for _ in range(args.rounds):
            out = subprocess.run([sys.executable, "-c", CHILD, str(run.path)], check=True,
                                 capture_output=True, text=True).stdout
            results.append(json.loads(out))
    total = statistics.median(r["total"] for r in results)
    print(f"events in run: {results[0]['events']:,}")
    print(f"analyze (median of {args.rounds}): {total:.3f} s; goal {GOAL_S} s; "
          f"ratio {total / GOAL_S:.2f} ({'meets' if total <= GOAL_S else 'MISSES'} goal)")
    for part in results[0]["parts"]:
        print(f"  {part:<12} {statistics.median(r['parts'][part] for r in results):.3f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
