"""ComplexFormer and HARoPE (``relpos.encodings.rotary.headwise``): the paper formulas in float64
(ComplexFormer's and HARoPE's official code), HARoPE with the identity map is RoPE, and
grouped-query calls equal the call with keys repeated when the shared parameters agree within each
group."""

from __future__ import annotations

import math

import pytest
import torch

import relpos

from .formulas import randn, rope_fp64, theta_fp64


def test_harope_with_identity_map_is_interleaved_rope():
    enc = relpos.create("harope", num_heads=2, head_dim=8)
    with torch.no_grad():
        enc.sigma.fill_(math.log(math.expm1(1.0 - 1e-6)))  # s = 1 exactly: M = I
    rope = relpos.create("rope", num_heads=2, head_dim=8, layout="interleaved")
    q, k, v = randn(2, 2, 7, 8, seed=1), randn(2, 2, 7, 8, seed=2), randn(2, 2, 7, 8, seed=3)
    pos = torch.tensor([[1, 2, 4, 8, 16, 32, 64], [0, 1, 2, 3, 4, 5, 6]])
    kw = dict(q_pos=pos, k_pos=pos, causal=True)
    torch.testing.assert_close(
        relpos.attention(q, k, v, enc, **kw),
        relpos.attention(q, k, v, rope, **kw),
        atol=1e-6,
        rtol=1e-5,
    )


@pytest.mark.parametrize("name", ["harope", "complexformer", "carope"])
def test_grouped_query_call_equals_repeated_keys_when_groups_share_parameters(name):
    torch.manual_seed(0)
    enc = relpos.create(name, num_heads=4, head_dim=8)
    with torch.no_grad():
        for p in enc.parameters():
            p.add_(torch.randn_like(p) * 0.3)
            if p.shape[0] == 4:  # per-head: make the two heads of each group agree
                p.copy_(
                    p.reshape(2, 2, *p.shape[1:])[:, :1].expand(2, 2, *p.shape[1:]).reshape(p.shape)
                )
        if name == "complexformer":
            enc.beta.copy_(randn(4, 4, seed=9))  # beta is per query head: may differ
    q, k, v = randn(1, 4, 6, 8, seed=1), randn(1, 2, 6, 8, seed=2), randn(1, 2, 6, 8, seed=3)
    gqa = relpos.attention(q, k, v, enc, causal=True)
    full = relpos.attention(
        q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), enc, causal=True
    )
    torch.testing.assert_close(gqa, full, rtol=1e-5, atol=1e-6)


def complexformer_scores_fp64(q, k, qp, kp, delta, beta, base=1e4):
    """ComplexFormer's score,
    s_mn = sum_j r^q r^k cos(delta (phi^q - phi^k) + beta + (m - n) w_j)."""
    q, k = q.double(), k.double()
    half = q.shape[-1] // 2
    w = theta_fp64(2 * half, base)

    def polar(x):
        re, im = x[..., :half], x[..., half:]
        return torch.sqrt(re**2 + im**2 + 1e-9), torch.atan2(im, re)

    rq, fq = polar(q)  # (B, H, Lq, J)
    rk, fk = polar(k)
    d, b = delta.double()[None, :, None, None, :], beta.double()[None, :, None, None, :]
    dist = (qp.double()[:, None] - kp.double()[None, :])[None, None, :, :, None]
    arg = d * (fq[:, :, :, None] - fk[:, :, None]) + b + dist * w
    return (rq[:, :, :, None] * rk[:, :, None] * torch.cos(arg)).sum(-1)


def test_complexformer_scores_follow_the_paper_formula():
    enc = relpos.create("complexformer", num_heads=2, head_dim=8)
    with torch.no_grad():
        enc.beta.copy_(randn(2, 4, seed=5))
    q, k = randn(1, 2, 6, 8, seed=1), randn(1, 2, 7, 8, seed=2)
    qp, kp = torch.arange(3, 9), torch.arange(2, 9)
    got = relpos.scores(q, k, enc, q_pos=qp, k_pos=kp, scale=1.0)
    ref = complexformer_scores_fp64(q, k, qp, kp, enc.delta.detach(), enc.beta.detach())
    torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-5)


def test_complexformer_with_unit_delta_and_zero_beta_is_half_split_rope():
    enc = relpos.create("complexformer", num_heads=2, head_dim=8)
    with torch.no_grad():
        enc.delta.fill_(1.0)
    q, k = randn(1, 2, 5, 8, seed=1), randn(1, 2, 5, 8, seed=2)
    pos = torch.arange(10, 15)
    theta = theta_fp64(8)
    ref = rope_fp64(q, pos, theta, "half") @ rope_fp64(k, pos, theta, "half").mT
    got = relpos.scores(q, k, enc, q_pos=pos, k_pos=pos, scale=1.0)
    torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-5)


def test_harope_init_is_the_identity_map():
    enc = relpos.create("harope", num_heads=3, head_dim=8)
    assert torch.allclose(enc.sigma, torch.tensor(0.5413), atol=1e-4)  # ln(e - 1)
    m, m_inv_t = enc.maps()
    eye = torch.eye(8).expand(3, 8, 8)
    torch.testing.assert_close(m, eye * (1 + 1e-6), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(m @ m_inv_t.mT, eye, rtol=1e-5, atol=1e-6)


def test_harope_score_is_q_dot_k_at_zero_distance_for_any_map():
    enc = relpos.create("harope", num_heads=2, head_dim=8)
    with torch.no_grad():
        for p in enc.parameters():
            p.add_(randn(*p.shape, seed=p.numel()) * 0.5)
    q, k = randn(1, 2, 4, 8, seed=1), randn(1, 2, 4, 8, seed=2)
    pos = torch.full((4,), 37)
    got = relpos.scores(q, k, enc, q_pos=pos, k_pos=pos, scale=1.0)
    torch.testing.assert_close(got, q @ k.mT, rtol=1e-4, atol=1e-4)


def test_harope_map_is_the_svd_formula():
    enc = relpos.create("harope", num_heads=1, head_dim=4)
    a_u, a_v, sigma = randn(1, 4, 4, seed=1), randn(1, 4, 4, seed=2), randn(1, 4, seed=3)
    with torch.no_grad():
        enc.a_u.copy_(a_u), enc.a_v.copy_(a_v), enc.sigma.copy_(sigma)
    u = torch.linalg.matrix_exp(((a_u - a_u.mT) / 2).double())
    v = torch.linalg.matrix_exp(((a_v - a_v.mT) / 2).double())
    s = torch.nn.functional.softplus(sigma.double()) + 1e-6
    m_ref = u @ torch.diag_embed(s) @ v.mT
    m, m_inv_t = enc.maps()
    torch.testing.assert_close(m.double(), m_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(m_inv_t.double(), torch.linalg.inv(m_ref).mT, rtol=1e-5, atol=1e-5)
