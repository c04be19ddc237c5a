"""Transformer-XL relative attention (Dai et al. 2019, arXiv 1901.02860): content and a global
bias read a projected sinusoid table of distances.

``logit_ij = [ (q_i + u) . k_j + (q_i + v) . (W_R R)[i - j] ] * scale``: the ``(q + v)`` read
of the projected table goes through the table reader (``table.py``: products per query block,
gathered at the distance), ``u . k_j`` is one number per key and head.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...functional import sinusoidal_table
from ...validation import check_int
from ..base import BiasContext
from ..options import Custom, Float, Int
from ..registry import register
from .table import DistanceRows, TableData, TableEncoding, TableRead, scaled_sum

__all__ = ["TransformerXL", "TransformerXLData", "DROPOUT"]

#: dropout on a table of relative embeddings: a probability in [0, 1)
DROPOUT = Float(minimum=0.0, below=1.0, doc="dropout on the relative embeddings in training")


def _d_model(value: Any, name: str) -> int:
    value = check_int(value, name, minimum=2)
    if value % 2:
        raise ValueError(f"{name} must be a positive even int (sin and cos halves), got {value}")
    return value


@dataclass
class TransformerXLData(TableData):
    """Per call: ``(q + v) . (W_R R)^T`` (``query``, a query read of the ``(H, R, D)``
    projected rows) and ``u . k_j`` (``uk (B, H, Lk)``)."""

    query: TableRead
    uk: Tensor


D_MODEL = Custom(
    _d_model,
    optional=True,
    invalid=[("64", TypeError), (2.5, TypeError), (0, ValueError), (7, ValueError)],
    doc="width of the sinusoid R (positive, even; default H * head_dim)",
)


@register("transformer-xl")
class TransformerXL(TableEncoding):
    """Transformer-XL relative attention (Dai et al. 2019, arXiv 1901.02860;
    kimiyoung/transformer-xl ``RelPartialLearnableMultiHeadAttn``, official code read).

    ``logit_ij = [ q_i.k_j + q_i.W_R R_{i-j} + u.k_j + v.W_R R_{i-j} ] * scale``, i.e.
    ``(q_i + u).k_j + (q_i + v).(W_R R_{i-j})``, scale ``1/sqrt(d)`` on the sum; ``i - j`` is
    ``q_pos - k_pos``.

    * ``R_t = [sin(t w), cos(t w)]`` (concatenated, not interleaved), ``w_k = base^(-2k/d_model)``,
      dimension ``d_model`` (default ``H * head_dim``).
    * ``W_R`` = ``r_net`` (``Linear(d_model, H * head_dim, bias=False)``), ``u`` = ``r_w_bias``
      and ``v`` = ``r_r_bias`` ``(H, head_dim)``, all ``N(0, init_std^2)`` (0.02, the official
      ``--init normal``). The official model shares ``u, v`` across layers and has one ``W_R`` per
      layer: ``TransformerLM(share_encoding=True)`` shares all three, ``False`` none.
    * ``clamp_len``: distances beyond ``±clamp_len`` use ``R_{±clamp_len}`` (official:
      ``pos_seq.clamp_(max=clamp_len)``). ``dropout`` is applied to ``R`` in training (official
      ``drop(pos_emb)``).

    Beyond the paper: distances may be negative (keys after the query, non-causal use); the
    sinusoid is evaluated there too, as XLNet's bidirectional form does. The official code
    computes only ``i - j >= 0`` (``_rel_shift``; the rest is masked). Keys may precede the
    queries (memory, ``Lk > Lq``: queries default to the last ``Lq`` key positions); see
    ``relpos.nn.SegmentRecurrence`` for the segment-level recurrence.

    Per call: the ``R`` distances of the call (``DistanceRows``; the table "row" of a distance
    is the distance itself), ``W_R R`` over them ``(H, R, D)``, ``u.k (B, H, Lk)``; per query
    block ``(q + v) . (W_R R)^T (B, H, T, R_block)``; ``bias`` gathers it at ``i - j``.
    Positions far apart with gaps (a sparse stream) make the rows as many as their distance
    range: bound it with ``clamp_len``.
    """

    paper = "Dai et al. 2019 (Transformer-XL)"

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        d_model: Annotated[int | None, D_MODEL] = None,
        clamp_len: Annotated[
            int | None, Int(minimum=0, optional=True, doc="distances beyond ±clamp_len share R")
        ] = None,
        base: Annotated[float, Float(above=1.0, doc="sinusoid base")] = 10000.0,
        dropout: Annotated[float, DROPOUT] = 0.0,
        init_std: Annotated[
            float, Float(minimum=0.0, doc="std of the N(0, std^2) initialisation")
        ] = 0.02,
    ) -> None:
        super().__init__(num_heads, head_dim)
        d_model = num_heads * head_dim if d_model is None else d_model
        self.d_model, self.clamp_len, self.base = d_model, clamp_len, float(base)
        self.dropout = float(dropout)
        self.r_net = nn.Linear(d_model, num_heads * head_dim, bias=False)
        nn.init.normal_(self.r_net.weight, std=init_std)
        self.r_w_bias = nn.Parameter(torch.randn(num_heads, head_dim) * init_std)  # u
        self.r_r_bias = nn.Parameter(torch.randn(num_heads, head_dim) * init_std)  # v

    def table_row(self, distance: Tensor) -> Tensor:
        d = distance.to(torch.int64)
        if self.clamp_len is not None:
            d = d.clamp(-self.clamp_len, self.clamp_len)
        return d

    @property
    def row_bounds(self) -> tuple[int, int] | None:
        return None if self.clamp_len is None else (-self.clamp_len, self.clamp_len)

    def table_rows(self, lo: int, hi: int, device: torch.device) -> Tensor:
        """``R_t`` for ``t = lo .. hi``: ``(R, d_model)``, ``[sin(t w), cos(t w)]``."""
        t = torch.arange(lo, hi + 1, device=device)
        table = sinusoidal_table(t, self.d_model, self.base)  # interleaved sin, cos
        return torch.cat((table[..., 0::2], table[..., 1::2]), dim=-1)

    def read_tables(
        self, q: Tensor, k: Tensor, ctx: BiasContext, rows: DistanceRows
    ) -> TransformerXLData:
        r = self.table_rows(rows.first, rows.first + rows.count - 1, q.device)
        r = F.dropout(r.to(self.r_net.weight.dtype), self.dropout, self.training)
        table = self.r_net(r).to(q.dtype).view(rows.count, self.num_heads, self.head_dim)
        table = table.transpose(0, 1)  # (H, R, D)
        v_bias = self.r_r_bias.to(q.dtype)[None, :, None, :]
        u = self.r_w_bias.to(q.dtype)[:, None, :]  # (H, 1, D): one "row" read by the keys
        uk = TableRead.keys(k, u, 0, self.num_heads).compute()[..., 0]  # (B, H, Lk)
        return TransformerXLData(
            rows=rows, query=TableRead.queries(q + v_bias, table, rows.first), uk=uk
        )

    def bias(self, ctx: BiasContext, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        data: TransformerXLData = ctx.data
        qr = data.query.read(b, h, i, data.rows.at(ctx, b, i, j))
        return scaled_sum([qr, data.uk[b, h, j]], ctx.scale)

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, d_model={self.d_model}, clamp_len={self.clamp_len}, "
            f"dropout={self.dropout}"
        )
