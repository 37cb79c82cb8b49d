"""Scale-out: import and analyze of a many-rank run, single process vs Dask, side by side.

Writes RANKS synthetic Kineto traces of EVENTS events each (default 16 x 1,000,000: one job,
see perfswarm.trace.synthetic; cached under bench-out/scale/), then, each in a fresh
process: the single-process import, the Dask import (a LocalCluster of --workers, default
one per core), the single-process analyze and the Dask analyze. Prints wall time and peak
memory of each and their ratios, and checks the two Runs' tables are byte-identical and the
two analyses equal.

Peak memory: VmHWM of every process of the child's tree (driver, nanny, workers), read from
/proc every 0.2 s (VmHWM only grows, so the last reading of each process is its peak). The
single-process path is one process; for Dask the largest single process (what a worker's
memory limit bounds) and the sum over the tree are both shown.

    python benchmarks/scale.py [--ranks 16] [--events 1000000] [--workers 0]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / "bench-out" / "scale"

IMPORT = """import sys
from pathlib import Path
from perfswarm.trace.cluster import ClusterOptions
from perfswarm.trace.ingest import ImportOptions, import_traces
out, workers, *paths = sys.argv[1:]
import_traces([Path(p) for p in paths], Path(out),
              ImportOptions(cluster=ClusterOptions(workers=int(workers))), ["bench"])
"""
ANALYZE = """import sys
import orjson
from perfswarm.analyze.summary import analyze
from perfswarm.trace.cluster import ClusterOptions
from perfswarm.trace.store import Run
run, workers, out = sys.argv[1:]
result = analyze(Run.open(run), cluster=ClusterOptions(workers=int(workers))).to_dict()
open(out, "wb").write(orjson.dumps(result, option=orjson.OPT_SORT_KEYS))
"""


def _write_rank(args: tuple[Path, int, int]) -> Path:
    from perfswarm.trace import synthetic

    path, events, rank = args
    tmp = path.with_suffix(".tmp")
    synthetic.write(tmp, events, seed=rank, rank=rank)
    tmp.rename(path)
    return path


def traces(ranks: int, events: int) -> list[Path]:
    """The rank traces, generated once per (generator source, size) and kept."""
    source = (REPO / "src" / "perfswarm" / "trace" / "synthetic.py").read_bytes()
    where = CACHE / f"{hashlib.sha256(source).hexdigest()[:10]}-{events}"
    where.mkdir(parents=True, exist_ok=True)
    paths = [where / f"rank{r}.json" for r in range(ranks)]
    todo = [(p, events, r) for r, p in enumerate(paths) if not p.exists()]
    if todo:
        print(f"writing {len(todo)} synthetic traces of {events:,} events to {where} ...",
              flush=True)
        with ProcessPoolExecutor(max(1, min(len(todo), psutil.cpu_count() or 1))) as pool:
            list(pool.map(_write_rank, todo))
    return paths


def _hwm(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def measure(code: str, *args: str) -> dict[str, float]:
    """Run `code` in a fresh process; wall time and the peak RSS of its process tree."""
    peaks: dict[int, int] = {}
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", code, *args])
    done = threading.Event()

    def sample() -> None:
        root = psutil.Process(proc.pid)
        while not done.is_set():
            try:
                pids = [root.pid] + [c.pid for c in root.children(recursive=True)]
            except psutil.Error:
                pids = [root.pid]
            for pid in pids:
                hwm = _hwm(pid)
                if hwm is not None:
                    peaks[pid] = max(peaks.get(pid, 0), hwm)
            done.wait(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    code_ = proc.wait()
    elapsed = time.perf_counter() - start
    done.set()
    sampler.join()
    if code_:
        raise SystemExit(f"child failed with exit code {code_}")
    return {"s": elapsed, "driver": float(peaks.get(proc.pid, 0)),
            "largest": float(max(peaks.values(), default=0)), "sum": float(sum(peaks.values())),
            "processes": float(len(peaks))}


def _digest(run: Path) -> dict[str, str]:
    out = {}
    for p in sorted((run / "tables").glob("*.parquet")):
        h = hashlib.sha256()
        with p.open("rb") as f:
            while chunk := f.read(1 << 24):
                h.update(chunk)
        out[p.name] = h.hexdigest()
    return out


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB"


def report(what: str, single: dict[str, float], dask: dict[str, float]) -> None:
    print(f"{what}:")
    print(f"  single process  {single['s']:8.1f} s   peak {_gb(single['largest'])}")
    print(f"  dask            {dask['s']:8.1f} s   peak of one process {_gb(dask['largest'])} "
          f"(driver {_gb(dask['driver'])}), sum over {int(dask['processes'])} processes "
          f"{_gb(dask['sum'])}")
    print(f"  ratios: time single/dask {single['s'] / dask['s']:.2f}x; peak single / "
          f"largest dask process {single['largest'] / dask['largest']:.2f}x; "
          f"single / dask sum {single['largest'] / dask['sum']:.2f}x", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=16)
    parser.add_argument("--events", type=int, default=1_000_000, help="events per rank")
    parser.add_argument("--workers", type=int, default=0,
                        help="Dask workers (0: one per core, at most one per rank)")
    parser.add_argument("--keep", action="store_true", help="keep the two Runs")
    args = parser.parse_args()
    workers = args.workers or max(1, min(args.ranks, psutil.cpu_count() or 1))
    paths = traces(args.ranks, args.events)
    out = CACHE / "runs"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    print(f"{args.ranks} ranks x {args.events:,} events; Dask: LocalCluster of {workers} "
          f"worker(s) on {psutil.cpu_count()} cores, {_gb(psutil.virtual_memory().total)} RAM",
          flush=True)
    single_run, dask_run = out / "single.run", out / "dask.run"
    imports = (measure(IMPORT, str(single_run), "0", *map(str, paths)),
               measure(IMPORT, str(dask_run), str(workers), *map(str, paths)))
    report("import", *imports)
    same_tables = _digest(single_run) == _digest(dask_run)
    analyses = (measure(ANALYZE, str(single_run), "0", str(out / "single.json")),
                measure(ANALYZE, str(single_run), str(workers), str(out / "dask.json")))
    report("analyze", *analyses)
    single_json = json.loads((out / "single.json").read_bytes())
    same_analysis = single_json == json.loads((out / "dask.json").read_bytes())
    print(f"events: {single_json['events']:,}; tables byte-identical: "
          f"{'yes' if same_tables else 'NO'}; analysis identical: "
          f"{'yes' if same_analysis else 'NO'}")
    if not args.keep:
        shutil.rmtree(out, ignore_errors=True)
    return 0 if same_tables and same_analysis else 1


if __name__ == "__main__":
    raise SystemExit(main())
