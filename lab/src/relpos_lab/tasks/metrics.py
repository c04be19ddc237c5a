"""The measurements of ``relpos tasks`` and their summary over seeds.

* ``masked_accuracy(logits, batch)``: the Chomsky suite's per-token accuracy
  ``sum(mask * [argmax = target]) / sum(mask)`` of one batch (the official
  ``accuracy_fn``); the score of a length is the mean over its sub-batches;
* ``exact_match(logits, batch)``: per example, whether every target token and EOS is the
  argmax under teacher forcing — the same as greedy decoding reproducing the target
  (``relpos_lab.tasks.text``);
* ``ood_score(per_length, test_lengths)``: the mean over the out-of-distribution lengths
  (Delétang et al.'s score: lengths ``N+1 .. M``; the official ``example.py`` drops
  ``N+1`` by an off-by-one, relpos does not);
* ``mean_ci``, ``wilson_interval``: the intervals of ``relpos_lab.intervals``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from torch import Tensor

from ..intervals import T_QUANTILE_975, mean_ci, wilson_interval
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
