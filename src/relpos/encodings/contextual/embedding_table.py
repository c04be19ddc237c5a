"""A windowed table of relative embeddings: the base of Shaw, NEZHA, the Music Transformer and
Huang et al. 2020 (``RelativeEmbeddingTable``, ``LearnedRelativeTable``, ``EmbeddingTableData``).

One idea behind the four (their classes live in ``shaw.py``, ``music_transformer.py`` and
``huang2020.py``): a table of relative embeddings ``a[r]`` indexed by a windowed relative
position ``r = row(j - i)`` (key minus query), read by the query (Shaw's relative keys,
``q_i . a_ij``), optionally by the key (``k_j . a_ij``, Huang et al. method 4) or jointly by both
(``sum_l q_il k_jl a_ijl``, method 3), and optionally by the attention weights (the "value
term" ``sum_j p_ij a^V_ij``, Shaw and NEZHA). The encodings differ in where the table comes
from (learned, fixed sinusoid), how the relative position is windowed (clipped at the edge, or
zero beyond it), in which order the rows are stored, and which terms they use.

The reads go through the table reader (``table.py``): ``q @ a^T`` over the rows a query block
reaches, ``(B, H, T, R)`` with ``R <= min(rows, T + S - 1)``, gathered at ``row(j - i)``. This
is the memory-efficient equivalent of the Music Transformer's "skewing" (``table_ops.skew``,
tested equal): both read ``q_i . E[j - i + L - 1]`` out of ``Q E^T``; the gather also works for
``Lq != Lk``, batch-specific and non-contiguous positions, clipping, KV-cache steps and query
tiles of the chunked backend. The value term scatter-adds the softmax weights of a query block
into row buckets ``(B, H, T, R)`` and multiplies by the value rows ``(R, Dv)``:
O(T S + T R Dv). Method 3's trilinear term loops over the D channels with a custom backward,
O(T S) memory per query tile, never ``(T, S, D)``.

Conventions: ``rel = k_pos - q_pos = j - i`` (Shaw / tensor2tensor / NEZHA), so ``rel <= 0`` for
keys in the past. Every term that reads q or k is multiplied by the call's logit scale
(``1/sqrt(d)`` by default), as in the sources, which scale the sum of all terms.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from ..base import BiasContext
from .table import NO_ROW, DistanceRows, RowIndex, TableData, TableEncoding, TableRead
from .table_ops import trilinear_scores, weighted_rows

__all__ = ["RelativeEmbeddingTable", "LearnedRelativeTable", "EmbeddingTableData", "Trilinear"]


@dataclass
class Trilinear:
    """Method 3's joint read ``sum_l q_il k_jl t[row, l]``: ``q (B, H, Lq, D)``,
    ``k (B, Hkv, Lk, D)`` (copies: FlexAttention's CPU kernel cannot read its own q / k as
    ``score_mod`` buffers) and the table rows ``first ..`` minus one, ``t (R, D)``."""

    q: Tensor
    k: Tensor
    table: Tensor
    first: int

    def read(self, b: Tensor, h: Tensor, i: Tensor, j: Tensor, r: RowIndex) -> Tensor:
        rows = r.rows if r.first == self.first else r.rows + (r.first - self.first)
        hk = h // (self.q.shape[1] // self.k.shape[1])
        q, k, t = self.q, self.k, self.table
        if rows.dim() == 0:  # FlexAttention's score_mod: one score, channel by channel
            out = q[b, h, i, 0] * k[b, hk, j, 0] * t[rows, 0]
            for l in range(1, t.shape[1]):
                out = out + q[b, h, i, l] * k[b, hk, j, l] * t[rows, l]
            return out
        return trilinear_scores(q[b, h, i], k[b, hk, j], t, rows)


@dataclass
class EmbeddingTableData(TableData):
    """Per call: the rows, the reads of the key table by the queries (``query``) and keys
    (``key``), the trilinear read and the value rows ``(R, Dv)`` / ``(H, R, Dv)`` (from
    ``rows.first``) of the terms the encoding uses (others None)."""

    query: TableRead | None = None
    key: TableRead | None = None
    trilinear: Trilinear | None = None
    values: Tensor | None = None


class RelativeEmbeddingTable(TableEncoding):
    """Base: a table of relative embeddings indexed by a windowed relative position.

    ``rel = k_pos - q_pos`` lies in a window ``[-left, right]`` (keys up to ``left`` positions
    before the query and ``right`` after it). The table has ``left + right + 1`` rows; the row
    of a pair is ``clip(rel) + left`` (``ascending``, Shaw's order) or ``right - clip(rel)``
    (HF BERT's order, ``i - j + M - 1``). Outside the window the embedding is the edge row
    (``beyond = "clip"``, Shaw) or zero (``beyond = "zero"``, Music Transformer).

    Logit terms (``terms``), each multiplied by the call's scale and added to
    ``scale * q_i . k_j``:

    * ``"query"``: ``q_i . a^K_ij`` (Shaw's relative keys);
    * ``"key"``: ``k_j . a^K_ij`` (Huang et al. 2020 method 4);
    * ``"trilinear"``: ``sum_l q_il k_jl (a^K_ijl - 1)`` (method 3, see its class).

    With ``values=True`` the output gains ``sum_j p_ij a^V_ij`` (``value_term``), so only the
    ``eager`` and ``chunked`` backends run the encoding.

    Subclasses provide ``relation_table(role)`` for ``role`` in ``"key"``, ``"value"``:
    ``(rows, D)`` shared by the heads, or ``(H, rows, D)`` per head.
    """

    terms: ClassVar[tuple[str, ...]] = ("query",)
    ascending: ClassVar[bool] = True
    beyond: ClassVar[str] = "clip"

    left: int
    right: int

    def _set_window(self, left: int, right: int, values: bool) -> None:
        """Called by the subclasses' constructors: the window ``[-left, right]`` and whether
        the value term is on (the instance's ``has_value_term`` flag)."""
        self.left, self.right = left, right
        self.has_value_term = values

    @property
    def num_rows(self) -> int:
        """Rows of the table: ``left + right + 1``."""
        return self.left + self.right + 1

    # ------------------------------------------------------------ the table
    def relation_table(self, role: str) -> Tensor:
        """The ``role`` ("key" or "value") table: ``(rows, D)`` or ``(H, rows, D)``."""
        raise NotImplementedError

    def _new_table(self, per_head: bool, init: str, scale: float) -> nn.Parameter:
        """A learned table ``(rows, D)`` or ``(H, rows, D)``: ``init`` "normal" (std ``scale``)
        or "uniform" (``U(-scale, scale)``)."""
        shape = (self.num_heads,) * per_head + (self.num_rows, self.head_dim)
        if init == "normal":
            return nn.Parameter(torch.randn(shape) * scale)
        return nn.Parameter((torch.rand(shape) * 2 - 1) * scale)

    # ------------------------------------------------------------ indexing
    def row(self, rel: Tensor) -> Tensor:
        """Table row of relative position ``rel = k_pos - q_pos`` (clipped to the window)."""
        clipped = rel.clamp(-self.left, self.right)
        return clipped + self.left if self.ascending else self.right - clipped

    def index(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """Row of every (query, key) pair: ``(..., Lq, Lk)`` from positions ``(..., L)``
        (pairs outside the window of a ``beyond = "zero"`` table read zeros instead)."""
        return self.row(k_pos[..., None, :] - q_pos[..., :, None])

    def table_row(self, distance: Tensor) -> Tensor:
        rel = -distance.to(torch.int64)
        row = self.row(rel)
        if self.beyond == "zero":
            row = torch.where((rel >= -self.left) & (rel <= self.right), row, NO_ROW)
        return row

    @property
    def row_bounds(self) -> tuple[int, int]:
        # distance = -rel; one step beyond each edge keeps "outside" for zero-beyond tables
        return -self.right - 1, self.left + 1

    # ------------------------------------------------------------ hooks
    def read_tables(
        self, q: Tensor, k: Tensor, ctx: BiasContext, rows: DistanceRows
    ) -> EmbeddingTableData:
        """The reads of the key table's reachable rows ``a (R, D)`` / ``(H, R, D)``: by the
        queries (products per query block), by the keys ``k @ a^T (B, H|Hkv, Lk, R)``, the
        trilinear read, and the value rows."""
        first, count = rows.first, rows.count
        table = self.relation_table("key")[..., first : first + count, :].to(q.dtype)
        data = EmbeddingTableData(rows=rows)
        if "query" in self.terms:
            data.query = TableRead.queries(q, table, first)
        if "key" in self.terms:
            data.key = TableRead.keys(k, table, first, self.num_heads)
        if "trilinear" in self.terms:
            data.trilinear = Trilinear(q.clone(), k.clone(), table - 1, first)
        if self.has_value_term:
            values = self.relation_table("value")[..., first : first + count, :]
            data.values = values.to(q.dtype)
        return data

    def bias(self, ctx: BiasContext, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        data: EmbeddingTableData = ctx.data
        r = data.rows.at(ctx, b, i, j)
        out: Tensor | None = None
        if data.query is not None:
            out = data.query.read(b, h, i, r)
        if data.key is not None:
            term = data.key.read(b, h, j, r)
            out = term if out is None else out + term
        if data.trilinear is not None:
            term = data.trilinear.read(b, h, i, j, r)
            out = term if out is None else out + term
        assert out is not None
        return r.zero_outside(out) * ctx.scale

    def value_term(
        self, ctx: BiasContext, p: Tensor, b: Tensor, h: Tensor, i: Tensor, j: Tensor
    ) -> Tensor:
        """``sum_j p_ij a^V[row(i, j)]``: ``p`` scatter-added into row buckets ``(B, H, T, R)``,
        then one matmul with the value rows ``(R, Dv)``."""
        data: EmbeddingTableData = ctx.data
        assert data.values is not None
        r = data.rows.at(ctx, b, i, j)
        rows = r.rows if r.first == data.rows.first else r.rows + (r.first - data.rows.first)
        if r.inside is not None:
            p = p * r.inside
        return weighted_rows(p, rows, data.values)

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, window=(-{self.left}, {self.right}), "
            f"values={self.has_value_term}"
        )


class LearnedRelativeTable(RelativeEmbeddingTable):
    """Base of the tables that are learned parameters: ``key_table`` and, with ``values``,
    ``value_table``, each ``(rows, D)`` shared by the heads or ``(H, rows, D)`` per head
    (Shaw, Music Transformer). NEZHA's fixed sinusoid and Huang et al.'s single
    ``distance_embedding`` are not of this kind.

    Subclasses call ``_learn_tables`` after ``__init__`` with their initialisation.
    """

    key_table: nn.Parameter
    value_table: nn.Parameter | None

    def _learn_tables(self, heads_share: bool, init: str, scale: float) -> None:
        """Create ``key_table`` (then ``value_table`` when the encoding has the value term):
        ``init`` and ``scale`` as in ``_new_table``; ``heads_share`` is stored as given."""
        self.heads_share = heads_share
        self.key_table = self._new_table(not self.heads_share, init, scale)
        self.value_table = (
            self._new_table(not self.heads_share, init, scale) if self.has_value_term else None
        )

    def relation_table(self, role: str) -> Tensor:
        table = self.key_table if role == "key" else self.value_table
        assert table is not None
        return table

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, heads_share={self.heads_share}"
