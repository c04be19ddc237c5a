"""Relative embeddings read by the queries (and keys, and values): Shaw, Music Transformer,
NEZHA, Huang et al. 2020.

One idea behind all of them: a table of relative embeddings ``a[r]`` indexed by a clipped
relative position ``r = row(j - i)`` (key minus query), read by the query (Shaw's relative
keys, ``q_i . a_ij``), optionally by the key (``k_j . a_ij``, Huang et al. method 4) or jointly
by both (``sum_l q_il k_jl a_ijl``, method 3), and optionally by the attention weights (the
"value term" ``sum_j p_ij a^V_ij``, Shaw and NEZHA). The encodings differ in where the table
comes from (learned, fixed sinusoid), how the relative position is windowed (clipped at the
edge, or zero beyond it), in which order the rows are stored, and which terms they use;
``RelativeEmbeddingTable`` holds everything else.

No ``(L, L, D)`` tensor is ever built:

* ``prepare`` computes ``qr = q @ a^T`` over the table rows that the call's positions can
  reach: ``(B, H, Lq, R)`` with ``R <= min(rows, Lq + Lk - 1)``; ``bias`` gathers
  ``qr[b, h, i, row(j - i)]``. This is the memory-efficient equivalent of the Music
  Transformer's "skewing" (``skew`` below): both read ``q_i . E[j - i + L - 1]`` out of
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
import torch.nn.functional as F
from torch import Tensor, nn

from ..functional import sinusoidal_table
from ..registry import register
from .base import BiasContext, Encoding

__all__ = [
    "skew",
    "skew_unmasked",
    "trilinear_scores",
    "gather_rows",
    "weighted_rows",
    "RelativeEmbeddingTable",
    "TableContext",
    "ShawRelative",
    "MusicTransformerRelative",
    "NezhaRelative",
    "Huang2020Method3",
    "Huang2020Method4",
]


# ------------------------------------------------------------------------------ skewing
def skew(qe: Tensor) -> Tensor:
    """Music Transformer's "skewing" (Huang et al. 2018, Sec. 3.4.1; tensor2tensor
    ``_relative_position_to_absolute_position_masked``).

    ``qe (..., L, L)`` is ``Q E_r^T``: column ``c`` holds relative position ``c - (L - 1)``.
    Pad one zero column on the left ``(..., L, L + 1)``, reshape to ``(..., L + 1, L)``, drop
    the first row. The result ``(..., L, L)`` is ``out[i, j] = qe[i, j - i + L - 1]`` for
    ``j <= i``; entries above the diagonal are garbage (masked by causal attention).
    """
    if qe.dim() < 2 or qe.shape[-1] != qe.shape[-2]:
        raise ValueError(f"qe must have shape (..., L, L), got {tuple(qe.shape)}")
    L = qe.shape[-1]
    padded = F.pad(qe, (1, 0))
    return padded.reshape(*qe.shape[:-2], L + 1, L)[..., 1:, :]


def skew_unmasked(qe: Tensor) -> Tensor:
    """The bidirectional skew (tensor2tensor ``_relative_position_to_absolute_position_unmasked``).

    ``qe (..., L, 2L - 1)``: column ``c`` holds relative position ``c - (L - 1)``. Append a zero
    column ``(..., L, 2L)``, flatten, append ``L - 1`` zeros, reshape to ``(..., L + 1, 2L - 1)``,
    keep rows ``:L`` and columns ``L - 1:``. The result ``(..., L, L)`` is
    ``out[i, j] = qe[i, j - i + L - 1]`` for every ``i, j``.
    """
    if qe.dim() < 2 or qe.shape[-1] != 2 * qe.shape[-2] - 1:
        raise ValueError(f"qe must have shape (..., L, 2L - 1), got {tuple(qe.shape)}")
    L = qe.shape[-2]
    lead = qe.shape[:-2]
    flat = F.pad(qe, (0, 1)).reshape(*lead, 2 * L * L)
    flat = F.pad(flat, (0, L - 1))
    return flat.reshape(*lead, L + 1, 2 * L - 1)[..., :L, L - 1 :]


# ------------------------------------------------------------------------------ trilinear
class _Trilinear(torch.autograd.Function):
    """``out = sum_l q[..., l] * k[..., l] * table[rows, l]`` (broadcasting leading dims)."""

    @staticmethod
    def forward(ctx, q, k, table, rows):  # type: ignore[override]
        columns = table.t().contiguous()
        out = None
        for l in range(columns.shape[0]):
            term = q[..., l] * k[..., l]
            term = term * columns[l][rows]
            out = term if out is None else out.add_(term)
        ctx.save_for_backward(q, k, columns, rows)
        return out

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        q, k, columns, rows = ctx.saved_tensors
        dq = torch.empty_like(q) if ctx.needs_input_grad[0] else None
        dk = torch.empty_like(k) if ctx.needs_input_grad[1] else None
        dcols = torch.zeros_like(columns) if ctx.needs_input_grad[2] else None
        flat_rows = rows.reshape(-1)
        for l in range(columns.shape[0]):
            ql, kl = q[..., l], k[..., l]
            weighted = grad * columns[l][rows]
            if dq is not None:
                dq[..., l] = (weighted * kl).sum_to_size(ql.shape)
            if dk is not None:
                dk[..., l] = (weighted * ql).sum_to_size(kl.shape)
            if dcols is not None:
                per_pair = (grad * ql * kl).sum_to_size(rows.shape)
                dcols[l].index_add_(0, flat_rows, per_pair.reshape(-1))
        dtable = dcols.t() if dcols is not None else None
        return dq, dk, dtable, None


def trilinear_scores(q: Tensor, k: Tensor, table: Tensor, rows: Tensor) -> Tensor:
    """``sum_l q[..., l] * k[..., l] * table[rows, l]`` without the ``(..., D)`` product tensor.

    ``q``, ``k`` ``(..., D)`` and ``rows`` (long, indices into ``table (R, D)``) broadcast
    against each other (e.g. ``(B, H, T, 1, D)``, ``(B, H, 1, S, D)``, ``(B, 1, T, S)``). Loops
    over the D channels forward and backward (custom autograd), so memory stays at a few
    tensors of the broadcast shape.
    """
    return _Trilinear.apply(q, k, table, rows)


# ------------------------------------------------------------------------------ base class
@dataclass
class TableContext(BiasContext):
    """``BiasContext`` plus ``row0``, the first table row the call reads (its products in
    ``extra`` cover rows ``row0 .. row0 + R - 1``)."""

    row0: int = 0


def gather_rows(t: Tensor, b: Tensor, h: Tensor, x: Tensor, rows: Tensor) -> Tensor:
    """``t[b, h, x, rows]`` for a per-call product ``t (B, H', L, R)`` (``q @ a^T`` with ``x``
    the query grid, ``k @ a^T`` with ``x`` the key grid), at the index grids of ``bias``
    (``b, h, x`` and ``rows`` broadcast to the output shape).

    On the backends' ``(B, H, T, S)`` grids this is one ``gather`` along R (plain advanced
    indexing would first build a ``(B, H, T, S)`` linear index from all four); other index
    shapes (0-d FlexAttention indices) use advanced indexing.
    """
    if rows.dim() != 4:
        return t[b, h, x, rows]
    grid = torch.broadcast_shapes(b.shape, h.shape, x.shape)
    shape = torch.broadcast_shapes(grid, rows.shape)
    sel = t[b, h, x]  # grid + (R,)
    n = sel.shape[-1]
    if grid[-1] == 1:  # x runs over queries: sel (B, H, T, 1, R)
        return torch.gather(sel[..., 0, :].expand(*shape[:-1], n), -1, rows.expand(shape))
    if grid[-2] == 1:  # x runs over keys: sel (B, H, 1, S, R); gather key-major, transpose
        per_key = sel[..., 0, :, :].expand(*shape[:-2], shape[-1], n)
        index = rows.expand(shape).transpose(-1, -2)
        return torch.gather(per_key, -1, index).transpose(-1, -2)
    return t[b, h, x, rows]


def weighted_rows(p: Tensor, rows: Tensor, table: Tensor) -> Tensor:
    """``sum_j p_ij table[rows_ij]``: the value term of a relative-embedding table.

    ``p (..., T, S)`` (attention weights of a query block), ``rows`` table rows broadcastable
    to ``p``, ``table (..., R, Dv)``; ``p`` is scatter-added into ``R`` row buckets
    ``(..., T, R)``, then one matmul: O(T S + T R Dv), never ``(T, S, Dv)``.
    """
    buckets = p.new_zeros(*p.shape[:-1], table.shape[-2])
    buckets.scatter_add_(-1, rows.expand(p.shape), p)
    return torch.matmul(buckets, table)


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


def _positive_int(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


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
        if not isinstance(values, bool):
            raise TypeError(f"values must be a bool, got {values!r}")
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


# ------------------------------------------------------------------------------ encodings
@register("shaw")
class ShawRelative(RelativeEmbeddingTable):
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
        max_relative_position: int | tuple[int, int] = 16,
        values: bool = True,
        heads_share: bool = True,
    ) -> None:
        left, right = _window(max_relative_position, "max_relative_position")
        super().__init__(num_heads, head_dim, left=left, right=right, values=values)
        self.heads_share = bool(heads_share)
        bound = (3.0 / self.num_rows) ** 0.5
        self.key_table = self._new_table(not self.heads_share, "uniform", bound)
        self.value_table = (
            self._new_table(not self.heads_share, "uniform", bound) if values else None
        )

    def relation_table(self, role: str) -> Tensor:
        table = self.key_table if role == "key" else self.value_table
        assert table is not None
        return table

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, heads_share={self.heads_share}"


@register("music-transformer")
class MusicTransformerRelative(RelativeEmbeddingTable):
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
        max_relative_position: int = 2048,
        values: bool = False,
        heads_share: bool = False,
        bidirectional: bool = False,
    ) -> None:
        n = _positive_int(max_relative_position, "max_relative_position")
        if not isinstance(bidirectional, bool):
            raise TypeError(f"bidirectional must be a bool, got {bidirectional!r}")
        super().__init__(
            num_heads, head_dim, left=n - 1, right=n - 1 if bidirectional else 0, values=values
        )
        self.max_relative_position = n
        self.bidirectional = bidirectional
        self.causal_only = not bidirectional  # type: ignore[misc]
        self.heads_share = bool(heads_share)
        std = head_dim**-0.5
        self.key_table = self._new_table(not self.heads_share, "normal", std)
        self.value_table = self._new_table(not self.heads_share, "normal", std) if values else None

    def relation_table(self, role: str) -> Tensor:
        table = self.key_table if role == "key" else self.value_table
        assert table is not None
        return table

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, heads_share={self.heads_share}, "
            f"bidirectional={self.bidirectional}"
        )


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
        max_relative_position: int = 64,
        values: bool = True,
    ) -> None:
        k = _positive_int(max_relative_position, "max_relative_position")
        super().__init__(num_heads, head_dim, left=k, right=k, values=values)
        if head_dim % 2:
            raise ValueError(f"head_dim must be even for NEZHA's sinusoid table, got {head_dim}")
        self.max_relative_position = k
        table = sinusoidal_table(torch.arange(self.num_rows), head_dim)
        self.register_buffer("table", table, persistent=False)

    def relation_table(self, role: str) -> Tensor:
        return self.table


class _Huang2020(RelativeEmbeddingTable):
    """Shared by methods 3 and 4: HF BERT's ``distance_embedding`` layout.

    ``a_ij = E[(i - j) + M - 1]``, ``E (2M - 1, D)`` shared by the heads, ``M =
    max_position_embeddings``. HF does not clip (positions stay below M); relpos clips
    ``i - j`` to ``±(M - 1)`` so longer sequences reuse the edge rows.
    """

    ascending = False

    def __init__(self, num_heads: int, head_dim: int, *, max_position_embeddings: int) -> None:
        m = _positive_int(max_position_embeddings, "max_position_embeddings")
        super().__init__(num_heads, head_dim, left=m - 1, right=m - 1, values=False)
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
        self, num_heads: int, head_dim: int, *, max_position_embeddings: int = 512
    ) -> None:
        super().__init__(num_heads, head_dim, max_position_embeddings=max_position_embeddings)
        self.distance_embedding = self._new_table(False, "normal", 0.02)


@register("huang2020-m3")
class Huang2020Method3(_Huang2020):
    """Method 3 of Huang et al. 2020 (arXiv 2009.13658): the trilinear interaction of query,
    key and relative embedding.

    ``e_ij = sum_l q_il k_jl a_ijl * scale``, ``a_ij = E[(i - j) + M - 1]`` (the content term
    ``q_i . k_j`` is not added separately: with ``a = 1`` this is plain attention). relpos adds
    ``sum_l q_il k_jl (a_ijl - 1) * scale`` to the backends' content term, computed per query
    tile by ``trilinear_scores`` (a loop over the D channels, O(T S) memory; no ``(T, S, D)``).

    Authority C (spec §13): no code was found; the formula is the paper's as recalled. Assumed
    here: HF's table layout and window (shared by heads, ``2M - 1`` rows, as for method 4)
    and the initialisation ``E = 1 + N(0, 0.02^2)``, so training starts from dot-product
    attention (with ``E ~ N(0, 0.02^2)`` every logit would start at ~0).

    Args:
        max_position_embeddings: ``M`` (default 512); ``E`` has ``2M - 1`` rows.
    """

    paper = "Huang et al. 2020, method 3 (trilinear)"
    terms = ("trilinear",)

    def __init__(
        self, num_heads: int, head_dim: int, *, max_position_embeddings: int = 512
    ) -> None:
        super().__init__(num_heads, head_dim, max_position_embeddings=max_position_embeddings)
        self.distance_embedding = nn.Parameter(1 + torch.randn(self.num_rows, head_dim) * 0.02)
