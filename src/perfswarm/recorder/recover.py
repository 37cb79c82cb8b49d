"""Runs from recordings a killed recorder left behind.

While it records, the session holds a flock on its `.NAME.XXXX.recording` directory and keeps
there `.recording.json`: the manifest as it stood once the collectors had started. A directory
nobody holds was left by a recorder that was SIGKILLed (or lost its machine); its raw files are
built into the Run NAME (or NAME.recovered-XXXX when NAME exists by then), `complete: false`.
"""

from __future__ import annotations

import fcntl
import glob
import os
import shutil
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from perfswarm.errors import PerfswarmError
from perfswarm.recorder.build import Recording, build_run
from perfswarm.trace.store import Manifest, Run, atomic_write_bytes

STATE = ".recording.json"


def save_state(rec: Recording) -> None:
    """What a recovery needs, written once the collectors have started."""
    atomic_write_bytes(rec.raw / STATE, orjson.dumps(
        {"manifest": rec.manifest, "perf_exe": rec.perf_exe, "start_ns": rec.start_ns}))


def hold(raw: Path) -> int:
    """An fd holding the recording directory's flock: 'a live recorder writes here'."""
    fd = os.open(raw, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def leftovers(parent: Path, name: str = "*") -> list[Path]:
    """Recording directories under `parent` (of the Run `name`) that no live recorder holds."""
    found = []
    pattern = f".{glob.escape(name) if name != '*' else '*'}.*.recording"
    for raw in sorted(parent.glob(pattern)):
        try:
            fd = os.open(raw, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if (raw / STATE).is_file():
                found.append(raw)
        except OSError:
            continue  # being recorded right now
        finally:
            os.close(fd)
    return found


def recover(raw: Path) -> Run:
    """Build the Run of one left-over recording directory, then remove the directory."""
    try:
        state = orjson.loads((raw / STATE).read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise PerfswarmError(f"{raw}: no readable {STATE} ({exc})") from None
    manifest: Manifest = state["manifest"]
    manifest["complete"], manifest["exit_status"], manifest["signal"] = False, None, None
    manifest["warnings"].append({"source": "record", "count": 1, "what": (
        "recovered: the recorder was killed while recording; how the child ended is unknown")})
    ends = [p.stat().st_mtime_ns for p in raw.iterdir() if p.is_file()]
    manifest.setdefault("extra", {}).setdefault("record", {})["end_ns"] = max(ends, default=0)
    name, _, rest = raw.name[1:].rpartition(".recording")[0].rpartition(".")
    out = raw.parent / name
    if os.path.lexists(out):
        out = raw.parent / f"{name}.recovered-{rest}"
    run = build_run(Recording(raw, manifest, state.get("perf_exe"), int(state["start_ns"])),
                    out, force=False)
    _unwritten(run)
    shutil.rmtree(raw, ignore_errors=True)
    return run


# the samplers that write their samples only as they stop (perf.data's header, py-spy's file)
_AT_STOP = {"perf": ("perf", "perf.data"), "pystacks": ("py-spy", "pystacks.txt")}


def _unwritten(run: Run) -> None:
    """Mark failed the samplers the killed recorder left no samples of (they had read ok with
    none: perf's unfinished perf.data, py-spy's file never written)."""
    manifest = run.manifest()
    sources = (pc.unique(run.table("samples", ["source"]).column("source").cast(pa.string()))
               .to_pylist() if run.has_table("samples") else [])
    changed = False
    for collector, (tool, file) in _AT_STOP.items():
        status = manifest["collectors"].get(collector)
        if status is not None and status["status"] == "ok" and tool not in sources:
            status["status"] = (f"failed: recovered: the recorder was killed before {tool} "
                                f"wrote its samples (raw/{file})")
            changed = True
    if changed:
        run.write_manifest(manifest)
