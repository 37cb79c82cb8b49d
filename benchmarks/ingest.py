"""Ingest speed and memory, measured side by side in one run (the machine is shared and noisy).

Each contender runs in its own fresh process, interleaved, several rounds; the
figures are medians and the verdicts are ratios between contenders of the same
round set:

- import (perfswarm, in-memory path) vs bare gunzip + orjson.loads of the same file: goal <= 1.5x
- HolisticTraceAnalysis TraceAnalysis load vs perfswarm import: goal >= 5x
- peak RSS of the import vs the uncompressed JSON size: goal <= 4x
- streaming path: peak RSS at 1x and 4x the trace size (bounded: it must not grow with the input)

HTA runs from its own virtual environment (.venv-hta, created on first use) because its
pins (pandas, numpy) are not ours.

    python benchmarks/ingest.py [--events 200000] [--rounds 3] [--no-hta]
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HTA_VENV = REPO / ".venv-hta"

CHILD_PRELUDE = "import json, sys, time\n"
# VmHWM is this process's own peak RSS (ru_maxrss survives exec and would include the parent's).
CHILD_REPORT = ("hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM')][0]\n"
                "print(json.dumps({'s': elapsed, 'rss': int(hwm.split()[1]) * 1024}))\n")

BARE = CHILD_PRELUDE + """import gzip, orjson
t = time.perf_counter()
with open(sys.argv[1], 'rb') as f:
    data = orjson.loads(gzip.decompress(f.read()))
elapsed = time.perf_counter() - t
""" + CHILD_REPORT

IMPORT = CHILD_PRELUDE + """from pathlib import Path
from perfswarm.trace.ingest import ImportOptions, import_traces
t = time.perf_counter()
import_traces([Path(sys.argv[1])], Path(sys.argv[2]), ImportOptions(streaming=sys.argv[3]),
              ['bench'])
elapsed = time.perf_counter() - t
""" + CHILD_REPORT

HTA = CHILD_PRELUDE + """import logging
logging.disable(logging.CRITICAL)
from hta.trace_analysis import TraceAnalysis
t = time.perf_counter()
TraceAnalysis(trace_dir=sys.argv[1])
elapsed = time.perf_counter() - t
""" + CHILD_REPORT


def child(python: Path, code: str, *args: str) -> dict[str, float]:
    out = subprocess.run([str(python), "-c", code, *args], check=True, capture_output=True,
                         text=True)
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def generate(path: Path, events: int, seed: int) -> Path:
    """Write a synthetic trace from a child process, so this one stays small."""
    code = ("import sys; from pathlib import Path; from perfswarm.trace import synthetic; "
            "synthetic.write(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))")
    subprocess.run([sys.executable, "-c", code, str(path), str(events), str(seed)], check=True)
    return path


def hta_python() -> Path | None:
    """HolisticTraceAnalysis's interpreter, its venv made on first use; None (and a line
    saying why) when it cannot be installed, e.g. offline."""
    python = HTA_VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(HTA_VENV)], check=True)
    ok = subprocess.run([str(python), "-c", "import hta.trace_analysis"], check=False,
                        capture_output=True)
    if ok.returncode != 0:
        pip = subprocess.run([str(python), "-m", "pip", "install", "-q",
                              "holistictraceanalysis"], check=False, capture_output=True,
                             text=True)
        if pip.returncode != 0:
            tail = (pip.stderr.strip().splitlines() or ["no output"])[-1]
            print(f"HTA: {HTA_VENV} could not install holistictraceanalysis: {tail}")
            return None
    return python


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-hta", action="store_true")
    args = parser.parse_args()
    me = Path(sys.executable)
    with tempfile.TemporaryDirectory(prefix="perfswarm-bench-") as tmp_name:
        tmp = Path(tmp_name)
        trace = generate(tmp / "rank0.pt.trace.json.gz", args.events, 0)
        text_size = len(gzip.decompress(trace.read_bytes()))
        big = generate(tmp / "big.pt.trace.json.gz", args.events * 4, 1)
        big_size = len(gzip.decompress(big.read_bytes()))
        hta_dir = tmp / "hta"
        hta_dir.mkdir()
        shutil.copy(trace, hta_dir / trace.name)
        hta = None if args.no_hta else hta_python()
        print(f"input: {args.events:,} events, {trace.stat().st_size / 1e6:.1f} MB gzip, "
              f"{text_size / 1e6:.1f} MB JSON; big: {big_size / 1e6:.1f} MB JSON")
        rows: dict[str, list[dict[str, float]]] = {"bare": [], "import": [], "hta": [],
                                                   "stream": [], "stream4x": []}
        for r in range(args.rounds):
            rows["bare"].append(child(me, BARE, str(trace)))
            rows["import"].append(child(me, IMPORT, str(trace), str(tmp / f"m{r}.run"), "never"))
            rows["stream"].append(child(me, IMPORT, str(trace), str(tmp / f"s{r}.run"), "always"))
            if r == 0:
                rows["stream4x"].append(child(me, IMPORT, str(big), str(tmp / "b.run"), "always"))
            if hta is not None:
                rows["hta"].append(child(hta, HTA, str(hta_dir)))
            for run in tmp.glob("*.run"):
                shutil.rmtree(run)
    med = {k: (statistics.median(x["s"] for x in v), max(x["rss"] for x in v))
           for k, v in rows.items() if v}
    for k, (s, rss) in med.items():
        print(f"  {k:9s} median {s:7.3f} s   peak RSS {rss / 1e6:8.1f} MB")
    ratio = med["import"][0] / med["bare"][0]
    print(f"import / (gunzip + orjson.loads): {ratio:.2f}x (goal <= 1.5x) "
          f"{'OK' if ratio <= 1.5 else 'MISSED'}")
    rss_ratio = med["import"][1] / text_size
    print(f"import peak RSS / JSON size: {rss_ratio:.2f}x (goal <= 4x) "
          f"{'OK' if rss_ratio <= 4 else 'MISSED'}")
    if "hta" in med:
        speedup = med["hta"][0] / med["import"][0]
        print(f"HTA TraceAnalysis load / import: {speedup:.1f}x (goal >= 5x) "
              f"{'OK' if speedup >= 5 else 'MISSED'}")
    else:
        print("HTA: not measured (--no-hta, or holistictraceanalysis did not install)")
    growth = med["stream4x"][1] / med["stream"][1]
    print(f"streaming peak RSS: {med['stream'][1] / 1e6:.0f} MB at 1x, "
          f"{med['stream4x'][1] / 1e6:.0f} MB at 4x input ({growth:.2f}x for 4x the data; "
          f"{med['stream4x'][1] / big_size:.2f}x of the big JSON)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
