"""Injected into the recorded command via PYTHONPATH: profiles torch without changing the script.

Nothing happens until the script imports torch; then a global optimizer-step
hook counts iterations. A loop that builds no torch.optim optimizer (manual SGD,
inference, a custom update) is counted by what it really does instead: the end
of each autograd backward, else the start of each forward of a top-level module
(one called from no other module's forward); the steps file says which
(`window_on`). An optimizer built drives the window only once it steps: until then the loop's
backwards and forwards are counted too, and after PERFSWARM_PATIENCE of one kind with no step
(an inference loop in a process that built an optimizer it never steps) that kind drives. A
better kind takes over a window of a worse one, open or done (a training loop that evaluated
first, an optimizer built late, manual SGD after an evaluation): that window is set aside, and
dropped, traces and its DataLoader workers' too, when the better one's opens (kept if it never
does). After SKIP steps (SKIP 0: when the first optimizer is built) torch.profiler starts
(shapes recorded, one ProfilerStep#N marker per iteration, N = the iteration index), an
ExecutionTraceObserver covers the first profiled step, and after COUNT steps the trace is
exported.
Every hook time is kept, so the steps outside the window are known too
(with the process's minor page-fault count at each hook: memory touched for
the first time, which a profiling window makes more of, see model/predict.py;
torch.get_num_threads() there, the intra-op threads of the step it ends; and the time
torch.compile spent compiling so far, which dynamo's compile callbacks sum):
appended to `steps-….live` as it happens (one decimal ns per line, unbuffered,
so a watcher such as `perfswarm tune` sees the steps live and a killed process
keeps them), then written whole to
`steps-….json` at exit. Files are per process: RANK and pid in the name.
Configuration comes from PERFSWARM_* variables set by `perfswarm record`.

Before the window opens, a heap reserve (PERFSWARM_HEAP_RESERVE MiB) is written once
and freed, so the tensors the profiler's allocations displace land on resident memory
instead of page-faulting new heap every step (`_perfswarm_heap.py`).

DataLoader workers never step an optimizer, so they follow their parent's
window instead: while it is open the parent keeps a flag file, and each worker
(its `_worker_loop` wrapped, forked or spawned) looks for it before fetching a
batch, profiling (CPU, shapes, no step markers) from the first batch it sees
the flag to the first it does not, or to its exit; each profiled batch is a
`DataLoader worker fetch` span. A child forked while the window is open drops the
profiler it inherited, unread (`_drop_inherited_profiler`), and a worker forked so traces
nothing (`_WorkerWindow`). The time the stepping process
spends starting a loader's workers (a new epoch's iterator, each worker's first batch, the
last one's workers joined) is summed at each hook too (`hook_loader`), outside the window as in it,
and so is what the loaders' batches held (`hook_loaded`: batches, tensors, samples).
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import resource
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from types import FrameType, ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from perfswarm.recorder.inject._perfswarm_batch import batch_tensors, index_samples
    from perfswarm.recorder.inject._perfswarm_heap import reserve_heap
else:  # injected, this file's folder is on the path, perfswarm maybe not
    from _perfswarm_batch import batch_tensors, index_samples
    from _perfswarm_heap import reserve_heap

_DIR = os.environ.get("PERFSWARM_RECORD_DIR", "")
FETCH = "DataLoader worker fetch"  # a worker's span around each batch it profiles
DRIVERS = ("optimizer", "backward", "forward")  # what counts the steps, best first
_HERE = os.path.dirname(os.path.abspath(__file__))


class _Window:
    """The per-process profiling state machine, driven by optimizer.step() returning (else a
    backward's end, else a top-level forward's start)."""

    in_worker = False  # set in DataLoader workers (spawned ones run this file too): no files

    def __init__(self, out: str, skip: int, count: int, with_et: bool,
                 reserve_mib: int, patience: int, settle: int) -> None:
        self.out, self.skip, self.count, self.with_et = out, skip, count, with_et
        self.patience = patience  # PERFSWARM_PATIENCE (torch_profiler.PATIENCE)
        self.settle = settle  # PERFSWARM_SETTLE (torch_profiler.SETTLE)
        self.reserve_mib = reserve_mib
        self.pid = os.getpid()
        self.rank = int(os.environ.get("RANK", "0") or 0)
        self.hook_ns: list[int] = []
        self.hook_faults: list[int] = []  # the process's minor page faults at each hook
        # the hooking thread's run delay so far at each hook (schedstat: ns it sat runnable on
        # a runqueue; -1 where the kernel keeps none): the wait for a core in each step, which
        # the system sampler's 50 ms readings spread over the steps they span
        self.hook_delays: list[int] = []
        # torch.get_num_threads() at each hook: the intra-op threads of the step it ends (a
        # program may set them inside the window: set_num_threads(1) at its 10th step)
        self.hook_threads: list[int] = []
        # torch.compile's compile time so far (ns) at each hook: what the step it ends spent
        # compiling (the first steps; a recompilation on a new shape, a last short batch,
        # outside the window too, where no trace shows dynamo's spans)
        self.hook_compile: list[int] = []
        self.compile_ns = 0  # the compiles' time so far (_watch_compiles)
        self.compile_began = 0  # when the compile under way began
        # the time spent so far (ns) starting DataLoader workers, at each hook: a new
        # iterator of a loader with workers (its workers forked), each one's first batch, and
        # the last one's workers joined as it ran out (a new epoch's loader, _watch_loaders),
        # which no trace shows outside the window
        self.hook_loader: list[int] = []
        self.loader_ns = 0
        # what DataLoader iterators handed the loop so far, at each hook (_watch_loaders):
        # [batches, their tensors (each batch's distinct storages), their samples (where the
        # batch sampler says them), those samples taken with autograd on (not an evaluation's
        # under no_grad)], which no trace shows (a collate of its own stacks nothing)
        self.hook_loaded: list[list[int]] = []
        self.loaded = [0, 0, 0, 0]
        # hook index -> the leading dimension of the top-level module's first input, of a
        # forward-driven step (an inference server's requests differ in size)
        self.batches: dict[int, int] = {}
        # hook index -> the elements of that input (batch x sequence: a generate loop's
        # prefill and decode steps are of one batch and other sizes)
        self.inputs: dict[int, int] = {}
        # hook index -> that forward's own time (ns, its start to its return): the step's busy
        # work, the rest of it up to the next forward's start a wait (an inference server's
        # for requests)
        self.forward_ns: dict[int, int] = {}
        self.step_done_ns: dict[int, int] = {}
        # hook index -> the optimizer.step() call's own time (ns): from its start, or the end
        # of the last backward inside it (a closure's), to its return; outside the window too
        self.optimizer_ns: dict[int, int] = {}
        self.backward_ns = 0  # when the last backward returned
        # The optimizers one training step steps, in order (a GAN's discriminator, then its
        # generator; a WGAN's critic 5 times, then its generator), ending with the call that
        # ends the step (ends_step); until it is known every call is a step, each by whom
        # (hook_keys), and then those of the cycle's last are kept (_regroup).
        self.cycle: list[int] | None = None
        self.phase = 0  # the cycle's place of the next call
        # the optimizer of the first call, and of the last; the hook from which the calls'
        # keys are held (an optimizer the cycle lacked stepped: learned again from there)
        self.first_key: int | None = None
        self.last_key: int | None = None
        self.learn_from = 0
        self.calls = 0  # the optimizer calls so far, steps or not
        self.hook_keys: list[int] = []
        # the optimizers built (alive) and the ids of those stepped inside another's step (a
        # wrapper's): the cycle is known once it holds every one built but those
        self.built: weakref.WeakSet[Any] = weakref.WeakSet()
        self.inner: set[int] = set()
        self.pending_ns = 0  # the own time of the cycle's calls since the last step
        self.prof: Any = None
        self.et: Any = None
        self.cpp_log_level: int | None = None  # torch's C++ log threshold the ET's run replaced
        self.live_fd = -1  # opened at the first step: most Python processes never step
        self.driver: str | None = None  # which of DRIVERS counts the steps
        # an optimizer was built and has not stepped yet: the loop's other events counted
        self.unstepped = False
        self.waited: dict[str, int] = {"backward": 0, "forward": 0}
        # a window a better driver took over from (its steps, its trace written): restored at
        # exit unless the better driver's window opens, which drops it (_drop_superseded)
        self.superseded: dict[str, Any] | None = None
        self.windows = 0  # windows opened: the flag file holds the number (workers' traces)
        self.opened_at = -1  # steps done when the window opened
        self.forward_hooks: list[Any] = []
        self.fp32: dict[str, str] = {}  # how FP32 GEMMs and convs would run on a CUDA GPU
        # as the window opened: torch.get_num_threads() (what torchrun's OMP_NUM_THREADS=1, a
        # set_num_threads() call or the default made of it) and whether CUDA was there
        self.runtime: dict[str, object] = {}
        # a DataLoader iterated with pin_memory=True that pins nothing (_watch_loaders)
        self.loaders: dict[str, object] = {}
        # a multiprocessing child that trains on its own (Hogwild: torch.multiprocessing
        # processes each stepping an optimizer) takes a rank of its own at its first step,
        # unless RANK says one; spawned children run this file themselves (None: decided at
        # the first step, once multiprocessing has started), forked ones come through forked()
        self.claim: bool | None = None
        # the program's own torch profiler took over at this step (None: it did not): this
        # window closed then, or never opened (two Kineto sessions cannot run at once)
        self.aside_at: int | None = None
        self.starting = False  # while this window's own profiler starts
        self.cut_at: int | None = None  # the step whose marker the window's close cut

    def _claim_rank(self) -> None:
        """The lowest free rank above 0 among the recording's processes (a file each, made
        exclusively: `.`-files are scratch to the build), for this process's stem: its steps
        and trace are another rank's."""
        self.claim = False
        rank = 1
        while True:
            try:
                os.close(os.open(os.path.join(self.out, f".rank-{rank}"),
                                 os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
                break
            except FileExistsError:
                rank += 1
        self.rank = rank

    @property
    def stem(self) -> str:
        """How this process's files are named: its rank and pid."""
        return f"rank{self.rank}-pid{self.pid}"

    @property
    def live(self) -> str:
        """The step times as they come (read when the `.json` at exit is missing)."""
        return os.path.join(self.out, f"steps-{self.stem}.live")

    def _clear_steps(self) -> None:
        """Forget the steps counted so far (another driver's, or a parent's): every per-hook
        record and the live file's lines."""
        self.hook_ns.clear()
        self.hook_faults.clear()
        self.hook_delays.clear()
        self.hook_threads.clear()
        self.hook_compile.clear()
        self.hook_loader.clear()
        self.hook_loaded.clear()
        self.optimizer_ns.clear()
        self.batches.clear()
        self.inputs.clear()
        self.forward_ns.clear()
        self.hook_keys.clear()
        self.learn_from = 0
        if self.live_fd >= 0:
            os.ftruncate(self.live_fd, 0)

    def forked(self) -> None:
        """In a forked child: the parent's steps, window and files are the parent's. The
        child keeps what drives its steps (an optimizer built before the fork steps here
        too) and writes its own at exit (multiprocessing runs its finalizers; no atexit)."""
        self.pid = os.getpid()
        self.live_fd = -1  # the parent's file, not to be written (nor truncated) here
        self._clear_steps()
        self.step_done_ns = {}
        self.cycle, self.phase, self.pending_ns, self.backward_ns = None, 0, 0, 0
        self.first_key = self.last_key = None
        self.calls = 0
        if self.prof is not None:  # forked while the window was open
            self.starting = True  # the empty session is no program's own (_yield_to_...)
            try:
                _drop_inherited_profiler()
                _WorkerWindow.inherited = True
            finally:
                self.starting = False
        self.prof = self.et = None
        if self.cpp_log_level is not None:  # forked while the ET ran: the child's log is its own
            _cpp_log_level(self.cpp_log_level)
            self.cpp_log_level = None
        self.opened_at = -1
        self.claim = "RANK" not in os.environ
        import multiprocessing.util as mp_util

        # multiprocessing clears the finalizers a child inherits, then runs its after-fork
        # hooks: this one's Finalize runs at the child's end, where it calls them
        mp_util.register_after_fork(self, _Window.flush_at_exit)

    def flush_at_exit(self) -> None:
        import multiprocessing.util as mp_util

        mp_util.Finalize(None, self.flush, exitpriority=100)

    def on_event(self, kind: str) -> bool:
        """A step-like event: its kind drives the window unless a better one does (an
        optimizer, once built and stepped, always; backward over forward); a better kind takes
        over a window of a worse one, done or open (`_supersede`). Whether it counted a step."""
        if os.getpid() != self.pid or self.in_worker:
            return False
        if kind == "optimizer" and self.unstepped:
            self.unstepped = False
            self.drop_forward_hooks()
        elif kind != "optimizer" and self.driver == "optimizer" and self.unstepped:
            self.waited[kind] += 1
            if kind == "backward":  # a forward drives no window of a loop that runs backward
                self.drop_forward_hooks()
            if self.waited[kind] < self.patience or (kind == "forward"
                                                      and self.waited["backward"]):
                return False
            self.driver = None  # the optimizer does not drive this loop, until it steps
            if self.opened_at >= 0:  # opened as it was built (SKIP 0): on these steps instead
                self._supersede()
                self._drop_superseded()
        if kind != self.driver:
            if self.driver is not None and DRIVERS.index(kind) > DRIVERS.index(self.driver):
                return False
            if self.opened_at >= 0:
                if self.aside_at is not None:
                    return False
                self._supersede()  # a training loop that evaluated first, or inferred
            self.driver = kind  # the steps counted so far were another kind's
            self._clear_steps()
            if kind != "forward":
                self.drop_forward_hooks()
        self.on_step()
        return True

    _KEPT = ("hook_ns", "hook_faults", "hook_delays", "hook_threads", "hook_compile",
             "hook_loader", "hook_loaded",
             "optimizer_ns",
             "batches", "inputs", "forward_ns", "step_done_ns",
             "driver", "opened_at", "cut_at")

    def _supersede(self) -> None:
        """A better driver's event after a window on a worse one opened (an evaluation or
        inference before training, an optimizer built late or stepped late, manual SGD after an
        evaluation): that window closes now, its trace written, and its steps are set aside for
        the better driver's, restored at exit if that window never opens. One set aside before
        it (forwards, then backwards, then an optimizer) goes: this one's files replace its."""
        self._drop_superseded(files=False)
        if self.et is not None:
            self._stop_et()
        if self.prof is not None:
            self.cut_at = len(self.hook_ns)
            self._stop()
        # its steps file now, beside its trace: a process killed before the better driver's
        # window opens leaves the two that go together (the live file goes on with the new steps)
        self._write_steps(self.cut_at)
        self.superseded = {name: copy.copy(getattr(self, name)) for name in self._KEPT}
        self.superseded["window"] = self.windows
        self.opened_at, self.cut_at, self.step_done_ns = -1, None, {}

    def _drop_superseded(self, files: bool = True) -> None:
        """The better driver's window opens (or the set-aside one had no steps of its own):
        the set-aside window's traces go, its DataLoader workers' too (_WorkerWindow marks
        them), and a worker still tracing for it writes none. `files`: this process's own
        (trace, execution trace, steps) too, unless a newer window's are to replace them."""
        if self.superseded is None:
            return
        window, self.superseded = self.superseded["window"], None
        names = [f"torch-{self.stem}.pt.trace.json", f"et-{self.stem}.json",
                 f"steps-{self.stem}.json"] if files else []
        mark = f".worker-pid{self.pid}-w{window}-"
        for entry in os.scandir(self.out):
            if entry.name.startswith(mark):
                with contextlib.suppress(OSError), open(entry.path) as f:
                    names.append(f"torch-{f.read().strip()}.pt.trace.json")
                with contextlib.suppress(OSError):
                    os.remove(entry.path)
        for name in names:
            with contextlib.suppress(OSError):
                os.remove(os.path.join(self.out, name))

    def stepped(self, key: int, own_ns: int) -> None:
        """The optimizer `key`'s step() returned, its own time `own_ns`: a step ends if the
        call ends one (ends_step), the optimizer drives the window and this one counts."""
        self.pending_ns += own_ns
        if self.ends_step(key) and self.on_event("optimizer") and self.driver == "optimizer":
            self.optimizer_ns[len(self.hook_ns) - 1] = self.pending_ns
            if self.cycle is None:
                self.hook_keys.append(key)
            self.pending_ns = 0

    def ends_step(self, key: int) -> bool:
        """Whether the call of the optimizer `key` ends a training step, an iteration of the
        loop. Every call does until the cycle is known (_learn), at a call of an optimizer
        that stepped before; then a step ends where the calls complete the cycle, which
        begins where the loop's first iteration did (a WGAN's critic 5 times, then its
        generator: at the generator's call; the generator first: at the critic's fifth), and
        the steps so far are regrouped. An optimizer built that the cycle lacks (it had not
        stepped yet) stepping with no window open makes it learned again from there."""
        repeat, self.last_key = key == self.last_key, key
        self.calls += 1
        if self.first_key is None:
            self.first_key = key
        if self.cycle and key not in self.cycle and key in self._required() \
                and self.prof is None:
            self._relearn()
        if self.cycle is None:
            if key not in self.hook_keys:
                return True
            if self.opened_at >= 0 and self.learn_from == 0:  # a window already open counts
                self.cycle = []  # on as it began: every call a step (SKIP 0, or one built)
            elif not self._learn(key):
                return True
        return self._advance(key, repeat)

    def _relearn(self) -> None:
        """An optimizer built that the cycle lacks steps: the cycle is learned again, from
        the calls that learned it where its steps were each a call (one optimizer's: a
        critic's warm-up, a generator's pretraining), no window opened and they are fewer
        than PATIENCE, else from here."""
        assert self.cycle is not None
        if len(self.cycle) == 1 and self.opened_at < 0 \
                and len(self.hook_ns) - self.learn_from < self.patience:
            self.hook_keys += self.cycle * (len(self.hook_ns) - self.learn_from
                                            - len(self.hook_keys))
        else:
            self.learn_from = len(self.hook_ns)
            self.hook_keys.clear()
        self.cycle, self.phase = None, 0

    def _learn(self, key: int) -> bool:
        """Whether the calls so far and `key`'s make the cycle known: once the last calls
        repeat one cycle twice that holds every optimizer built (alive, and not stepped
        inside another's step; a WGAN's critic steps 5 times and its generator once, twice:
        an iteration with extra calls, lazy regularisation's, is no cycle), or the last
        SETTLE calls repeat one cycle that holds every one built that stepped (one built and
        not stepped yet is none of it), or PATIENCE calls have gone by. The cycle
        begins at a run of the loop's first call's optimizer, and back as far as the calls
        repeat it; the steps so far regrouped."""
        seq = [*self.hook_keys, key]
        required = self._required()
        period = next((p for p in range(1, len(seq) // 2 + 1)
                       if seq[-p:] == seq[-2 * p:-p] and required <= set(seq[-p:])), 0)
        if not period:
            tail = seq[-self.settle:] if len(seq) >= self.settle else []
            period = next((p for p in range(1, len(tail) // 2 + 1) if tail[p:] == tail[:-p]
                           and required & set(seq) <= set(tail[:p])), 0)
            if not period and len(self.hook_keys) < self.patience:
                return False
            period = period or len(self.hook_keys) - self.hook_keys.index(key)
        last = seq[-period:]
        lead = next(k for k in (self.first_key, *seq) if k in last)
        turn = next((r for r in range(period) if last[r] == lead and last[r - 1] != lead), 0)
        self.cycle = last[turn:] + last[:turn]
        begin = len(seq) - period + turn
        while begin >= period and seq[begin - period:begin] == self.cycle:
            begin -= period
        self._regroup(seq, begin)
        return True

    def _advance(self, key: int, repeat: bool) -> bool:
        """A call of `key` once the cycle is known: whether it completes the cycle (every call
        does of a window opened before it was known). A call out of the cycle's order (an
        iteration that skipped one) takes the next place of its optimizer; one of an optimizer
        the cycle does not hold ends no step, and so does a call of the optimizer the last
        call was of where the cycle holds no such repeat (an extra one: lazy regularisation's,
        an iteration stepping one twice)."""
        if not self.cycle:
            return True
        n = len(self.cycle)
        if repeat and self.cycle[self.phase] != key:
            return False
        at = next((i for i in range(self.phase, self.phase + n) if self.cycle[i % n] == key),
                  None)
        if at is None:
            return False
        self.phase = (at + 1) % n
        return self.phase == 0

    def _required(self) -> set[int]:
        """The optimizers a cycle must hold: every one built and alive, but those stepped
        inside another's step."""
        return {id(o) for o in self.built} - self.inner

    def settled(self) -> bool:
        """Whether the window may open: an optimizer's steps are iterations once the cycle is
        known, or with one optimizer built (its every call a step). A cycle that lacks one
        built (not stepped yet) waits for twice SETTLE calls: a critic's warm-up or a
        generator's pretraining shorter than that is learned again before it opens."""
        required = self._required()
        return self.driver != "optimizer" or len(required) < 2 or (
            self.cycle is not None
            and (required <= set(self.cycle) or self.calls >= 2 * self.settle))

    def _regroup(self, seq: list[int], begin: int) -> None:
        """The hooks so far as steps of the learned cycle, of the calls `seq` (from hook
        learn_from on; the last, this one's, to come), begun at call `begin`: the calls that
        complete it, each with the own time of the calls since the one before, the calls after
        the last pending (the live file rewritten). Before `begin` a call ends a step unless
        the next goes on with the cycle's iteration (both of optimizers the cycle holds, the
        next not starting the cycle's first run): a critic's warm-up calls before its
        generator's, a generator's pretraining, each iteration a step."""
        cycle = self.cycle
        assert cycle is not None
        n, lead = len(cycle), cycle[0]
        single = n == 1 or cycle[1] != lead  # the cycle's first run is one call

        def ends(i: int) -> bool:
            if i >= begin:
                return (i - begin) % n == n - 1
            this, after = seq[i], seq[i + 1]
            starts = after == lead and (this != lead or single)
            return starts or this not in cycle or after not in cycle

        calls = len(self.hook_ns)
        kept = [*range(self.learn_from),
                *(self.learn_from + i for i in range(len(seq) - 1) if ends(i))]
        self.phase = (len(seq) - 1 - begin) % n
        own = [self.optimizer_ns.get(i, 0) for i in range(calls)]
        self.optimizer_ns = {k: sum(own[(kept[k - 1] + 1 if k else 0):i + 1])
                             for k, i in enumerate(kept)}
        self.pending_ns += sum(own[kept[-1] + 1 if kept else 0:])
        self.hook_ns = [self.hook_ns[i] for i in kept]
        self.hook_faults = [self.hook_faults[i] for i in kept]
        self.hook_delays = [self.hook_delays[i] for i in kept]
        self.hook_threads = [self.hook_threads[i] for i in kept]
        self.hook_compile = [self.hook_compile[i] for i in kept]
        self.hook_loader = [self.hook_loader[i] for i in kept]
        self.hook_loaded = [self.hook_loaded[i] for i in kept]
        if self.live_fd >= 0:
            os.ftruncate(self.live_fd, 0)
            os.write(self.live_fd, b"".join(b"%d\n" % t for t in self.hook_ns))

    def drop_forward_hooks(self) -> None:
        while self.forward_hooks:
            self.forward_hooks.pop().remove()

    def on_step(self, *_: object) -> None:
        if os.getpid() != self.pid:  # a forked child stepping before _forked() ran (no hook)
            return
        if self.claim is None:
            self.claim = "RANK" not in os.environ and _mp_child()
        if self.claim:
            self._claim_rank()
        # the run delay right after `now`, in one syscall: a thread is preempted as a syscall
        # returns, after the kernel copied the count, so such a wait falls after both, in the
        # next step's time and reading alike (read before `now`, or as open/read/close, a
        # wait of 8 ms fell into a 0.7 ms step's time and the next one's reading)
        now = time.time_ns()
        delay = _run_delay_ns()
        done = len(self.hook_ns) + 1
        # The marker first, so that ProfilerStep#N ends where the step's last op did; this
        # hook's own work (and the ET's file write) falls at the head of step N+1, before its
        # first op.
        if self.prof is not None:
            if done == self.opened_at + self.count:
                self._stop()
            else:
                self.prof.step()
                # when step() returned: ProfilerStep#N ended between this and hook_ns[-1]
                self.step_done_ns[done - 1] = time.time_ns()
            if self.et is not None:
                self._stop_et()
        self.hook_ns.append(now)
        self.hook_faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt)
        self.hook_delays.append(delay)
        self.hook_threads.append(_get_num_threads())
        self.hook_compile.append(self.compile_ns)
        self.hook_loader.append(self.loader_ns)
        self.hook_loaded.append(self.loaded.copy())
        if self.live_fd < 0:
            self.live_fd = os.open(self.live, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.write(self.live_fd, b"%d\n" % now)
        # A forward-driven window waits one step more: a backward between two forwards (a
        # training loop after an evaluation) takes over before it opens.
        if self.opened_at < 0 and done >= self.skip + (self.driver == "forward") \
                and self.settled():
            self.start()

    def open_here(self) -> bool:
        """Whether this process's window is open (its profiler recording)."""
        return self.prof is not None and os.getpid() == self.pid and not self.in_worker

    def flag(self) -> str:
        """Exists while this process's profiling window is open (DataLoader workers look)."""
        return _flag(self.out, self.pid)

    def start(self) -> None:
        import torch
        from torch.profiler import ProfilerAction, ProfilerActivity, profile

        if self.aside_at is not None:
            return
        self._drop_superseded()  # first: the execution trace opens its file as it registers
        self.opened_at = len(self.hook_ns)
        # the script's TF32 settings (torch.backends.cuda.matmul.allow_tf32,
        # torch.backends.cudnn.allow_tf32) as it runs: set on a CPU too, where they change
        # nothing, and what predict --device needs to price its matrix products on a GPU
        with contextlib.suppress(AttributeError, RuntimeError):
            self.fp32 = {"fp32_matmul": "tf32" if torch.backends.cuda.matmul.allow_tf32
                         else "ieee", "fp32_conv": "tf32" if torch.backends.cudnn.allow_tf32
                         else "ieee"}
        reserve_heap(self.reserve_mib)
        activities = [ProfilerActivity.CPU]
        cuda = torch.cuda.is_available()
        if cuda:
            activities.append(ProfilerActivity.CUDA)
        self.runtime = {"threads": torch.get_num_threads(), "cuda": cuda}
        # A schedule (always RECORD) is what makes torch emit ProfilerStep#N markers.
        self.prof = profile(activities=activities, record_shapes=True,
                            schedule=lambda _step: ProfilerAction.RECORD, **_any_thread())
        self.prof.step_num = self.opened_at  # ProfilerStep#N names the iteration index
        if self.with_et and not _rpc_agent():
            from torch.profiler import ExecutionTraceObserver

            self.et = ExecutionTraceObserver()
            self.et.register_callback(os.path.join(self.out, f"et-{self.stem}.json"))
            # The observer logs its start, its stop and each op it cannot record as torch's
            # C++ warnings, the last with the exception's C++ stack trace (some 40 lines an op;
            # every op on a nested tensor, whose sizes NestedTensorImpl refuses, as on the
            # encoder fast path under a padding mask): on the program's stderr. Those are held
            # back while it runs; the program's warnings from Python (TORCH_WARN of an op it
            # calls too) are Python's and still appear (a C++ warning of a thread with no
            # Python on it, an autograd device thread's, in that step is held back too), and
            # the Run names the ops the trace lacks (execution_trace.join_warnings).
            self.cpp_log_level = _cpp_log_level(_CPP_LOG_ERROR)
            self.et.start()
        self.windows += 1
        # before the profiler: the first step's marker opens last. Whole as it appears (written,
        # then renamed): a worker reading it empty had marked its trace with no window, which
        # then outlived its window's drop
        _write_whole(self.flag(), str(self.windows))
        self.starting = True
        try:
            with _kineto_quiet():
                self.prof.start()
        finally:
            self.starting = False

    def stand_aside(self) -> None:
        """The program starts its own torch profiler: close this window now (its trace
        exported as it stands) and open none later."""
        if self.aside_at is not None:
            return
        self.aside_at = len(self.hook_ns)
        if self.et is not None:
            self._stop_et()
        if self.prof is not None:  # its last marker is cut where the program's began
            self.cut_at = len(self.hook_ns)
            self._stop()

    def _stop_et(self) -> None:
        self.et.stop()
        self.et.unregister_callback()
        self.et = None
        if self.cpp_log_level is not None:
            _cpp_log_level(self.cpp_log_level)
            self.cpp_log_level = None

    def _stop(self) -> None:
        prof, self.prof = self.prof, None
        with _kineto_quiet():
            prof.stop()  # first: the last step's marker ends where its last op did
        with contextlib.suppress(OSError):
            os.remove(self.flag())
        _export(prof, self.out, self.stem)
        del prof
        _free_profiler()

    def flush(self) -> None:
        """At exit (also after Ctrl-C): close an open window, then write the step times (none
        from a process that never stepped nor opened a window, e.g. torchrun's agent, which
        imports torch.optim)."""
        if os.getpid() != self.pid or self.in_worker:
            return
        if self.superseded is not None and self.prof is None and self.opened_at < 0:
            for name, value in self.superseded.items():  # the optimizer's window never opened
                if name in self._KEPT:
                    setattr(self, name, value)
            self.superseded = None
        if not (self.hook_ns or self.prof):
            if self.unstepped and any(self.waited.values()):  # the collector tells why
                _write_whole(os.path.join(self.out, f".unstepped-{self.stem}.json"),
                             json.dumps(self.waited))
            return
        if self.et is not None:
            self._stop_et()
        cut = self.cut_at
        if self.prof is not None:  # the window still open: its last marker is the exit's
            cut = len(self.hook_ns)
            self._stop()
        self._write_steps(cut)
        if self.live_fd >= 0:  # the .json holds every hook time now
            os.close(self.live_fd)
            os.unlink(self.live)

    def _write_steps(self, cut: int | None) -> None:
        """The steps file (`steps-….json`, whole: a temporary file renamed), of the steps
        counted now."""
        _write_whole(os.path.join(self.out, f"steps-{self.stem}.json"), json.dumps({
            "rank": self.rank, "pid": self.pid, "hook_ns": self.hook_ns,
            "hook_faults": self.hook_faults, "hook_delays": self.hook_delays,
            "hook_threads": self.hook_threads, "hook_compile": self.hook_compile,
            "hook_loader": self.hook_loader, "hook_loaded": self.hook_loaded,
            "step_done_ns": self.step_done_ns,
            "optimizer_ns": self.optimizer_ns, "batches": self.batches, "inputs": self.inputs,
            "forward_ns": self.forward_ns,
            "cut_step": cut, "aside_at": self.aside_at, "unsettled": not self.settled(),
            "torch": getattr(sys.modules.get("torch"), "__version__", None),
            "window_on": self.driver, **self.fp32, **self.runtime, **self.loaders}))


def _get_num_threads() -> int:
    """torch.get_num_threads() (the hooks run once torch is imported): a C call, 0.1 us."""
    return int(sys.modules["torch"].get_num_threads())


_SCHEDSTAT: dict[tuple[int, int], int] = {}  # (pid, thread) -> its schedstat, open


def _run_delay_ns() -> int:
    """The calling thread's time on a runqueue so far (ns, schedstat's second field), -1 where
    the kernel keeps no schedstat. The file stays open, one per process and thread (a forked
    child's thread is another), and is read with one pread."""
    key = (os.getpid(), threading.get_ident())
    try:
        if key not in _SCHEDSTAT:
            _SCHEDSTAT[key] = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        return int(os.pread(_SCHEDSTAT[key], 64, 0).split()[1])
    except (OSError, ValueError, IndexError):
        return -1


_CPP_LOG_ERROR = 2  # c10's severities: 0 INFO, 1 WARNING, 2 ERROR, 3 FATAL


def _cpp_log_level(level: int) -> int | None:
    """Set the threshold of torch's C++ log (c10's FLAGS_caffe2_log_level, which
    TORCH_CPP_LOG_LEVEL sets as torch loads; read at each message); the threshold it replaces,
    None (nothing set) where this torch's libc10 exports none."""
    import ctypes

    import torch

    try:
        lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so"))
        flag = ctypes.c_int.in_dll(lib, "FLAGS_caffe2_log_level")
    except (OSError, ValueError):
        return None
    replaced, flag.value = flag.value, level
    return replaced


_KINETO_QUIET = 6  # above Kineto's severities (0 VERBOSE .. 4 ERROR, 5 USDT): it logs nothing
_KINETO_UNSET = 7  # a level no init sets while KINETO_LOG_LEVEL reads _KINETO_QUIET


@contextlib.contextmanager
def _kineto_quiet() -> Iterator[None]:
    """Hold back Kineto's log while this window's profiler starts or stops: its
    SyncActivityProfilerHandler writes a `USDT: ... profiler_start` and a `profiler_stop` line
    on the program's stderr (torch 2.13), and its warnings. Kineto's threshold
    (libkineto::Logger::severityLevel_, exported by libtorch_cpu) is read at each message.
    The first profiler of a process initializes Kineto as it starts, which sets the threshold
    from KINETO_LOG_LEVEL and then (torch's suppressLogMessages) to ERROR where that is unset:
    it reads a quiet KINETO_LOG_LEVEL then, and the threshold is then set as that init would
    have with the user's environment, so a profiler of the program's own logs as it would
    bare. Nothing is held back where this torch exports no threshold."""
    import ctypes

    import torch

    try:
        lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib",
                                       "libtorch_cpu.so"))
        level = ctypes.c_int.in_dll(lib, "_ZN9libkineto6Logger14severityLevel_E")
        suppress = lib.suppressLibkinetoLogMessages
    except (OSError, ValueError, AttributeError):
        yield
        return
    before, level.value = level.value, _KINETO_UNSET
    users = os.environ.get("KINETO_LOG_LEVEL")
    os.environ["KINETO_LOG_LEVEL"] = str(_KINETO_QUIET)
    try:
        yield
    finally:
        if users is None:
            del os.environ["KINETO_LOG_LEVEL"]
        else:
            os.environ["KINETO_LOG_LEVEL"] = users
        if level.value == _KINETO_UNSET:  # Kineto was initialized before
            level.value = before
        else:  # by this start: as libkineto_init, then torch, set it
            if users is not None:
                level.value = _atoi(users)
            suppress()


def _atoi(text: str) -> int:
    """C's atoi, as Kineto reads KINETO_LOG_LEVEL: the leading integer, 0 where none."""
    import re

    found = re.match(r"\s*[+-]?\d+", text)
    return int(found[0]) if found else 0


def _mp_child() -> bool:
    """Whether this process is a multiprocessing child (spawned; a forked one is told)."""
    mp = sys.modules.get("multiprocessing")
    return mp is not None and mp.parent_process() is not None


def _write_whole(path: str, text: str) -> None:
    """Write `path` whole: a temporary file renamed, so a reader never sees it half-written."""
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def _flag(out: str, pid: int) -> str:
    return os.path.join(out, f".window-pid{pid}")


def _rpc_agent() -> bool:
    """Whether this process serves torch.distributed.rpc: torch's ExecutionTraceObserver
    segfaults in its distributed autograd's backward (dist_autograd.backward, torch 2.13, with
    no recorder too), so such a process's window runs without the execution trace."""
    rpc = sys.modules.get("torch.distributed.rpc.api")
    return rpc is not None and bool(rpc._is_current_rpc_agent_set())


def _any_thread() -> dict[str, Any]:
    """profile()'s keywords for a window opened off the main thread (a training thread, a
    server's threads: torch.distributed.rpc's pool runs a remote module's forwards). torch's
    profiler is otherwise the opening thread's alone: stepped and stopped by another thread's
    request, it found no session there and its export segfaulted. Profiling every thread lets
    whichever thread ends a step step it or stop it. None where torch has no such setting."""
    import threading

    if threading.current_thread() is threading.main_thread():
        return {}
    try:
        from torch._C._profiler import _ExperimentalConfig

        return {"experimental_config": _ExperimentalConfig(profile_all_threads=True)}
    except (ImportError, TypeError):
        return {}


def _drop_inherited_profiler() -> None:
    """Drop the profiler state a child forked while the window was open inherited (the forking
    thread's copy of its parent's, still on), without reading it. Left on, the child recorded
    every op into that copy (a DataLoader worker's ops 2-5x their time), and its own profiler's
    start (a worker's, at its first fetch in the window) freed the parent's events, touching
    their copy-on-write pages: 10 us of CPU an event, 2.3 s for the first batch of a new
    epoch's worker (denoising-diffusion-pytorch's Trainer). Read instead (torch's
    _disable_profiler), it cost as much. The legacy disable pops the state off the thread and
    removes its callbacks; an empty session then ends Kineto's inherited one, whose
    cancelling torch warns of on stderr (TORCH_WARN, which the C++ log's threshold does not
    hold back): the child's stderr goes to /dev/null meanwhile, its one thread (just forked)
    the only writer. Both: 30 ms of CPU after 50,000 events, where the start had taken 0.7 s
    to free them."""
    from torch._C import _autograd as untyped
    from torch.autograd import profiler

    autograd: Any = untyped  # its stubs lack the disable's options
    if not autograd._profiler_enabled():  # forked by another thread than the window's
        return
    with _stderr_to_devnull(), contextlib.suppress(RuntimeError, AttributeError, TypeError):
        # (cleanupTLSState, consolidate); called without options it hung in a forked child
        autograd._disable_profiler_legacy(autograd._ProfilerDisableOptions(True, False))
        empty: Any = profiler.profile(use_cpu=True, use_kineto=True)
        empty.__enter__()
        empty.__exit__(None, None, None)


@contextlib.contextmanager
def _stderr_to_devnull() -> Iterator[None]:
    """File descriptor 2 on /dev/null meanwhile (C++ writes there; a process with no stderr
    is left as it is)."""
    try:
        stderr = os.dup(2)
    except OSError:
        yield
        return
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(stderr, 2)
        os.close(stderr)
        os.close(null)


def _free_profiler() -> None:
    """Free a stopped profiler now. Its bound methods make reference cycles, so dropping it
    leaves its events to a later full collection; meanwhile the memory they hold keeps the
    heap from reusing freed tensor buffers, and every step after the window page-faulted
    about 3,000 times more and ran 15-20% slower (CPU trainer)."""
    import gc

    gc.collect()


def _export(prof: Any, out: str, stem: str) -> None:
    tmp = os.path.join(out, f".torch-{stem}.tmp")
    prof.export_chrome_trace(tmp)
    os.replace(tmp, os.path.join(out, f"torch-{stem}.pt.trace.json"))


class _WorkerWindow:
    """A DataLoader worker's profiling, following its parent's window flag batch by batch.

    It uses the autograd profiler (Kineto, as torch.profiler does underneath) directly:
    torch.profiler's start imports torch._inductor, a second of CPU in a fresh worker, which
    the training loop would wait for inside its profiled steps.

    A worker forked while its parent's window was open (a new epoch's, in the window) traces
    nothing: Kineto, started again in a child that inherited its parent's live session (dropped,
    `_drop_inherited_profiler`), could crash the worker as its profiler stopped at exit
    (SIGSEGV in `_disable_profiler`), and the parent's loop with it ("DataLoader worker ... is
    killed by signal: Segmentation fault"): 6 of 22 recordings of a 2-worker loop whose window
    held two epoch starts, once the parent also timed its workers' starts; 0 of 72 before that,
    0 of 20 with such workers untraced (docs/benchmarks.md, thirty-second pass).
    """

    inherited = False  # set in a worker forked while the window was open (_Window.forked)

    def __init__(self, out: str) -> None:
        self.out = out
        self.flag = _flag(out, os.getppid())
        rank = int(os.environ.get("RANK", "0") or 0)
        self.stem = f"rank{rank}-pid{os.getpid()}"
        self.prof: Any = None  # set while tracing
        self.mark = ""  # its mark of the parent's window it traced
        self.traced: Any = None  # the stopped profiler, its trace not written yet
        self.done = _WorkerWindow.inherited  # (never started)

    def before_fetch(self) -> bool:
        """Start or stop with the parent's window; whether this batch is profiled."""
        if self.done:
            return False
        if self.prof is None:
            with contextlib.suppress(OSError), open(self.flag) as f:
                window = f.read().strip()
                from torch.autograd import profiler

                # which of the parent's windows this traces: one a better driver takes over
                # drops its workers' traces (_Window._drop_superseded)
                self.mark = os.path.join(self.out, f".worker-pid{os.getppid()}-w{window}-pid"
                                                   f"{os.getpid()}")
                with open(self.mark, "w") as m:
                    m.write(self.stem)
                prof: Any = profiler.profile(use_cpu=True, record_shapes=True, use_kineto=True)
                with _kineto_quiet():
                    prof.__enter__()
                self.prof = prof
                _stop_on_sigterm(self)
        elif not os.path.exists(self.flag):
            self.close()
        return self.prof is not None

    def close(self) -> None:
        """Stop tracing as the parent's window closes. The trace is written when the worker
        leaves (stop): written here, with a collection to free it, it held the worker's next
        batch 180 ms, and a loop waiting on its workers saw two steps after the window as long
        as the export step, one a worker."""
        if self.prof is not None:
            self.traced, self.prof = self.prof, None
            self.done = True
            with _kineto_quiet():
                self.traced.__exit__(None, None, None)

    def stop(self) -> None:
        """Write the trace, as the worker leaves (it needs no freeing: the process ends)."""
        self.close()
        if self.traced is not None and os.path.exists(self.mark):  # (else its window was dropped)
            prof, self.traced = self.traced, None
            _export(prof, self.out, self.stem)
            if not os.path.exists(self.mark):  # dropped meanwhile
                with contextlib.suppress(OSError):
                    os.remove(os.path.join(self.out, f"torch-{self.stem}.pt.trace.json"))


def _stop_on_sigterm(window: _WorkerWindow) -> None:
    """Write the trace when the worker is terminated. At exit multiprocessing terminates its
    daemonic children, DataLoader workers among them, when the loader was not shut down first
    (a module-level iterator outlives the atexit hooks). Installed once tracing, after torch
    installed its handlers: a handler the worker's code set in Python is called after; else
    the worker exits quietly, as torch's own handler (C, not in Python's table, which a forked
    worker inherits from its parent as SIG_DFL) does for its parent's terminate(). Dying by
    the signal instead made the parent's SIGCHLD handler raise "DataLoader worker ... is
    killed by signal: Terminated" at exit whenever it ran before the worker was reaped."""
    import signal

    previous = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum: int, frame: Any) -> None:
        window.stop()
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:
            os._exit(0)

    signal.signal(signal.SIGTERM, on_sigterm)


def _wrap_worker_loop(module: ModuleType, out: str) -> None:
    """Make `_worker_loop` (what DataLoader starts its workers with) profile the worker.

    functools.wraps keeps its module and name, so a spawned worker, which unpickles the
    target by name, gets this wrapper too (its own sitecustomize wrapped it on import).
    """
    import functools

    loop: Callable[..., Any] = vars(module)["_worker_loop"]

    @functools.wraps(loop)
    def worker_loop(*args: Any, **kwargs: Any) -> Any:
        from torch.profiler import record_function
        from torch.utils.data import _DatasetKind  # torch.utils.data is whole by now

        _Window.in_worker = True
        window = _WorkerWindow(out)
        create: Callable[..., Any] = _DatasetKind.create_fetcher  # patched in this worker only

        def create_fetcher(*a: Any, **kw: Any) -> Any:
            fetcher = create(*a, **kw)
            fetch = fetcher.fetch

            def fetch_in_window(index: Any) -> Any:
                if window.before_fetch():
                    with record_function(FETCH):  # each profiled batch as one span
                        return fetch(index)
                return fetch(index)

            fetcher.fetch = fetch_in_window
            return fetcher

        _DatasetKind.create_fetcher = staticmethod(create_fetcher)  # type: ignore[method-assign]
        try:
            return loop(*args, **kwargs)
        finally:
            window.stop()  # workers leave by os._exit: no atexit

    vars(module)["_worker_loop"] = worker_loop


def _watch_loaders(window: _Window, module: ModuleType) -> None:
    """Note a DataLoader iterated with pin_memory=True whose iterator pins nothing: torch turns
    the option off where no accelerator is (it warns on stderr), and on MPS. Wrapped where the
    loader makes its iterator, above the iterator's __init__: torch's warning names its
    caller's line (stacklevel), which a wrapper of __init__ would have become.

    And time, in the stepping process, what starting a loader's workers takes
    (window.loader_ns): a new iterator of a loader with workers (a new epoch's, unless
    persistent_workers: its workers forked), its first batch from each worker (their first
    fetches; the rest of its batches unwrapped: the instance's `_next_data` goes back to the
    class's), and the workers' shutdown as an iterator runs out (joined).

    And count what each batch an iterator returns holds (window.loaded, _count_batches)."""
    _count_batches(window, vars(module)["_BaseDataLoaderIter"])
    loader_type: type = vars(module)["DataLoader"]
    iter_type: type = vars(module)["_MultiProcessingDataLoaderIter"]
    get: Callable[..., Any] = loader_type._get_iterator  # type: ignore[attr-defined]
    shutdown: Callable[[Any], None] = iter_type._shutdown_workers  # type: ignore[attr-defined]
    next_data: Callable[[Any], Any] = iter_type._next_data  # type: ignore[attr-defined]

    def stepping() -> bool:
        return os.getpid() == window.pid and not window.in_worker

    def first_batches(it: Any) -> Callable[[], Any]:
        ref = weakref.ref(it)  # no cycle: an iterator dropped unread is shut down as before
        left = it._num_workers  # the workers take the first batches in turn: each one's first

        def timed() -> Any:
            nonlocal left
            this = ref()
            left -= 1
            if left <= 0:
                del vars(this)["_next_data"]
            begun = time.time_ns()
            try:
                return next_data(this)
            finally:
                window.loader_ns += time.time_ns() - begun

        return timed

    def get_then_note(this: Any) -> Any:
        begun = time.time_ns()
        it = get(this)
        if isinstance(it, iter_type) and stepping():
            window.loader_ns += time.time_ns() - begun
            vars(it)["_next_data"] = first_batches(it)
        if getattr(this, "pin_memory", False) and not getattr(it, "_pin_memory", True):
            window.loaders["pin_memory_unused"] = True
        return it

    def shutdown_timed(this: Any) -> None:
        timed = not getattr(this, "_shutdown", True) and stepping()  # (again from __del__)
        begun = time.time_ns()
        try:
            shutdown(this)
        finally:
            if timed:
                window.loader_ns += time.time_ns() - begun

    loader_type._get_iterator = get_then_note  # type: ignore[attr-defined]
    iter_type._shutdown_workers = shutdown_timed  # type: ignore[attr-defined]


_SIZES = "_perfswarm_sizes"  # an iterator's drawn batches' samples, not yet returned


def _count_batches(window: _Window, base: type) -> None:
    """Count, in every process but a DataLoader's workers, each batch a DataLoader iterator
    returns to it (its
    `__next__`, below the loader's `enumerate(DataLoader)` range): its tensors
    (_perfswarm_batch.batch_tensors) and, where the loader batches by a batch sampler, its
    samples: the length of the index list drawn for it (`_next_index`: a workers' loader
    draws ahead, and returns its batches in the order drawn; `_reset`, a new epoch of
    persistent workers, drops those drawn and never returned). Where torch's autograd is on
    as it returns (a training step's batch; an evaluation's under no_grad or inference_mode
    is not), its samples are counted apart too. An IterableDataset's last batch is counted
    as its loader's batch size, and a loader of `in_order=False` returns a short batch where
    its full ones are counted."""
    import collections

    torch: Any = sys.modules["torch"]
    take: Callable[[Any], Any] = base.__next__  # type: ignore[attr-defined]
    draw: Callable[[Any], Any] = base._next_index  # type: ignore[attr-defined]
    reset: Callable[..., None] = base._reset  # type: ignore[attr-defined]

    def drawn(this: Any) -> Any:
        index = draw(this)
        sizes = vars(this).get(_SIZES)
        if sizes is None:
            sizes = vars(this)[_SIZES] = collections.deque()
        sizes.append(index_samples(index) if this._auto_collation else None)
        return index

    def reset_drawn(this: Any, *args: Any, **kwargs: Any) -> None:
        vars(this).pop(_SIZES, None)
        reset(this, *args, **kwargs)

    def counted(this: Any) -> Any:
        batch = take(this)
        sizes = vars(this).get(_SIZES)
        samples = sizes.popleft() if sizes else None
        if not window.in_worker:  # (no getpid: 0.7 us; a forked child counts for its own)
            loaded = window.loaded
            loaded[0] += 1
            loaded[1] += batch_tensors(batch, torch.Tensor)
            if samples is not None:
                loaded[2] += samples
                if torch.is_grad_enabled():
                    loaded[3] += samples
        return batch

    base.__next__ = counted  # type: ignore[attr-defined]
    base._next_index = drawn  # type: ignore[attr-defined]
    base._reset = reset_drawn  # type: ignore[attr-defined]


def _install(window: _Window, module: ModuleType) -> None:
    _step_after_optimizers(window, vars(module)["Optimizer"])
    atexit.register(window.flush)
    _watch_optimizers(window, vars(module)["Optimizer"])


def _step_after_optimizers(window: _Window, optimizer: type) -> None:
    """Each outermost optimizer.step() ends a step once it has returned. torch runs step
    post-hooks inside the step's `Optimizer.step#` range, so a ProfilerStep marker ended from
    one ended inside that range, and the range's rest (the profiler's own step() in it) fell in
    the next step: 0.29 ms of a 27 ms step on an H200, the marker cutting through an op. torch
    wraps each optimizer class's step in Optimizer.profile_hook_step (the range and the
    hooks) at its first instance; this wraps what that makes. An optimizer stepping another
    inside its step (a wrapper optimizer) ends one step, not two."""
    import functools

    make: Callable[[Callable[..., Any]], Callable[..., Any]] = (
        vars(optimizer)["profile_hook_step"].__func__)
    depth = 0
    outer = 0  # the outermost call's optimizer

    def profile_hook_step(func: Callable[..., Any]) -> Callable[..., Any]:
        hooked = make(func)

        @functools.wraps(hooked)
        def step_then_mark(*args: Any, **kwargs: Any) -> Any:
            nonlocal depth, outer
            depth += 1
            key = id(args[0]) if args else 0
            if depth == 1:
                outer = key
            elif key != outer:  # a wrapper optimizer's inner one (not a super().step()): in
                window.inner.add(key)  # no cycle
            start = time.time_ns()
            try:
                out = hooked(*args, **kwargs)
            finally:
                depth -= 1
            if depth == 0 and os.getpid() == window.pid and not window.in_worker:
                window.stepped(key, time.time_ns() - max(start, window.backward_ns))
            return out

        return step_then_mark

    optimizer.profile_hook_step = staticmethod(profile_hook_step)  # type: ignore[attr-defined]


def _watch_optimizers(window: _Window, optimizer: type) -> None:
    """The first optimizer built makes the optimizer drive the window. SKIP 0: no step has
    ended before step 0, so its window opens then (torch.optim loads with torch itself, too
    early to start a profiler). Every one built is noted (_Window.built)."""
    import functools

    init: Callable[..., None] = vars(optimizer)["__init__"]

    @functools.wraps(init)
    def init_then_note(this: Any, *args: Any, **kwargs: Any) -> None:
        init(this, *args, **kwargs)
        if os.getpid() == window.pid and not window.in_worker:
            window.built.add(this)

    @functools.wraps(init)
    def init_then_open(this: Any, *args: Any, **kwargs: Any) -> None:
        init_then_note(this, *args, **kwargs)
        if os.getpid() == window.pid and not window.in_worker:
            optimizer.__init__ = init_then_note  # type: ignore[misc]
            if window.opened_at < 0 and window.driver != "optimizer":
                window.driver = "optimizer"
                window.unstepped = True  # the forward hooks stay until it steps
                window._clear_steps()
                if window.skip == 0:
                    window.start()
            elif window.driver != "forward":  # (a window open on forwards keeps counting them)
                window.drop_forward_hooks()

    optimizer.__init__ = init_then_open  # type: ignore[misc]


def _yield_to_programs_profiler(window: _Window, module: ModuleType, method: str) -> None:
    """The program's own profiler makes this process's window stand aside first, as it starts
    (torch.profiler.profile's start: from then on its step() opens ProfilerStep ranges, which
    a window open meanwhile recorded beside its own) or prepares a trace
    (torch.autograd.profiler.profile's, which torch.profiler's uses too): torch runs one
    Kineto session at a time, and the program's crashed (SIGSEGV in its export) when this
    window's stop ended it."""
    import functools

    cls = vars(module)["profile"]
    begin: Callable[..., Any] = vars(cls)[method]

    @functools.wraps(begin)
    def begin_after_window(this: Any, *args: Any, **kwargs: Any) -> Any:
        if not window.starting and os.getpid() == window.pid and not window.in_worker:
            window.stand_aside()
        return begin(this, *args, **kwargs)

    setattr(cls, method, begin_after_window)


def _watch_backward(window: _Window, autograd: ModuleType) -> None:
    """Each autograd backward's end is a step (Tensor.backward calls torch.autograd.backward)."""
    import functools

    backward: Callable[..., Any] = vars(autograd)["backward"]

    @functools.wraps(backward)
    def backward_then_step(*args: Any, **kwargs: Any) -> Any:
        out = backward(*args, **kwargs)
        window.backward_ns = time.time_ns()
        window.on_event("backward")
        return out

    vars(autograd)["backward"] = backward_then_step


SERVE = "rpc_serve"  # a request's Python function run on its callee: `rpc_serve#FUNC(WORKER)`


def _trace_rpc_requests(window: _Window, api: ModuleType) -> None:
    """Name each torch.distributed.rpc request this process sends in a profiled window as
    torch's profiler key names it (`rpc_sync#FUNC(CALLER -> CALLEE)`, `rpc_async#...`), a range
    from its send to its reply's arrival: torch names them so only under its legacy profiler
    (which makes this window stand aside); the range ends, as there, when the request's future
    completes (an rpc_sync's when its wait returns). rpc_sync, rpc_async and the RRef proxies
    (`rref.rpc_sync().f()`) all send through `_invoke_rpc`. FUNC as torch names it: a builtin
    op's (`aten::add`), a TorchScript function's qualified name (`__torch__.module.function`:
    its callee records an op of the function's name), else the Python function's
    (`_python_name`: any callable torch sends, a partial or a callable object too). torch's own
    `rpc_async_jit#` range of a TorchScript request reached the trace for 1 of 10 requests
    (torch 2.13). A remote() is not named."""
    import functools

    invoke: Callable[..., Any] = vars(api)["_invoke_rpc"]

    @functools.wraps(invoke)
    def invoke_in_range(to: Any, func: Any, rpc_type: Any, *args: Any, **kwargs: Any) -> Any:
        import torch

        # torch refuses a function that is not callable (TypeError) before naming it
        if not window.open_here() or not callable(func):
            return invoke(to, func, rpc_type, *args, **kwargs)
        builtin: Callable[[Any], str | None] = vars(torch.jit._builtins)["_find_builtin"]
        name = builtin(func) or (torch._jit_internal._qualified_name(func)
                                 if isinstance(func, torch.jit.ScriptFunction)
                                 else _python_name(func))
        key = api._build_rpc_profiling_key(rpc_type, name, api.get_worker_info().name,
                                           api._to_worker_info(to).name)
        rf: Any = torch.autograd.profiler.record_function(key)
        rf.__enter__()
        try:
            fut = invoke(to, func, rpc_type, *args, **kwargs)
        except BaseException:
            rf.__exit__(None, None, None)
            raise
        if rpc_type is api.RPCExecMode.SYNC:  # rpc_sync's own wait() ends it, on this thread
            return _Waited(fut, rf)
        return rf._call_end_callbacks_on_future(fut)

    vars(api)["_invoke_rpc"] = invoke_in_range


def _python_name(func: Any) -> str:
    """An RPC's Python function as its request's range and its callee's name it: a
    functools.partial by the function it binds, a callable object (no `__qualname__`) by its
    class."""
    import functools

    while isinstance(func, functools.partial):
        func = func.func
    return getattr(func, "__qualname__", None) or type(func).__qualname__


class _Waited:
    """What rpc_sync waits on (its request's future, which it waits on at once and nothing else
    sees): the request's range ends as the wait returns, the reply unpickled, on the calling
    thread. Ended by the future's callback, it had ended 150-270 us before the step did, the
    rest untraced (rpc_server.py's trainer, steps 4-6: 2.4-3.5% of each)."""

    def __init__(self, fut: Any, rf: Any) -> None:
        self.fut, self.rf = fut, rf

    def wait(self) -> Any:
        try:
            return self.fut.wait()
        finally:
            self.rf.__exit__(None, None, None)


def _trace_rpc_serving(window: _Window, internal: ModuleType) -> None:
    """Name each Python request this process runs for another worker in a profiled window
    (`rpc_serve#FUNC(THIS WORKER)`, FUNC as its caller's range names it): torch's RPC handler
    runs every Python function a request carries through `internal._run_function`, which it
    looks up when RPC starts."""
    import functools

    run: Callable[..., Any] = vars(internal)["_run_function"]

    @functools.wraps(run)
    def run_in_range(python_udf: Any) -> Any:
        func = getattr(python_udf, "func", None)
        if func is None or not window.open_here():
            return run(python_udf)
        from torch.distributed.rpc import get_worker_info
        from torch.profiler import record_function

        with record_function(f"{SERVE}#{_python_name(func)}({get_worker_info().name})"):
            return run(python_udf)

    vars(internal)["_run_function"] = run_in_range


def _watch_compiles(window: _Window, module: ModuleType) -> None:
    """Sums torch.compile's compile time into window.compile_ns: dynamo's callbacks run
    around its outermost compiles (a frame's, and AOT autograd's lazy compile of a compiled
    backward, at the first backward), in every step. torch._dynamo.reset() clears them: the
    compiles after it go unclocked. As a compile begins where an optimizer drives the steps
    (built, not yet stepped: the forward hooks stay until then), the global forward hooks
    (_watch_forward) go before dynamo reads them: traced into the compiled graph and guarded
    on (the count of global hooks), their removal at the first backward had compiled every
    graph again (an MLP's inductor graphs, 0.19 s of its second step)."""

    def began(_: Any) -> None:
        window.compile_began = time.time_ns()
        if window.driver == "optimizer" and os.getpid() == window.pid:
            window.drop_forward_hooks()

    def ended(_: Any) -> None:
        window.compile_ns += time.time_ns() - window.compile_began

    module.callback_handler.register_start_callback(began)
    module.callback_handler.register_end_callback(ended)


NOT_MODELS = ("torch.nn.modules.loss", "torch.ao.quantization")
JIT_TRACE = os.path.join("torch", "jit", "_trace.py")


def _in_jit_trace() -> bool:
    """Whether torch.jit.trace (or trace_module) is on the calling stack: it runs the model's
    forward to trace it, and again, traced and not, to check the trace."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename.endswith(JIT_TRACE):
            return True
        frame = frame.f_back
    return False


def _watch_forward(window: _Window, module: ModuleType) -> None:
    """Each forward of a top-level module (called from no other module's forward) starts a
    step. Global module hooks slow every module call a little: they go when a better driver
    (an optimizer built, a backward seen) takes over. A forward-driven step's input is the
    top-level call's first tensor: a positional one (the pre-hook's), else the first keyword
    one of two dimensions or more, else of one (a Hugging Face model's `model(input_ids=...)`,
    generate()'s calls, whose first keyword was `cache_position`, the positions, in
    transformers 4.45-4.5x: its length had been read as the batch): torch passes a global hook
    the keywords only after the forward, and only a torch that has with_kwargs for global
    hooks."""
    depth = 0
    started = -1  # the hook index of the forward under way that began a step
    unseen = False  # that forward took no positional tensor: its keywords are read after it

    def note(at: int, values: Iterable[Any], dims: int = 1) -> bool:
        """Notes the step's batch and input elements of the first tensor in `values` of `dims`
        dimensions or more."""
        shape = next((s for v in values
                      if (s := getattr(v, "shape", None)) is not None and len(s) >= dims), None)
        if shape is None or not isinstance(shape[0], int):
            return False
        window.batches[at] = shape[0]
        elements = 1
        for n in shape:
            elements *= n if isinstance(n, int) else 1
        window.inputs[at] = elements
        return True

    def before(module: Any, args: Any) -> None:
        nonlocal depth, started, unseen
        depth += 1
        # a loss, a quantization observer (quantize_dynamic runs one on each weight before
        # the loop), or torch.jit.trace's runs of the model before the loop make no step
        if depth == 1 and not type(module).__module__.startswith(NOT_MODELS) \
                and not _in_jit_trace():
            counted = window.on_event("forward")
            if window.driver != "forward" or not window.hook_ns or os.getpid() != window.pid:
                return
            started = len(window.hook_ns) - 1 if counted else -1
            unseen = not note(len(window.hook_ns) - 1, args)

    def after(module: Any, args: Any, *rest: Any) -> None:
        # rest: (kwargs, output), or (output,) where the forward raised or torch's global
        # hooks take no keywords
        nonlocal depth, started
        depth = max(0, depth - 1)
        if depth == 0 and started >= 0:
            if window.driver == "forward" and started < len(window.hook_ns):
                window.forward_ns[started] = time.time_ns() - window.hook_ns[started]
                if unseen and len(rest) == 2 and not note(started, rest[0].values(), 2):
                    note(started, rest[0].values())
            started = -1

    register = vars(module)["register_module_forward_hook"]
    try:
        post = register(after, with_kwargs=True, always_call=True)
    except TypeError:  # a torch whose global hooks take no keywords: positional inputs only
        post = register(after, always_call=True)
    window.forward_hooks += [vars(module)["register_module_forward_pre_hook"](before), post]


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs a hook right after a module has been executed (once per module name)."""

    def __init__(self, hooks: dict[str, Callable[[ModuleType], None]]) -> None:
        self.hooks = hooks

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        hook = self.hooks.pop(name, None)
        if hook is None:
            return None
        if not self.hooks:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_then_hook(module: ModuleType) -> None:
            exec_module(module)
            hook(module)

        loader.exec_module = exec_then_hook  # type: ignore[method-assign]
        return spec


def _chain() -> None:
    """Run the sitecustomize this one shadows, if any, so the user's own keeps working."""
    others = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


def _main() -> None:
    if _DIR:
        skip, _, count = os.environ.get("PERFSWARM_STEPS", "5:10").partition(":")
        window = _Window(_DIR, int(skip), int(count), os.environ.get("PERFSWARM_ET") == "1",
                         int(os.environ.get("PERFSWARM_HEAP_RESERVE", "0") or 0),
                         int(os.environ["PERFSWARM_PATIENCE"]),
                         int(os.environ["PERFSWARM_SETTLE"]))
        os.register_at_fork(after_in_child=window.forked)
        sys.meta_path.insert(0, _AfterImport({
            "torch.optim.optimizer": lambda module: _install(window, module),
            "torch.autograd": lambda module: _watch_backward(window, module),
            "torch.autograd.profiler": lambda module: _yield_to_programs_profiler(
                window, module, "_prepare_trace"),
            "torch.profiler.profiler": lambda module: _yield_to_programs_profiler(
                window, module, "start"),
            "torch.nn.modules.module": lambda module: _watch_forward(window, module),
            "torch._dynamo.callback": lambda module: _watch_compiles(window, module),
            "torch.utils.data._utils.worker": lambda module: _wrap_worker_loop(module, _DIR),
            "torch.utils.data.dataloader": lambda module: _watch_loaders(window, module),
            "torch.distributed.rpc.api": lambda module: _trace_rpc_requests(window, module),
            "torch.distributed.rpc.internal": lambda module: _trace_rpc_serving(window, module),
        }))
    _chain()


_main()
