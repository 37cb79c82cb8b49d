"""The report of a 200k-event run: its size, and how long Debian's chromium takes to open it.

Builds a synthetic Kineto trace (perfswarm.trace.synthetic), imports it once (not timed),
builds the report (timed, in this process) and opens it in headless chromium several
times: from navigation to the overview's chart drawn, and from choosing the Trace view to
the timeline drawn. Prints the medians, the page size, and the ratios to the goals
(<= 1.0 meets them): a few MB (8 MB taken as the goal) and under 2 s to open.

    python benchmarks/report.py [--events 200000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from playwright.sync_api import sync_playwright

from perfswarm.report import html
from perfswarm.report.data import report_data
from perfswarm.trace import synthetic
from perfswarm.trace.ingest import ImportOptions, import_traces
from perfswarm.trace.store import Run

GOAL_OPEN_S = 2.0
GOAL_BYTES = 8_000_000
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        src = synthetic.write(Path(tmp) / "trace.json.gz", events=args.events)
        run = import_traces([src], Path(tmp) / "r.run", ImportOptions(), ["benchmark"])
        t = time.process_time()
        data = report_data(Run.open(run.path))
        out = html.write(data, Path(tmp) / "report.html")
        build_cpu_s = time.process_time() - t
        size = out.stat().st_size
        opens, traces = [], []
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            for _ in range(args.rounds):
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                t = time.perf_counter()
                page.goto(out.as_uri(), wait_until="load")
                page.wait_for_selector("#chart-breakdown svg.main-svg")
                opens.append(time.perf_counter() - t)
                t = time.perf_counter()
                page.click("nav#views a[data-view=trace]")
                page.wait_for_function(
                    "document.getElementById('timeline').dataset.drawn > 0")
                traces.append(time.perf_counter() - t)
                page.close()
            browser.close()
    open_s, trace_s = statistics.median(opens), statistics.median(traces)
    print(json.dumps({
        "events": args.events, "spans_shown": data["timeline"]["shown"],
        "spans_total": data["timeline"]["spans_total"], "bytes": size,
        "build_cpu_s": round(build_cpu_s, 2), "open_s": round(open_s, 3),
        "trace_view_s": round(trace_s, 3),
        "ratio_bytes": round(size / GOAL_BYTES, 3),
        "ratio_open": round((open_s + trace_s) / GOAL_OPEN_S, 3)}, indent=1))


if __name__ == "__main__":
    main()
