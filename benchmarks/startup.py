"""Start-up cost of `perfswarm --help`, of every command's `--help` and of `perfswarm info RUN`,
side by side with their peers.

Each contender is a fresh process, interleaved, several rounds; figures are the median CPU seconds
(user + system) of the whole process, which a busy shared machine disturbs less than wall time.
Each command is compared with a peer that does the same with only the libraries it truly needs:

- `--help` vs a one-command typer app printing its help: goal <= 1.5x
- `perfswarm NAME --help`, for every command the application lists, vs the same peer: goal <= 1.5x
- `info RUN` on a small Run vs a one-command typer app reading the Run's events table with
  pyarrow and printing a rich table: goal <= 1.5x
- `python -c pass` and `python -c 'import hta.trace_analysis'` (when .venv-hta exists: HTA's
  own start-up; its top package `hta` alone imports nothing) are printed for scale.

    python benchmarks/startup.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import compileall
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SMALL_TRACE = (REPO.parent / "shared" / "corpus" / "hta" / "cpu_only"
               / "rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz")
HTA_PYTHON = REPO / ".venv-hta" / "bin" / "python"

PEER_APP = """
import sys
from pathlib import Path
from typing import Annotated
import typer
app = typer.Typer(add_completion=False)
@app.command()
def info(run: Annotated[Path, typer.Argument()], as_json: bool = False) -> None:
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    from rich.console import Console
    from rich.table import Table
    events = pq.read_table(run / "tables" / "events.parquet", columns=["ts", "dur", "kind"])
    counts = pc.value_counts(events.column("kind").combine_chunks().dictionary_decode())
    table = Table("kind", "events")
    for c in counts.to_pylist():
        table.add_row(str(c["values"]), str(c["counts"]))
    Console().print(table)
app()
"""


def usage(argv: list[str]) -> tuple[float, int]:
    """User + system CPU seconds and peak RSS (bytes) of one child process, run to completion.

    The peak is ru_maxrss, which survives exec: it is the child's own as long as the parent
    (this script, standard library only) is smaller."""
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, rusage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)}: exit {proc.returncode}")
    return rusage.ru_utime + rusage.ru_stime, rusage.ru_maxrss * 1024


def usage_rounds(contenders: dict[str, list[str]],
                 rounds: int) -> tuple[dict[str, float], dict[str, int]]:
    """Each contender run `rounds` times, interleaved (round by round, so a burst of other load
    falls on all of them alike): its median CPU seconds and its highest peak RSS (bytes).
    perfswarm's own modules are byte-compiled first, as a pip-installed package's are: an
    editable install under PYTHONDONTWRITEBYTECODE=1 (this VM) compiles them in every process
    again (0.2-0.3 CPU s of a command)."""
    compileall.compile_dir(REPO / "src", quiet=1)
    seen: dict[str, list[tuple[float, int]]] = {k: [] for k in contenders}
    for _ in range(rounds):
        for name, argv in contenders.items():
            seen[name].append(usage(argv))
    return ({k: statistics.median(s for s, _ in v) for k, v in seen.items()},
            {k: max(r for _, r in v) for k, v in seen.items()})


GOAL = 1.5  # each command against its peer, CPU seconds


def verdict(cmd: str, peer: str, med: dict[str, float]) -> str:
    ratio = med[cmd] / med[peer]
    return f"{ratio:.2f}x (goal <= {GOAL}x) {'OK' if ratio <= GOAL else 'MISSED'}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    py = sys.executable
    cli = [py, "-m", "perfswarm.cli.main"]
    names = subprocess.run(  # the commands the application lists
        [py, "-c", "from perfswarm.cli.app import command_names; print(*command_names())"],
        check=True, capture_output=True, text=True).stdout.split()
    helps = {f"perfswarm {name} --help": [*cli, name, "--help"] for name in names}
    with tempfile.TemporaryDirectory(prefix="perfswarm-startup-") as tmp:
        run = str(Path(tmp) / "small.run")
        subprocess.run([*cli, "import", str(SMALL_TRACE), "--out", run], check=True,
                       capture_output=True)
        contenders = {
            "python -c pass": [py, "-c", "pass"],
            "peer --help": [py, "-c", PEER_APP, "--help"],
            "perfswarm --help": [*cli, "--help"],
            "peer info": [py, "-c", PEER_APP, run],
            "perfswarm info": [*cli, "info", run],
            **helps,
        }
        if HTA_PYTHON.exists():
            contenders["import hta.trace_analysis"] = [str(HTA_PYTHON), "-c",
                                                       "import hta.trace_analysis"]
        med, _ = usage_rounds(contenders, args.rounds)
    for name, s in med.items():
        if name not in helps:
            print(f"  {name:26s} {s:6.3f} CPU s (median of {args.rounds})")
    for cmd, peer in (("perfswarm --help", "peer --help"), ("perfswarm info", "peer info")):
        print(f"{cmd} / {peer}: {verdict(cmd, peer, med)}")
    print(f"each command's --help / peer --help ({med['peer --help']:.3f} CPU s):")
    for cmd in helps:
        print(f"  {cmd:32s} {med[cmd]:6.3f} CPU s  {verdict(cmd, 'peer --help', med)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
