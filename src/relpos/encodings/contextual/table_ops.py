"""Reading a table of relative embeddings without an ``(L, L, D)`` tensor: pure functions.

* ``skew`` / ``skew_unmasked``: the Music Transformer's "skewing" of ``Q E^T`` (Huang et al.
  2018, Sec. 3.4.1; tensor2tensor), kept as the reference the gather below is tested against;
* ``gather_rows``: ``t[b, h, x, rows]`` of a per-call product ``q @ a^T`` (or ``k @ a^T``) at
  the index grids of ``Encoding.bias``: O(L R) memory, any positions, any query tile;
* ``weighted_rows``: the value term ``sum_j p_ij a^V[rows_ij]`` by scatter-adding the softmax
  weights into row buckets, O(T S + T R Dv);
* ``trilinear_scores``: ``sum_l q_l k_l a_l`` with a custom backward that loops over the
  channels (Huang et al. 2020 method 3), O(T S) memory per query tile.

Used by ``relative_table.RelativeEmbeddingTable`` (Shaw, Music Transformer, NEZHA, Huang 2020)
and by ``irpe``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["skew", "skew_unmasked", "trilinear_scores", "gather_rows", "weighted_rows"]


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


# ------------------------------------------------------------------------------ gathers
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
