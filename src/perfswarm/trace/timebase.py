"""Kineto microsecond floats to integer nanoseconds, without drift.

A Kineto `ts` such as 4458676522690.655 has 16 significant digits; multiplying
the float by 1000 loses the last one. Splitting off the integer part first is
exact (Sterbenz), and the fractional part then carries only the parse error,
which is below half a nanosecond for any timestamp under 2**43 us (~100 days of
time relative to baseTimeNanoseconds, where the float's spacing is 2**-10 us).
Integer microseconds (older traces write epoch us) are exact up to 2**53.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import orjson
import pyarrow as pa
import pyarrow.compute as pc

# |ts| above this (in us) would overflow int64 nanoseconds.
MAX_ABS_US = 9.0e15


def us_to_ns(us: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
    """Convert microseconds (float64) to nanoseconds (int64), rounding to the nearest ns."""
    whole = np.floor(us)
    frac_ns = np.rint((us - whole) * 1000.0).astype(np.int64)
    return whole.astype(np.int64) * 1000 + frac_ns


def ns_to_us_text(ns: int) -> str:
    """The exact decimal microsecond text of `ns`, as Kineto writes it."""
    sign = "-" if ns < 0 else ""
    whole, frac = divmod(abs(ns), 1000)
    return f"{sign}{whole}.{frac:03d}"


def us_texts(ns: npt.NDArray[np.int64] | npt.NDArray[np.uint64]) -> list[str]:
    """`ns_to_us_text` of each value, formatted a column at a time (Arrow's casts)."""
    negative = ns < 0
    magnitude = np.where(negative, (-(ns + 1)).astype(np.uint64) + 1, ns.astype(np.uint64))
    whole, frac = np.divmod(magnitude, np.uint64(1000))
    text: list[str] = pc.binary_join_element_wise(
        pa.array(whole).cast(pa.string()),
        pc.utf8_lpad(pa.array(frac).cast(pa.string()), width=3, padding="0"), ".").to_pylist()
    for i in np.flatnonzero(negative).tolist():
        text[i] = "-" + text[i]
    return text


def us_json(ns: int) -> orjson.Fragment:
    """`ns` as the JSON number Kineto writes (exact decimal microseconds, `ns_to_us_text`)."""
    return orjson.Fragment(ns_to_us_text(ns).encode())
