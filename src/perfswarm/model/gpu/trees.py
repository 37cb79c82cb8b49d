"""Gradient-boosted regression trees as plain arrays: fitted with scikit-learn (imported only
to fit), evaluated with numpy, saved without pickle (an .npz of numbers loads safely)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]
I32 = npt.NDArray[np.int32]
TREES: Final = 200
DEPTH: Final = 5
RATE: Final = 0.1
LEAF: Final = -1


@dataclass(frozen=True)
class Ensemble:
    """Trees laid end to end: node i splits on feature[i] at threshold[i] (left when <=), or
    is a leaf (left[i] == -1) worth value[i] (already times the learning rate); roots[t] is
    tree t's first node."""

    base: float
    roots: I32
    feature: I32
    threshold: F64
    left: I32
    right: I32
    value: F64

    def predict(self, x: F64) -> F64:
        """The ensemble's value for each row of x: every tree walked at once, a level per
        pass (a per-tree loop cost predict a minute on a 120k-event run), the trees' values
        added in tree order as one by one."""
        rows = np.arange(len(x))[:, None]
        node = np.broadcast_to(self.roots, (len(x), len(self.roots)))
        while (inner := self.left[node] != LEAF).any():
            go_left = x[rows, np.maximum(self.feature[node], 0)] <= self.threshold[node]
            node = np.where(inner, np.where(go_left, self.left[node], self.right[node]), node)
        values = np.concatenate([np.full((len(x), 1), self.base), self.value[node]], axis=1)
        return np.cumsum(values, axis=1)[:, -1]

    def arrays(self, prefix: str) -> dict[str, npt.NDArray[np.generic]]:
        return {f"{prefix}.{k}": v for k, v in (
            ("base", np.array([self.base])), ("roots", self.roots), ("feature", self.feature),
            ("threshold", self.threshold), ("left", self.left), ("right", self.right),
            ("value", self.value))}

    @classmethod
    def of_arrays(cls, data: dict[str, npt.NDArray[np.generic]], prefix: str) -> Ensemble:
        """Raises KeyError for a missing array."""
        return cls(float(data[f"{prefix}.base"][0]), data[f"{prefix}.roots"].astype(np.int32),
                   data[f"{prefix}.feature"].astype(np.int32),
                   data[f"{prefix}.threshold"].astype(np.float64),
                   data[f"{prefix}.left"].astype(np.int32),
                   data[f"{prefix}.right"].astype(np.int32),
                   data[f"{prefix}.value"].astype(np.float64))


def fit(x: F64, y: F64, weight: F64 | None = None, seed: int = 0) -> Ensemble:
    """Least-squares gradient boosting (scikit-learn's GradientBoostingRegressor: TREES trees of
    depth DEPTH, each on every row, weighted by `weight`, 1 without), exported to arrays.
    Every row, not a random 80% of them per tree: with five GPUs, each held out a lookup among
    four, the subsample's seed had moved the leave-one-GPU-out whole-model means by 2 points
    (docs/benchmarks.md). `seed` orders the features the splitter tries, which decides only
    between features that split the rows alike."""
    from sklearn.ensemble import GradientBoostingRegressor

    model = GradientBoostingRegressor(n_estimators=TREES, max_depth=DEPTH, learning_rate=RATE,
                                      random_state=seed)
    model.fit(x, y, sample_weight=weight)
    roots, feature, threshold, left, right, value = [], [], [], [], [], []
    offset = 0
    for (estimator,) in model.estimators_:
        tree = estimator.tree_
        n = tree.node_count
        leaf = tree.children_left == LEAF
        roots.append(offset)
        feature.append(np.where(leaf, LEAF, tree.feature))
        threshold.append(tree.threshold)
        left.append(np.where(leaf, LEAF, tree.children_left + offset))
        right.append(np.where(leaf, LEAF, tree.children_right + offset))
        value.append(tree.value[:, 0, 0] * RATE)
        offset += n
    base = float(model.init_.constant_.ravel()[0])
    return Ensemble(base, np.array(roots, np.int32), np.concatenate(feature).astype(np.int32),
                    np.concatenate(threshold), np.concatenate(left).astype(np.int32),
                    np.concatenate(right).astype(np.int32), np.concatenate(value))
