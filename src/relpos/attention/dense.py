"""Attention over one block of query rows with the full logit block materialised.

The reference computation (``eager`` runs it on the whole matrix) and the building block of
the chunked backend's probability path (query blocks under activation checkpointing). It is
the only place that runs the hooks which change the attention weights themselves:

    logit_ij = <q^r_i, k^r_j> * scale + bias_ij      r = piece_index(i, j) (piecewise) or 0
    (row-dependent encodings: bias_ij = row_bias(s, g, count)_ij, with the gates
     g = row_gates(s) of the unmasked keys and count_ij = sum_{t >= j} g_it, ``row_term``)
    logit_ij = c * tanh(logit_ij / c)                    (``softcap`` c, when given)
    p_ij     = softmax_j(logit_ij + mask_ij)             (0 on a row that sees no key)
               (with ``sinks``: softmax over [logit_i + mask_i, sink_h], the sink dropped)
    out_i    = sum_j p_ij * m_ij * v_j  +  value_term(p)_i      m = prob_multiplier (URPE)

A row whose every logit is ``-inf`` (fully masked, causal with ``Lq > Lk``, left padding
under a causal mask) gets weights 0, so its output is 0 and its gradients are 0, as SDPA and
the flash kernels give (docs/numerics.md); with sinks the sink takes the whole row, which
gives the same 0.

Softcapping follows Gemma-2 (transformers ``models/gemma2/modeling_gemma2.py``,
``eager_attention_forward``: scaled ``q k^T``, then ``/ c``, ``tanh``, ``* c``, then the
mask is added), in the same order of operations; relpos's score terms (biases, piecewise
logits) are part of the logits it caps, and a logit that is ``-inf`` (a pair a piecewise
schedule leaves out) stays ``-inf``. Sinks follow gpt-oss (transformers
``models/gpt_oss/modeling_gpt_oss.py`` ``eager_attention_forward``; openai/gpt-oss
``gpt_oss/torch/model.py`` ``sdpa``): the sink logit of the row's head is concatenated to
the row's masked logits before the (max-subtracted) softmax and its weight dropped after it,
so the weights of a row sum to ``1 - p_sink``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .call import AttentionCall


def masked_softmax(s: Tensor) -> Tensor:
    """``softmax(s, dim=-1)`` with rows that are entirely ``-inf`` set to 0 (instead of NaN).

    The dead rows are replaced by zeros *before* the softmax (no NaN is ever formed) and their
    weights are selected away after it, so the gradient there is exactly 0: a padded batch
    leaves every parameter's gradient finite, and the dead rows contribute nothing to it."""
    dead = (s == float("-inf")).all(dim=-1, keepdim=True)
    p = torch.softmax(s.masked_fill(dead, 0.0), dim=-1)
    return p.masked_fill(dead, 0.0)


def capped_logits(s: Tensor, softcap: float) -> Tensor:
    """``softcap * tanh(s / softcap)`` with ``-inf`` kept (a pair a piecewise schedule leaves
    out stays out), in the order of operations of Gemma-2's eager attention."""
    capped = torch.tanh(s / softcap) * softcap
    return torch.where(s == float("-inf"), s, capped)


def sink_softmax(s: Tensor, sinks: Tensor) -> Tensor:
    """Softmax weights of the rows of ``s (B, H, T, S)`` (masked logits, ``-inf`` where
    masked) with the head's sink logit ``sinks (H,)`` as one more entry of every row, the
    sink's weight dropped: ``(B, H, T, S)``, rows summing to ``1 - p_sink``. The sink (cast to
    the dtype of ``s``, like the other score terms) is finite, so no row is dead: a fully
    masked row gives weights 0 with zero gradients."""
    sink = sinks.to(s.dtype).view(1, -1, 1, 1).expand(*s.shape[:-1], 1)
    return torch.softmax(torch.cat([s, sink], dim=-1), dim=-1)[..., :-1]


def empty_attention(call: AttentionCall) -> Tensor:
    """The result of a call with ``Lq = 0`` or ``Lk = 0``: ``(B, H, Lq, Dv)``, zeros when
    ``Lk = 0`` (no key: a dead row), as SDPA gives. Formed as ``(q k^T) v`` over the empty
    axis so that it stays connected to q, k, v: backward runs and gives zero gradients."""
    k, v = call.expanded_kv()
    return torch.matmul(torch.matmul(call.q, k.transpose(-1, -2)), v)


def row_term(
    call: AttentionCall,
    s: Tensor,
    mask: Tensor | None,
    i: Tensor,
    j: Tensor,
    carry: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """The row-dependent logit term (``Encoding.row_dependent``: CoPE, TRA) of the content
    logits ``s (B, H, T, S)`` of query indices ``i (T,)`` against consecutive keys ``j (S,)``.

    Gates ``g = row_gates(s)`` are zeroed where the additive ``mask`` is ``-inf``; their
    suffix sums ``count_ij = carry_i + sum_{t >= j, t in block} g_it`` are formed in float64
    (counted positions are positions: summed in another order per backend, they still agree
    to ~1e-13), where ``carry (B, H, T, 1)`` is the sum over the keys right of the block
    (None: there are none). Returns the term (dtype of ``s``) and the carry for the block on
    the left (``count`` at the block's first key)."""
    enc = call.encoding
    assert enc is not None and call.ctx is not None
    ctx = call.bias_context(i, j)
    grids = call.index_grids(i, j)
    g = enc.row_gates(ctx, s, *grids).to(torch.float64).expand(s.shape)
    if mask is not None:
        g = torch.where(mask.expand(s.shape) == float("-inf"), 0.0, g)
    count = g.flip(-1).cumsum(-1).flip(-1)
    if carry is not None:
        count = count + carry
    return enc.row_bias(ctx, s, g, count, *grids).to(s.dtype), count[..., :1]


def block_logits(
    call: AttentionCall, start: int, end: int, key_end: int, mask: Tensor | None = None
) -> Tensor:
    """Logits ``(B, H, end - start, key_end)`` of query rows ``start:end`` against keys
    ``0:key_end``, before any mask (the dtype of q), softcapped when the call asks. ``mask``:
    the additive mask of the block, read only by row-dependent terms (their gates count the
    visible keys only, from the logits before the cap)."""
    dev = call.q.device
    i = torch.arange(start, end, device=dev)
    j = torch.arange(key_end, device=dev)
    groups = call.groups

    def product(q: Tensor, k: Tensor) -> Tensor:
        k = k[:, :, :key_end]
        if groups > 1:
            k = k.repeat_interleave(groups, dim=1)
        return torch.matmul(q[:, :, start:end], k.transpose(-1, -2)) * call.scale

    if call.pieces is None:
        out = product(call.q, call.k)
    else:
        assert call.encoding is not None and call.ctx is not None
        index = call.encoding.piece_index(call.ctx, *call.index_grids(i, j))
        out = None
        for r, (qr, kr) in enumerate(call.pieces):
            part = product(qr, kr)
            out = part if out is None else torch.where(index == r, part, out)
        assert out is not None
        out = out.masked_fill(index < 0, float("-inf"))
    if call.has_bias:
        assert call.encoding is not None
        if call.encoding.row_dependent:
            out = out + row_term(call, out, mask, i, j)[0]
        else:
            out = out + call.bias_block(i, j).to(out.dtype)
    if call.softcap is not None:
        out = capped_logits(out, call.softcap)
    return out


def block_attention(call: AttentionCall, start: int, end: int, key_end: int) -> Tensor:
    """Attention output ``(B, H, end - start, Dv)`` of query rows ``start:end`` over keys
    ``0:key_end`` (the caller guarantees that causal masking hides every later key)."""
    m = call.mask_block(start, end, key_end, call.q.dtype)
    s = block_logits(call, start, end, key_end, mask=m)
    if m is not None:
        s = s + m
    p = masked_softmax(s) if call.sinks is None else sink_softmax(s, call.sinks)
    _, v = call.expanded_kv()
    v = v[:, :, :key_end]
    enc = call.encoding
    if enc is None or not enc.needs_probabilities:
        return torch.matmul(p, v)
    assert call.ctx is not None
    dev = call.q.device
    grids = call.index_grids(
        torch.arange(start, end, device=dev), torch.arange(key_end, device=dev)
    )
    weights = p * enc.prob_multiplier(call.ctx, *grids).to(p.dtype) if enc.multiplies_probs else p
    out = torch.matmul(weights, v)
    if enc.has_value_term:
        out = out + enc.value_term(call.ctx, p, *grids).to(out.dtype)
    return out
