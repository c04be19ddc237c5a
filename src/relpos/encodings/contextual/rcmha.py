"""RCMHA's relative attention scores (Sugiharto, Aradea, Mubarok 2023, "RCMHA: Relative
Convolutional Multi-Head Attention for Natural Language Modelling", arXiv 2308.03429; official
code hermansh-id/rcmha ``rcmha/attention.py`` ``RelativeMultiHeadAttention.get_scores`` and
``rcmha/util.py`` ``shift_right``, read).

RCMHA changes multi-head attention in two places. This module holds the second, the relative
scoring; the first, causal depth-wise convolutions of the projected q, k and v, mixes tokens
outside attention and lives in ``relpos.nn`` (``MultiHeadAttention(qkv_conv=3)``,
``relpos.nn.qkv_convolution``). The scoring is the labml.ai "relative multi-head attention"
(Transformer-XL with a learned relative table), as the official code writes it::

    logit_ij = [ (q_i + u) . k_j  +  q_i . E[P + (j - i)]  +  e[P + (j - i)] ] / sqrt(d_k)

* ``E (2P, H, d_k)``: relative key embeddings (``key_pos_embeddings``), read by the query;
* ``e (2P, H)``: a relative bias per head (``key_pos_bias``);
* ``u (H, d_k)``: a global content bias (``query_pos_bias``);
* all zero-initialised (so a fresh layer scores as NoPE), ``P = 2^12``.

The official code reads ``q_i . E`` and ``e`` with the Transformer-XL skew (``shift_right`` of
the ``(Lq, Lk + Lq)`` products over rows ``P - Lk .. P + Lq - 1``, last ``Lk`` columns kept),
which gives ``E[P - Lk + Lq + j - i]``: queries aligned to the end of the keys (a memory before
them), i.e. the row ``P + (k_pos - q_pos)`` with relpos's default positions. For ``Lq = Lk = 4``
the offsets are ``j - i``; for ``Lq = 2, Lk = 5`` the rows are ``-3 .. 1`` and ``-4 .. 0``
(tested against a re-implementation of the skew). relpos reads the same rows through its table
reader (``table.py``), so positions may be any integers.

Beyond the official code (where a slice past ``2P`` rows breaks): a key more than ``P``
positions before the query, or ``P - 1`` after it, reads the edge row (Shaw's clipping);
``max_relative_position`` sets ``P`` (rows ``2P``). The official layer has one set of tables
per layer: ``TransformerLM(share_encoding=False)`` gives that; the default shares them.

Code note: the released ``main.py`` builds its model with labml's own
``labml_nn.transformers.xl.RelativeMultiHeadAttention`` (no convolutions), not with the
repository's class; relpos follows ``rcmha/attention.py``, the layer the paper describes.

Shapes: ``E`` is stored per head first, ``key_table (H, 2P, d_k)``; ``distance_bias (H, 2P)``;
``content_bias (H, d_k)`` (official ``key_pos_embeddings.permute(1, 0, 2)``,
``key_pos_bias.t()``, ``query_pos_bias``). Per call: ``u . k_j (B, H, Lk)``, the reachable rows
of ``e``, and per query block ``q @ E^T (B, H, T, R)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import torch
from torch import Tensor, nn

from ..base import BiasContext
from ..options import Int
from ..registry import register
from .embedding_table import EmbeddingTableData, LearnedRelativeTable
from .table import DistanceRows, TableRead, scaled_sum

__all__ = ["RCMHARelative", "RCMHAData"]


@dataclass
class RCMHAData(EmbeddingTableData):
    """Per call, beside the query read of ``E``: ``uk = u . k_j (B, H, Lk)`` and the rows of
    ``e`` the call reaches, ``bias_rows (H, R)`` (from ``rows.first``)."""

    uk: Tensor | None = None
    bias_rows: Tensor | None = None
    bias_first: int = 0


@register("rcmha")
class RCMHARelative(LearnedRelativeTable):
    """RCMHA's relative scoring (Sugiharto et al. 2023; hermansh-id/rcmha; see the module).

    ``logit_ij = [(q_i + u).k_j + q_i.E[P + j - i] + e[P + j - i]] * scale``, ``scale =
    1/sqrt(d_k)``; ``j - i`` is ``k_pos - q_pos``, clipped to ``[-P, P - 1]``.

    Args:
        max_relative_position: ``P`` (official ``2 ** 12``): the table has ``2P`` rows, for
            ``k_pos - q_pos`` in ``[-P, P - 1]``; further distances read the edge row.

    Parameters (all zero at init, as the official): ``key_table (H, 2P, d_k)`` (``E``),
    ``distance_bias (H, 2P)`` (``e``), ``content_bias (H, d_k)`` (``u``).
    """

    paper = "Sugiharto et al. 2023 (RCMHA)"

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        max_relative_position: Annotated[
            int, Int(minimum=1, doc="P: 2P rows for k_pos - q_pos in [-P, P-1]")
        ] = 4096,
    ) -> None:
        super().__init__(num_heads, head_dim)
        p = max_relative_position
        self.max_relative_position = p
        self._set_window(p, p - 1, values=False)
        self.heads_share = False
        self.key_table = nn.Parameter(torch.zeros(num_heads, 2 * p, head_dim))
        self.value_table = None
        self.distance_bias = nn.Parameter(torch.zeros(num_heads, 2 * p))
        self.content_bias = nn.Parameter(torch.zeros(num_heads, head_dim))

    @classmethod
    def example_options(cls) -> dict:
        return {"max_relative_position": 8}  # test lengths reach past the table: clipping

    def read_tables(self, q: Tensor, k: Tensor, ctx: BiasContext, rows: DistanceRows) -> RCMHAData:
        first, count = rows.first, rows.count
        table = self.key_table[:, first : first + count].to(q.dtype)
        u = self.content_bias.to(q.dtype)[:, None, :]  # (H, 1, D): one row read by the keys
        return RCMHAData(
            rows=rows,
            query=TableRead.queries(q, table, first),
            uk=TableRead.keys(k, u, 0, self.num_heads).compute()[..., 0],
            bias_rows=self.distance_bias[:, first : first + count].to(q.dtype),
            bias_first=first,
        )

    def bias(self, ctx: BiasContext, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        data: RCMHAData = ctx.data
        r = data.rows.at(ctx, b, i, j)
        assert data.query is not None and data.uk is not None and data.bias_rows is not None
        rows = r.rows if r.first == data.bias_first else r.rows + (r.first - data.bias_first)
        terms = [data.query.read(b, h, i, r), data.bias_rows[h, rows], data.uk[b, h, j]]
        return scaled_sum(terms, ctx.scale)
