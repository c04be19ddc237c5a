"""The measurements of ``relpos tasks`` and their summary over seeds.

* ``masked_accuracy(logits, batch)``: the Chomsky suite's per-token accuracy
  ``sum(mask * [argmax = target]) / sum(mask)`` of one batch (the official
  ``accuracy_fn``); the score of a length is the mean over its sub-batches;
* ``exact_match(logits, batch)``: per example, whether every target token and EOS is the
  argmax under teacher forcing — the same as greedy decoding reproducing the target
  (``relpos.lab.tasks.text``);
* ``ood_score(per_length, test_lengths)``: the mean over the out-of-distribution lengths
  (Delétang et al.'s score: lengths ``N+1 .. M``; the official ``example.py`` drops
  ``N+1`` by an off-by-one, relpos does not);
* ``mean_ci(values)``: the mean over seeds and the half-width of its 95 % Student-t
  interval (0 for one seed: no interval);
* ``wilson_interval(hits, n)``: the 95 % Wilson score interval of an exact-match rate over
  ``n`` test examples (Wilson 1927), ``(p + z²/2n ± z·sqrt(p(1-p)/n + z²/4n²)) / (1 +
  z²/n)`` with ``z = 1.96``: how far the evaluation sample alone can move a score (it
  stays inside ``[0, 1]`` and is not empty at 0 or n hits, unlike the normal interval).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from torch import Tensor

from .chomsky import TaskBatch
from .text import DecoderBatch

__all__ = [
    "masked_accuracy",
    "exact_match",
    "ood_score",
    "mean_ci",
    "wilson_interval",
    "T_QUANTILE_975",
]

#: two-sided 95 % Student-t quantiles by degrees of freedom (1..30); 1.96 beyond
T_QUANTILE_975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def masked_accuracy(logits: Tensor, batch: TaskBatch) -> float:
    """Per-token accuracy over the masked outputs: ``logits (B, T_out, V)``."""
    correct = (logits.argmax(-1) == batch.targets) & batch.mask
    return float(correct.sum()) / max(1, int(batch.mask.sum()))


def exact_match(logits: Tensor, batch: DecoderBatch) -> Tensor:
    """``(B,)`` bool: every loss position's argmax equals the next token (``logits (B, T,
    V)`` of ``batch.tokens``)."""
    pred = logits[:, :-1].argmax(-1)
    ok = (pred == batch.tokens[:, 1:]) | ~batch.loss_mask[:, :-1]
    return ok.all(dim=1)


def ood_score(per_length: Mapping[int, float], test_lengths: Sequence[int]) -> float:
    """Mean accuracy over ``test_lengths`` (every one must be measured)."""
    missing = [n for n in test_lengths if n not in per_length]
    if missing:
        raise ValueError(f"no accuracy measured at test lengths {missing}")
    return sum(per_length[n] for n in test_lengths) / len(test_lengths)


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
