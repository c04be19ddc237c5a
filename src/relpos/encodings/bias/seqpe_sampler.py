"""SeqPE's contrastive candidate sampler (H. Li et al. 2025, "SeqPE: Transformer with Sequential
Position Encoding", arXiv 2506.13277; official code ghrua/seqpe
``text_seqpe/src/transformers/custom_modules/pe_sampler.py``, class
``SeqPeContrstiveDataSampler``: ``init_dataset``, ``_prepare_batch``,
``generate_hard_negatives``, ``distributional_sample``; read, not copied).

The contrastive regulariser ``L_ct`` (``seqpe_encoder.contrastive_loss``) asks the position
encoder to pick, among ``C`` candidate positions, the one nearest to a pivot. The official
sampler draws the candidates of each pivot as follows (released WikiText-103 config:
``C = 32``, sample range 256, positions below 20000, 16 pivots per batch):

* **uniform**: ``C + 1`` distinct positions drawn uniformly from all positions;
* then, with probability 0.6 (``uniform > 0.4``), **distributional** candidates: ``C``
  positions drawn without replacement from a random window ``[s, s + w)``, ``w = max(range,
  5 C)``, ``s = floor((max_position - range) * u)`` (close positions the encoder must tell
  apart); otherwise ``int(0.25 C)`` **hard** negatives: the pivot's decimal string edited 1 to
  3 times (insert / swap / replace / delete a digit, no leading zeros, below the largest
  position), each kept only if it is farther from the pivot than the nearest uniform
  candidate that is sure to survive (so a hard negative is never the label);
* the special candidates come first, then the uniform ones; duplicates and the pivot itself
  are dropped and the first ``C`` kept;
* label: the candidate nearest in squared Euclidean distance (the first on ties,
  ``seqpe_encoder.contrastive_labels``).

Pivots: every position once per epoch in a shuffled order, the last batch topped up with
positions drawn without replacement (``init_dataset``).

2-D positions (``data_dim=2``, the image setting): positions are ``(row, col)`` with each
axis in ``[0, max_position)`` and the window is ``range x range`` (``w = max(range,
floor(sqrt(5 C)))`` per axis). The official class takes a flat maximum and range and uses
their square roots; here both are given per axis. Hard negatives of a 2-D pivot edit the
concatenated digits of its axes and split them back into two numbers of at most
``max_digits`` digits each (``split_num``), as the official code does.

Differences, all at edges the released config never reaches: the window start is clamped at
0 (the official start is negative when ``max_position < range``); with ``int(0.25 C) = 0``
there are no hard negatives (the official ``dist[:, :-0]`` is empty and fails); a pivot whose
edits keep failing stops after ``MAX_EDIT_TRIES`` attempts (the official loop has no bound).

Randomness: one ``random.Random(seed)`` per sampler, so a sampler is deterministic from its
seed (the official one reads the global ``random`` module in a prefetching process, so its
stream cannot be reproduced bit for bit).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch
from torch import Tensor

from ...validation import check_int

__all__ = ["ContrastiveBatch", "ContrastiveSampler", "hard_negatives", "MAX_EDIT_TRIES"]

#: attempts at one hard negative before the pivot gets no more of them (official: unbounded)
MAX_EDIT_TRIES = 1000


@dataclass
class ContrastiveBatch:
    """One batch for ``contrastive_loss``: ``pivots (N, m)``, ``candidates (N, C, m)`` int64
    positions and ``labels (N,)`` (the nearest candidate, first on ties)."""

    pivots: Tensor
    candidates: Tensor
    labels: Tensor


# ----------------------------------------------------------------------- digit edits
def _add_digit(rng: random.Random, s: str, max_digits: int, n_max: int) -> str | None:
    if len(s) == max_digits:
        return None
    pos = rng.randint(0, len(s))
    digit = rng.randint(1, 9) if pos == 0 else rng.randint(0, 9)
    out = s[:pos] + str(digit) + s[pos:]
    return None if int(out) >= n_max else out


def _swap_digits(rng: random.Random, s: str, max_digits: int, n_max: int) -> str | None:
    n = len(s)
    if n == 1 or (n == 2 and (s[1] == "0" or s[0] == s[1])):
        return None
    for _ in range(11):  # the official: a first draw and up to 10 retries
        a, b = sorted(rng.sample(range(n), 2))
        chars = list(s)
        chars[a], chars[b] = chars[b], chars[a]
        out = "".join(chars)
        if not ((a == 0 and s[b] == "0") or out == s):
            return None if int(out) >= n_max else out
    return None


def _replace_digit(rng: random.Random, s: str, max_digits: int, n_max: int) -> str | None:
    pos, digit = rng.randint(0, len(s) - 1), rng.randint(0, 9)
    while (pos == 0 and digit == 0) or str(digit) == s[pos]:
        pos, digit = rng.randint(0, len(s) - 1), rng.randint(0, 9)
    out = s[:pos] + str(digit) + s[pos + 1 :]
    return None if int(out) >= n_max else out


def _delete_digit(rng: random.Random, s: str, max_digits: int, n_max: int) -> str | None:
    n = len(s)
    if n == 1:
        return None
    pos = rng.randint(0, n - 1)
    while pos == 0 and s[1] == "0":
        pos = rng.randint(1, n - 1)
    return s[:pos] + s[pos + 1 :]


#: the official ``operation_dict`` order: 1 add, 2 exchange, 3 edit, 4 delete
_EDITS = (_add_digit, _swap_digits, _replace_digit, _delete_digit)


def _edited_number(rng: random.Random, pivot: int, max_digits: int, n_max: int) -> int | None:
    """The pivot's digits edited 1 to 3 times (``generate_hard_negative_number``)."""
    target, done, tries = rng.randint(1, 3), 0, 0
    text = pivot_text = str(pivot)
    while done != target:
        tries += 1
        if tries > MAX_EDIT_TRIES:
            return None
        out = _EDITS[rng.randint(1, 4) - 1](rng, text, max_digits, n_max)
        if out is not None and out != pivot_text:
            done, text = done + 1, out
    return int(text)


def _split_number(rng: random.Random, x: int, max_digits: int) -> tuple[int, int] | None:
    """Two axes from concatenated digits (``split_num``): a cut after ``k`` digits, each part
    at most ``max_digits`` long."""
    s = str(x)
    if len(s) < 2:
        s = s + "0" if rng.uniform(0, 1) < 0.5 else "0" + s
    if len(s) > 2 * max_digits:
        return None
    while True:
        k = rng.sample(range(1, max_digits + 1), 1)[0]
        if 0 < len(s) - k <= max_digits:
            return int(s[:k]), int(s[k:])


def hard_negatives(
    rng: random.Random,
    pivot: tuple[int, ...],
    count: int,
    max_digits: int,
    max_position: int,
    min_square_dist: float = 0.0,
) -> list[tuple[int, ...]]:
    """Up to ``count`` digit-edit negatives of ``pivot`` (1-D ``(p,)`` or 2-D ``(r, c)``),
    each farther than ``min_square_dist`` (squared) from it (``generate_hard_negatives``).
    1-D edits stay below ``max_position``; 2-D ones below ``max_position ** 2`` as a
    concatenated number, as the official code."""
    two_d = len(pivot) == 2
    n_max = max_position**2 if two_d else max_position
    number = int("".join(str(v) for v in pivot)) if two_d else pivot[0]
    out: list[tuple[int, ...]] = []
    for _ in range(count):
        edited = _edited_number(rng, number, max_digits, n_max)
        if edited is None:
            continue
        cand = _split_number(rng, edited, max_digits) if two_d else (edited,)
        if cand is None:
            continue
        if sum((a - b) ** 2 for a, b in zip(cand, pivot, strict=True)) > min_square_dist:
            out.append(cand)
    return out


# ----------------------------------------------------------------------- the sampler
class ContrastiveSampler:
    """SeqPE's contrastive candidates (``SeqPeContrstiveDataSampler``; see the module).

    Args:
        max_position: positions (per axis) are ``0 .. max_position - 1`` (released: 20000).
        max_digits: the encoder's digits per axis (hard negatives stay below ``10 **
            max_digits``).
        candidates: ``C`` per pivot (32).
        batch_size: pivots per batch (16).
        sample_range: width of the distributional window (256; per axis for 2-D).
        data_dim: 1 or 2 position axes.
        seed: the sampler's own ``random.Random``: equal seeds give equal batches.

    ``next() -> ContrastiveBatch``, ready for ``contrastive_loss(encoder, batch.pivots,
    batch.candidates, batch.labels)``. Also iterable.
    """

    DISTRIBUTIONAL_RATE = 0.6  # the official ``uniform > method_ratio = 0.4``
    HARD_RATIO = 0.25  # ``hard_neg_ratio``

    def __init__(
        self,
        max_position: int,
        max_digits: int = 5,
        *,
        candidates: int = 32,
        batch_size: int = 16,
        sample_range: int = 256,
        data_dim: int = 1,
        seed: int = 0,
    ) -> None:
        self.max_digits = check_int(max_digits, "max_digits", maximum=18)
        self.max_position = check_int(max_position, "max_position", minimum=2)
        if self.max_position > 10**self.max_digits:
            raise ValueError(
                f"max_position must be <= 10 ** max_digits = {10**self.max_digits} (the "
                f"encoder writes positions with {max_digits} digits), got {max_position}"
            )
        self.data_dim = check_int(data_dim, "data_dim", maximum=2)
        self.candidates = check_int(candidates, "candidates")
        total = self.max_position**self.data_dim
        if self.candidates + 1 > total - 1:
            raise ValueError(
                f"candidates must be at most {total - 2} (max_position ** data_dim - 2: distinct "
                f"positions besides the pivot), got {candidates}"
            )
        self.batch_size = check_int(batch_size, "batch_size")
        self.sample_range = check_int(sample_range, "sample_range")
        check_int(seed, "seed", minimum=None)
        self.rng = random.Random(seed)
        self.epoch = -1
        self._order: list[int] = []
        self._ptr = 0

    # ------------------------------------------------------------------ positions
    def _position(self, flat: int) -> tuple[int, ...]:
        if self.data_dim == 1:
            return (flat,)
        return divmod(flat, self.max_position)

    @staticmethod
    def _square_dist(a: tuple[int, ...], b: tuple[int, ...]) -> int:
        return sum((x - y) ** 2 for x, y in zip(a, b, strict=True))

    def _new_epoch(self) -> None:
        """Every position once, shuffled, the last batch topped up (``init_dataset``)."""
        total = self.max_position**self.data_dim
        top_up = (self.batch_size - total % self.batch_size) % self.batch_size
        order = list(range(total))
        if top_up:
            order += self.rng.sample(range(total), top_up)
        self.rng.shuffle(order)
        self._order, self._ptr, self.epoch = order, 0, self.epoch + 1

    def distributional(self, count: int) -> list[tuple[int, ...]]:
        """``count`` positions from a random window (``distributional_sample``)."""
        n_max = self.max_position
        if self.data_dim == 1:
            start = max(0, int((n_max - self.sample_range) * self.rng.uniform(0, 1)))
            end = min(max(self.sample_range, 5 * count) + start, n_max)
            window = [(p,) for p in range(start, end)]
        else:
            width = max(self.sample_range, int(math.sqrt(5 * count)))
            r0 = max(0, int((n_max - width) * self.rng.uniform(0, 1)))
            c0 = max(0, int((n_max - width) * self.rng.uniform(0, 1)))
            window = [
                (r, c)
                for r in range(r0, min(width + r0, n_max))
                for c in range(c0, min(width + c0, n_max))
            ]
        return window if len(window) <= count else self.rng.sample(window, count)

    def candidates_for(self, pivot: tuple[int, ...]) -> list[tuple[int, ...]]:
        """The ``C`` candidates of one pivot (``_prepare_batch``, one row)."""
        C, total = self.candidates, self.max_position**self.data_dim
        uniform = [self._position(f) for f in self.rng.sample(range(total), C + 1)]
        n_hard = int(C * self.HARD_RATIO)
        if self.rng.uniform(0, 1) > 1.0 - self.DISTRIBUTIONAL_RATE:
            special = self.distributional(C)
        elif n_hard:
            nearest = min(self._square_dist(u, pivot) for u in uniform[:-n_hard])
            special = hard_negatives(
                self.rng, pivot, n_hard, self.max_digits, self.max_position, nearest
            )
        else:
            special = []
        merged, seen = [], {pivot}
        for cand in special + uniform:
            if cand not in seen:
                merged.append(cand)
                seen.add(cand)
        return merged[:C]

    def next(self) -> ContrastiveBatch:
        """The next batch of pivots with their candidates and labels."""
        if self._ptr + self.batch_size > len(self._order):
            self._new_epoch()
        flat = self._order[self._ptr : self._ptr + self.batch_size]
        self._ptr += self.batch_size
        pivots = [self._position(f) for f in flat]
        rows = [self.candidates_for(p) for p in pivots]
        piv = torch.tensor(pivots, dtype=torch.int64)
        cand = torch.tensor(rows, dtype=torch.int64)
        d2 = (cand - piv[:, None]).square().sum(-1)
        return ContrastiveBatch(pivots=piv, candidates=cand, labels=torch.argmin(d2, dim=1))

    def __iter__(self) -> ContrastiveSampler:
        return self

    def __next__(self) -> ContrastiveBatch:
        return self.next()
