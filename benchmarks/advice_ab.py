"""Advice against an A/B of the change it suggests, on loops that need it.

    PYTHONPATH=src python benchmarks/advice_ab.py [--rounds 3] [--only CASE,...] [--dir DIR]

For each case of benchmarks/advice_loops.py (`augment`: per_sample_ops, `reads`: untraced_wait,
`threads`: thread_oversubscription) the slow and the mended form run unrecorded, interleaved,
`--rounds` times each (median step, fresh processes); then the slow form is recorded (torch,
system and perf collectors) and advised. Printed side by side: the rule's claimed gain as a
share of the time it is of (`gain_pct`), and the measured saving as a share of the slow form's
step, with both forms' step medians. `reads` reads a 1 GiB file of random bytes it writes in
`--dir` (default: a temporary folder; it must be on a file system that takes O_DIRECT).
One intra-op thread for `augment` and `reads`; `threads` keeps torch's default on purpose.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from realworld import found, record, truth

HERE = Path(__file__).resolve().parent
LOOPS = HERE / "advice_loops.py"
RULES = {"augment": "per_sample_ops", "reads": "untraced_wait",
         "threads": "thread_oversubscription"}
DATA_BYTES = 1 << 30


def _args(case: str, data: Path, port: int) -> list[str]:
    return {"augment": [], "reads": ["--file", str(data)],
            "threads": ["--port", str(port)]}[case]


def _env(case: str) -> dict[str, str]:
    return {} if case == "threads" else {"OMP_NUM_THREADS": "1"}


def _bare(case: str, mended: bool, data: Path, port: int) -> float:
    done = subprocess.run([sys.executable, str(LOOPS), case, *_args(case, data, port),
                           *(["--mended"] if mended else [])], capture_output=True, text=True,
                          check=False, env={**os.environ, **_env(case)})
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-2000:])
        raise SystemExit(f"{case}{' mended' if mended else ''} failed ({done.returncode})")
    return float(truth(done.stdout)["median_step_s"])


def _data(folder: Path) -> Path:
    path = folder / "advice_ab.data"
    if not path.exists() or path.stat().st_size < DATA_BYTES:
        with path.open("wb") as f:
            for _ in range(DATA_BYTES >> 24):
                f.write(os.urandom(1 << 24))
    return path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--only", default="", help="cases, comma-separated (default: all)")
    p.add_argument("--dir", type=Path, default=None, help="where `reads` keeps its data file")
    a = p.parse_args()
    unknown = set(a.only.split(",")) - set(RULES) if a.only else set()
    if unknown:
        p.error(f"--only: unknown case(s) {', '.join(sorted(unknown))}; known: {', '.join(RULES)}")
    cases = [c for c in RULES if not a.only or c in a.only.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        folder = a.dir or Path(tmp)
        data = _data(folder) if "reads" in cases else folder / "none"
        print(f"{'case':8s} {'rule':24s} {'slow':>9s} {'mended':>9s} {'saved':>7s} "
              f"{'claimed':>8s}  severity")
        for i, case in enumerate(cases):
            port = 29700 + 10 * i
            slow, mended = [], []
            for r in range(a.rounds):
                slow.append(_bare(case, False, data, port + r))
                mended.append(_bare(case, True, data, port + r))
            s, m = statistics.median(slow), statistics.median(mended)
            run, _out = record(Path(tmp) / f"{case}.run",
                               [sys.executable, str(LOOPS), case, *_args(case, data, port + 9)],
                               collectors="torch,system,perf", env=_env(case))
            advice = found(run).get(RULES[case])
            claimed = ("none" if advice is None else "no gain" if advice.gain_pct is None
                       else f"{advice.gain_pct:.1f}%")
            print(f"{case:8s} {RULES[case]:24s} {1e3 * s:7.2f}ms {1e3 * m:7.2f}ms "
                  f"{100 * (1 - m / s):6.1f}% {claimed:>8s}  "
                  f"{advice.severity if advice else '-'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
