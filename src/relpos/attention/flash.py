"""Attention over one block of queries and keys with its log-sum-exp, and the log-sum-exp
merge of such partial attentions: what the multi-pass folds share (``fold.py``'s band
passes, ``disentangled.py``'s DeBERTa regions).

* ``kernel_forward``: ``(out, lse)`` of ``q (B, H, T, W)`` over ``k, v (B, H / g, S, W)`` with
  an optional bool ``ok (T, S)`` and an additive float ``bias`` ``(B|1, H, T, S)``. On CPU the
  fused flash kernel (``_scaled_dot_product_flash_attention_for_cpu``), elsewhere explicit
  logits; rows that see no key give ``lse = -inf`` and ``out = 0``.
* ``kernel_backward``: gradients of one such call whose rows are normalised by a *merged*
  log-sum-exp (the whole row's, in this call's frame): the flash backward on CPU, or explicit
  logits, which also return the score gradient ``dS = P (dP - rowsum(dO O))`` when asked
  (``score_grad=True``: a bias that needs a gradient).
* ``merge_partials``: ``out = sum_p exp(lse_p - lse) out_p`` with ``lse = logsumexp_p lse_p``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["kernel_backward", "kernel_forward", "merge_partials", "use_flash"]


def use_flash(t: Tensor) -> bool:
    """The CPU flash kernel (with its log-sum-exp and its backward) runs ``t``'s device."""
    return t.device.type == "cpu" and hasattr(
        torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu"
    )


def _group_rows(x: Tensor, g: int) -> Tensor:
    """``(B, H, T, D)`` -> ``(B, H / g, g T, D)``: the query heads of a group as rows."""
    B, H, T, D = x.shape
    return x.reshape(B, H // g, g * T, D)


def _same_width(*xs: Tensor, width: int) -> list[Tensor]:
    """Each tensor zero-padded to ``width`` channels (the flash kernel takes one head size)."""
    return [x if x.shape[-1] == width else F.pad(x, (0, width - x.shape[-1])) for x in xs]


def _mask(q: Tensor, ok: Tensor | None, bias: Tensor | None, g: int) -> Tensor | None:
    """The additive mask of one kernel call: ``bias`` (``g == 1``) with ``-inf`` where not
    ``ok``, or the ``ok`` mask alone repeated over the ``g`` query heads of a group."""
    if bias is not None:
        if g != 1:
            raise ValueError("kernel calls with a bias take expanded keys (groups == 1)")
        return bias if ok is None else bias.masked_fill(~ok, -math.inf)
    if ok is None:
        return None
    mask = torch.zeros(ok.shape, dtype=q.dtype, device=q.device).masked_fill(~ok, -math.inf)
    return mask.repeat(g, 1)


def kernel_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    ok: Tensor | None,
    scale: float,
    g: int,
    bias: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """``(out (B, H, T, Wv), lse (B, H, T))`` of queries ``q (B, H, T, W)`` over ``k, v``;
    ``ok (T, S)`` bool or None, ``bias`` an additive float ``(B|1, H, T, S)`` in q's dtype or
    None; rows that see no key get ``lse = -inf`` and ``out = 0``."""
    B, H, T, _ = q.shape
    qg = _group_rows(q, g)
    mask = _mask(q, ok, bias, g)
    if use_flash(q):
        width, dv = max(q.shape[-1], v.shape[-1]), v.shape[-1]
        qg, k, v = _same_width(qg, k, v, width=width)
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            qg, k, v, attn_mask=mask, scale=scale
        )
        out = out[..., :dv]
    else:
        acc = torch.promote_types(q.dtype, torch.float32)
        s = torch.matmul(qg.to(acc), k.to(acc).transpose(-1, -2)) * scale
        if mask is not None:
            s = s + mask.to(acc)
        lse = torch.logsumexp(s, dim=-1)
        p = torch.exp(s - lse.masked_fill(lse == -math.inf, 0.0)[..., None])
        out = torch.matmul(p, v.to(acc)).to(q.dtype)
    out, lse = out.reshape(B, H, T, -1), lse.reshape(B, H, T)
    if ok is not None:
        dead = ~ok.any(-1)
        lse = lse.masked_fill(dead, -math.inf)
        out = out.masked_fill(dead[:, None], 0.0)
    return out, lse


def kernel_backward(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    ok: Tensor | None,
    scale: float,
    g: int,
    bias: Tensor | None = None,
    score_grad: bool = False,
) -> tuple[Tensor, ...]:
    """Gradients ``(dq, dk, dv)`` of one kernel call whose rows are normalised by ``lse`` (the
    merged log-sum-exp in this call's frame; ``+inf`` for rows that see nothing at all), and
    with ``score_grad`` the score gradient ``dS (B, H, T, S)`` as a fourth (explicit logits)."""
    B, H, T, W = q.shape
    qg, dg, og = _group_rows(q, g), _group_rows(dout, g), _group_rows(out, g)
    lg = lse.reshape(B, H // g, g * T)
    mask = _mask(q, ok, bias, g)
    if use_flash(q) and not score_grad:
        width, d, dv_width = max(W, v.shape[-1]), W, v.shape[-1]
        dg, qg, kw, vw, og = _same_width(dg, qg, k, v, og, width=width)
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            dg,
            qg,
            kw,
            vw,
            og,
            lg.to(torch.float64 if q.dtype == torch.float64 else torch.float32),
            0.0,
            False,
            attn_mask=mask,
            scale=scale,
        )
        dq, dk, dv = dq[..., :d], dk[..., :d], dv[..., :dv_width]
        return dq.reshape(B, H, T, W), dk, dv
    acc = torch.promote_types(q.dtype, torch.float32)
    qa, ka, va, da, oa = (t.to(acc) for t in (qg, k, v, dg, og))
    s = torch.matmul(qa, ka.transpose(-1, -2)).mul_(scale)
    if mask is not None:
        s += mask.to(acc)
    p = s.sub_(lg.to(acc)[..., None]).exp_()
    dv = torch.matmul(p.transpose(-1, -2), da)
    ds = torch.matmul(da, va.transpose(-1, -2)).sub_((da * oa).sum(-1, keepdim=True)).mul_(p)
    dq = torch.matmul(ds, ka).mul_(scale)
    dk = torch.matmul(ds.transpose(-1, -2), qa).mul_(scale)
    if score_grad:
        return dq.reshape(B, H, T, W), dk, dv, ds.reshape(B, H, T, -1)
    return dq.reshape(B, H, T, W), dk, dv


def merge_partials(outs: list[Tensor], lses: list[Tensor]) -> tuple[Tensor, Tensor, list[Tensor]]:
    """Merge attentions of one query block over disjoint key sets: ``outs[p] (B, H, T, Dv)``
    normalised by ``lses[p] (B, H, T)`` (``-inf``: the part sees nothing). Returns ``(out,
    lse, weights)`` with ``lse = logsumexp_p lses[p]``, ``weights[p] = exp(lses[p] - lse)`` and
    ``out = sum_p weights[p] outs[p]`` (in the dtype of ``lses``; 0 where nothing is seen)."""
    total = torch.logsumexp(torch.stack(lses), dim=0)
    safe = total.masked_fill(total == -math.inf, 0.0)
    weights = [torch.exp(lp - safe) for lp in lses]
    out = weights[0][..., None] * outs[0].to(total.dtype)
    for w, op in zip(weights[1:], outs[1:], strict=True):
        out = out + w[..., None] * op.to(total.dtype)
    return out, total, weights
