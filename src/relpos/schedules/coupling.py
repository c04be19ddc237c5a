"""Position coupling (Cho et al. 2024, "Position Coupling: Improving Length Generalization of
Arithmetic Transformers Using Task Structure", arXiv 2405.20671; HanseulJo/position-coupling
``src/data/addition.py``).

Position ids come from the task's structure: digits of equal significance in the operands
and in the answer share one id, so a model that learned to add ``n``-digit numbers aligns
the digits of longer ones the same way. The ids feed any encoding that takes arbitrary
positions (a learned absolute table, a relative bias, RoPE).

Layout ``a + b = answer`` (any number of operands, operators between them), ``s = start``:

* a digit of significance ``k`` (0 = units) gets ``s + 1 + k``, in operands and answer;
* an operator between operands (``+``) gets ``s``;
* ``=`` gets ``s + len(answer) + 1`` when the answer is written most significant digit
  first, ``s`` when it is written reversed (least significant first);
* tokens before the first operand (BOS) and after the answer (EOS, padding) get 0.

``start`` is 1 at evaluation; during training it is drawn uniformly
(``coupling_start``) so every id up to ``max_position`` is trained.
"""

from __future__ import annotations

from collections.abc import Collection

import torch
from torch import Tensor

from ..validation import check_bool, check_generator, check_int, check_int_tensor

DIGITS = "0123456789"


def _runs(is_digit: list[bool]) -> list[tuple[int, int]]:
    """``[start, end)`` of each maximal run of digits."""
    runs, begin = [], None
    for i, d in enumerate([*is_digit, False]):
        if d and begin is None:
            begin = i
        elif not d and begin is not None:
            runs.append((begin, i))
            begin = None
    return runs


def _coupled_row(
    is_digit: list[bool], is_equals: list[bool], start: int, reverse_answer: bool
) -> list[int]:
    n = len(is_digit)
    eq = [i for i, e in enumerate(is_equals) if e]
    if len(eq) != 1:
        raise ValueError(f"expected exactly one '=' token per sequence, found {len(eq)}")
    e = eq[0]
    runs = _runs(is_digit)
    operands = [r for r in runs if r[1] <= e]
    answers = [r for r in runs if r[0] > e]
    if not operands:
        raise ValueError("no operand digits before the '=' token")
    if len(answers) != 1 or answers[0][0] != e + 1:
        raise ValueError("expected one run of answer digits right after the '=' token")
    out = [0] * n
    for lo, hi in operands:  # most significant digit first
        for i in range(lo, hi):
            out[i] = start + hi - i
    first, last = operands[0][0], operands[-1][1]
    for i in range(first, last):
        if not is_digit[i]:
            out[i] = start  # operators between operands
    lo, hi = answers[0]
    for i in range(lo, hi):
        out[i] = start + 1 + (i - lo if reverse_answer else hi - 1 - i)
    if any(not d for d in is_digit[last:e]):
        raise ValueError("unexpected non-digit tokens between the last operand and '='")
    out[e] = start if reverse_answer else start + (hi - lo) + 1
    return out


def coupled_positions(
    tokens: str | Tensor,
    *,
    digit_ids: Collection[int] | None = None,
    equals_id: int | None = None,
    start: int | Tensor = 1,
    reverse_answer: bool = False,
) -> Tensor:
    """Coupled position ids for an addition-style sequence ``operand (op operand)* = answer``.

    Args:
        tokens: a string such as ``"653+049=0702"`` (digits ``0-9``, ``=``), or token ids
            ``(L,)`` / ``(B, L)`` with ``digit_ids`` (the ids of the ten digit tokens) and
            ``equals_id``.
        start: the offset ``s`` (int, or ``(B,)`` ints, one per row); ``coupling_start``
            samples it for training.
        reverse_answer: the answer is written least significant digit first.

    Returns:
        int64 ``(L,)`` or ``(B, L)``. Spec example: ``"653+049=0702"``, start 1 ->
        ``[4, 3, 2, 1, 4, 3, 2, 6, 5, 4, 3, 2]``; reversed answer ``"123+045=8610"`` ->
        ``[4, 3, 2, 1, 4, 3, 2, 1, 2, 3, 4, 5]``.

    Operands should be zero-padded to one length (as the paper does), or their digits of
    equal significance still share ids but the operators no longer line up.
    """
    check_bool(reverse_answer, "reverse_answer")
    if isinstance(tokens, str):
        if digit_ids is not None or equals_id is not None:
            raise ValueError("digit_ids / equals_id are for token-id tensors, not strings")
        rows = [([c in DIGITS for c in tokens], [c == "=" for c in tokens])]
        batched = False
    else:
        ids = check_int_tensor(tokens, "tokens")
        if digit_ids is None or equals_id is None:
            raise ValueError("token-id tensors need digit_ids (the digit tokens) and equals_id")
        digits = {check_int(d, "digit_ids[...]", minimum=None) for d in digit_ids}
        check_int(equals_id, "equals_id", minimum=None)
        if equals_id in digits:
            raise ValueError(f"equals_id ({equals_id}) must not be one of digit_ids")
        batched = ids.dim() == 2
        rows = [
            ([t in digits for t in row], [t == equals_id for t in row])
            for row in ids.reshape(-1, ids.shape[-1]).tolist()
        ]
    starts = _starts(start, len(rows))
    out = torch.tensor(
        [_coupled_row(d, e, s, reverse_answer) for (d, e), s in zip(rows, starts, strict=True)],
        dtype=torch.int64,
    ).reshape(len(rows), -1)
    if not isinstance(tokens, str):
        out = out.to(tokens.device)
    return out if batched else out[0]


def _starts(start: int | Tensor, rows: int) -> list[int]:
    if isinstance(start, Tensor):
        check_int_tensor(start, "start", dims=(0, 1))
        values = start.reshape(-1).tolist()
        if len(values) == 1:
            values = values * rows
        if len(values) != rows:
            raise ValueError(
                f"start must be an int or hold one value per row ({rows}), got {len(values)}"
            )
    else:
        values = [check_int(start, "start", minimum=None)] * rows
    for v in values:
        if v < 1:
            raise ValueError(f"start must be >= 1 (id 0 is kept for BOS / padding), got {v}")
    return values


def coupling_start(
    max_position: int,
    answer_length: int,
    *,
    reverse_answer: bool = False,
    batch: int | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """The training offset ``s ~ U{1, .., max_position - answer_length - 1}`` (one more when
    the answer is reversed), so every id stays ``<= max_position``: int64 ``()`` or
    ``(batch,)``."""
    check_int(max_position, "max_position", minimum=1)
    check_int(answer_length, "answer_length", minimum=1)
    check_generator(generator)
    high = max_position - answer_length + (1 if reverse_answer else 0)  # exclusive
    if high <= 1:
        raise ValueError(
            f"max_position ({max_position}) is too small for an answer of {answer_length} "
            f"digits: needs max_position >= answer_length + {2 if not reverse_answer else 1}"
        )
    shape = () if batch is None else (check_int(batch, "batch", minimum=1),)
    return torch.randint(1, high, shape, generator=generator)


__all__ = ["coupled_positions", "coupling_start"]
