"""Sparse + low-rank attention with RoPE: a fixed-sparsity block-sparse softmax branch plus a
global low-rank linear-attention branch over the blocks it does not cover (RoLA; RoPeSLR, arXiv
2605.20659, as a baseline), combined as SLA does.

Combination (SLA: Zhang et al. 2025, "SLA: Beyond Sparsity in Diffusion Transformers via
Fine-Tunable Sparse-Linear Attention", arXiv 2509.24006; the official
thu-ml/SLA code was read, ``sparse_linear_attention/core.py`` and ``kernel.py``). Queries and
keys are cut into blocks of ``b`` consecutive tokens; a block mask ``M (nq, nk)`` marks the
key blocks each query block attends to exactly. Per head, with ``C_i`` the keys of the
blocks covered for query ``i`` and ``N_i`` the other visible keys,

    O_s_i = sum_{j in C_i} softmax_j(s_ij) v_j,           s_ij = <R_i q_i, R_j k_j> * scale
    O_l_i = sum_{j in N_i} (a_i . a'_j) v_j  /  sum_{j in N_i} phi_q_i . phi_k_j
    O_i   = O_s_i + W O_l_i

``R`` the model's rotary encoding, ``(phi, a, a')`` the low-rank branch's features (below)
and ``W`` a learnt ``(Dv, Dv)`` projection (with a bias) shared by the heads, **initialised
to zero**, so the module starts as the sparse attention alone (SLA's ``proj_l``). Each branch
is normalised on its own keys; a branch whose key set is empty gives 0 (SLA: its denominator
is set to infinity). SLA's linear branch sums exactly over the complement ``N_i``: its kernel
forms per-block sums ``(S_J, Z_J)`` and subtracts the selected blocks' from the total.

Block selection (SLA's ``get_block_map``, plus the local neighbourhood RoLA's "fixed-sparsity
sparse branch" implies): pooled scores ``s_IJ = mean_{i in I} (R q)_i . mean_{j in J} (R k)_j``
(relative, since the pooled rotated vectors are), and per query block the key blocks within
``local_radius`` of the diagonal (always kept) plus the top-scoring others up to
``floor((1 - sparsity) * n_visible)`` blocks ("90% sparsity" keeps 10% of the visible blocks).
SLA centres the keys by their mean before pooling (``smooth-k``); that shifts a row of scores
by one constant and does not change the top-k, so it is not done here. Causal (not in SLA,
whose DiTs are bidirectional; assumed): only blocks ``J <= I`` are visible, the diagonal block
is never ranked (its pooled key would read future keys), and a query block is pooled over the
``b`` queries that end at its first token, so no selection reads a future token. The
selection is discrete (no gradient); it is computed once per call and shared by the two
branches (``BlockSelection``; pass one to fix the pattern).

Low-rank branches (``lowrank``):

* ``"rola"`` (abstract only, ``relpos.nn.mixers.rola``): ``phi`` a low-rank feature map
  (``LowRankFeatures``), ``a = R^S phi`` rotated *after* the features by ``r/2`` pairs of the
  model's rotary schedule (``frequency_subset``), the denominator unrotated: relative.
* ``"ropeslr"`` (abstract only, ``relpos.nn.mixers.ropeslr``): head-wise low-rank
  features of the inputs plus a learnt absolute 3-D position embedding, no rotation:
  absolute (a baseline, not an RPE method).

What was assumed (neither RoLA's nor RoPeSLR's code was found; their abstracts do not say how
the branches combine): SLA's combination above, SLA's mean-pooled top-k selection, the local
neighbourhood, the causal rules, and that both branches see the same keys (the low-rank branch
exactly the complement). The token order defines the blocks: 3-D grids flattened as
``relpos.positions_nd.grid_positions`` (time, height, width) give blocks of consecutive rows.

Cost (``method="blocked"``). The sparse branch gathers the kept key blocks per query block,
O(L * K * b * (d + Dv)) time for ``K`` kept blocks, in chunks of query blocks (memory bounded
by ``CHUNK_ELEMENTS`` scores). A chunk whose gathered keys are all attended (bidirectional,
each row keeping ``K`` whole blocks, no padding) is one fused SDPA call; a masked chunk
(causal, padding, rows keeping fewer blocks) one masked SDPA call, or an explicit masked
softmax when it holds a row that sees no key. The low-rank branch forms per-block sums
``S_J = sum a'_j v_j^T`` and ``Z_J = sum phi_k_j`` (O(L r Dv)), their complement per query
block with one product by the 0/1 complement mask (O((L/b)^2 r Dv), a small GEMM; summing
the uncovered blocks directly instead of total minus covered avoids cancellation), and reads
them per query (O(L r Dv)); causal calls add the in-block causal term for query blocks whose
diagonal block is not covered (O(L b r)). Without autograd the memory is O(L (d + Dv)) plus
one chunk; under autograd each chunk's gathered blocks are kept for the backward pass
(O(L K b (d + Dv))) unless ``checkpoint_chunks`` recomputes them. ``method="dense"`` is the
O(L^2) definition (explicit token masks and kernel sums), the tests' reference.

Shapes: ``q, k (B, H, L, d)``, ``v (B, H, L, Dv)`` (self-attention: one sequence), positions
``(L,)``, ``(L, m)``, ``(B|1, L)`` or ``(B|1, L, m)`` (default ``0..L-1`` on every axis),
``key_valid (B, L)`` bool (False: padded token, never attended); output ``(B, H, L, Dv)`` in
q's dtype (features and softmax in float32, float64 for float64 inputs). Rows with no visible
key give 0 with zero gradients. No recurrent decoding: the selection reads the whole sequence.

The layer: ``SparseLowRankAttention``: a block-sparse softmax branch with RoPE plus a
zero-initialised
low-rank branch over the blocks it does not cover (RoLA; RoPeSLR, arXiv 2605.20659, as a
baseline; combined as SLA, arXiv 2509.24006). ``relpos.nn.mixers.sparse_lowrank`` holds the
math and states what was assumed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from ...attention.linear.feature_maps import FeatureMap, HeadwiseLowRankFeatures, LowRankFeatures
from ...attention.linear.kernelized import _nonzero_ratio
from ...encodings.base import Encoding
from ...validation import check_bool, check_choice, check_float, check_int, check_int_sequence
from ..attention import build_encoding
from ..head_projections import ProjectedHeads
from .rola import rotary_schedule, rotate_by_schedule, select_frequencies
from .ropeslr import GridPositionEmbedding, ropeslr_features

__all__ = [
    "CHUNK_ELEMENTS",
    "LOWRANK_BRANCHES",
    "BlockSelection",
    "select_blocks",
    "block_sparse_attention",
    "complement_linear_attention",
    "sparse_lowrank_attention",
    "normalize_grid_positions",
    "rotate_queries_keys",
    "SparseLowRankAttention",
]


#: score elements of one chunk of query blocks in the sparse branch
CHUNK_ELEMENTS = 1 << 22
#: the low-rank branches of ``sparse_lowrank_attention``
LOWRANK_BRANCHES = ("rola", "ropeslr")


def _compute_dtype(x: Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _num_blocks(length: int, block_size: int) -> int:
    return -(-length // block_size)


@dataclass(frozen=True)
class BlockSelection:
    """The key blocks each query block attends to exactly: ``mask (B|1, H|1, n, n)`` bool,
    ``n = ceil(length / block_size)`` (row: query block, column: key block). Causal
    selections never cover a block above the diagonal."""

    mask: Tensor
    block_size: int
    length: int
    causal: bool

    def __post_init__(self) -> None:
        check_int(self.block_size, "block_size")
        check_int(self.length, "length", minimum=0)
        n = _num_blocks(self.length, self.block_size)
        m = self.mask
        if not isinstance(m, Tensor) or m.dtype != torch.bool or m.dim() != 4:
            raise ValueError("BlockSelection.mask must be a bool tensor (B|1, H|1, n, n)")
        if m.shape[-2:] != (n, n):
            raise ValueError(
                f"BlockSelection.mask must be (B|1, H|1, {n}, {n}) for length {self.length} "
                f"and block_size {self.block_size}, got {tuple(m.shape)}"
            )
        if self.causal and n and bool(m.triu(1).any()):
            raise ValueError("a causal BlockSelection must not cover key blocks after the query's")

    @classmethod
    def full(cls, length: int, block_size: int, causal: bool = False) -> BlockSelection:
        """Every visible block covered (the sparse branch is softmax attention)."""
        n = _num_blocks(length, block_size)
        mask = torch.ones(n, n, dtype=torch.bool)
        if causal:
            mask = mask.tril()
        return cls(mask[None, None], block_size, length, causal)

    @classmethod
    def empty(cls, length: int, block_size: int, causal: bool = False) -> BlockSelection:
        """No block covered (the low-rank branch sees every key)."""
        n = _num_blocks(length, block_size)
        return cls(torch.zeros(1, 1, n, n, dtype=torch.bool), block_size, length, causal)

    @property
    def num_blocks(self) -> int:
        return _num_blocks(self.length, self.block_size)

    def density(self) -> float:
        """The fraction of visible blocks covered (1 - the realised sparsity)."""
        n = self.num_blocks
        if n == 0:
            return 0.0
        visible = n * (n + 1) / 2 if self.causal else n * n
        return float(self.mask.double().sum(dim=(-2, -1)).mean()) / visible

    def gather_index(self) -> tuple[Tensor, Tensor]:
        """``(index, keep)``, both ``(B|1, H|1, n, K)``: the covered key blocks of each query
        block in increasing order, padded to the largest count ``K`` (``keep`` False on
        padding, whose index is 0)."""
        counts = self.mask.sum(-1)
        K = int(counts.max()) if self.mask.numel() else 0
        order = torch.sort(self.mask.to(torch.int8), dim=-1, descending=True, stable=True)
        index = order.indices[..., :K]
        keep = order.values[..., :K].bool()
        return torch.where(keep, index, torch.zeros_like(index)), keep

    def token_mask(self) -> Tensor:
        """``(B|1, H|1, L, L)`` bool: pairs whose key block is covered for the query's block
        (before the causal and padding masks)."""
        b, L = self.block_size, self.length
        blk = torch.arange(L, device=self.mask.device) // b
        return self.mask[:, :, blk][:, :, :, blk]


def _block_sums(x: Tensor, weight: Tensor | None, b: int, n: int) -> Tensor:
    """``x (B, H, L, d)`` weighted by ``weight (B, 1, L, 1)`` (None: 1) and summed per block:
    ``(B, H, n, d)``."""
    pad = n * b - x.shape[2]
    y = x if weight is None else x * weight
    if pad:
        y = F.pad(y, (0, 0, 0, pad))
    return y.unflatten(2, (n, b)).sum(3)


def _pooled_queries(q: Tensor, weight: Tensor, b: int, n: int, causal: bool) -> Tensor:
    """Mean query of each block ``(B, H, n, d)``; causal: the mean of the ``b`` queries that
    end at the block's first token (nothing after it)."""
    if not causal:
        total = _block_sums(q, None if bool(weight.all()) else weight, b, n)
        count = _block_sums(weight, None, b, n)
        return total / count.clamp(min=1)
    cq = F.pad((q * weight).cumsum(2), (0, 0, 1, 0))  # cq[t] = sum_{u < t}
    cw = F.pad(weight.cumsum(2), (0, 0, 1, 0))
    first = torch.arange(n, device=q.device) * b
    hi, lo = first + 1, (first - b + 1).clamp(min=0)
    count = (cw[:, :, hi] - cw[:, :, lo]).clamp(min=1)
    return (cq[:, :, hi] - cq[:, :, lo]) / count


def select_blocks(
    q: Tensor,
    k: Tensor,
    *,
    block_size: int,
    sparsity: float,
    local_radius: int | None = 0,
    causal: bool = False,
    key_valid: Tensor | None = None,
) -> BlockSelection:
    """The fixed-sparsity block pattern (module docstring) from rotated ``q, k (B, H, L, d)``.

    Per query block ``I``: the key blocks ``J`` with ``|I - J| <= local_radius`` (None: no
    local neighbourhood; causal: ``I - r <= J <= I``), then the visible others by decreasing
    pooled score ``q_I . k_J`` (ties: lower block first) until ``max(n_local, floor((1 -
    sparsity) n_visible))`` blocks are kept; key blocks without a valid key are never ranked.
    ``sparsity = 0`` covers every visible block, ``sparsity = 1`` the local ones only."""
    b = check_int(block_size, "block_size")
    s = check_float(sparsity, "sparsity", minimum=0.0, maximum=1.0)
    if local_radius is not None:
        local_radius = check_int(local_radius, "local_radius", minimum=0)
    causal = check_bool(causal, "causal")
    B, H, L, _ = q.shape
    n = _num_blocks(L, b)
    dev = q.device
    with torch.no_grad():
        dtype = _compute_dtype(q)
        valid = torch.ones(B, L, dtype=torch.bool, device=dev) if key_valid is None else key_valid
        w = valid.to(dtype)[:, None, :, None]
        k_bar = _block_sums(k.detach().to(dtype), None if key_valid is None else w, b, n)
        k_cnt = _block_sums(w, None, b, n)[:, :, :, 0]  # (B, 1, n)
        k_bar = k_bar / k_cnt[..., None].clamp(min=1)
        q_bar = _pooled_queries(q.detach().to(dtype), w, b, n, causal)
        scores = q_bar @ k_bar.transpose(-1, -2)  # (B, H, n, n)
        rows = torch.arange(n, device=dev)[:, None]
        cols = torch.arange(n, device=dev)[None, :]
        visible = cols <= rows if causal else torch.ones(n, n, dtype=torch.bool, device=dev)
        ranked = (cols < rows) if causal else visible
        ranked = ranked & (k_cnt[:, :, None, :] > 0)  # (B, 1, n, n)
        if local_radius is None:
            local = torch.zeros(n, n, dtype=torch.bool, device=dev)
        else:
            local = ((rows - cols).abs() <= local_radius) & visible
        rank_score = scores.masked_fill(~ranked, -math.inf).masked_fill(local, math.inf)
        n_visible = (torch.arange(n, device=dev) + 1) if causal else torch.full((n,), n, device=dev)
        budget = torch.floor((1.0 - s) * n_visible.double() + 1e-9).long()
        count = torch.maximum(budget, local.sum(-1))  # (n,)
        values, order = torch.sort(rank_score, dim=-1, descending=True, stable=True)
        take = (torch.arange(n, device=dev) < count[:, None]) & (values > -math.inf)
        mask = torch.zeros_like(take).scatter(-1, order, take)
    return BlockSelection(mask, b, L, causal)


def _token_valid(key_valid: Tensor | None, B: int, L: int, N: int, device: torch.device) -> Tensor:
    """``(B|1, N)`` bool: real (unpadded, valid) key tokens of the block-padded sequence."""
    valid = torch.zeros(1 if key_valid is None else B, N, dtype=torch.bool, device=device)
    valid[:, :L] = True if key_valid is None else key_valid
    return valid


def _softmax_values(logits: Tensor, allowed: Tensor, v: Tensor) -> Tensor:
    """``softmax(logits) @ v`` over the allowed entries of each row; rows with none give 0
    with zero gradients."""
    logits = logits.masked_fill(~allowed, -math.inf)
    top = logits.detach().amax(-1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    p = torch.exp(logits - top)
    den = p.sum(-1, keepdim=True)
    return (p @ v) / torch.where(den > 0, den, torch.ones_like(den))


def _attend_chunk(
    qc: Tensor,
    kb: Tensor,
    vb: Tensor,
    idx: Tensor,
    allowed: Tensor | None,
    scale: float,
    bufs: tuple[Tensor, Tensor] | None,
) -> Tensor:
    """Softmax attention of the query blocks ``qc (B, H, g, b, d)`` over the key blocks
    ``idx`` of ``kb, vb (B H n, b, .)`` (``kc`` per query block), restricted to ``allowed
    (B, H, g, 1|b, kc b)`` (None: every gathered key): ``(B, H, g, b, Dv)``."""
    B, H, g, b, d = qc.shape
    Dv = vb.shape[-1]
    kc = idx.numel() // (B * H * g)
    if bufs is None:
        kg, vg = kb.index_select(0, idx), vb.index_select(0, idx)
    else:
        kg = torch.index_select(kb, 0, idx, out=bufs[0][: idx.numel()])
        vg = torch.index_select(vb, 0, idx, out=bufs[1][: idx.numel()])
    kg, vg = kg.view(B, H, g, kc * b, d), vg.view(B, H, g, kc * b, Dv)
    if allowed is None:  # the fused kernel, no mask
        return F.scaled_dot_product_attention(
            qc.flatten(1, 2), kg.flatten(1, 2), vg.flatten(1, 2), scale=scale
        ).unflatten(1, (H, g))
    if bool(allowed.any(-1).all()):  # every row sees a key: the fused kernel, masked
        return F.scaled_dot_product_attention(
            qc.flatten(1, 2),
            kg.flatten(1, 2),
            vg.flatten(1, 2),
            attn_mask=allowed.flatten(1, 2),
            scale=scale,
        ).unflatten(1, (H, g))
    # rows without a key: 0 with zero gradients
    logits = (qc @ kg.transpose(-1, -2)) * scale  # (B, H, g, b, kc b)
    return _softmax_values(logits, allowed, vg)


def block_sparse_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    selection: BlockSelection,
    *,
    scale: float | None = None,
    key_valid: Tensor | None = None,
    checkpoint_chunks: bool = False,
) -> Tensor:
    """The sparse branch ``O_s (B, H, L, Dv)``: softmax attention of rotated ``q, k (B, H, L,
    d)`` over the covered key blocks only (token-causal inside the diagonal block when
    ``selection.causal``), in the compute dtype of q (float32 or float64).
    ``checkpoint_chunks``: under autograd, recompute each chunk's gathers and attention in
    the backward pass (activation checkpointing) instead of keeping them: training memory
    O(L (d + Dv)) instead of O(L K b (d + Dv)), for about one more forward of the branch."""
    B, H, L, d = q.shape
    Dv = v.shape[-1]
    b, n = selection.block_size, selection.num_blocks
    scale = d**-0.5 if scale is None else scale
    work = _compute_dtype(q)
    index, keep = selection.gather_index()
    K = index.shape[-1]
    if L == 0 or K == 0:
        return q.new_zeros(B, H, L, Dv, dtype=work)
    N = n * b
    index = index.expand(B, H, n, K)
    keep = keep.expand(B, H, n, K)

    def blocks(t: Tensor) -> Tensor:
        t = t.to(work)
        return t if N == L else F.pad(t, (0, 0, 0, N - L))

    qb = blocks(q).unflatten(2, (n, b))  # (B, H, n, b, d)
    kb = blocks(k).reshape(B * H * n, b, d)
    vb = blocks(v).reshape(B * H * n, b, Dv)
    # every gathered key is attended unless a key is padding, a row keeps fewer blocks than
    # K, or the call is causal: then the explicit masked softmax, else the fused kernel
    every_key = key_valid is None and N == L and bool(keep.all()) and not selection.causal
    valid = None
    if not every_key:
        valid = _token_valid(key_valid, B, L, N, q.device).view(-1, 1, n, b).expand(B, H, n, b)
        valid = valid.reshape(B * H * n, b)
    flat = torch.arange(B * H, device=q.device).view(B, H, 1, 1) * n + index
    offs = torch.arange(b, device=q.device)
    step = max(1, CHUNK_ELEMENTS // max(1, B * H * b * K * b))
    # without autograd the gathers reuse one buffer per chunk and the chunks write into the
    # output (fresh large allocations cost page faults comparable to the copies themselves)
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    bufs: tuple[Tensor, Tensor] | None = None
    if not grad:
        g0 = min(step, n)
        bufs = (kb.new_empty(B * H * g0 * K, b, d), vb.new_empty(B * H * g0 * K, b, Dv))
        out = q.new_empty(B, H, n, b, Dv, dtype=work)
    outs = []
    for s in range(0, n, step):
        e = min(n, s + step)
        g = e - s
        # this chunk's rows keep at most kc blocks (causal rows keep more further down)
        kc = K if every_key else int(keep[:, :, s:e].sum(-1).max())
        if kc == 0:
            part = q.new_zeros(B, H, g, b, Dv, dtype=work)
            if bufs is None:
                outs.append(part)
            else:
                out[:, :, s:e] = part
            continue
        idx = flat[:, :, s:e, :kc].reshape(-1)
        allowed = None
        if not every_key:
            assert valid is not None
            blk = index[:, :, s:e, :kc]  # (B, H, g, kc)
            kvalid = valid.index_select(0, idx).view(B, H, g, kc, b)
            kvalid = kvalid & keep[:, :, s:e, :kc, None]
            allowed = kvalid.view(B, H, g, 1, kc * b)
            if selection.causal:
                k_tok = (blk[..., None] * b + offs).flatten(-2, -1)  # (B, H, g, kc b)
                q_tok = (torch.arange(s, e, device=q.device)[:, None] * b + offs)[..., None]
                allowed = allowed & (k_tok[:, :, :, None, :] <= q_tok)
        if grad and checkpoint_chunks:
            part = checkpoint(
                _attend_chunk, qb[:, :, s:e], kb, vb, idx, allowed, scale, None, use_reentrant=False
            )
        else:
            part = _attend_chunk(qb[:, :, s:e], kb, vb, idx, allowed, scale, bufs)
        if bufs is None:
            outs.append(part)
        else:
            out[:, :, s:e] = part
    if bufs is None:
        out = torch.cat(outs, 2)
    return out.flatten(2, 3)[:, :, :L]


def complement_linear_attention(
    phi_q: Tensor,
    phi_k: Tensor,
    v: Tensor,
    selection: BlockSelection,
    *,
    rotated: tuple[Tensor, Tensor] | None = None,
    key_valid: Tensor | None = None,
) -> Tensor:
    """The low-rank branch ``O_l (B, H, L, Dv)``: kernelized attention of the features
    ``phi_q, phi_k (B, H, L, r)`` over the visible keys the selection does not cover;
    ``rotated = (a_q, a_k)`` the numerator's features (RoLA; the denominator keeps phi)."""
    B, H, L, r = phi_q.shape
    Dv = v.shape[-1]
    b, n = selection.block_size, selection.num_blocks
    work = phi_q.dtype
    if L == 0:
        return phi_q.new_zeros(B, H, L, Dv)
    N = n * b
    aq, ak = (phi_q, phi_k) if rotated is None else (rotated[0].to(work), rotated[1].to(work))
    valid = _token_valid(key_valid, B, L, N, phi_q.device).to(work)  # (B|1, N)
    kw = valid[:, None, :, None]

    def blocks(t: Tensor) -> Tensor:
        t = t.to(work)
        return (t if N == L else F.pad(t, (0, 0, 0, N - L))).unflatten(2, (n, b))

    vb, akb, dkb = blocks(v), blocks(ak), blocks(phi_k)
    if key_valid is not None:  # padded keys: zero features (block padding is zero already)
        w = kw.unflatten(2, (n, b))
        vb, akb, dkb = vb * w, akb * w, dkb * w
    aqb, dqb = blocks(aq), blocks(phi_q)
    S = akb.transpose(-1, -2) @ vb  # (B, H, n, r, Dv)
    Z = dkb.sum(3)  # (B, H, n, r)
    cnt = valid.view(-1, 1, n, b).sum(-1)  # (B|1, 1, n)
    rows = torch.arange(n, device=phi_q.device)[:, None]
    cols = torch.arange(n, device=phi_q.device)[None, :]
    comp = ~selection.mask
    if selection.causal:
        comp = comp & (cols < rows)  # the diagonal block is handled token-causally below
    comp = comp.to(work)  # (B|1, H|1, n, n)
    Sc = (comp @ S.flatten(-2, -1)).unflatten(-1, (r, Dv))  # (B, H, n, r, Dv)
    Zc = comp @ Z  # (B, H, n, r)
    count = (comp @ cnt[..., None])[..., 0][..., None].expand(*comp.shape[:-1], b)
    num = aqb @ Sc  # (B, H, n, b, Dv)
    den = (dqb @ Zc[..., None])[..., 0]  # (B, H, n, b)
    if selection.causal:
        open_diag = ~selection.mask.diagonal(dim1=-2, dim2=-1)  # (B|1, H|1, n)
        if bool(open_diag.any()):
            tri = torch.ones(b, b, dtype=torch.bool, device=phi_q.device).tril()
            o = open_diag.to(work)[..., None]
            a_in = (aqb @ akb.transpose(-1, -2)).masked_fill(~tri, 0.0)
            d_in = (dqb @ dkb.transpose(-1, -2)).masked_fill(~tri, 0.0)
            num = num + (a_in @ vb) * o[..., None]
            den = den + d_in.sum(-1) * o
            seen = valid.view(-1, 1, n, b).cumsum(-1)  # valid keys j <= i inside the block
            count = count + seen * o
    out = _nonzero_ratio(num, den, count > 0.5)
    return out.flatten(2, 3)[:, :, :L]


def _dense_sparse(q, k, v, selection, scale, visible):  # noqa: ANN001, ANN202
    """O(L^2) definition of ``block_sparse_attention`` (method="dense")."""
    work = _compute_dtype(q)
    allowed = visible & selection.token_mask()
    logits = (q.to(work) @ k.to(work).transpose(-1, -2)) * scale
    return _softmax_values(logits, allowed, v.to(work))


def _dense_lowrank(phi_q, phi_k, v, selection, rotated, visible):  # noqa: ANN001, ANN202
    """O(L^2) definition of ``complement_linear_attention`` (method="dense")."""
    work = phi_q.dtype
    comp = (visible & ~selection.token_mask()).to(work)
    aq, ak = (phi_q, phi_k) if rotated is None else rotated
    num = ((aq.to(work) @ ak.to(work).transpose(-1, -2)) * comp) @ v.to(work)
    den = ((phi_q @ phi_k.transpose(-1, -2)) * comp).sum(-1)
    return _nonzero_ratio(num, den, comp.sum(-1) > 0.5)


def normalize_grid_positions(
    pos: Tensor | None, length: int, dims: int, device: torch.device
) -> Tensor:
    """``(B|1, L, m)`` positions from ``(L,)``, ``(L, m)``, ``(B|1, L)`` or ``(B|1, L, m)``
    (default ``0..L-1`` on every axis); ``ValueError`` naming ``pos`` otherwise."""
    if pos is None:
        pos = torch.arange(length, device=device)
    if not isinstance(pos, Tensor):
        raise TypeError(f"pos must be a tensor, got {type(pos).__name__}")
    if pos.dim() == 2 and dims > 1 and tuple(pos.shape) == (length, dims):
        pos = pos[None]
    if pos.dim() == 1:
        pos = pos[None]
    if pos.dim() == 2:
        pos = pos[..., None].expand(*pos.shape, dims)
    if pos.dim() != 3 or pos.shape[1] != length or pos.shape[-1] != dims:
        raise ValueError(
            f"pos must be (L,), (L, {dims}), (B|1, L) or (B|1, L, {dims}) with L = {length}, "
            f"got {tuple(pos.shape)}"
        )
    return pos.to(device)


def rotate_queries_keys(
    encoding: Encoding, q: Tensor, k: Tensor, pos: Tensor | None, dims: int
) -> tuple[Tensor, Tensor, Tensor]:
    """``(R q, R k, pos)``: the encoding's rotation of the sparse branch at the positions
    ``normalize_grid_positions`` makes of ``pos`` (returned, ``(B|1, L, dims)``)."""
    pos = normalize_grid_positions(pos, q.shape[2], dims, q.device)
    enc_pos = pos if encoding.dims > 1 else pos[..., 0]
    rq, rk = encoding.rotate_qk(q, k, enc_pos, enc_pos)
    if rq.shape != q.shape or rk.shape != k.shape:
        raise ValueError(f"encoding {encoding.name!r} changes the shape of q and k")
    return rq, rk, pos


def sparse_lowrank_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    encoding: Encoding,
    feature_map: FeatureMap,
    *,
    block_size: int = 64,
    sparsity: float = 0.9,
    local_radius: int | None = 0,
    causal: bool = False,
    pos: Tensor | None = None,
    key_valid: Tensor | None = None,
    lowrank: str = "rola",
    frequency_subset: str | Sequence[int] = "lowest",
    position_embedding: GridPositionEmbedding | None = None,
    projection: Callable[[Tensor], Tensor] | None = None,
    selection: BlockSelection | None = None,
    scale: float | None = None,
    method: str = "blocked",
    return_parts: bool = False,
    checkpoint_chunks: bool = False,
) -> Tensor | tuple[Tensor, Tensor, Tensor]:
    """``O = O_s + W O_l`` (module docstring): ``(B, H, L, Dv)`` in q's dtype.

    Args:
        q, k, v: ``(B, H, L, d)``, ``(B, H, L, d)``, ``(B, H, L, Dv)``, before the rotation.
        encoding: the model's rotary encoding (``rope`` or a sectioned m-D RoPE such as
            ``rope-axial`` with ``dims=3``): it rotates the sparse branch and, for RoLA, its
            schedule rotates the low-rank features.
        feature_map: the low-rank branch's ``FeatureMap`` (``LowRankFeatures``;
            ``HeadwiseLowRankFeatures`` for RoPeSLR).
        block_size, sparsity, local_radius: the pattern (``select_blocks``), unless
            ``selection`` is given.
        causal: token-causal attention (query ``i`` sees keys ``j <= i``).
        pos: positions (module docstring); key_valid: ``(B, L)`` bool, False for padding.
        lowrank: ``"rola"`` or ``"ropeslr"`` (then ``position_embedding`` is required).
        frequency_subset: RoLA's pairs of the schedule (``relpos.nn.mixers.rola``).
        projection: ``W``, applied to ``O_l (B, H, L, Dv)``; None: the identity.
        scale: the softmax logit scale (default ``d ** -0.5``).
        method: ``"blocked"`` (the efficient form) or ``"dense"`` (the O(L^2) reference).
        return_parts: also return ``O_s`` and ``O_l`` (before ``W``), in the compute dtype.
        checkpoint_chunks: recompute the sparse branch's chunks in the backward pass
            (``block_sparse_attention``): O(L) training memory for about one more forward.
    """
    check_choice(lowrank, "lowrank", LOWRANK_BRANCHES)
    check_choice(method, "method", ("blocked", "dense"))
    if not isinstance(encoding, Encoding):
        raise TypeError(f"encoding must be a relpos Encoding, got {type(encoding).__name__}")
    if not isinstance(feature_map, FeatureMap):
        raise TypeError(
            f"feature_map must be a relpos.attention.linear.feature_maps.FeatureMap, got "
            f"{type(feature_map).__name__}"
        )
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor) or t.dim() != 4 or not t.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor of shape (B, H, L, D)")
    B, H, L, d = q.shape
    if k.shape != q.shape or v.shape[:3] != (B, H, L):
        raise ValueError(
            "sparse + low-rank attention is self-attention over one sequence: k must have q's "
            f"shape {tuple(q.shape)} and v (B, H, L, Dv); got {tuple(k.shape)} and "
            f"{tuple(v.shape)}"
        )
    if key_valid is not None and (
        not isinstance(key_valid, Tensor)
        or key_valid.dtype != torch.bool
        or tuple(key_valid.shape) != (B, L)
    ):
        raise ValueError(f"key_valid must be a bool tensor (B, L) = ({B}, {L})")
    causal = check_bool(causal, "causal")
    if lowrank == "ropeslr" and not isinstance(position_embedding, GridPositionEmbedding):
        raise ValueError(
            "lowrank='ropeslr' needs position_embedding (a "
            "relpos.nn.mixers.ropeslr.GridPositionEmbedding)"
        )
    if lowrank == "rola" and position_embedding is not None:
        raise ValueError("position_embedding is RoPeSLR's: pass lowrank='ropeslr' or drop it")
    dims = position_embedding.dims if lowrank == "ropeslr" else max(1, encoding.dims)
    if lowrank == "ropeslr" and dims != encoding.dims:
        raise ValueError(
            f"position_embedding has {dims} axes but encoding {encoding.name!r} has "
            f"dims={encoding.dims}"
        )
    rq, rk, pos = rotate_queries_keys(encoding, q, k, pos, dims)
    scale = d**-0.5 if scale is None else check_float(scale, "scale", above=0.0)
    if selection is None:
        selection = select_blocks(
            rq,
            rk,
            block_size=block_size,
            sparsity=sparsity,
            local_radius=local_radius,
            causal=causal,
            key_valid=key_valid,
        )
    elif not isinstance(selection, BlockSelection):
        raise TypeError(f"selection must be a BlockSelection, got {type(selection).__name__}")
    elif selection.length != L or selection.causal != causal:
        raise ValueError(
            f"selection was made for length {selection.length}, causal={selection.causal}; "
            f"this call has length {L}, causal={causal}"
        )
    if lowrank == "rola":
        freq = select_frequencies(
            rotary_schedule(encoding, q.device), feature_map.num_features, frequency_subset
        )
        phi_q, _ = feature_map(q, "q", scale)
        phi_k, _ = feature_map(k, "k", scale)  # a per-(batch, head) key offset cancels
        p64 = pos.double()
        layout = encoding.layout
        rotated: tuple[Tensor, Tensor] | None = (
            rotate_by_schedule(phi_q, p64, freq, layout),
            rotate_by_schedule(phi_k, p64, freq, layout),
        )
    else:
        assert position_embedding is not None
        phi_q, phi_k = ropeslr_features(q, k, pos, feature_map, position_embedding)
        rotated = None
    if method == "dense":
        i = torch.arange(L, device=q.device)
        visible = torch.ones(L, L, dtype=torch.bool, device=q.device)
        if causal:
            visible = i[None, :] <= i[:, None]
        if key_valid is not None:
            visible = visible & key_valid[:, None, None, :]
        o_s = _dense_sparse(rq, rk, v, selection, scale, visible)
        o_l = _dense_lowrank(phi_q, phi_k, v, selection, rotated, visible)
    else:
        o_s = block_sparse_attention(
            rq,
            rk,
            v,
            selection,
            scale=scale,
            key_valid=key_valid,
            checkpoint_chunks=check_bool(checkpoint_chunks, "checkpoint_chunks"),
        )
        o_l = complement_linear_attention(
            phi_q, phi_k, v, selection, rotated=rotated, key_valid=key_valid
        )
    low = o_l.to(q.dtype)
    out = o_s.to(q.dtype) + (low if projection is None else projection(low))
    if return_parts:
        return out, o_s, o_l
    return out


class SparseLowRankAttention(ProjectedHeads, nn.Module):
    """Multi-head sparse + low-rank self-attention (``relpos.nn.mixers.sparse_lowrank``).

    ``O = O_sparse + W O_lowrank`` per head, then ``out_proj``: ``O_sparse`` is softmax
    attention of the encoding-rotated q, k over the covered key blocks (the local
    neighbourhood plus the top pooled-score blocks, ``1 - sparsity`` of the visible blocks),
    ``O_lowrank`` the low-rank linear attention over the other keys, and ``W`` a
    ``(head_dim, head_dim)`` projection shared by the heads, initialised to zero (the layer
    starts as block-sparse attention; SLA's ``proj_l``, here without a bias so that a row
    with no visible key stays 0).

    Args:
        dim, num_heads: model width and heads.
        encoding: the model's rotary encoding: ``"rope"``, ``"rope-axial"`` with
            ``encoding_options={"dims": 3}`` (Wan2.1 / HunyuanVideo 3-D RoPE), ``"m-rope"``,
            ... or an instance.
        lowrank: ``"rola"`` (RoPE outside a low-rank feature map, on ``rank / 2`` pairs of
            the encoding's schedule chosen by ``frequency_subset``: relative) or
            ``"ropeslr"`` (head-wise low-rank features plus a learnt absolute position
            embedding of a grid of ``grid_size``: absolute, a baseline).
        rank: the low-rank bottleneck ``r`` (default ``head_dim``; even for RoLA).
        block_size, sparsity, local_radius: the block pattern (``select_blocks``).
        grid_size: RoPeSLR's table sizes per position axis (one per ``encoding.dims``);
            positions must lie inside.
        feature_map: a ``FeatureMap`` with ``rank`` features instead of the default one.
        seed: seeds the default feature map and position tables.
        checkpoint_chunks: recompute the sparse branch's chunks in the backward pass (O(L)
            training memory instead of O(L K b), for about one more forward of the branch).

    ``forward(x (B, L, dim), pos=None, causal=False, mask=None, selection=None) -> (B, L,
    dim)``: positions ``(L[, m])`` or ``(B|1, L[, m])`` (default ``0..L-1`` on every axis;
    a 3-D grid: ``relpos.positions_nd.grid_positions(T, H, W)``), ``mask (B, L)`` bool
    (False: padded token), ``selection`` a fixed ``BlockSelection``. No KV cache: the block
    selection reads the whole sequence.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        encoding: str | Encoding = "rope",
        *,
        encoding_options: dict[str, Any] | None = None,
        lowrank: str = "rola",
        rank: int | None = None,
        block_size: int = 64,
        sparsity: float = 0.9,
        local_radius: int | None = 0,
        frequency_subset: str | Sequence[int] = "lowest",
        grid_size: Sequence[int] | None = None,
        feature_map: FeatureMap | None = None,
        seed: int | None = None,
        bias: bool = False,
        checkpoint_chunks: bool = False,
    ) -> None:
        super().__init__()
        dim, num_heads = check_int(dim, "dim"), check_int(num_heads, "num_heads")
        if dim % num_heads:
            raise ValueError(f"dim ({dim}) must be divisible by num_heads ({num_heads})")
        self.dim, self.num_heads, self.head_dim = dim, num_heads, dim // num_heads
        self.lowrank = check_choice(lowrank, "lowrank", LOWRANK_BRANCHES)
        self.checkpoint_chunks = check_bool(checkpoint_chunks, "checkpoint_chunks")
        self.block_size = check_int(block_size, "block_size")
        self.sparsity = check_float(sparsity, "sparsity", minimum=0.0, maximum=1.0)
        if local_radius is not None:
            local_radius = check_int(local_radius, "local_radius", minimum=0)
        self.local_radius = local_radius
        self.frequency_subset = frequency_subset
        enc = build_encoding(encoding, num_heads, self.head_dim, encoding_options or {})
        assert enc is not None
        schedule = rotary_schedule(enc)  # a rotary encoding with one schedule, or refused
        self.encoding = enc
        if feature_map is not None:
            if rank is not None and rank != feature_map.num_features:
                raise ValueError(
                    f"rank ({rank}) must equal the feature map's num_features "
                    f"({feature_map.num_features})"
                )
        else:
            rank = self.head_dim if rank is None else check_int(rank, "rank", minimum=2)
            if self.lowrank == "rola":
                feature_map = LowRankFeatures(self.head_dim, rank, seed=seed)
            else:
                feature_map = HeadwiseLowRankFeatures(num_heads, self.head_dim, rank, seed=seed)
        self.feature_map = feature_map
        self.rank = feature_map.num_features
        self.position_embedding: GridPositionEmbedding | None = None
        if self.lowrank == "rola":
            if grid_size is not None:
                raise ValueError("grid_size is RoPeSLR's (lowrank='ropeslr'); RoLA adds no tables")
            select_frequencies(schedule, self.rank, frequency_subset)  # checks now
        else:
            if grid_size is None:
                raise ValueError(
                    "lowrank='ropeslr' needs grid_size: the learnt table size per position "
                    f"axis ({enc.dims} axes for encoding {enc.name!r})"
                )
            sizes = check_int_sequence(grid_size, "grid_size", length=enc.dims)
            self.position_embedding = GridPositionEmbedding(
                num_heads, self.head_dim, sizes, seed=seed
            )
        self._build_projections(bias)
        self.lowrank_proj = nn.Linear(self.head_dim, self.head_dim, bias=False)
        nn.init.zeros_(self.lowrank_proj.weight)

    def select(
        self, x: Tensor, pos: Tensor | None = None, causal: bool = False, mask: Tensor | None = None
    ) -> BlockSelection:
        """The block pattern ``forward`` would use for ``x`` (for inspection or reuse)."""
        q, k = self._heads(self.q_proj(x)), self._heads(self.kv_proj(x)[..., : self.dim])
        dims = self.position_embedding.dims if self.position_embedding else self.encoding.dims
        rq, rk, _ = rotate_queries_keys(self.encoding, q, k, pos, max(1, dims))
        return select_blocks(
            rq,
            rk,
            block_size=self.block_size,
            sparsity=self.sparsity,
            local_radius=self.local_radius,
            causal=causal,
            key_valid=mask,
        )

    def forward(
        self,
        x: Tensor,
        pos: Tensor | None = None,
        causal: bool = False,
        mask: Tensor | None = None,
        selection: BlockSelection | None = None,
    ) -> Tensor:
        q, k, v = self._project(x)
        out = sparse_lowrank_attention(
            q,
            k,
            v,
            self.encoding,
            self.feature_map,
            block_size=self.block_size,
            sparsity=self.sparsity,
            local_radius=self.local_radius,
            causal=causal,
            pos=pos,
            key_valid=mask,
            lowrank=self.lowrank,
            frequency_subset=self.frequency_subset,
            position_embedding=self.position_embedding,
            projection=self.lowrank_proj,
            selection=selection,
            checkpoint_chunks=self.checkpoint_chunks,
        )
        assert isinstance(out, Tensor)
        return self._merge(out)

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, num_heads={self.num_heads}, lowrank={self.lowrank!r}, "
            f"rank={self.rank}, block_size={self.block_size}, sparsity={self.sparsity}, "
            f"local_radius={self.local_radius}"
        )
