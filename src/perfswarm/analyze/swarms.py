"""Function swarms: groups of sampled call stacks that spend time in the same code.

Each distinct stack becomes a feature vector: its frames (functions, weighted
towards the leaf: that is where the time goes), the leaf's module, and the leaf's
address relative to its module's span (nearby code lands nearby). After a small
SVD, k-means runs for each k in a range and the k with the best silhouette wins;
samples are weighted by their `weight`. A swarm is captioned by its heaviest leaf
functions and reports its time share and the iterations it lives in. Where a Run has
steps, only the samples inside them are clustered: the training loop, not the start-up
(importing torch alone is seconds of a short script's samples) or what follows the loop.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from perfswarm.analyze.frame import I64, codes
from perfswarm.analyze.intervals import union
from perfswarm.analyze.iterations import StepWindow
from perfswarm.trace.schema import EXPORT
from perfswarm.trace.store import Run

if TYPE_CHECKING:
    import scipy.sparse as sp

MAX_K = 12
SVD_DIMS = 16
SILHOUETTE_SAMPLE = 2_000  # stacks the silhouette is scored on (it is quadratic)
ADDRESS_WEIGHT = 0.5
MODULE_WEIGHT = 1.0
SEED = 0


@dataclass(frozen=True)
class Swarm:
    caption: str
    functions: tuple[str, ...]  # heaviest leaf functions, first = caption's
    modules: tuple[str, ...]
    samples: int
    weight: int
    share: float
    steps: Mapping[int, float]  # step -> share of this swarm's weight in it

    def to_dict(self) -> dict[str, Any]:
        return {"caption": self.caption, "functions": list(self.functions),
                "modules": list(self.modules), "samples": self.samples, "weight": self.weight,
                "share": self.share, "steps": {str(k): v for k, v in self.steps.items()}}


@dataclass(frozen=True)
class Swarms:
    k: int
    silhouette: float | None  # None when k was not chosen (too few distinct stacks)
    swarms: tuple[Swarm, ...]  # heaviest first
    # "steps": the samples inside the steps (the training loop: start-up, the interpreter's
    # import of torch and the time after the loop left out), else "run": every sample
    scope: str = "run"
    sampled_ns: int = 0  # the wall time those samples cover (the steps', or the samples' span)
    left_out: int = 0  # samples outside the steps
    unprofiled: bool = False  # the steps are those timed outside the profiler's window

    def to_dict(self) -> dict[str, Any]:
        return {"k": self.k, "silhouette": self.silhouette, "scope": self.scope,
                "unprofiled": self.unprofiled,
                "sampled_ns": self.sampled_ns, "left_out": self.left_out,
                "swarms": [s.to_dict() for s in self.swarms]}


def features(stacks: pa.Table, stack_ids: I64) -> sp.csr_matrix:
    """One row per stack in `stack_ids`: frames, leaf module, leaf address position."""
    import scipy.sparse as sp  # here, not at the top: a Run without samples never needs it

    sid = np.asarray(stacks.column("stack_id").to_numpy(), np.int64)
    depth = np.asarray(stacks.column("depth").to_numpy(), np.int64)
    func, _ = codes(stacks.column("function"))
    module, _ = codes(stacks.column("module"))
    address = np.asarray(stacks.column("address").to_numpy(), np.float64)
    row_of = {int(s): i for i, s in enumerate(stack_ids)}
    rows = np.array([row_of.get(int(s), -1) for s in sid], np.int64)
    keep = rows >= 0
    rows, depth, func, module, address = rows[keep], depth[keep], func[keep], module[keep], \
        address[keep]
    n = len(stack_ids)
    frames = sp.csr_matrix((1.0 / (1.0 + depth), (rows, func)),
                           shape=(n, int(func.max(initial=0)) + 1))
    frames = sp.csr_matrix(frames.multiply(1.0 / np.sqrt(frames.multiply(frames).sum(axis=1)
                                                         + 1e-12)))
    leaf = depth == 0
    mods = sp.csr_matrix((np.full(int(leaf.sum()), MODULE_WEIGHT), (rows[leaf], module[leaf])),
                         shape=(n, int(module.max(initial=0)) + 1))
    # The leaf's address as a position inside its module's sampled range, 0..1.
    pos = np.zeros(n)
    for m in np.unique(module[leaf]):
        sel = leaf & (module == m)
        lo, hi = address[sel].min(), address[sel].max()
        pos[rows[sel]] = (address[sel] - lo) / (hi - lo) if hi > lo else 0.0
    addr = sp.csr_matrix(ADDRESS_WEIGHT * pos[:, None])
    return sp.csr_matrix(sp.hstack([frames, mods, addr]))


def choose_k(x: np.ndarray[Any, Any], weights: np.ndarray[Any, Any]) -> tuple[np.ndarray[Any, Any],
                                                                             int, float | None]:
    """Labels for the k (2..MAX_K) with the best silhouette; one cluster if too few points."""
    from sklearn.cluster import KMeans
    from sklearn.metrics import silhouette_score

    n = len(x)
    distinct = len(np.unique(np.round(x, 9), axis=0))
    if distinct < 3:
        return np.zeros(n, np.int64), 1, None
    rng = np.random.default_rng(SEED)
    probe = rng.choice(n, SILHOUETTE_SAMPLE, replace=False) if n > SILHOUETTE_SAMPLE else None
    best: tuple[float, int, np.ndarray[Any, Any]] | None = None
    for k in range(2, min(MAX_K, distinct - 1) + 1):
        labels = KMeans(k, n_init=4, random_state=SEED).fit_predict(x, sample_weight=weights)
        if len(np.unique(labels)) < 2:
            continue
        idx = probe if probe is not None else slice(None)
        score = float(silhouette_score(x[idx], labels[idx])) if len(
            np.unique(labels[idx])) > 1 else -1.0
        if best is None or score > best[0] + 1e-9:
            best = (score, k, labels)
    if best is None:
        return np.zeros(n, np.int64), 1, None
    return best[2], best[1], best[0]


@dataclass(frozen=True)
class Labels:
    """Which swarm each distinct stack of the samples fell in."""

    uniq: I64  # distinct stack ids
    inv: I64  # per sample, its row in `uniq`
    labels: np.ndarray[Any, Any]  # per distinct stack, its swarm
    k: int
    silhouette: float | None


def label_stacks(samples: pa.Table, stacks: pa.Table) -> Labels:
    """Cluster the samples' distinct stacks (samples not empty)."""
    stack_of = np.asarray(samples.column("stack_id").to_numpy(), np.int64)
    weight = np.asarray(samples.column("weight").to_numpy(), np.int64)
    uniq, inv = np.unique(stack_of, return_inverse=True)
    stack_weight = np.bincount(inv, weights=weight).astype(np.float64)
    from sklearn.decomposition import TruncatedSVD

    x = features(stacks, uniq)
    dims = min(SVD_DIMS, x.shape[1] - 1, len(uniq) - 1)
    dense = (TruncatedSVD(dims, random_state=SEED).fit_transform(x) if dims >= 2
             else x.toarray())
    labels, k, score = choose_k(dense, stack_weight)
    return Labels(uniq, inv, labels, k, score)


def run_samples(run: Run, columns: list[str] | None = None) -> pa.Table:
    """The Run's samples of the program's own time: not those in a step that holds the
    recorder's trace export (the profiler's stop and its trace written: torch.profiler's and
    the collector's functions, which would lead the swarms of a short run)."""
    samples = run.table("samples", columns)
    steps = run.table("steps", ["start", "end", "source"])
    export = steps.filter(pc.equal(steps.column("source").cast(pa.string()), EXPORT))
    if export.num_rows == 0 or samples.num_rows == 0:
        return samples
    ts = np.asarray(run.table("samples", ["ts"]).column("ts").to_numpy(), np.int64)
    inside = np.zeros(len(ts), bool)
    for lo, hi in zip(export.column("start").to_pylist(), export.column("end").to_pylist(),
                      strict=True):
        inside |= (ts >= lo) & (ts < hi)
    return samples.filter(pa.array(~inside))


def swarms(samples: pa.Table, stacks: pa.Table,
           steps: Mapping[int, Sequence[StepWindow]] | None = None,
           unprofiled: bool = False) -> Swarms:
    """The swarms of the samples inside the steps (any rank's: a launcher's samples carry
    none) where those hold any, else of every sample; `unprofiled`: the steps are those the
    recorder timed outside the profiler's window (iterations.unprofiled_steps)."""
    if samples.num_rows == 0 or stacks.num_rows == 0:
        return Swarms(0, None, ())
    ts = np.asarray(samples.column("ts").to_numpy(), np.int64)
    windows = [w for ws in (steps or {}).values() for w in ws if w.source != EXPORT]
    lo, hi = union(np.array([w.start for w in windows], np.int64),
                   np.array([w.end for w in windows], np.int64))
    at = np.searchsorted(lo, ts, side="right") - 1
    inside = (at >= 0) & (ts < hi[np.maximum(at, 0)]) if len(lo) else np.zeros(len(ts), bool)
    scope, sampled_ns, left_out = "run", int(ts.max() - ts.min()), 0
    if inside.any():
        scope, sampled_ns, left_out = "steps", int((hi - lo).sum()), int((~inside).sum())
        samples = samples.filter(pa.array(inside))
    lab = label_stacks(samples, stacks)
    weight = np.asarray(samples.column("weight").to_numpy(), np.int64)
    found = describe(samples, stacks, lab, weight, steps or {})
    return Swarms(lab.k, lab.silhouette, tuple(sorted(found, key=lambda s: (-s.weight,
                                                                            s.caption))),
                  scope, sampled_ns, left_out, unprofiled and scope == "steps")


def describe(samples: pa.Table, stacks: pa.Table, lab: Labels, weight: I64,
             steps: Mapping[int, Sequence[StepWindow]]) -> tuple[Swarm, ...]:
    """Each swarm's caption, functions, modules, samples, weight and steps, in label order."""
    uniq, inv, labels = lab.uniq, lab.inv, lab.labels
    sid = np.asarray(stacks.column("stack_id").to_numpy(), np.int64)
    depth = np.asarray(stacks.column("depth").to_numpy(), np.int64)
    func, func_names = codes(stacks.column("function"))
    module, module_names = codes(stacks.column("module"))
    leaf = depth == 0
    leaf_of = dict(zip(sid[leaf].tolist(), zip(func[leaf].tolist(), module[leaf].tolist(),
                                                 strict=True), strict=True))
    sample_label = labels[inv]
    ts = np.asarray(samples.column("ts").to_numpy(), np.int64)
    rank = np.asarray(samples.column("rank").to_numpy(), np.int64)
    step_of = np.full(len(ts), -1, np.int64)
    by_time = np.lexsort((ts, rank))
    for r, windows in steps.items():
        mine = by_time[slice(*np.searchsorted(rank[by_time], [r, r + 1]))]
        times = ts[mine]
        for w in windows:  # a later window keeps a sample two windows hold, as it did
            step_of[mine[slice(*np.searchsorted(times, [w.start, w.end]))]] = w.step
    total = int(weight.sum())
    out = []
    for label in np.unique(labels):
        mine = sample_label == label
        w = weight[mine]
        by_leaf: dict[tuple[int, int], int] = {}
        for s, sw in zip(uniq[inv[mine]].tolist(), w.tolist(), strict=True):
            leaf_fm = leaf_of.get(s, (-1, -1))
            by_leaf[leaf_fm] = by_leaf.get(leaf_fm, 0) + sw
        # the caption is the heaviest leaf, a function with its own module (the heaviest
        # function and the heaviest module apart could pair a function with another's file)
        top_f, top_m = min(by_leaf, key=lambda fm: (-by_leaf[fm], fm))
        funcs = _heaviest(by_leaf, 0, func_names, 5, top_f)
        mods = _heaviest(by_leaf, 1, module_names, 3, top_m)
        in_steps = step_of[mine]
        step_share = {int(s): float(w[in_steps == s].sum() / w.sum())
                      for s in np.unique(in_steps) if s >= 0}
        out.append(Swarm(f"{mods[0]}: {funcs[0]}", tuple(funcs), tuple(mods), int(mine.sum()),
                         int(w.sum()), float(w.sum() / total) if total else 0.0, step_share))
    return tuple(out)


def _heaviest(by_leaf: Mapping[tuple[int, int], int], part: int, names: Sequence[str],
              top: int, first: int) -> list[str]:
    """The `top` heaviest functions (part 0) or modules (part 1) of a swarm's leaves, by the
    weight summed over the leaves holding them, the caption's (`first`) leading."""
    total: dict[int, int] = {}
    for fm, weight in by_leaf.items():
        total[fm[part]] = total.get(fm[part], 0) + weight
    order = sorted(total, key=lambda c: (c != first, -total[c], c))[:top]
    return [names[c] if c >= 0 else "?" for c in order]
