"""Dense references for the bias tests: attention written out from the formula.

``dense_attention`` is ``softmax(q k^T * scale + bias [+ causal mask]) [* multiplier] @ v``;
``assert_matches_reference`` compares ``relpos.attention`` with such a reference in the
output and in every gradient. Imported by the test modules of ``tests/encodings/*/``.
"""

from __future__ import annotations

import torch

import relpos


def dense_attention(q, k, v, bias, scale, causal, multiplier=None):
    """softmax(q k^T * scale + bias [+ causal mask]) [* multiplier] @ v, GQA by repetition."""
    groups = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(groups, dim=1)
    v = v.repeat_interleave(groups, dim=1)
    logits = q @ k.transpose(-1, -2) * scale + bias
    if causal:
        Lq, Lk = q.shape[2], k.shape[2]
        i = torch.arange(Lq)[:, None] + (Lk - Lq)
        logits = logits.masked_fill(torch.arange(Lk)[None, :] > i, float("-inf"))
    p = logits.softmax(-1)
    if multiplier is not None:
        p = p * multiplier
    return p @ v


def qkv(batch=2, heads=4, kv_heads=None, lq=24, lk=24, dim=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    kv_heads = heads if kv_heads is None else kv_heads
    return (
        torch.randn(batch, heads, lq, dim, generator=gen),
        torch.randn(batch, kv_heads, lk, dim, generator=gen),
        torch.randn(batch, kv_heads, lk, dim, generator=gen),
    )


def grads(out, tensors, seed=123):
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed))
    return torch.autograd.grad((out * weight).sum(), tensors)


def assert_matches_reference(enc, reference, *, causal, backends, lq=24, lk=24, kv_heads=None):
    """relpos.attention == reference(q, k, v) in output and in the gradients of q, k, v and
    of every parameter of ``enc``; ``reference`` builds its bias from ``enc``'s parameters."""
    params = [p for p in enc.parameters() if p.requires_grad]
    q, k, v = qkv(lq=lq, lk=lk, kv_heads=kv_heads)
    leaves = [t.requires_grad_(True) for t in (q, k, v)]
    ref = reference(*leaves)
    ref_grads = grads(ref, leaves + params)
    for backend in backends:
        out = relpos.attention(*leaves, enc, causal=causal, backend=backend)
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5, msg=backend)
        for g, r in zip(grads(out, leaves + params), ref_grads, strict=True):
            torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5, msg=backend)


def zero_scores(enc, lq, lk, **kw):
    """The bias alone: logits of all-zero queries and keys."""
    q = torch.zeros(1, enc.num_heads, lq, enc.head_dim)
    k = torch.zeros(1, enc.num_heads, lk, enc.head_dim)
    return relpos.scores(q, k, enc, **kw)[0]
