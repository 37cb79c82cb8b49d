"""Rule: fuse a conv pair of the run (dw->pw, pw->dw, conv->dw, conv->conv) into one kernel, only
where `perfswarm fuse` measured that pair faster fused than PyTorch's two ops on this machine."""

from __future__ import annotations

from collections import Counter
from typing import Any

from perfswarm.model.opstats import op_sequence
from perfswarm.optimize.fuse.layers import run_pairs
from perfswarm.optimize.fuse.plan import default_cache
from perfswarm.optimize.fuse.tune import ScheduleCache
from perfswarm.optimize.rules.base import Advice, advice
from perfswarm.optimize.rules.facts import Facts
from perfswarm.trace.store import host_info


def _measured_here() -> dict[str, dict[str, Any]]:
    """fuse's stored results measured on this CPU, by pair label (the best thread count's)."""
    path = default_cache()
    if not path.is_file():
        return {}
    cpu = str(host_info()["cpu_model"])
    best: dict[str, dict[str, Any]] = {}
    for result in ScheduleCache(path, cpu).results(cpu):
        label = str(result.get("pair"))
        if label not in best or result.get("speedup", 0) > best[label].get("speedup", 0):
            best[label] = result
    return best


def conv_fusion(facts: Facts) -> Advice | None:
    """Conv pairs of the first rank's first iteration that fuse measured a gain for here."""
    # fuse's results first: without any measured here, the rank's op table (25 MB at 200k
    # events) is not built for nothing
    measured = _measured_here()
    if not measured or not facts.ranks or \
            not facts.named_like(facts.events, "conv").any():
        return None
    pairs = Counter(p.label for p in run_pairs(op_sequence(facts.run, facts.ranks[0])))
    gaining = [(label, count, measured[label]) for label, count in pairs.items()
               if label in measured and measured[label].get("recommended")]
    if not gaining:
        return None
    steps = max(1, facts.step_count() // max(1, len(facts.ranks)))
    saved_ms = sum(count * (r["torch_separate_ms"]["min_ms"] - r["fused_ms"]["min_ms"])
                   for _, count, r in gaining) * steps * len(facts.ranks)
    evidence = {"pairs": [{"pair": label, "per_iteration": count,
                           "speedup": round(r["speedup"], 3),
                           "speedup_interval": r.get("speedup_interval"),
                           "confirmation_interval": r.get("confirmation_interval"),
                           "torch_separate_ms": r["torch_separate_ms"]["min_ms"],
                           "fused_ms": r["fused_ms"]["min_ms"], "schedule": r["schedule"]}
                          for label, count, r in gaining]}
    return advice(facts, "conv_fusion", "conv pairs run faster fused on this machine",
                  evidence, saved_ms * 1e6,
                  "measured: perfswarm fuse timed each pair fused and as PyTorch's two ops "
                  "side by side here, the interval of the rounds' speedups above 1; gain = the "
                  "difference x pairs per iteration x iterations",
                  "run each pair as one fused kernel (perfswarm fuse RUN prints the tuned "
                  "schedule), folding batch norm into the first conv's weights")
