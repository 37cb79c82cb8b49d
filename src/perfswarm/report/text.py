"""How the report and the terminal write a number or an advice's evidence: one wording for both,
with nothing heavy imported (the CLI prints with it)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from perfswarm.analyze.diff import StepTimeDelta


def ms(ns: float) -> str:
    return f"{ns / 1e6:,.3f} ms"


def pct(share: float) -> str:
    """A share as %: two significant digits below 1% (a tiny run's share of a GPU's peak)."""
    return f"{100 * share:.1f}%" if share >= 0.01 or share == 0 else f"{100 * share:.2g}%"


def size(nbytes: float) -> str:
    """Bytes in binary units (KiB, MiB, GiB: what allocators and the OS count in), the one way
    the terminal and the report write an amount of memory or data; rates stay GB/s (10^9)."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:,.1f} {unit}"
    return f"{nbytes:,.0f} B"


def evidence_text(key: str, value: Any) -> str:
    """An advice's evidence value as a person reads it: ns as ms, numbers with separators,
    mappings as `key value` pairs, lists one item after another."""
    if isinstance(value, bool) or value is None:
        return str(value).lower()
    if isinstance(value, int | float):
        if key.endswith("_ns"):
            return ms(value)
        return f"{value:,}" if isinstance(value, int) else f"{value:,.2f}"
    if isinstance(value, dict):
        return ", ".join(f"{k} {evidence_text(str(k) if str(k).endswith('_ns') else key, v)}"
                         for k, v in value.items())
    if isinstance(value, list | tuple):
        return "; ".join(evidence_text(key, v) for v in value)
    return str(value)


def short_caption(caption: str) -> str:
    """A swarm's caption (`module: function`) with the module's file name only: a library's
    path took the 70 characters a terminal row had, and four swarms read alike."""
    module, sep, function = caption.partition(": ")
    return f"{module.rsplit('/', 1)[-1]}{sep}{function}"


def step_time_change(t: StepTimeDelta) -> tuple[str, str]:
    """(A's step time -> B's, the change against its band and which steps were timed), as
    `diff` and the board's comparison say them."""
    where = t.a.which if t.a.which == t.b.which else (
        "unprofiled" if t.a.outside and t.b.outside else "profiled")
    inside = "outside" if abs(t.delta_ns) > t.noise_ns else "inside"
    return (f"{ms(t.a.median_ns)} -> {ms(t.b.median_ns)}",
            f"{ms(t.delta_ns)} ({100 * t.delta_ns / t.a.median_ns:+.1f}%), {inside} ± "
            f"{ms(t.noise_ns)} of step-to-step variation; the steps {where}")


WAITED_FOR_OTHERS: Final = ("its threads' run delay over the compared steps: its ops ran "
                            "slower for it, not only for the change")
UNSAMPLED: Final = ("recorded without the system sampler: whether it waited for other "
                    "processes too is unknown")
