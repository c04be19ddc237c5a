"""Huang, Liang, Xu, Xiang 2020, "Improve Transformer Models with Better Relative Position
Embeddings" (arXiv 2009.13658): methods 3 and 4.

* ``huang2020-m4``: relative embeddings read by the query and by the key (HF BERT
  ``position_embedding_type="relative_key_query"``);
* ``huang2020-m3``: the trilinear interaction ``sum_l q_il k_jl a_ijl``.

Both use HF BERT's ``distance_embedding`` layout and are ``RelativeEmbeddingTable``s
(``embedding_table.py``).
"""

from __future__ import annotations

from typing import Annotated

import torch
from torch import Tensor, nn

from ..options import Int
from ..registry import register
from .embedding_table import RelativeEmbeddingTable

__all__ = ["Huang2020Method3", "Huang2020Method4"]

#: ``M`` of both methods (``max_position_embeddings``)
TABLE_POSITIONS = Int(minimum=1, doc="M; the table has 2M - 1 rows")


class _Huang2020(RelativeEmbeddingTable):
    """Shared by methods 3 and 4: HF BERT's ``distance_embedding`` layout.

    ``a_ij = E[(i - j) + M - 1]``, ``E (2M - 1, D)`` shared by the heads, ``M =
    max_position_embeddings``. HF does not clip (positions stay below M); relpos clips
    ``i - j`` to ``±(M - 1)`` so longer sequences reuse the edge rows.
    """

    ascending = False

    def _set_positions(self, max_position_embeddings: int) -> None:
        m = max_position_embeddings
        self._set_window(m - 1, m - 1, False)
        self.max_position_embeddings = m

    def relation_table(self, role: str) -> Tensor:
        return self.distance_embedding


@register("huang2020-m4")
class Huang2020Method4(_Huang2020):
    """Method 4 of Huang, Liang, Xu, Xiang 2020 ("Improve Transformer Models with Better
    Relative Position Embeddings", arXiv 2009.13658) = HF BERT
    ``position_embedding_type="relative_key_query"``.

    ``e_ij = (q_i . k_j + q_i . a_ij + k_j . a_ij) * scale``, ``a_ij = E[(i - j) + M - 1]``.
    ``prepare`` computes ``q E^T`` and ``k E^T`` (both ``(B, H, L, R)``); ``bias`` reads
    ``qr[i, row] + kr[j, row]``. Values are unchanged.

    Args:
        max_position_embeddings: ``M`` (BERT: 512); ``E`` has ``2M - 1`` rows.

    Parameter ``distance_embedding (2M - 1, D)`` in HF's row order, init ``N(0, 0.02^2)``
    (BERT's ``initializer_range``).
    """

    paper = "Huang et al. 2020, method 4 (HF relative_key_query)"
    terms = ("query", "key")

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        max_position_embeddings: Annotated[int, TABLE_POSITIONS] = 512,
    ) -> None:
        super().__init__(num_heads, head_dim)
        self._set_positions(max_position_embeddings)
        self.distance_embedding = self._new_table(False, "normal", 0.02)


@register("huang2020-m3")
class Huang2020Method3(_Huang2020):
    """Method 3 of Huang et al. 2020 (arXiv 2009.13658): the trilinear interaction of query,
    key and relative embedding.

    ``e_ij = sum_l q_il k_jl a_ijl * scale``, ``a_ij = E[(i - j) + M - 1]`` (the content term
    ``q_i . k_j`` is not added separately: with ``a = 1`` this is plain attention). relpos adds
    ``sum_l q_il k_jl (a_ijl - 1) * scale`` to the backends' content term, computed per query
    tile by ``trilinear_scores`` (a loop over the D channels, O(T S) memory; no ``(T, S, D)``).

    No code was found for method 3; the formula is the paper's as recalled, not checked. Assumed
    here: HF's table layout and window (shared by heads, ``2M - 1`` rows, as for method 4)
    and the initialisation ``E = 1 + N(0, 0.02^2)``, so training starts from dot-product
    attention (with ``E ~ N(0, 0.02^2)`` every logit would start at ~0).

    Args:
        max_position_embeddings: ``M`` (default 512); ``E`` has ``2M - 1`` rows.
    """

    paper = "Huang et al. 2020, method 3 (trilinear)"
    terms = ("trilinear",)

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        max_position_embeddings: Annotated[int, TABLE_POSITIONS] = 512,
    ) -> None:
        super().__init__(num_heads, head_dim)
        self._set_positions(max_position_embeddings)
        self.distance_embedding = nn.Parameter(1 + torch.randn(self.num_rows, head_dim) * 0.02)
