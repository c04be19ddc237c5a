"""Shaw's relation-aware self-attention and NEZHA's functional relative positions.

* ``shaw``: Shaw, Uszkoreit, Vaswani 2018 (arXiv 1803.02155): learned relative key and value
  embeddings ``w^K``, ``w^V`` indexed by ``clip(j - i, -k, k)``;
* ``nezha``: Wei et al. 2019 (arXiv 1909.00204): the same keys and values read from a fixed
  sinusoid table.

Both are ``RelativeEmbeddingTable``s (``embedding_table.py``, read through the table reader of
``table.py``); Shaw's learned tables come from ``LearnedRelativeTable``.
"""

from __future__ import annotations

from typing import Annotated, Any

import torch
from torch import Tensor

from ...functional import sinusoidal_table
from ...validation import check_int
from ..options import Bool, Custom, Int
from ..registry import register
from .embedding_table import LearnedRelativeTable, RelativeEmbeddingTable

__all__ = ["ShawRelative", "NezhaRelative"]


def _window(value: Any, name: str) -> tuple[int, int]:
    """A clipping distance ``k`` (window ``[-k, k]``) or a ``(left, right)`` pair of them:
    ``(left, right)``, each a non-negative int."""
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise ValueError(f"{name} must be an int k >= 0 or a (left, right) pair, got {value}")
        return check_int(value[0], f"{name}[0]", minimum=0), check_int(
            value[1], f"{name}[1]", minimum=0
        )
    return (check_int(value, name, minimum=0),) * 2


_WINDOW = Custom(
    _window,
    invalid=[
        ("16", TypeError),
        (2.5, TypeError),
        (True, TypeError),
        (-1, ValueError),
        ((4, -1), ValueError),
        ((1, 2, 3), ValueError),
    ],  # fmt: skip
    doc="clipping distance k >= 0, or a (left, right) pair",
)


@register("shaw")
class ShawRelative(LearnedRelativeTable):
    """Relation-aware self-attention (Shaw, Uszkoreit, Vaswani 2018, arXiv 1803.02155;
    tensor2tensor ``dot_product_attention_relative``).

    ``e_ij = q_i . (k_j + a^K_ij) * scale`` and ``z_i = sum_j alpha_ij (v_j + a^V_ij)`` with
    ``a^K_ij = w^K[clip(j - i, -k, k) + k]``, ``a^V_ij = w^V[clip(j - i, -k, k) + k]``.

    Args:
        max_relative_position: the clipping distance ``k`` (paper: 16 for the main results;
            t2t ``transformer_relative``: 20), or a ``(left, right)`` pair for an asymmetric
            window (``clip(j - i, -left, right) + left``, Wav2Vec2-BERT's ``relative_key``).
        values: add the relative value embeddings ``a^V`` (the paper's full method). ``False``
            is keys only (HF ``relative_key``); it then runs on every backend.
        heads_share: one table for all heads (the paper and t2t) or one per head.

    Parameters ``key_table``, ``value_table``: ``(2k + 1, D)`` (``(H, 2k + 1, D)`` per head),
    initialised ``U(-sqrt(3 / rows), sqrt(3 / rows))``: t2t's ``uniform_unit_scaling`` (gain 1)
    of ``transformer_base`` for a ``[rows, D]`` variable.
    """

    paper = "Shaw et al. 2018 (relation-aware self-attention)"

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        max_relative_position: Annotated[int | tuple[int, int], _WINDOW] = 16,
        values: Annotated[bool, Bool(doc="add the relative value embeddings")] = True,
        heads_share: Annotated[
            bool, Bool(doc="one table for all heads (else one per head)")
        ] = True,
    ) -> None:
        super().__init__(num_heads, head_dim)
        m = max_relative_position  # checked: an int k or a (left, right) tuple
        self._set_window(*((m, m) if isinstance(m, int) else m), values)
        self._learn_tables(heads_share, "uniform", (3.0 / self.num_rows) ** 0.5)


@register("nezha")
class NezhaRelative(RelativeEmbeddingTable):
    """NEZHA functional relative positions (Wei et al. 2019, arXiv 1909.00204; huawei-noah
    ``NEZHA-PyTorch/modeling_nezha.py``).

    Shaw's keys and values with a fixed sinusoid table shared by keys, values and heads:
    ``e_ij = (q_i . k_j + q_i . T[idx]) * scale``, ``z_i = sum_j p_ij (v_j + T[idx])``,
    ``idx = clip(j - i, -K, K) + K`` and ``T[pos, 2m] = sin(pos / 10000^(2m / D))``,
    ``T[pos, 2m + 1] = cos(...)``, evaluated at the shifted index ``pos = idx`` in ``0 .. 2K``
    (the official code's choice, kept for checkpoint parity), not at the signed distance.
    The official code tabulates 512 positions (so ``L <= 512``); relpos has no such limit.

    Args:
        max_relative_position: ``K`` (nezha-cn-base: 64).
        values: add the value term (NEZHA does).

    Buffer ``table (2K + 1, D)`` (not saved: it is a function of ``K`` and ``D``).
    """

    paper = "Wei et al. 2019 (NEZHA)"

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        max_relative_position: Annotated[int, Int(minimum=0, doc="clipping distance K")] = 64,
        values: Annotated[bool, Bool(doc="add the value term")] = True,
    ) -> None:
        super().__init__(num_heads, head_dim)
        k = max_relative_position
        self._set_window(k, k, values)
        if head_dim % 2:
            raise ValueError(f"head_dim must be even for NEZHA's sinusoid table, got {head_dim}")
        self.max_relative_position = k
        table = sinusoidal_table(torch.arange(self.num_rows), head_dim)
        self.register_buffer("table", table, persistent=False)

    def relation_table(self, role: str) -> Tensor:
        return self.table
