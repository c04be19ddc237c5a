"""Addition for position coupling (Cho et al. 2024, "Position Coupling: Improving Length
Generalization of Arithmetic Transformers Using Task Structure", NeurIPS, arXiv 2405.20671;
HanseulJo/position-coupling ``src/data/addition.py``, ``scripts/addition/*.sh``).

Format (the official ``AdditionDataset`` with ``padding=True, reverse_output=True``): both
operand lengths uniform in ``min..max`` digits, each number uniform with a non-zero leading
digit (``0..9`` for one digit); operands zero-padded to the longer one (the code's ``P``,
read as ``0``), the sum padded to ``max_len + 1`` digits and written least
significant digit first, then EOS: ``123+045=8610 <eos>`` (123 + 45 = 168).

Position ids (``relpos.schedules.coupled_positions(..., reverse_answer=True)``): a digit of
significance ``k`` gets ``s + 1 + k`` in both operands and in the answer, ``+`` and ``=``
get ``s``, EOS and padding 0; ``s ~ U{1..max_position - len(answer)}`` in training
(``coupling_start``), ``s = 1`` at test. Spec example: ``123+045=`` + ``8610`` -> prompt
ids ``4 3 2 1 4 3 2 1`` and answer ids ``2 3 4 5``.

The length category of an example is the longer operand's digit count; a test set at
length ``n`` has both operands of ``n`` digits (``eval_coupling.sh``: ``min = max = n``).
"""

from __future__ import annotations

import string

import numpy as np
import torch
from torch import Tensor

from relpos.schedules import coupled_positions, coupling_start
from relpos.validation import check_int

from .text import DecoderBatch, Example, Vocab

__all__ = ["addition_example", "coupling_vocab", "coupled_batch_positions", "random_start"]


def coupling_vocab() -> Vocab:
    """``<pad> <eos> 0-9 + =``."""
    return Vocab([*string.digits, "+", "="])


def _number(rng: np.random.Generator, digits: int) -> int:
    if digits == 1:
        return int(rng.integers(0, 10))
    return int(str(int(rng.integers(1, 10))) + "".join(map(str, rng.integers(0, 10, digits - 1))))


def addition_example(
    rng: np.random.Generator, min_digits: int, max_digits: int, a_digits: int | None = None
) -> Example:
    """One ``a+b=`` example; operand lengths uniform in ``min_digits..max_digits`` (or both
    ``a_digits``)."""
    check_int(min_digits, "min_digits")
    check_int(max_digits, "max_digits", minimum=min_digits)
    if a_digits is None:
        n_a, n_b = (int(n) for n in rng.integers(min_digits, max_digits + 1, size=2))
    else:
        n_a = n_b = check_int(a_digits, "a_digits")
    a, b = _number(rng, n_a), _number(rng, n_b)
    width = max(len(str(a)), len(str(b)))
    answer = f"{a + b:0{width + 1}d}"[::-1]
    prompt = f"{a:0{width}d}+{b:0{width}d}="
    return Example(tuple(prompt), tuple(answer), width, prompt, answer)


def coupled_batch_positions(
    batch: DecoderBatch,
    vocab: Vocab,
    *,
    max_position: int,
    train: bool,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Coupled position ids ``(B, T)`` of a batch of ``addition_example``s: start 1 at test,
    ``coupling_start`` (one per row) in training."""
    digits = vocab.encode(list(string.digits))
    answer_lens = (batch.loss_mask.sum(1) - 1).tolist()  # target digits (EOS excluded)
    if train:
        starts = []
        for answer_len in answer_lens:
            starts.append(
                coupling_start(
                    max_position, answer_len, reverse_answer=True, generator=generator
                ).item()
            )
        start: int | Tensor = torch.tensor(starts)
    else:
        start = 1
    pos = coupled_positions(
        batch.tokens, digit_ids=digits, equals_id=vocab.ids["="], start=start, reverse_answer=True
    )
    if int(pos.max()) > max_position:
        raise ValueError(
            f"coupled position {int(pos.max())} exceeds max_position {max_position}: the "
            f"answers have up to {max(answer_lens)} digits"
        )
    return pos


def random_start(
    batch: DecoderBatch, *, max_position: int, train: bool, generator: torch.Generator | None
) -> Tensor:
    """Random-start absolute positions (the paper's baseline): ``s + 0..T-1`` with
    ``s ~ U{0..max_position - T}`` per row in training, ``s = 0`` at test."""
    B, T = batch.tokens.shape
    if T > max_position + 1:
        raise ValueError(f"sequences of {T} tokens do not fit max_position {max_position}")
    if not train:
        return torch.arange(T).expand(B, T).clone()
    s = torch.randint(0, max_position - T + 2, (B, 1), generator=generator)
    return s + torch.arange(T)
