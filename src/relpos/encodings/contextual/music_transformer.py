"""Relative attention of the Music Transformer (Huang et al. 2018, arXiv 1809.04281).

``music-transformer``: a learned table ``E_r`` of ``N`` relative positions read by the queries
(zero beyond ``N``, causal by default). The paper's "skewing" is ``relative_table_ops.skew``;
the class itself is a ``LearnedRelativeTable`` (``embedding_table.py``).
"""

from __future__ import annotations

from typing import Annotated

from ..options import Bool, Int
from ..registry import register
from .embedding_table import LearnedRelativeTable

__all__ = ["MusicTransformerRelative"]


@register("music-transformer")
class MusicTransformerRelative(LearnedRelativeTable):
    """Relative attention of the Music Transformer (Huang et al. 2018, arXiv 1809.04281;
    tensor2tensor ``dot_product_self_attention_relative_v2``).

    ``logit_ij = (q_i . k_j + q_i . E_r[j - i + N - 1]) * scale`` for ``0 <= i - j < N``
    (``N = max_relative_position`` rows ordered from relative position ``-(N - 1)`` to ``0``);
    distances ``>= N`` read zero rows (t2t prepends zeros when ``L > N``: no clipping).
    Causal: keys after the query have no embedding (their term is 0, and they are masked).
    The paper computes ``S_rel`` by "skewing" ``Q E_r^T`` (``skew``), O(L D) memory instead of
    Shaw's O(L^2 D). relpos's ``prepare`` computes the same ``Q E_r^T`` over the reachable rows
    (``(B, H, Lq, R)``, ``R <= min(N, Lq + Lk - 1)``) and ``bias`` gathers
    ``S_rel[i, j] = (Q E_r^T)[i, j - i + N - 1]``: the memory-efficient equivalent of skewing
    (equal to it, tested), which also serves query tiles, KV-cache steps and arbitrary positions.

    Args:
        max_relative_position: ``N``, rows of ``E_r`` (t2t's name; the paper trains on 2048
            tokens).
        values: ``add_relative_to_values``: also ``z_i += sum_j p_ij E_v[j - i + N - 1]`` with
            a second table (t2t default: off).
        heads_share: t2t ``heads_share_relative_embedding`` (default False: ``(H, N, D)``).
        bidirectional: the unmasked variant (``dot_product_unmasked_self_attention_relative_v2``):
            ``2N - 1`` rows for relative positions ``-(N - 1) .. N - 1``, zero beyond; then not
            causal-only.

    Init ``N(0, D^-0.5)`` (t2t ``get_relative_embeddings_left``: stddev ``depth ** -0.5``).
    """

    paper = "Huang et al. 2018 (Music Transformer)"
    causal_only = True
    beyond = "zero"

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        max_relative_position: Annotated[int, Int(minimum=1, doc="N, rows of E_r")] = 2048,
        values: Annotated[bool, Bool(doc="add_relative_to_values")] = False,
        heads_share: Annotated[bool, Bool(doc="heads_share_relative_embedding")] = False,
        bidirectional: Annotated[bool, Bool(doc="the unmasked variant (2N - 1 rows)")] = False,
    ) -> None:
        super().__init__(num_heads, head_dim)
        n = max_relative_position
        self._set_window(n - 1, n - 1 if bidirectional else 0, values)
        self.max_relative_position = n
        self.bidirectional = bidirectional
        self.causal_only = not bidirectional  # type: ignore[misc]
        self._learn_tables(heads_share, "normal", head_dim**-0.5)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, bidirectional={self.bidirectional}"
