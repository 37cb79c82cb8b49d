"""`perfswarm tune --space SPACE.yaml [--trials N] [--storage URL] -- CMD...`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from perfswarm.cli.app import app
from perfswarm.defaults import STEP_PATTERN, Measure


@app.command("tune", context_settings={"allow_interspersed_args": False})
def tune_command(
    command: Annotated[list[str], typer.Argument(metavar="-- CMD...", help="The command to tune: a torch.optim training loop (--measure record), or any command that prints one line per step (--measure stdout).")],
    space: Annotated[Path, typer.Option("--space", help="YAML search space: params with name, type (int|float|categorical|bool), low/high or choices, env or flag.")],
    trials: Annotated[int, typer.Option("--trials", "-n", help="Trials to run (this worker); a space of no more configurations is tried whole, each once.")] = 20,
    storage: Annotated[str | None, typer.Option("--storage", help="Optuna RDB URL shared by workers (default: sqlite file in --out).")] = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory for tune.json, trials.json, importance.json and the runs/.")] = Path("tune-out"),
    study: Annotated[str, typer.Option("--study", help="Study name in the storage.")] = "perfswarm-tune",
    measure: Annotated[Measure, typer.Option("--measure", help="record: each run is a light recorded run (torch + system collectors) timed by its optimizer steps; stdout: step times the command prints, for commands without a torch.optim loop.")] = "record",
    step_pattern: Annotated[str, typer.Option("--step-pattern", help="--measure stdout: regex with groups (step)(time)[(unit)] for the step lines.")] = STEP_PATTERN,
    warmup: Annotated[int, typer.Option("--warmup", help="Leading steps left out of the throughput.")] = 1,
    window: Annotated[int, typer.Option("--window", help="--measure record: profiled steps per run, right after the warm-up (left out of the throughput).")] = 2,
    seed: Annotated[int, typer.Option("--seed", help="Sampler seed.")] = 0,
    timeout: Annotated[float | None, typer.Option("--timeout", help="Seconds before a trial is killed (counts as failed).")] = None,
    baseline_repeats: Annotated[int, typer.Option("--baseline-repeats", help="Runs of the command as given before the trials (one more after them, from 2): a trial counts as a speedup above their 95% prediction bound for one more run.")] = 3,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON (keys in docs/cli.md).")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar or line per run (the trials table and the summary still print).")] = False,
) -> None:
    """Search environment variables and command flags for the highest throughput (Optuna)."""
    from rich.table import Table

    from perfswarm.cli.json_output import print_json
    from perfswarm.cli.output import console, progress_bar
    from perfswarm.optimize.space import load_space
    from perfswarm.optimize.tune import TuneOptions, closing_repeats, tune

    options = TuneOptions(out=out, trials=trials, storage=storage, study=study, measure=measure,
                          step_pattern=step_pattern, warmup=warmup, window=window, seed=seed,
                          timeout_s=timeout, baseline_repeats=baseline_repeats)

    with progress_bar(quiet) as bar:
        task = bar.add_task("tuning (baseline + trials)",
                            total=trials + closing_repeats(baseline_repeats))

        def progress(msg: str) -> None:
            if not quiet:
                bar.console.print(msg)
            # One closing line per finished run: the baseline's rate, then each trial's outcome.
            if msg.startswith("trial ") or (msg.startswith("baseline:") and msg.endswith("/s")):
                bar.advance(task)

        result = tune(command, load_space(space), options, progress)
    summary = result.to_dict()
    if as_json:
        print_json(summary)
        return
    table = Table("trial", "state", result.unit, "params", title="trials", title_justify="left")
    for t in result.trials:
        rate = "" if t["throughput"] is None else f"{t['throughput']:.3f}"
        table.add_row(str(t["number"]), t["state"], rate, str(t["params"]))
    console.print(table)
    console.print(f"baseline: {result.baseline_rate:.3f} {result.unit} (median of "
                  f"{len(result.baseline_throughputs)}; noise ±{100 * result.noise:.1f}%)")
    best = result.best
    if best is None:
        console.print("no trial completed")
        return
    verdict = ("" if result.beyond_noise else
               f": within the noise, no speedup shown (it needs over "
               f"{result.noise_bound / result.baseline_rate:.2f}x: {result.noise_bound:.3f} "
               f"{result.unit}, the 95% bound of one more run of the command)")
    console.print(f"best: trial {best['number']} {best['params']}: {best['throughput']:.3f} "
                  f"{result.unit}, {summary['speedup']:.2f}x the baseline{verdict}")
    if summary["importance"]:
        console.print("importance: " + ", ".join(f"{k} {v:.2f}" for k, v in
                                                 sorted(summary["importance"].items(),
                                                        key=lambda kv: -kv[1])))
    console.print(f"wrote {out / 'tune.json'}, {out / 'trials.json'}, {out / 'importance.json'}")
    if best["run"]:
        console.print(f"report of the best run: perfswarm report {best['run']} --tune {out}",
                      soft_wrap=True)
