"""Rotary variants against the spec's reference values and formulas.

Expected values are copied from ../shared/spec/formulas-rotary.md (sections 12-21 and R.1,
R.9) or re-derived here in float64 from the formulas stated there, never from relpos.
"""

from __future__ import annotations

import math

import pytest
import torch

import relpos

# R.1: default, b = 1e4, d = 64.
R1 = [
    1, 0.749894202, 0.562341332, 0.421696514, 0.316227764, 0.237137362, 0.177827939, 0.133352146,
    0.100000001, 0.0749894157, 0.0562341288, 0.0421696492, 0.0316227786, 0.0237137359,
    0.0177827943, 0.0133352149, 0.00999999978, 0.00749894232, 0.00562341325, 0.00421696482,
    0.00316227786, 0.00237137382, 0.00177827943, 0.00133352145, 0.00100000005, 0.000749894185,
    0.000562341302, 0.000421696488, 0.000316227786, 0.000237137385, 0.00017782794, 0.00013335215,
]  # fmt: skip

# R.9: proportional (p-RoPE as in Gemma 4), head_dim 16, p = 0.25, b = 1e6.
R9 = [1, 0.177827939, 0, 0, 0, 0, 0, 0]


def rope_fp64(x: torch.Tensor, pos: torch.Tensor, theta: torch.Tensor, layout: str):
    """RoPE in float64 from the formula (spec §1): pair (a, b) -> (a c - b s, a s + b c)."""
    x = x.double()
    ang = pos.double()[:, None] * theta.double()  # (L, F)
    c, s = ang.cos(), ang.sin()
    f = theta.numel()
    if layout == "half":
        a, b = x[..., :f], x[..., f:]
        return torch.cat((a * c - b * s, a * s + b * c), dim=-1)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack((a * c - b * s, a * s + b * c), dim=-1).flatten(-2)


def theta_fp64(d: int, base: float = 1e4) -> torch.Tensor:
    return base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)


def randn(*shape, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------- p-RoPE (§14, R.9)


def test_p_rope_frequencies_match_r9():
    enc = relpos.create("p-rope", num_heads=1, head_dim=16, p=0.25, base=1e6)
    torch.testing.assert_close(enc.inv_freq, torch.tensor(R9), rtol=1e-6, atol=0)
    assert enc.rotary_dim == 16  # cos/sin span the whole head (spec P4b)


def test_p_rope_zero_frequency_pairs_pass_through():
    enc = relpos.create("p-rope", num_heads=1, head_dim=16, p=0.25, base=1e6)
    x = randn(1, 1, 5, 16)
    out = enc.rotate(x, torch.arange(100, 105)[None], "q")
    kept = [2, 3, 4, 5, 6, 7, 10, 11, 12, 13, 14, 15]  # half layout: pairs (i, i + 8), i >= 2
    torch.testing.assert_close(out[..., kept], x[..., kept], rtol=0, atol=0)


# ----------------------------------------------------------------------- HoPE (§13)


def test_hope_keeps_the_pairs_whose_wavelength_fits_the_training_length():
    # lambda_i = 2 pi 1e4^(2i/64) <= 4096  <=>  i <= 32 log10(4096 / 2 pi) / 4 = 22.5
    cutoff = math.floor(32 * math.log10(4096 / (2 * math.pi)) / 4) + 1
    assert cutoff == 23
    enc = relpos.create("hope", num_heads=1, head_dim=64, train_length=4096)
    assert enc.rotated_pairs == cutoff
    expected = torch.tensor(R1[:cutoff] + [0.0] * (32 - cutoff))
    torch.testing.assert_close(enc.inv_freq, expected, rtol=1e-6, atol=0)


def test_hope_with_explicit_pairs_is_p_rope():
    hope = relpos.create("hope", num_heads=1, head_dim=16, rotated_pairs=2, base=1e6)
    torch.testing.assert_close(hope.inv_freq, torch.tensor(R9), rtol=1e-6, atol=0)


# ----------------------------------------------------------------------- LeRoPE (§12)


def test_lerope_is_rope_at_init_and_rescales_frequencies_in_log_space():
    enc = relpos.create("lerope", num_heads=1, head_dim=64)
    torch.testing.assert_close(enc.learned_inv_freq, torch.tensor(R1), rtol=1e-6, atol=0)
    # u_i = -(2i/d) ln 4 turns base 1e4 into base 4e4
    with torch.no_grad():
        enc.log_scale.copy_(-torch.arange(0, 64, 2) / 64 * math.log(4.0))
    torch.testing.assert_close(enc.learned_inv_freq, theta_fp64(64, 4e4).float(), rtol=1e-6, atol=0)


# ----------------------------------------------------------------------- ComplexFormer (§17)


def complexformer_scores_fp64(q, k, qp, kp, delta, beta, base=1e4):
    """s_mn = sum_j r^q r^k cos(delta (phi^q - phi^k) + beta + (m - n) w_j), spec §17."""
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


# ----------------------------------------------------------------------- HARoPE (§20)


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


# ----------------------------------------------------------------------- LieRE (§19)


def test_liere_generator_is_skew_with_the_stored_upper_triangle():
    enc = relpos.create("liere", num_heads=1, head_dim=6, dims=2, generator_dim=3 * 2)
    s = enc.generators()
    assert s.shape == (2, 1, 6, 6)
    torch.testing.assert_close(s, -s.mT)
    rows, cols = torch.triu_indices(6, 6, 1)
    torch.testing.assert_close(s[..., rows, cols], enc.generator)
    # the source's raw ~ U(0, 2 pi): every stored entry lies there
    assert (
        0
        <= float(enc.generator.detach().min())
        <= float(enc.generator.detach().max())
        <= 2 * math.pi
    )


def test_liere_with_block_diagonal_2x2_generators_is_interleaved_rope():
    enc = relpos.create("liere", num_heads=1, head_dim=8, generator_dim=2, expected_steps=1.0)
    theta = theta_fp64(8)
    with torch.no_grad():  # S = [[0, s], [-s, 0]] rotates by -s p: s = -theta_i
        enc.generator.copy_(-theta.float().view(1, 4, 1))
    x = randn(1, 1, 6, 8, seed=3)
    pos = torch.tensor([0, 1, 5, 77, 1000, 4097])
    got = enc.rotate(x, pos[None], "q")
    torch.testing.assert_close(
        got.double(), rope_fp64(x, pos, theta, "interleaved"), atol=2e-5, rtol=0
    )


@pytest.mark.parametrize(
    "pos",
    [[[-3, 0, 2, 50, 513]], [[-5, -4, -3, -2, -1, 0, 1, 2, 3, 7]], [[4, 5, 6], [2, 3, 9]]],
    ids=["sparse: binary powering", "range: table of powers", "batch rows"],
)
def test_liere_rotation_is_the_matrix_exponential(pos):
    enc = relpos.create("liere", num_heads=1, head_dim=8, expected_steps=16.0)
    pos = torch.tensor(pos)
    s = enc.generators().double()[0, 0] / 16.0
    ref = torch.linalg.matrix_exp(pos.double()[..., None, None] * s)
    got = enc.rotations(pos)[:, :, 0]  # integer positions: powers of expm(S)
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-9)
    got_float = enc.rotations(pos.double())[:, :, 0]  # fractional path: matrix_exp per token
    torch.testing.assert_close(got_float, ref, rtol=0, atol=1e-9)


# ----------------------------------------------------------------------- CARoPE (§16)


def test_carope_phases_are_prefix_sums_of_powers_of_token_frequencies():
    enc = relpos.create("carope", num_heads=2, head_dim=8)
    k = randn(1, 2, 6, 8, seed=4)
    with torch.no_grad():
        enc.freq_weight.copy_(randn(2, 8, seed=5))  # far from RoPE: f varies per token
    z = (
        torch.einsum("bhld,hd->bhl", k.double(), enc.freq_weight.double())
        + enc.freq_bias.double()[None, :, None]
    )
    f = 1 / (torch.nn.functional.softplus(z) + 1)
    # paper: phi_i(m) = sum_{t=1}^{m} f_t^i (positions 0..5, i 0-based)
    ref = torch.zeros(1, 2, 6, 4, dtype=torch.float64)
    for m in range(6):
        for i in range(4):
            ref[..., m, i] = sum(f[..., t] ** i for t in range(1, m + 1))
    got, _ = enc.phases(k, torch.arange(6)[None])
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-6)


def test_carope_bias_makes_rope_frequency_at_init():
    enc = relpos.create("carope", num_heads=3, head_dim=16, base=1e4)
    f = 1 / (torch.nn.functional.softplus(enc.freq_bias.double()) + 1)
    torch.testing.assert_close(f, torch.full((3,), 1e4 ** (-2 / 16), dtype=torch.float64))


# ----------------------------------------------------------------------- RoVE (§18)


def test_rove_output_is_attentive_convolution_with_kernel_r_n_minus_m():
    enc = relpos.create("rove", num_heads=1, head_dim=8)
    q, k, v = randn(1, 1, 5, 8, seed=1), randn(1, 1, 5, 8, seed=2), randn(1, 1, 5, 8, seed=3)
    pos = torch.tensor([3, 4, 6, 9, 10])
    theta = theta_fp64(8)
    logits = rope_fp64(q, pos, theta, "half") @ rope_fp64(k, pos, theta, "half").mT / math.sqrt(8)
    logits = logits.masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), float("-inf"))
    a = logits.softmax(-1)[0, 0]
    ref = torch.zeros(5, 8, dtype=torch.float64)
    for m in range(5):
        for n in range(m + 1):  # R(n - m) v_n
            ref[m] += (
                a[m, n] * rope_fp64(v[0, 0, n : n + 1], pos[n : n + 1] - pos[m], theta, "half")[0]
            )
    got = relpos.attention(q, k, v, enc, q_pos=pos, k_pos=pos, causal=True)
    torch.testing.assert_close(got[0, 0].double(), ref, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------- boosts (§15, §21)


def boost(phi: float) -> torch.Tensor:
    return torch.tensor(
        [[math.cosh(phi), math.sinh(phi)], [math.sinh(phi), math.cosh(phi)]], dtype=torch.float64
    )


@pytest.mark.parametrize("a,b", [(0.3, -1.1), (2.0, 0.5)])
def test_boost_facts_of_the_spec(a, b):
    eta = torch.diag(torch.tensor([1.0, -1.0], dtype=torch.float64))
    torch.testing.assert_close(boost(a) @ boost(b), boost(a + b))
    torch.testing.assert_close(boost(a).T @ eta @ boost(b), eta @ boost(b - a))
    light = torch.tensor([1.0, 1.0], dtype=torch.float64)
    torch.testing.assert_close(boost(a) @ light, math.exp(a) * light)


def test_minkowski_score_is_the_block_formula():
    enc = relpos.create("minkowski", num_heads=1, head_dim=8, dims=3, max_rapidity=0.05)
    q, k = randn(1, 1, 3, 8, seed=1), randn(1, 1, 4, 8, seed=2)
    qp = torch.tensor([[[5.0, 1, 2], [6, 3, 0], [9, -2, 4]]])
    kp = torch.tensor([[[0.0, 0, 0], [2, 1, 7], [4, 4, 4], [8, -1, 2]]])
    eta = torch.diag(torch.tensor([1.0, -1.0], dtype=torch.float64))
    rates = 0.05 * 1e4 ** (-torch.arange(2, dtype=torch.float64) / 2)
    # block b rotates with axis 1 + b % 2, rank 0 on each axis: theta = 1
    ref = torch.zeros(3, 4, dtype=torch.float64)
    for i in range(3):
        for j in range(4):
            d = (kp[0, j] - qp[0, i]).double()
            for b in range(2):
                qb, kb = (
                    q[0, 0, i, 4 * b : 4 * b + 4].double(),
                    k[0, 0, j, 4 * b : 4 * b + 4].double(),
                )
                ref[i, j] += qb[:2] @ eta @ boost(float(rates[b] * d[0])) @ kb[:2]
                ang = float(d[1 + b])
                rot = torch.tensor(
                    [[math.cos(ang), -math.sin(ang)], [math.sin(ang), math.cos(ang)]],
                    dtype=torch.float64,
                )
                ref[i, j] += qb[2:] @ rot @ kb[2:]
    got = relpos.scores(q, k, enc, q_pos=qp, k_pos=kp, scale=1.0)[0, 0]
    torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-5)
