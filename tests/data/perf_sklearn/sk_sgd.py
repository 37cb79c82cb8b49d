"""The scikit-learn loop whose perf samples are in this folder: 40 partial_fit iterations of
about 40 ms, recorded with `perfswarm record` (perf at its default rate, about 70 Hz of the
process's CPU time: 3 samples an iteration). chance_*: perf, py-spy and system collectors;
unsteady_*: perf, strace and system (the samples of a second recording)."""
import time

import numpy as np
from sklearn.linear_model import SGDClassifier

rng = np.random.default_rng(0)
X = rng.standard_normal((20000, 200))
y = (X[:, 0] + 0.1 * rng.standard_normal(20000) > 0).astype(int)
clf = SGDClassifier(loss="log_loss")
marks = []
for _ in range(40):
    marks.append(time.time_ns())
    idx = rng.integers(0, 20000, 4000)
    Xb = (X[idx] - X[idx].mean(0)) / X[idx].std(0)
    clf.partial_fit(Xb, y[idx], classes=[0, 1])
    clf.score(X[:5000], y[:5000])
print(*marks)
