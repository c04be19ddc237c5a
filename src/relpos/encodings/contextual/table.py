"""The shared base of relative-embedding tables: ``RelativeEmbeddingTable``, ``TableContext``,
and ``LearnedRelativeTable`` (learned key and value tables: Shaw, Music Transformer).

One idea behind Shaw, the Music Transformer, NEZHA and Huang et al. 2020 (their classes live
in ``shaw.py``, ``music_transformer.py`` and ``huang2020.py``): a table of relative embeddings
``a[r]`` indexed by a clipped relative position ``r = row(j - i)`` (key minus query), read by
the query (Shaw's relative keys, ``q_i . a_ij``), optionally by the key (``k_j . a_ij``, Huang
et al. method 4) or jointly by both (``sum_l q_il k_jl a_ijl``, method 3), and optionally by
the attention weights (the "value term" ``sum_j p_ij a^V_ij``, Shaw and NEZHA). The encodings
differ in where the table comes from (learned, fixed sinusoid), how the relative position is
windowed (clipped at the edge, or zero beyond it), in which order the rows are stored, and
which terms they use; ``RelativeEmbeddingTable`` holds everything else.

No ``(L, L, D)`` tensor is ever built (the functions are in ``relative_table_ops.py``):

* ``prepare`` computes ``qr = q @ a^T`` over the table rows that the call's positions can
  reach: ``(B, H, Lq, R)`` with ``R <= min(rows, Lq + Lk - 1)``; ``bias`` gathers
  ``qr[b, h, i, row(j - i)]``. This is the memory-efficient equivalent of the Music
  Transformer's "skewing" (``skew``): both read ``q_i . E[j - i + L - 1]`` out of
  ``Q E^T`` with O(L R) memory; the gather also works for ``Lq != Lk``, batch-specific and
  non-contiguous positions, clipping, and query tiles of the chunked backend.
* the value term scatter-adds the softmax weights of a query block into relative-position
  buckets ``(B, H, T, R)`` and multiplies by the value table ``(R, Dv)``: O(T S + T R Dv).
* method 3's trilinear term loops over the D channels with a custom backward, so it needs
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

from ...functional import _check_bool
from ..base import BiasContext, Encoding
from .table_ops import gather_rows, trilinear_scores, weighted_rows

__all__ = ["RelativeEmbeddingTable", "LearnedRelativeTable", "TableContext"]


# ------------------------------------------------------------------------------ base class
@dataclass
class TableContext(BiasContext):
    """``BiasContext`` plus ``row0``, the first table row the call reads (its products in
    ``extra`` cover rows ``row0 .. row0 + R - 1``)."""

    row0: int = 0


def _window(value: object, name: str) -> tuple[int, int]:
    """A clipping distance ``k`` (window ``[-k, k]``) or a ``(left, right)`` pair."""
    if isinstance(value, tuple) and len(value) == 2:
        left, right = value
    else:
        left = right = value
    for v in (left, right):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(
                f"{name} must be a non-negative int k or a (left, right) pair of them, "
                f"got {value!r}"
            )
    return left, right


class RelativeEmbeddingTable(Encoding):
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

    family = "contextual"
    has_bias = True
    relative = True
    terms: ClassVar[tuple[str, ...]] = ("query",)
    ascending: ClassVar[bool] = True
    beyond: ClassVar[str] = "clip"

    def __init__(
        self, num_heads: int, head_dim: int, *, left: int, right: int, values: bool
    ) -> None:
        super().__init__(num_heads, head_dim)
        self.left, self.right = left, right
        self.has_value_term = _check_bool(values, "values")

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

    def _span(self, q_pos: Tensor, k_pos: Tensor) -> tuple[int, int]:
        """The rows ``r0 .. r1`` this call can reach (the relative positions between the
        smallest and largest, clipped): at most ``min(rows, Lq + Lk - 1)`` for range positions."""
        if q_pos.numel() == 0 or k_pos.numel() == 0:
            return 0, self.num_rows - 1
        lo = int(k_pos.min()) - int(q_pos.max())
        hi = int(k_pos.max()) - int(q_pos.min())
        a, b = (int(x) for x in self.row(torch.tensor([lo, hi])))
        return min(a, b), max(a, b)

    # ------------------------------------------------------------ hooks
    def prepare(
        self,
        q: Tensor,
        k: Tensor,
        q_pos: Tensor,
        k_pos: Tensor,
        inputs: dict[str, Tensor] | None = None,
    ) -> BiasContext:
        """Per call: the reachable table rows ``r0..r1`` and the products that ``bias`` reads.

        ``extra``: ``qr = q @ a^T (B, H, Lq, R)`` ("query"), ``kr = k @ a^T (B, Hkv, Lk, R)``
        ("key"), ``q``, ``k`` and ``a - 1`` ("trilinear"), the value rows ``av (R, Dv)`` or
        ``(H, R, Dv)``; ``TableContext.row0 = r0``.
        """
        base = super().prepare(q, k, q_pos, k_pos, inputs)
        r0, r1 = self._span(base.q_pos, base.k_pos)
        table = self.relation_table("key")[..., r0 : r1 + 1, :].to(q.dtype)
        extra: dict[str, Tensor] = {}
        if "query" in self.terms:
            extra["qr"] = torch.matmul(q, table.transpose(-1, -2))
        if "key" in self.terms:
            if table.dim() == 3 and k.shape[1] != q.shape[1]:
                k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
            extra["kr"] = torch.matmul(k, table.transpose(-1, -2))
        if "trilinear" in self.terms:
            # copies: FlexAttention's CPU kernel cannot read its own q / k as score_mod buffers
            extra.update(q=q.clone(), k=k.clone(), a=table - 1)
        if self.has_value_term:
            extra["av"] = self.relation_table("value")[..., r0 : r1 + 1, :].to(q.dtype)
        return TableContext(q_pos=base.q_pos, k_pos=base.k_pos, extra=extra, row0=r0)

    def _rows(
        self, ctx: TableContext, b: Tensor, i: Tensor, j: Tensor
    ) -> tuple[Tensor, Tensor | None]:
        """Rows ``row(j - i) - row0`` of the call's products at the index grids, and (for
        ``beyond = "zero"``) whether each pair lies inside the window (else None)."""
        first, last = -ctx.row0, self.num_rows - 1 - ctx.row0
        if self.ascending:  # clip(rel) + left - row0
            shifted = (ctx.k_pos[b, j] + (self.left - ctx.row0)) - ctx.q_pos[b, i]
        else:  # right - clip(rel) - row0
            shifted = (ctx.q_pos[b, i] + (self.right - ctx.row0)) - ctx.k_pos[b, j]
        inside = (shifted >= first) & (shifted <= last) if self.beyond == "zero" else None
        return shifted.clamp(first, last), inside

    def bias(self, ctx: BiasContext, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        assert isinstance(ctx, TableContext)
        rows, inside = self._rows(ctx, b, i, j)
        out: Tensor | None = None
        if "query" in self.terms:
            out = gather_rows(ctx.extra["qr"], b, h, i, rows)
        if "key" in self.terms:
            kr = ctx.extra["kr"]
            term = gather_rows(kr, b, h // (self.num_heads // kr.shape[1]), j, rows)
            out = term if out is None else out + term
        if "trilinear" in self.terms:
            q, k = ctx.extra["q"], ctx.extra["k"]
            hk, a = h // (self.num_heads // k.shape[1]), ctx.extra["a"]
            if rows.dim() == 0:  # FlexAttention's score_mod: one score, channel by channel
                term = q[b, h, i, 0] * k[b, hk, j, 0] * a[rows, 0]
                for l in range(1, a.shape[1]):
                    term = term + q[b, h, i, l] * k[b, hk, j, l] * a[rows, l]
            else:
                term = trilinear_scores(q[b, h, i], k[b, hk, j], a, rows)
            out = term if out is None else out + term
        assert out is not None
        if inside is not None:
            out = torch.where(inside, out, 0.0)
        return out * ctx.scale

    def value_term(
        self, ctx: BiasContext, p: Tensor, b: Tensor, h: Tensor, i: Tensor, j: Tensor
    ) -> Tensor:
        """``sum_j p_ij a^V[row(i, j)]``: ``p`` scatter-added into row buckets ``(B, H, T, R)``,
        then one matmul with the value rows ``(R, Dv)``."""
        assert isinstance(ctx, TableContext)
        rows, inside = self._rows(ctx, b, i, j)
        if inside is not None:
            p = p * inside
        return weighted_rows(p, rows, ctx.extra["av"])

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
        self.heads_share = bool(heads_share)
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
