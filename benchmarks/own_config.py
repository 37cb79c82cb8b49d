"""`predict` at each Run's own configuration: the steady steps' measured and predicted median
and mean, the signed error of the medians (what `predict` judges), the replay's error and the
steps' spread, one line a Run.

    .venv/bin/python benchmarks/own_config.py RUN...

The prediction prices every op at its typical time (its mean over the steady steps), so its
mean step is the measured mean where the model holds; a median above it on steps that other
load stretched now and then is that load, not the model (docs/benchmarks.md)."""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from perfswarm.model.predict import predict
from perfswarm.trace.store import Run


def main(paths: list[Path]) -> None:
    print(f"{'run':28s} {'error':>7s} {'replay':>6s} {'spread':>6s} {'steady':>6s} "
          f"{'meas med':>9s} {'mean':>9s} {'pred med':>9s} {'mean':>9s}")
    for path in paths:
        p = predict(Run(path))
        kept = [s for s in p.steps if (s.rank, s.step) in p.steady] or list(p.steps)
        measured = [s.measured_ns / 1e6 for s in kept]
        predicted = [s.predicted_ns / 1e6 for s in kept]
        error = p.predicted_steady_ns / p.measured_steady_ns - 1
        print(f"{path.name:28s} {100 * error:+6.2f}% {100 * p.replay_error:5.2f}% "
              f"{100 * p.steady_spread:5.1f}% {len(kept):6d} {statistics.median(measured):9.3f} "
              f"{statistics.mean(measured):9.3f} {statistics.median(predicted):9.3f} "
              f"{statistics.mean(predicted):9.3f}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, metavar="RUN")
    main(parser.parse_args().runs)
