"""RCMHA's relative scoring (``relpos.encodings.contextual.rcmha``) against the official code
(hermansh-id/rcmha).

Two references, both float64: the official computation order (the ``(Lq, Lk + Lq)`` products over
table rows ``P - Lk .. P + Lq - 1``, skewed by a zero-column shift and cut to the last ``Lk``
columns; the skew is re-implemented here from its description and first checked on worked
index examples), and the formula pair by pair with clipping.
"""

from __future__ import annotations

import math

import pytest
import torch

import relpos

H, D = 2, 4


def shift_right(x: torch.Tensor) -> torch.Tensor:
    """The Transformer-XL skew on ``x (Lq, W, ...)``: append a zero column, read the buffer
    as ``(W + 1, Lq)``, drop its last row, read it back as ``(Lq, W)``: ``out[i, c] =
    x[i, c - i]`` for ``c >= i``."""
    zero = x.new_zeros(x.shape[0], 1, *x.shape[2:])
    padded = torch.cat([x, zero], dim=1).reshape(x.shape[1] + 1, x.shape[0], *x.shape[2:])
    return padded[:-1].reshape(x.shape)


def official_offsets(lq: int, lk: int) -> torch.Tensor:
    """The table offset (row minus P) each (query, key) pair reads in the official code."""
    rows = torch.arange(-lk, lq, dtype=torch.float64).expand(lq, lk + lq)  # rows P-Lk .. P+Lq-1
    return shift_right(rows)[:, -lk:]


def test_official_skew_offsets_are_the_spec_examples() -> None:
    i, j = torch.arange(4)[:, None], torch.arange(4)[None]
    assert torch.equal(official_offsets(4, 4), (j - i).double())
    want = torch.tensor([[-3, -2, -1, 0, 1], [-4, -3, -2, -1, 0]], dtype=torch.float64)
    assert torch.equal(official_offsets(2, 5), want)


def _random_encoding(p: int = 8, seed: int = 0) -> relpos.Encoding:
    torch.manual_seed(seed)
    enc = relpos.create("rcmha", num_heads=H, head_dim=D, max_relative_position=p).double()
    with torch.no_grad():
        for param in enc.parameters():
            param.normal_()
    return enc


def official_scores(enc, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``get_scores`` in the official order, in relpos's ``(B, H, L, D)`` layout, times
    ``1/sqrt(d_k)`` as the official ``forward`` does."""
    lq, lk, p = q.shape[2], k.shape[2], enc.max_relative_position
    emb = enc.key_table[:, p - lk : p + lq]  # (H, Lk + Lq, D)
    pos_bias = enc.distance_bias[:, p - lk : p + lq]  # (H, Lk + Lq)
    ac = torch.einsum("bhid,bhjd->ijbh", q + enc.content_bias[None, :, None], k)
    b = torch.einsum("bhid,hrd->irbh", q, emb)
    bd = shift_right(b + pos_bias.t()[None, :, None, :])[:, -lk:]
    return (ac + bd).permute(2, 3, 0, 1) / math.sqrt(D)


@pytest.mark.parametrize("lq, lk", [(4, 4), (2, 5), (6, 6), (1, 7)])
def test_scores_equal_the_official_computation(lq: int, lk: int) -> None:
    enc = _random_encoding()
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(2, H, lq, D, generator=gen, dtype=torch.float64)
    k = torch.randn(2, H, lk, D, generator=gen, dtype=torch.float64)
    got = relpos.scores(q, k, enc)  # queries default to the last Lq key positions
    torch.testing.assert_close(got, official_scores(enc, q, k), rtol=1e-12, atol=1e-12)


def formula_logits(enc, q, k, q_pos, k_pos) -> torch.Tensor:
    """``[(q_i + u).k_j + q_i.E[P + c] + e[P + c]] / sqrt(d)``, ``c = clip(j - i, -P, P-1)``."""
    p = enc.max_relative_position
    c = (k_pos[:, None, :] - q_pos[:, :, None]).clamp(-p, p - 1) + p  # (B, Lq, Lk)
    hk = torch.arange(H)[None, :, None, None] // (H // k.shape[1])
    b = torch.arange(q.shape[0])[:, None, None, None]
    kk = k[b, hk, torch.arange(k.shape[2])[None, None, None, :]]  # (B, H, 1, Lk, D)
    e_rel = enc.key_table[torch.arange(H)[None, :, None, None], c[:, None]]  # (B, H, Lq, Lk, D)
    content = ((q + enc.content_bias[None, :, None])[:, :, :, None] * kk).sum(-1)
    rel = (q[:, :, :, None] * e_rel).sum(-1)
    return (content + rel + enc.distance_bias[torch.arange(H)[None, :, None, None], c[:, None]]) / (
        math.sqrt(D)
    )


@pytest.mark.parametrize("backend", ["eager", "chunked"])
def test_attention_and_gradients_match_the_formula_with_clipping(backend: str) -> None:
    enc = _random_encoding(p=3)
    gen = torch.Generator().manual_seed(2)
    B, L, hkv = 2, 9, 1  # distances up to 8 > P = 3: the edge rows; grouped-query keys
    q = torch.randn(B, H, L, D, generator=gen, dtype=torch.float64, requires_grad=True)
    k = torch.randn(B, hkv, L, D, generator=gen, dtype=torch.float64, requires_grad=True)
    v = torch.randn(B, hkv, L, D, generator=gen, dtype=torch.float64)
    pos = torch.stack([torch.arange(L), torch.arange(L) * 2 + 5])  # batch-specific positions
    out = relpos.attention(q, k, v, enc, q_pos=pos, k_pos=pos, causal=True, backend=backend)
    logits = formula_logits(enc, q, k, pos, pos)
    logits = logits.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
    want = torch.softmax(logits, -1) @ v.expand(B, H, L, D)
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-12)
    w = torch.randn_like(want)
    params = [q, k, enc.key_table, enc.distance_bias, enc.content_bias]
    got_g = torch.autograd.grad((out * w).sum(), params)
    want_g = torch.autograd.grad((want * w).sum(), params)
    for name, g, g_ref in zip(["q", "k", "E", "e", "u"], got_g, want_g, strict=True):
        torch.testing.assert_close(g, g_ref, rtol=1e-9, atol=1e-12, msg=name)


def test_zero_initialised_tables_score_as_nope() -> None:
    enc = relpos.create("rcmha", num_heads=H, head_dim=D)
    assert enc.key_table.shape == (H, 2 * 4096, D)
    assert all(bool((p == 0).all()) for p in enc.parameters())
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, H, 6, D, generator=gen) for _ in range(3))
    torch.testing.assert_close(
        relpos.attention(q, k, v, enc, causal=True), relpos.attention(q, k, v, None, causal=True)
    )


def test_max_relative_position_is_checked_by_name() -> None:
    with pytest.raises(ValueError, match="max_relative_position"):
        relpos.create("rcmha", num_heads=H, head_dim=D, max_relative_position=0)
