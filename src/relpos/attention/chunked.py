"""Memory-efficient backend for biased attention: query blocks, O(L * block) memory.

One ladder per call (``chunked_path``, also what ``relpos.attention.plan`` reports):

* **piecewise-sdpa** (piecewise rotary logits without bias or value term: the RoPE
  schedules): the engine's piecewise kernel (``relpos.attention.piecewise``), the pieces
  through the fused SDPA kernel at about plain-attention cost.
* **probabilities** (encodings that change the weights themselves: value terms, URPE's
  multiplied weights, other piecewise logits; and every call with ``softcap`` or ``sinks``,
  which change the softmax beyond an additive score: the fused kernel cannot take them):
  each query block runs ``dense.block_attention`` (explicit logits, capped, and a softmax
  over its keys and the sink) under activation checkpointing.
* **row-suffix** (row-dependent terms, ``Encoding.row_dependent``: CoPE, TRA): each query
  block walks its keys in blocks of ``FORWARD_BLOCK`` from right to left, carrying the
  running suffix sum of the gates (``dense.row_term``), and merges the key blocks by an
  online softmax (running max, sum and output), under activation checkpointing. Softcapping
  caps each key block's logits; a sink is the first entry of the running max and sum (it
  contributes no value).
* **toeplitz** (a bias that is a function of ``q_pos - k_pos`` for this call, positions one
  batch-shared integer range, no user mask: ``AttentionCall.distance_table``): the bias is
  tabulated once per distance, ``table (H, Lq + Lk - 1)`` (O(L)), with ``-inf`` on future
  distances when causal. Each query block is processed with its rows reversed, so its bias
  slice is a zero-copy Hankel *view* of the reversed table (``as_strided`` with strides
  ``(H: N, row: 1, col: 1)``) handed straight to the fused SDPA kernel. Causal blocks only
  visit keys up to their last query. A custom ``autograd.Function`` recomputes each block in
  backward; the gradient of the table is the sum of ``dS`` over anti-diagonals (a
  pad-and-reshape, no scatter), and autograd carries it into the encoding's parameters (T5
  table, KERPLE r1/r2, FIRE's MLP, ...).
* **row-affine** (a bias affine in a per-row scalar over each block, ``Encoding.row_affine``:
  FIRE above its threshold; positions one batch-shared integer range, no user mask, and no
  gradient in the call): each block asks the encoding for two tables over the block's
  distances and the rows' scalars (``row_affine_tables``) and forms its bias, a few heads at
  a time (``ROW_AFFINE_BIAS_BYTES``: read by SDPA while in cache), as one ``constant +
  row_scale * slope`` over two zero-copy Hankel views (rows reversed, as on the Toeplitz
  path; ``-inf`` written into the tables' future distances when causal); at the few
  distances where the block's rows do not share one affine form (``exact`` False) each pair
  is asked for as a group of one row (one affine form), the encoding's ``bias`` only where
  even that is not exact. Training steps take the tile path.
* **tile** (any other bias, user masks, arbitrary positions): each query block computes its
  ``(B, H, T, S)`` bias slice with the encoding's element-wise ``bias`` and runs SDPA on it,
  under activation checkpointing so backward recomputes the slice instead of storing it. The
  block has ``T = TILE_ELEMENTS // Lk`` rows, so per-tile work (e.g. FIRE's MLP over every
  pair) takes constant memory whatever the length.

Every loop walks ``relpos.attention.call.query_blocks``; the checkpointed ones run through
``run_blocks``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from .call import AttentionCall, QueryBlock, query_blocks, run_blocks
from .dense import block_attention, capped_logits, empty_attention, row_term
from .piecewise import piecewise_sdpa_attention, runs_piecewise

FORWARD_BLOCK = 256  # the most query rows of a forward block (Toeplitz), key blocks (row-suffix)
BACKWARD_BLOCK = 128  # rows per backward block; its (B, H, rows, L) temporaries set the peak
TILE_ELEMENTS = 1 << 18  # query rows x keys per tile of the tile path (bias work scales with it)
ROW_AFFINE_GROUP = 32  # rows sharing one pair of tables inside a row-affine block
ROW_AFFINE_BIAS_BYTES = 4 << 20  # the most bias per kernel call of the row-affine path (cache)


# ---------------------------------------------------------------------------- Toeplitz path
def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of the softmax statistics and of backward: float32 for half types, the
    input dtype otherwise (float64 in, float64 throughout)."""
    return torch.promote_types(dtype, torch.float32)


def forward_rows(length_k: int) -> int:
    """Query rows per forward block of the Toeplitz path: ``Lk / 8`` within ``[64,
    FORWARD_BLOCK]``, so causal calls of a few hundred keys skip their masked upper triangle
    in several blocks while long calls keep few kernel calls."""
    return max(64, min(FORWARD_BLOCK, length_k // 8))


def _hankel(w: Tensor, offset: int, rows: int, cols: int) -> Tensor:
    """Zero-copy view ``M[..., r, c] = w[..., offset + r + c]`` of ``w (..., N)`` whose last
    dimension is contiguous: one Hankel matrix per row of ``w`` (a head's table; on the
    row-affine path, a group of rows of one head)."""
    lead = w.shape[:-1]
    return w.as_strided((*lead, rows, cols), (*w.stride()[:-1], 1, 1), w.storage_offset() + offset)


def _antidiagonal_sums(a: Tensor) -> Tensor:
    """``out[h, c] = sum_{r + s = c} a[h, r, s]`` for ``a (H, R, S)`` -> ``(H, R + S - 1)``."""
    h, r, s = a.shape
    padded = F.pad(a, (0, r)).reshape(h, r * (s + r))[:, : r * (s + r - 1)]
    return padded.reshape(h, r, s + r - 1).sum(1)


def _block_forward(qf: Tensor, kb: Tensor, vb: Tensor, bias: Tensor, scale: float):
    if qf.device.type == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            qf, kb, vb, attn_mask=bias, scale=scale
        )
        return out, lse
    acc = compute_dtype(qf.dtype)
    s = torch.matmul(qf.to(acc), kb.to(acc).transpose(-1, -2)) * scale + bias.to(acc)
    lse = torch.logsumexp(s, dim=-1)
    lse = lse.masked_fill(lse == float("-inf"), 0.0)  # dead rows: p = exp(-inf - 0) = 0
    out = torch.matmul(torch.exp(s - lse[..., None]), vb.to(acc)).to(qf.dtype)
    return out, lse


class _ToeplitzAttention(torch.autograd.Function):
    """Attention with bias ``table[h, i - j + Lk - 1]``; q, k, v are ``(B, H, L, D)``."""

    @staticmethod
    def forward(ctx, q, k, v, table, scale, causal):  # type: ignore[override]
        B, H, Lq, D = q.shape
        Lk = k.shape[2]
        w = table.detach().flip(-1).to(q.dtype).contiguous()
        out = torch.empty(B, H, Lq, v.shape[-1], dtype=q.dtype, device=q.device)
        # a dead row (every key masked) stores lse 0: its scores are all -inf, p = 0
        lse = torch.zeros(B, H, Lq, dtype=compute_dtype(q.dtype), device=q.device)
        for s, e, kend in query_blocks(Lq, Lk, forward_rows(Lk), causal=causal):
            if kend == 0:  # causal, Lq > Lk: the block sees no key
                out[:, :, s:e] = 0
                continue
            qf = q[:, :, s:e].flip(2)
            bias = _hankel(w, Lq - e, e - s, kend)[None]
            o, l = _block_forward(qf, k[:, :, :kend], v[:, :, :kend], bias, scale)
            out[:, :, s:e] = o.flip(2)
            lse[:, :, s:e] = l.flip(2).to(lse.dtype)
        ctx.save_for_backward(q, k, v, table, out, lse)
        ctx.scale, ctx.causal = scale, causal
        return out

    @staticmethod
    def backward(ctx, dout):  # type: ignore[override]
        q, k, v, table, out, lse = ctx.saved_tensors
        scale, causal = ctx.scale, ctx.causal
        B, H, Lq, D = q.shape
        Lk = k.shape[2]
        need_table = ctx.needs_input_grad[3]
        acc = lse.dtype  # compute_dtype(q.dtype): float64 calls stay float64
        q32, k32, v32 = q.to(acc), k.to(acc), v.to(acc)
        do32, o32 = dout.to(acc), out.to(acc)
        w = table.detach().to(acc).flip(-1).contiguous()
        dq = torch.zeros_like(q32)
        dk = torch.zeros_like(k32)
        dv = torch.zeros_like(v32)
        dw = torch.zeros_like(w) if need_table else None
        for s, e, kend in query_blocks(Lq, Lk, BACKWARD_BLOCK, causal=causal):
            if kend == 0:  # dead rows: no gradient
                continue
            qf = q32[:, :, s:e].flip(2)
            dof = do32[:, :, s:e].flip(2)
            delta = (dof * o32[:, :, s:e].flip(2)).sum(-1, keepdim=True)
            kb, vb = k32[:, :, :kend], v32[:, :, :kend]
            off = Lq - e
            scores = torch.matmul(qf, kb.transpose(-1, -2)).mul_(scale)
            scores += _hankel(w, off, e - s, kend)[None]
            p = scores.sub_(lse[:, :, s:e].flip(2)[..., None]).exp_()
            dv[:, :, :kend] += torch.matmul(p.transpose(-1, -2), dof)
            ds = torch.matmul(dof, vb.transpose(-1, -2)).sub_(delta).mul_(p)
            dq[:, :, s:e] = torch.matmul(ds, kb).mul_(scale).flip(2)
            dk[:, :, :kend] += torch.matmul(ds.transpose(-1, -2), qf).mul_(scale)
            if dw is not None:
                dw[:, off : off + (e - s) + kend - 1] += _antidiagonal_sums(ds.sum(0))
        dtable = dw.flip(-1).to(table.dtype) if dw is not None else None
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dtable, None, None


def _toeplitz_attention(call: AttentionCall, table: Tensor) -> Tensor:
    k, v = call.expanded_kv()
    return _ToeplitzAttention.apply(call.q, k, v, table, call.scale, call.causal)


# ---------------------------------------------------------------------------- tile path
def _tile_rows(call: AttentionCall) -> int:
    """Query rows per tile: ``TILE_ELEMENTS / Lk``, at least 16, and at least what the
    encoding asks for (``Encoding.block_rows``: table encodings whose per-tile work does not
    shrink with the tile), capped at ``TILE_ELEMENTS / 256`` rows."""
    least = 16
    if call.has_bias:
        assert call.encoding is not None
        least = max(least, min(call.encoding.block_rows(call.ctx), TILE_ELEMENTS >> 8))
    return max(least, TILE_ELEMENTS // max(call.k.shape[2], 1))


def _tile_attention(call: AttentionCall) -> Tensor:
    dev = call.q.device

    def block(blk: QueryBlock, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        s, e, kend = blk.start, blk.end, blk.key_end
        if kend == 0:  # causal, Lq > Lk: the block sees no key, its rows are 0
            return q.new_zeros(*q.shape[:2], e - s, v.shape[-1])
        qb, kb, vb = q[:, :, s:e], k[:, :, :kend], v[:, :, :kend]
        bias = None
        if call.has_bias:
            i = torch.arange(s, e, device=dev)
            j = torch.arange(kend, device=dev)
            bias = call.bias_block(i, j).to(qb.dtype)
        m = call.mask_block(s, e, kend, qb.dtype)
        if m is not None:
            bias = m if bias is None else bias + m
        return F.scaled_dot_product_attention(qb, kb, vb, attn_mask=bias, scale=call.scale)

    return run_blocks(block, call.blocks(_tile_rows(call)), call.q, *call.expanded_kv())


def _bias_at_pairs(call: AttentionCall, blk: QueryBlock, i: Tensor, j: Tensor) -> Tensor:
    """The encoding's bias at the query indices ``i (P,)`` and key indices ``j (P,)`` of
    block ``blk``, as one ``(1, H, 1, P)`` grid row."""
    assert call.encoding is not None
    dev = call.q.device
    ctx = call.bias_context(
        torch.arange(blk.start, blk.end, device=dev), torch.arange(blk.key_end, device=dev)
    )
    b = torch.zeros(1, 1, 1, 1, dtype=torch.long, device=dev)
    h = torch.arange(call.q.shape[1], device=dev).view(1, -1, 1, 1)
    return call.encoding.bias(ctx, b, h, i.view(1, 1, 1, -1), j.view(1, 1, 1, -1))


@dataclass
class RowAffineRows:
    """The bias of ``groups`` groups of ``R`` consecutive (reversed) rows of a row-affine
    block from ``first`` on: ``constant``, ``slope (H, G, N)``, ``row_scale (G, R)``, and
    the pairs where the groups share no affine form (``pairs``: flat indices into the
    block's ``(T, S)`` bias, ``values (H, P)``), written a few heads at a time."""

    first: int
    groups: int
    R: int
    constant: Tensor
    slope: Tensor
    row_scale: Tensor
    pairs: Tensor | None = None
    values: Tensor | None = None

    def write(self, bias: Tensor, heads: slice) -> None:
        """The rows of ``heads`` into ``bias (len(heads), T, S)``: one ``addcmul`` of two
        zero-copy Hankel views over those heads and every group (group ``g`` of head ``h``
        reads row ``(h, g)`` of the tables), then the pairs."""
        n, S = bias.shape[0], bias.shape[2]
        a, b, G, R = self.first, self.first + self.groups * self.R, self.groups, self.R
        torch.addcmul(
            _hankel(self.constant[heads], 0, R, S),
            _hankel(self.slope[heads], 0, R, S),
            self.row_scale.view(1, G, R, 1),
            out=bias[:, a:b].view(n, G, R, S),
        )
        if self.pairs is not None:
            assert self.values is not None
            bias.view(n, -1).index_copy_(1, self.pairs, self.values[heads])


def _row_affine_attention(call: AttentionCall) -> Tensor:
    enc = call.encoding
    assert enc is not None and call.positions is not None
    q_span, k_span = call.positions.q.span, call.positions.k.span
    assert q_span is not None and k_span is not None
    dev, H = call.q.device, call.q.shape[1]
    dtype = next((p.dtype for p in enc.parameters()), call.q.dtype)
    shift = q_span.start - k_span.start  # position distance - index distance

    def at_pairs(blk: QueryBlock, i: Tensor, j: Tensor) -> Tensor:
        """The bias at query indices ``i (P,)`` and key indices ``j (P,)``: ``(H, P)``.
        Each pair is a group of one row at one distance, where a row-affine bias is one
        affine form; the encoding's ``bias`` where its tables say otherwise."""
        one = enc.row_affine_tables(call.ctx, (q_span.start + i)[:, None], (i - j + shift)[:, None])
        values = torch.addcmul(one.constant[:, :, 0], one.slope[:, :, 0], one.row_scale[:, 0])
        if not bool(one.exact.all()):
            odd = ~one.exact[:, 0]
            values[:, odd] = _bias_at_pairs(call, blk, i[odd], j[odd]).view(H, -1)
        return values

    def rows_of(blk: QueryBlock, first: int, groups: int, R: int) -> RowAffineRows:
        """Reversed rows ``first .. first + groups * R - 1`` of block ``blk`` (row ``t'`` is
        query ``end - 1 - t'``), in ``groups`` groups of ``R`` rows, each group with its own
        tables: entry ``(t', j)`` of a group reads index ``t' - start + j``."""
        e, S = blk.end, blk.key_end
        starts = first + R * torch.arange(groups, device=dev)[:, None]  # (G, 1)
        m = starts + torch.arange(R + S - 1, device=dev)  # (G, N): t' + j at the group's rows
        distance = (e - 1 + shift) - m
        rows = q_span.start + e - 1 - (starts + torch.arange(R, device=dev))  # (G, R)
        tables = enc.row_affine_tables(call.ctx, rows, distance)
        constant, slope, exact = tables.constant.to(dtype), tables.slope.to(dtype), tables.exact
        if call.causal:  # bottom-right: key S - 1 is the block's last query's own, so the
            # future keys are t' + j > S - 1: -inf there, written into the call's tables
            future = m > S - 1
            constant.masked_fill_(future, float("-inf"))
            slope.masked_fill_(future, 0.0)
            exact |= future
        out = RowAffineRows(first, groups, R, constant, slope, tables.row_scale.to(dtype))
        g, n = (~exact).nonzero(as_tuple=True)
        if g.numel():  # the distances where a group's rows share no affine form: per pair
            r = torch.arange(R, device=dev)
            t = (first + g * R)[:, None] + r  # reversed rows
            j = n[:, None] - r
            inside = (j >= 0) & (j < S)
            t, j = t[inside], j[inside]
            out.pairs, out.values = t * S + j, at_pairs(blk, e - 1 - t, j).to(dtype)
        return out

    rows, Lk = forward_rows(call.k.shape[2]), call.k.shape[2]
    # the bias of a few heads at a time (ROW_AFFINE_BIAS_BYTES), in one buffer for every
    # block: written and read back by the kernel while it is in cache (all heads at once,
    # 32 MB per block at L = 4096, went through memory; a fresh buffer per block also paid
    # the page faults of new memory)
    budget = max(1, ROW_AFFINE_BIAS_BYTES // (torch.finfo(dtype).bits // 8))  # elements
    T_max = min(rows, call.q.shape[2])
    scratch = torch.empty(min(H * T_max * Lk, max(budget, T_max * Lk)), dtype=dtype, device=dev)

    def block(blk: QueryBlock, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        s, e, kend = blk.start, blk.end, blk.key_end
        if kend == 0:  # causal, Lq > Lk: the block sees no key, its rows are 0
            return q.new_zeros(*q.shape[:2], e - s, v.shape[-1])
        T = e - s
        R = min(ROW_AFFINE_GROUP, T)
        full = T // R
        parts = [rows_of(blk, 0, full, R)]
        if T > full * R:
            parts.append(rows_of(blk, full * R, 1, T - full * R))
        qb = q[:, :, s:e].flip(2)
        outs = []
        step = max(1, min(H, budget // (T * kend)))  # heads per kernel call
        for h in range(0, H, step):
            heads = slice(h, min(h + step, H))
            n = heads.stop - heads.start
            bias = scratch[: n * T * kend].view(n, T, kend)
            for part in parts:
                part.write(bias, heads)
            outs.append(
                F.scaled_dot_product_attention(
                    qb[:, heads],
                    k[:, heads, :kend],
                    v[:, heads, :kend],
                    attn_mask=bias[None].to(qb.dtype),
                    scale=call.scale,
                )
            )
        out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)  # no copy for one call
        return out.flip(2)

    return run_blocks(block, call.blocks(rows), call.q, *call.expanded_kv())


def _runs_row_affine(call: AttentionCall) -> bool:
    """A ``row_affine`` bias over batch-shared integer ranges of positions, no user mask and
    no gradient anywhere in the call (training steps keep the checkpointed tile path)."""
    enc = call.encoding
    if enc is None or not enc.row_affine or not call.has_bias or call.has_user_mask:
        return False
    if call.positions is None or call.positions.q.span is None or call.positions.k.span is None:
        return False
    return not call.takes_gradients


def _probability_attention(call: AttentionCall) -> Tensor:
    def block(blk: QueryBlock, *_: Tensor) -> Tensor:
        if blk.key_end == 0:  # causal, Lq > Lk: the block sees no key, its rows are 0
            return call.q.new_zeros(*call.q.shape[:2], blk.end - blk.start, call.v.shape[-1])
        return block_attention(call, blk.start, blk.end, blk.key_end)

    # q/k/v pass through so checkpointing sees the tensors the block reads
    return run_blocks(block, call.blocks(_tile_rows(call)), call.q, call.k, call.v)


def _row_suffix_attention(call: AttentionCall) -> Tensor:
    """Row-dependent terms: key blocks right to left with the gates' suffix sum carried."""
    dev = call.q.device
    acc = compute_dtype(call.q.dtype)
    width = FORWARD_BLOCK

    def block(blk: QueryBlock, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        s, e, kend = blk.start, blk.end, blk.key_end
        if kend == 0:  # causal, Lq > Lk: the block sees no key, its rows are 0
            return q.new_zeros(*q.shape[:2], e - s, v.shape[-1])
        qb = q[:, :, s:e]
        i = torch.arange(s, e, device=dev)
        shape = (*qb.shape[:3], 1)
        if call.sinks is None:
            run_max = torch.full(shape, float("-inf"), dtype=acc, device=dev)
            run_sum = torch.zeros(shape, dtype=acc, device=dev)
        else:  # the sink: one more logit of every row, weight exp(sink - max), no value
            sink = call.sinks.to(qb.dtype).to(acc).view(1, -1, 1, 1).expand(shape)
            run_max = sink.detach()
            run_sum = torch.exp(sink - run_max)
        out = torch.zeros(*qb.shape[:3], v.shape[-1], dtype=acc, device=dev)
        carry = None
        for a in reversed(range(0, kend, width)):
            c = min(a + width, kend)
            scores = torch.matmul(qb, k[:, :, a:c].transpose(-1, -2)) * call.scale
            mask = call.mask_block(s, e, c, qb.dtype, k_start=a)
            term, carry = row_term(call, scores, mask, i, torch.arange(a, c, device=dev), carry)
            logits = scores + term
            if call.softcap is not None:
                logits = capped_logits(logits, call.softcap)
            logits = logits.to(acc)
            if mask is not None:
                logits = logits + mask.to(acc)
            # the running max only stabilises the exponentials: detached, exact gradients
            new_max = torch.maximum(run_max, logits.amax(-1, keepdim=True)).detach()
            ref = torch.where(new_max == float("-inf"), 0.0, new_max)  # dead so far: p = 0
            p = torch.exp(logits - ref)
            rescale = torch.exp(run_max - ref)
            run_sum = run_sum * rescale + p.sum(-1, keepdim=True)
            out = out * rescale + torch.matmul(p, v[:, :, a:c].to(acc))
            run_max = new_max
        live = run_sum > 0  # a row whose every key is masked gives 0 with zero gradients
        out = torch.where(live, out / torch.where(live, run_sum, 1.0), 0.0)
        return out.to(q.dtype)

    return run_blocks(block, call.blocks(_tile_rows(call)), call.q, *call.expanded_kv())


# ---------------------------------------------------------------------------- the ladder
def chunked_path(call: AttentionCall) -> str:
    """Which path the chunked backend takes for this call (see the module docstring)."""
    if call.pieces is not None and runs_piecewise(call):
        return "piecewise-sdpa"
    enc = call.encoding
    if (
        enc is not None
        and enc.row_dependent
        and not (enc.has_value_term or enc.multiplies_probs or enc.piecewise)
    ):
        return "row-suffix"
    if call.needs_probabilities or call.score_features:
        return "probabilities"
    if not call.has_user_mask and call.distance_delta() is not None:
        return "toeplitz"
    if _runs_row_affine(call):
        return "row-affine"
    return "tile"


def chunked_attention(call: AttentionCall) -> Tensor:
    """Biased attention in O(L * block) memory, forward and backward. ``(B, H, Lq, Dv)``."""
    if call.q.shape[2] == 0 or call.k.shape[2] == 0:
        return empty_attention(call)
    path = chunked_path(call)
    if path == "piecewise-sdpa":
        return piecewise_sdpa_attention(call)
    if path == "row-suffix":
        return _row_suffix_attention(call)
    if path == "probabilities":
        return _probability_attention(call)
    if path == "toeplitz":
        table = call.distance_table(causal=call.causal)
        assert table is not None
        return _toeplitz_attention(call, table)
    if path == "row-affine":
        return _row_affine_attention(call)
    return _tile_attention(call)
