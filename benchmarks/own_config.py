"""`predict` at each Run's own configuration: the steady steps' measured and predicted median
and mean, the signed error of the medians (what `predict` judges) and of the means, the replay's
error, the steps' spread, how far their median lies from their mean, and the loop threads' run
delay over them, one line a Run.

    .venv/bin/python benchmarks/own_config.py RUN...

The prediction takes each step from its own ops, each op's measured time times its model's
ratio (1 at the Run's own configuration), so there its steps are the replayed ones and the
medians' error is the replay's (docs/benchmarks.md, thirty-second pass). `skew` is the
measured median over the measured mean, less one: the error a prediction of the typical step
(every op at its mean over the steady steps, as `predict` priced them before that pass) read on
the medians even when it had the mean right. `delay` is the share of the steady steps
the ranks' loop threads sat runnable on a runqueue, waiting for a core (their run delay, read
by the recorder at each step hook), `-` where the Run holds no such reading (an imported trace,
a Run recorded before the readings)."""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from perfswarm.analyze.iterations import hook_deltas
from perfswarm.model.predict import Prediction, predict
from perfswarm.trace.schema import HOOK_DELAY
from perfswarm.trace.store import Run


def run_delay(run: Run, p: Prediction) -> float | None:
    """The loop threads' run delay over the steady steps, as a share of those steps' time."""
    steps = run.table("steps")
    keys = pa.array([f"{s.rank}:{s.step}" for s in p.steps if (s.rank, s.step) in p.steady],
                    pa.string())
    mine = steps.filter(pc.is_in(pc.binary_join_element_wise(
        pc.cast(steps.column("rank"), pa.string()), pc.cast(steps.column("step"), pa.string()),
        ":"), value_set=keys))
    delays = hook_deltas(run.table("counters"), mine, HOOK_DELAY)
    timed = ~np.isnan(delays)
    if not timed.any():
        return None
    span = (np.asarray(mine.column("end").to_numpy(), np.int64)
            - np.asarray(mine.column("start").to_numpy(), np.int64))
    return float(delays[timed].sum() / span[timed].sum())


def main(paths: list[Path]) -> None:
    print(f"{'run':28s} {'error':>7s} {'mean':>7s} {'replay':>6s} {'spread':>6s} {'skew':>6s} "
          f"{'delay':>5s} {'steady':>6s} {'meas med':>9s} {'mean':>9s} {'pred med':>9s} "
          f"{'mean':>9s}")
    for path in paths:
        run = Run(path)
        p = predict(run)
        kept = [s for s in p.steps if (s.rank, s.step) in p.steady] or list(p.steps)
        measured = [s.measured_ns / 1e6 for s in kept]
        predicted = [s.predicted_ns / 1e6 for s in kept]
        error = p.predicted_steady_ns / p.measured_steady_ns - 1
        means = statistics.mean(predicted) / statistics.mean(measured) - 1
        skew = statistics.median(measured) / statistics.mean(measured) - 1
        delay = run_delay(run, p)
        print(f"{path.name:28s} {100 * error:+6.2f}% {100 * means:+6.2f}% "
              f"{100 * p.replay_error:5.2f}% {100 * p.steady_spread:5.1f}% {100 * skew:+5.1f}% "
              f"{'-' if delay is None else f'{100 * delay:4.0f}%':>5s} {len(kept):6d} "
              f"{statistics.median(measured):9.3f} {statistics.mean(measured):9.3f} "
              f"{statistics.median(predicted):9.3f} {statistics.mean(predicted):9.3f}",
              flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, metavar="RUN")
    main(parser.parse_args().runs)
