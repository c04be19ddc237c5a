"""Confidence intervals of the lab's reports.

* ``mean_ci(values)``: the mean over seeds and the half-width of its 95 % Student-t
  interval (0 for one seed: no interval);
* ``wilson_interval(hits, n)``: the 95 % Wilson score interval of an exact-match rate over
  ``n`` test examples (Wilson 1927), ``(p + z²/2n ± z·sqrt(p(1-p)/n + z²/4n²)) / (1 +
  z²/n)`` with ``z = 1.96``: how far the evaluation sample alone can move a score (it
  stays inside ``[0, 1]`` and is not empty at 0 or n hits, unlike the normal interval).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["T_QUANTILE_975", "mean_ci", "wilson_interval"]

#: two-sided 95 % Student-t quantiles by degrees of freedom (1..30); 1.96 beyond
T_QUANTILE_975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def mean_ci(values: Sequence[float]) -> tuple[float, float]:
    """``(mean, half-width)`` of the 95 % t-interval of the mean; half-width 0 for n = 1."""
    n = len(values)
    if n == 0:
        raise ValueError("mean_ci needs at least one value")
    mean = sum(values) / n
    if n == 1:
        return mean, 0.0
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    t = T_QUANTILE_975[n - 2] if n - 1 <= len(T_QUANTILE_975) else 1.96
    return mean, t * math.sqrt(var / n)


def wilson_interval(hits: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """``(low, high)``: the Wilson score interval of ``hits / n`` (``hits`` may be a
    fractional count, ``accuracy * n``); ``ValueError`` for ``n < 1`` or ``hits`` outside
    ``[0, n]``."""
    if n < 1:
        raise ValueError(f"wilson_interval needs n >= 1 examples, got {n}")
    if not 0 <= hits <= n:
        raise ValueError(f"hits must be in [0, n={n}], got {hits}")
    p = hits / n
    denom = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, center - half), min(1.0, center + half)
