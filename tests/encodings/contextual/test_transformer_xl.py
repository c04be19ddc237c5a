"""Transformer-XL (``relpos.encodings.contextual.transformer_xl``) against the official code
(kimiyoung/transformer-xl): the sinusoid ``R_t = [sin(t w), cos(t w)]``; logits,
outputs and gradients against a dense reference written from the paper formula, on the eager
and chunked backends, and outputs against the official computation (``_rel_shift`` over
``klen - 1 .. 0`` with a memory), whose shift is first checked on a worked example.
"""

from __future__ import annotations

import math

import pytest
import torch

import relpos
from relpos.attention import chunked

B, H, D = 2, 4, 8


# ---------------------------------------------------------------------------- Transformer-XL
def test_transformer_xl_sinusoid_is_concatenated_sin_cos() -> None:
    enc = relpos.create("transformer-xl", num_heads=H, head_dim=D, d_model=8)
    got = enc.table_rows(-3, 5, torch.device("cpu"))
    t = torch.arange(-3, 6, dtype=torch.float64)[:, None]
    w = 1.0 / 10000 ** (torch.arange(0, 8, 2, dtype=torch.float64) / 8)
    want = torch.cat(((t * w).sin(), (t * w).cos()), dim=-1)
    torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-6)


def txl_dense_attention(enc, q, k, v, q_pos, k_pos, causal: bool):
    """Paper formula, pair by pair: ``[(q_i + u).k_j + (q_i + v).W_R R_{i-j}] / sqrt(d)``."""
    delta = q_pos[:, None] - k_pos[None, :]
    if enc.clamp_len is not None:
        delta = delta.clamp(-enc.clamp_len, enc.clamp_len)
    dm = enc.d_model
    w = 1.0 / 10000 ** (torch.arange(0, dm, 2, dtype=torch.float64) / dm)
    ang = delta[..., None].double() * w
    r = torch.cat((ang.sin(), ang.cos()), dim=-1).float()  # (Lq, Lk, d_model)
    wr = (r @ enc.r_net.weight.t()).view(*delta.shape, H, D)
    ac = torch.einsum("bhid,bhjd->bhij", q + enc.r_w_bias[:, None], k)
    bd = torch.einsum("bhid,ijhd->bhij", q + enc.r_r_bias[:, None], wr)
    logits = (ac + bd) / math.sqrt(D)
    if causal:
        logits = logits.masked_fill(delta < 0, float("-inf"))
    return logits, torch.softmax(logits, -1) @ v


def _txl(clamp_len=None, seed=0):
    torch.manual_seed(seed)
    enc = relpos.create("transformer-xl", num_heads=H, head_dim=D, clamp_len=clamp_len)
    with torch.no_grad():  # larger position terms than the 0.02 init, so errors would show
        enc.r_net.weight.normal_(0, 0.3)
        enc.r_w_bias.normal_(0, 0.5)
        enc.r_r_bias.normal_(0, 0.5)
    return enc


@pytest.mark.parametrize("backend", ["eager", "chunked"])
@pytest.mark.parametrize(
    "causal,clamp_len", [(True, None), (False, None), (True, 7)], ids=["causal", "full", "clamp7"]
)
def test_transformer_xl_matches_dense_formula_forward_and_backward(
    backend, causal, clamp_len, monkeypatch
) -> None:
    enc = _txl(clamp_len)
    if backend == "chunked":
        monkeypatch.setattr(chunked, "TILE_ELEMENTS", 16 * 64)  # several query tiles
    gen = torch.Generator().manual_seed(1)
    lq, lk = 40, 64  # a memory of 24 keys before the segment
    q = torch.randn(B, H, lq, D, generator=gen, requires_grad=True)
    k = torch.randn(B, H, lk, D, generator=gen, requires_grad=True)
    v = torch.randn(B, H, lk, D, generator=gen, requires_grad=True)
    k_pos = torch.arange(lk) + 5
    q_pos = k_pos[lk - lq :]
    g = torch.randn(B, H, lq, D, generator=gen)
    params = [enc.r_w_bias, enc.r_r_bias, enc.r_net.weight]

    logits, want = txl_dense_attention(enc, q, k, v, q_pos, k_pos, causal)
    want_grads = torch.autograd.grad((want * g).sum(), [q, k, v, *params])
    got = relpos.attention(q, k, v, enc, q_pos=q_pos, k_pos=k_pos, causal=causal, backend=backend)
    got_grads = torch.autograd.grad((got * g).sum(), [q, k, v, *params])
    names = ["q", "k", "v", "u", "v_bias", "W_R"]

    got_logits = relpos.scores(q, k, enc, q_pos=q_pos, k_pos=k_pos)
    finite = torch.isfinite(logits)
    scale = float(logits.detach()[finite].abs().max())
    torch.testing.assert_close(got_logits[finite], logits[finite], rtol=1e-5, atol=1e-5 * scale)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * float(want.detach().abs().max()))
    for name, a, b in zip(names, got_grads, want_grads, strict=True):
        torch.testing.assert_close(
            a, b, rtol=1e-5, atol=1e-5 * float(b.abs().max()), msg=lambda m, n=name: f"{n}: {m}"
        )


def rel_shift(x: torch.Tensor) -> torch.Tensor:
    """Transformer-XL's ``_rel_shift`` on ``x (qlen, klen, ...)``: prepend a zero
    column, view as ``(klen + 1, qlen)``, drop the first row, view back."""
    zero = torch.zeros((x.shape[0], 1, *x.shape[2:]), dtype=x.dtype)
    padded = torch.cat((zero, x), dim=1).view(x.shape[1] + 1, x.shape[0], *x.shape[2:])
    return padded[1:].view_as(x)


def test_rel_shift_of_the_reference_matches_spec_example() -> None:
    got = rel_shift(torch.arange(9.0).view(3, 3))
    lower = torch.tril(torch.ones(3, 3, dtype=torch.bool))
    assert got[lower].tolist() == [2, 4, 5, 6, 7, 8]


def txl_official_attention(enc, q, k, v, mlen: int) -> torch.Tensor:
    """Official ``RelPartialLearnableMultiHeadAttn`` order of work for q of the
    segment and k, v of memory + segment: ``R`` over ``klen - 1 .. 0`` (clamped to
    ``clamp_len``), ``AC`` + ``_rel_shift(BD)``, causal mask ``triu(1 + mlen)``."""
    qlen, klen = q.shape[2], k.shape[2]
    pos_seq = torch.arange(klen - 1, -1, -1.0)
    if enc.clamp_len is not None:
        pos_seq = pos_seq.clamp(max=enc.clamp_len)
    inv_freq = 1 / (10000 ** (torch.arange(0.0, enc.d_model, 2.0) / enc.d_model))
    ang = torch.outer(pos_seq, inv_freq)
    pos_emb = torch.cat((ang.sin(), ang.cos()), dim=-1)  # (klen, d_model)
    r_head_k = enc.r_net(pos_emb).view(klen, H, D)
    qi = q.permute(2, 0, 1, 3)  # (qlen, B, H, D)
    kj = k.permute(2, 0, 1, 3)
    ac = torch.einsum("ibnd,jbnd->ijbn", qi + enc.r_w_bias, kj)
    bd = rel_shift(torch.einsum("ibnd,jnd->ijbn", qi + enc.r_r_bias, r_head_k))
    score = (ac + bd) / math.sqrt(D)
    mask = torch.triu(torch.ones(qlen, klen, dtype=torch.bool), 1 + mlen)
    score = score.masked_fill(mask[:, :, None, None], float("-inf"))
    prob = torch.softmax(score, dim=1)
    return torch.einsum("ijbn,jbnd->ibnd", prob, v.permute(2, 0, 1, 3)).permute(1, 2, 0, 3)


@pytest.mark.parametrize("clamp_len", [None, 9])
@pytest.mark.parametrize("mlen", [0, 17])
def test_transformer_xl_matches_official_rel_shift_computation(mlen: int, clamp_len) -> None:
    enc = _txl(clamp_len)
    gen = torch.Generator().manual_seed(2)
    qlen = 23
    q = torch.randn(B, H, qlen, D, generator=gen)
    k, v = torch.randn(2, B, H, mlen + qlen, D, generator=gen).unbind(0)
    with torch.no_grad():
        want = txl_official_attention(enc, q, k, v, mlen)
        got = relpos.attention(q, k, v, enc, causal=True)  # queries = the last qlen positions
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))


def test_transformer_xl_precomputes_only_the_distances_of_the_call() -> None:
    """``prepare`` holds (B, H, Lq, R) with R = the distances the call reaches, never (L, L, D)."""
    enc = _txl()
    q, k = torch.randn(B, H, 10, D), torch.randn(B, H, 30, D)
    ctx = enc.prepare(q, k, torch.arange(20, 30)[None], torch.arange(30)[None])
    assert ctx.data.query.compute().shape == (B, H, 10, 39)  # distances -9 .. 29
    assert ctx.data.uk.shape == (B, H, 30)
    clamped = _txl(clamp_len=4).prepare(q, k, torch.arange(20, 30)[None], torch.arange(30)[None])
    assert clamped.data.query.compute().shape == (B, H, 10, 9)  # distances clamped to -4 .. 4
