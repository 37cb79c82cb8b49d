"""Linux perf: `perf record -e cpu-clock -g` on the process tree, parsed with `perf script`.

perf stamps samples with CLOCK_MONOTONIC (`-k CLOCK_MONOTONIC`); the measured
monotonic->epoch offset maps them onto the run clock.

Other events (`--perf-events`) are sampled in the same `perf record` every PERIOD
events, without stacks, and become cumulative counters `perf.<event>`. Each is
probed first with `perf stat`: one perf refuses (a hardware counter a VM does
not expose reads `<not supported>`) is left out, the reason kept for the
manifest. perf falls back from a refused `cycles` to cpu-clock without a word,
so it cannot be left to perf record to refuse.

perf starts with its events off (`-D -1`) and is told to enable them over its control pipe;
its acknowledgement means it is sampling. A recorded command is held before its exec until
then (Collector.before_exec): perf, attached by pid, reads the process's mappings once and
hears only of those made while its events are on, so a library mapped in between (torch's,
imported as perf started) left every sample in it without a module or function.

oneDNN's JIT kernels live in anonymous executable memory, which perf can only name from the
perf map a JIT writes, /tmp/perf-PID.map (oneDNN writes one where ONEDNN_JIT_PROFILE=2; the
recorder does not set it: under perf it measured 1.14-1.24x slower steps, docs/benchmarks.md).
The maps of the recorded process and the children seen of it are copied into the recording,
where the reader finds them.
"""

from __future__ import annotations

import os
import re
import select
import shutil
import stat
import subprocess
from pathlib import Path

from perfswarm.errors import ParameterError
from perfswarm.recorder.system import tree_pids
from perfswarm.recorder.tools import ToolCollector
from perfswarm.trace.readers.perf import STACKS_EVENT

# software events perf counts exactly: each is sampled at every occurrence by default
SOFTWARE = frozenset({"context-switches", "cs", "page-faults", "faults", "minor-faults",
                      "major-faults", "cpu-migrations", "migrations", "alignment-faults",
                      "emulation-faults"})
HARDWARE_PERIOD = 100_000  # default sample period of any other event (cycles, cache-misses)
ENABLE_TIMEOUT_S = 30.0  # perf's acknowledgement that its events are on (0.3 s here)
CONTROL_SINCE = (5, 10)  # the perf release that added --control and -D -1
_VERSION = re.compile(r"perf version (\d+)\.(\d+)", re.ASCII)
_EVENT_NAME = re.compile(r"^[A-Za-z][\w.:-]*$", re.ASCII)


def parse_events(text: str) -> tuple[tuple[str, int], ...]:
    """`--perf-events` `EVENT[@PERIOD],...` -> (event, period) pairs; PERIOD defaults to 1 for
    perf's software events and HARDWARE_PERIOD for the rest."""
    out: dict[str, int] = {}
    for item in (i.strip() for i in text.split(",")):
        if not item:
            continue
        name, at, period = item.partition("@")
        if not _EVENT_NAME.match(name):
            raise ParameterError("perf_events", "not a perf event name", value=item)
        if at and not (period.isdigit() and 0 < int(period) < 1 << 62):
            raise ParameterError("perf_events", "PERIOD must be a positive integer", value=item)
        out[name] = int(period) if at else (1 if name in SOFTWARE else HARDWARE_PERIOD)
    return tuple(out.items())


def refusal(exe: str, event: str) -> str | None:
    """Why perf will not count `event` here (None: it will), from `perf stat -x,`."""
    try:
        done = subprocess.run([exe, "stat", "-x,", "-e", event, "--", "true"],
                              capture_output=True, text=True, errors="replace", timeout=30,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"perf stat did not run ({exc})"
    lines = [ln.strip() for ln in done.stderr.splitlines() if ln.strip()]
    row = next((ln.split(",") for ln in reversed(lines) if f",{event}," in ln), None)
    if row is None:
        return f"perf stat: {lines[0] if lines else 'no output'}"
    if row[0].startswith("<"):  # <not supported>, <not counted>
        return f"perf stat counts {row[0]} (the kernel or VM exposes no such counter)"
    return None


class PerfCollector(ToolCollector):
    name = "perf"
    tool = "perf"
    output = "perf.data"
    spins = True  # perf 6.1 -p, once a thread it follows exits (ToolCollector.watch)
    before_exec = True

    def __init__(self, raw: Path, hz: int, events: tuple[tuple[str, int], ...] = ()) -> None:
        super().__init__(raw, hz)
        self.events: tuple[tuple[str, int], ...] = ()
        self.refused: dict[str, str] = {}
        self.pids: set[int] = set()  # the recorded process and the children seen of it
        self._control: tuple[int, ...] = ()  # our ends of the running perf's control pipes
        if self.exe is None:
            self.refused = {e: f"{self.tool} not found" for e, _ in events}
            return
        # a perf without --control (before 5.10) samples from its start, as it always did
        self.before_exec = controllable(self.exe)
        kept = []
        for event, period in events:
            if event == STACKS_EVENT:
                continue  # sampled already, with stacks
            why = refusal(self.exe, event)
            if why is None:
                kept.append((event, period))
            else:
                self.refused[event] = why
        self.events = tuple(kept)

    def clock_offset(self, monotonic_offset: int) -> int | None:
        return monotonic_offset

    def start(self, pid: int) -> None:
        self.pids.add(pid)
        super().start(pid)
        if self.proc is None:  # perf exited at once: its pipes go with it
            self._close_control()

    def launch(self, argv: list[str], pass_fds: tuple[int, ...] = ()) -> subprocess.Popen[bytes]:
        """perf started with its events off, then enabled: back once it says they are on (or
        it has exited, or ENABLE_TIMEOUT_S passed). Our ends of its control pipes stay open
        while it runs: perf 6.1 stops at once, writing no samples, when its control fd hangs
        up ("Thread and evlist pollfd index mismatch")."""
        if not self.before_exec:
            return super().launch(argv, pass_fds)
        ctl_read, ctl_write = os.pipe()
        ack_read, ack_write = os.pipe()
        self._control = (ctl_write, ack_read)
        try:
            proc = super().launch([*argv[:2], "-D", "-1", "--control",
                                   f"fd:{ctl_read},{ack_write}", *argv[2:]],
                                  (*pass_fds, ctl_read, ack_write))
        except BaseException:
            os.close(ctl_write)
            os.close(ack_read)
            self._control = ()
            raise
        finally:
            os.close(ctl_read)
            os.close(ack_write)
        try:
            os.write(ctl_write, b"enable\n")
        except BrokenPipeError:  # perf exited at once (ToolCollector.start says why)
            return proc
        said = b""
        while b"ack" not in said and select.select([ack_read], [], [], ENABLE_TIMEOUT_S)[0]:
            more = os.read(ack_read, 64)
            if not more:  # perf exited
                break
            said += more
        return proc

    def _end(self) -> None:
        super()._end()
        self._close_control()

    def _close_control(self) -> None:
        for fd in self._control:
            os.close(fd)
        self._control = ()

    def watch(self, pid: int, elapsed_s: float) -> None:
        self.pids.update(tree_pids(pid))
        super().watch(pid, elapsed_s)

    def stop(self) -> None:
        super().stop()
        for pid in sorted(self.pids):
            written = Path(f"/tmp/perf-{pid}.map")
            if own_file(written):  # the program's to keep: copied
                shutil.copyfile(written, self.raw / written.name)

    def files(self) -> list[str]:
        return [*super().files(), *(f"perf-{pid}.map" for pid in sorted(self.pids)
                                    if (self.raw / f"perf-{pid}.map").is_file())]

    def argv(self, pid: int) -> list[str]:
        assert self.exe is not None
        extra = [a for event, period in self.events
                 for a in ("-e", f"{event}/period={period},call-graph=no/")]
        return [self.exe, "record", "-e", STACKS_EVENT, *extra, "-g", "-k", "CLOCK_MONOTONIC",
                "-F", str(self.hz), "-p", str(pid), "-o", str(self.raw / self.output)]


def own_file(path: Path) -> bool:
    """Whether `path` is a plain file of this user's, not a link: /tmp is everyone's, and a
    perf map another user left under a recorded pid's name (or a link to a file of ours
    elsewhere) is not copied into the Run."""
    try:
        st = path.lstat()
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid()


def controllable(exe: str) -> bool:
    """Whether the perf at `exe` takes `--control` and `-D -1` (CONTROL_SINCE; `perf version`
    says "perf version 6.1.135"): an older one, or one that does not say, is started as before,
    sampling from its start, and the command is not held for it."""
    try:
        said = subprocess.run([exe, "version"], capture_output=True, text=True, timeout=10,
                              check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    found = _VERSION.search(said)
    return found is not None and (int(found[1]), int(found[2])) >= CONTROL_SINCE
