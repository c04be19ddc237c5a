"""Reading a table of relative embeddings without an ``(L, L, D)`` tensor: pure functions.

* ``skew`` / ``skew_unmasked``: the Music Transformer's "skewing" of ``Q E^T`` (Huang et al.
  2018, Sec. 3.4.1; tensor2tensor), kept as the reference the gather below is tested against;
* ``gather_rows``: ``t[b, h, n, rows]`` of a per-call product ``q @ a^T`` (or ``k @ a^T``) at
  the index grids of ``Encoding.bias``: the one fast gather of every relative-table read;
* ``weighted_rows``: the value term ``sum_j p_ij a^V[rows_ij]`` by scatter-adding the softmax
  weights into row buckets, O(T S + T R Dv);
* ``trilinear_scores``: ``sum_l q_l k_l a_l`` with a custom backward that loops over the
  channels (Huang et al. 2020 method 3), O(T S) memory per query tile.

Used by the table reader (``table.py``: ``TableRead``) and by the encodings built on it.
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
def _is_grid(b: Tensor, h: Tensor, n: Tensor, axis: int) -> bool:
    """``b (Bb,1,1,1)``, ``h (1,Hh,1,1)`` and ``n`` a query (axis 2) or key (axis 3) index grid."""
    if b.dim() != 4 or h.dim() != 4 or n.dim() != 4:
        return False
    other = 5 - axis  # the grid axis of the other index
    return (
        b.shape[1:] == (1, 1, 1)
        and h.shape[0] == 1
        and h.shape[2:] == (1, 1)
        and n.shape[:2] == (1, 1)
        and n.shape[other] == 1
    )


def _select(t: Tensor, dim: int, index: Tensor) -> Tensor:
    """``t.index_select(dim, index)``; ``t`` itself or a ``narrow`` view when ``index`` is
    ``start, start + 1, ...`` (the usual grids), so neither a copy nor an ``index_add`` in
    backward is needed."""
    flat = index.reshape(-1)
    if flat.numel() == 0:
        return t.index_select(dim, flat)
    start = int(flat[0])
    span = torch.arange(start, start + flat.numel(), device=flat.device, dtype=flat.dtype)
    if torch.equal(flat, span):
        if start == 0 and flat.numel() == t.shape[dim]:
            return t
        return t.narrow(dim, start, flat.numel())
    return t.index_select(dim, flat)


def gather_rows(
    t: Tensor, b: Tensor, h: Tensor, n: Tensor, rows: Tensor, *, by_keys: bool | None = None
) -> Tensor:
    """``t[b, h, n, rows]`` for a per-call product ``t (B, H', N, R)`` (``q @ a^T`` with ``n``
    the query index, ``k @ a^T`` with ``n`` the key index and ``by_keys=True``), at the index
    grids of ``Encoding.bias`` (``b, h, n`` and ``rows`` broadcast to the output shape).

    On the backends' ``(B, H, T, S)`` grids the batch rows, heads and rows ``n`` are selected
    first (views for consecutive indices) and then gathered along ``R``: one ``gather``, whose
    backward is a ``scatter_add`` of ``T x S`` values (plain advanced indexing would build a
    linear index from all four and accumulate with ``index_put``). Other index shapes
    (FlexAttention's 0-d indices) use advanced indexing. ``by_keys=None``: from the shape of
    ``n`` (a key grid has its keys on the last axis).
    """
    if by_keys is None:
        by_keys = n.dim() == 4 and n.shape[-2] == 1 and n.shape[-1] != 1
    if rows.dim() != 4 or not _is_grid(b, h, n, 3 if by_keys else 2):
        return t[b, h, n, rows]
    sel = _select(_select(_select(t, 2, n), 0, b), 1, h)
    if not by_keys:
        return sel.gather(-1, rows.expand(*sel.shape[:2], *rows.shape[2:]))
    # key-major: gather (S, T) per head with a contiguous index (a transposed index makes the
    # gather much slower), then hand back the (T, S) view
    index = rows.transpose(-1, -2).contiguous()  # (Bb|1, 1, S, T): no head copies
    return sel.gather(-1, index.expand(*sel.shape[:2], *index.shape[2:])).transpose(-1, -2)


def weighted_rows(p: Tensor, rows: Tensor, table: Tensor) -> Tensor:
    """``sum_j p_ij table[rows_ij]``: the value term of a relative-embedding table.

    ``p (..., T, S)`` (attention weights of a query block), ``rows`` table rows broadcastable
    to ``p``, ``table (..., R, Dv)``; ``p`` is scatter-added into ``R`` row buckets
    ``(..., T, R)``, then one matmul: O(T S + T R Dv), never ``(T, S, Dv)``.
    """
    buckets = p.new_zeros(*p.shape[:-1], table.shape[-2])
    buckets.scatter_add_(-1, rows.expand(p.shape), p)
    return torch.matmul(buckets, table)
