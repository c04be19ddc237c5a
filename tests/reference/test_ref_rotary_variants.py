"""Rotary variants against the spec's reference values and formulas.

Expected values are copied from ../shared/spec/formulas-rotary.md (sections 12-21 and R.1,
R.9) or re-derived here in float64 from the formulas stated there, never from relpos.
"""

from __future__ import annotations

import math

import pytest
import torch

import relpos


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
