"""Axis ticks of `slime report`'s charts: "nice" tick values (1, 2 or 5 times a power of ten) and
labels with as many decimals as the tick step needs, so ticks over a narrow range stay apart
(step 0.0005 -> "5.7520", "5.7525", not "5.752" twice).

A tick is held as an integer `n` times `10**e`: labels are made from the integer's digits, never
by rounding a float, so they are exact. The page's JavaScript (report_assets.TICKS_JS) is the same
algorithm for zoomed views; tests/observability/test_report_ticks.py runs both and compares them.
The report embeds these Python ticks for each chart's full view.
"""

from __future__ import annotations

import math

__all__ = ["axis", "nice_step", "tick_label", "y_range"]

Tick = tuple[float, str]
MAX_INDEX = 1e15  # tick values k * step with |k| past this are not exact floats (2**53 ~ 9e15)


def nice_step(span: float, n: int, min_step: float = 0.0) -> tuple[int, int]:
    """(m, e): the step m * 10**e (m in 1, 2, 5) that cuts `span` into about `n` parts, at least `min_step`."""
    raw = max(span / n, min_step)
    e = math.floor(math.log10(raw))
    norm = raw / _pow10(e)
    # d3's cut points: the nearest of 1, 2, 5, 10 on a log scale
    m = 10 if norm >= math.sqrt(50) else 5 if norm >= math.sqrt(10) else 2 if norm >= math.sqrt(2) else 1
    if m == 10:
        m, e = 1, e + 1
    return m, e


def _pow10(e: int) -> float:
    # a positive power of ten is exact as a float (up to 1e22); dividing by one rounds once
    return 10.0**e if e >= 0 else 1.0 / 10.0 ** (-e)


def tick_label(n: int, e: int, exponent: bool = False) -> str:
    """The label of n * 10**e: fixed-point with max(0, -e) decimals, or `1.25e6` when `exponent`."""
    sign, digits = ("-" if n < 0 else ""), str(abs(n))
    if n == 0:
        return "0"
    if exponent:
        lead = len(digits) - 1 + e  # the power of ten of the first digit
        return f"{sign}{digits[0]}{'.' + digits[1:] if len(digits) > 1 else ''}e{lead}"
    if e >= 0:
        return sign + digits + "0" * e
    digits = digits.rjust(-e + 1, "0")
    return f"{sign}{digits[:e]}.{digits[e:]}"


def axis(lo: float, hi: float, n: int, min_step: float = 0.0) -> list[Tick]:
    """(value, label) of the ticks in [lo, hi], about `n` of them, steps at least `min_step`."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return []  # a chart widens a flat range first (y_range; x: +-0.5)
    m, e = nice_step(hi - lo, n, min_step)
    step = m * _pow10(e)
    first, last = math.ceil(lo / step - 1e-9), math.floor(hi / step + 1e-9)
    if max(abs(first), abs(last)) > MAX_INDEX:
        return []  # a range too narrow for its magnitude: floats cannot tell such ticks apart
    ks = range(first, last + 1)
    # exponent notation for big numbers and for tiny ones (not for a narrow range around 12.5)
    biggest = max(abs(first), abs(last)) * m * _pow10(e)
    exponent = biggest >= 1e6 or (biggest < 1e-3 and e < -4)
    return [(k * m * _pow10(e), tick_label(k * m, e, exponent)) for k in ks]


def y_range(lo: float, hi: float) -> tuple[float, float]:
    """The y range a chart draws for data in [lo, hi]: 6% margins; a flat line gets a band around it."""
    if lo == hi:
        lo, hi = lo - abs(lo) * 0.1 - 0.5, hi + abs(hi) * 0.1 + 0.5
    pad = (hi - lo) * 0.06
    return lo - pad, hi + pad
