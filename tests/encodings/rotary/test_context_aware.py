"""CARoPE (``relpos.encodings.rotary.context_aware``): phases are prefix sums of powers of the token
frequencies (the paper's formula, arXiv 2507.23083); a constant frequency is RoPE; phase differences
depend only on the tokens in between; any activation dtype."""

from __future__ import annotations

import pytest
import torch

import relpos

from .formulas import randn


def test_carope_with_constant_frequency_is_rope():
    enc = relpos.create("carope", num_heads=2, head_dim=16)
    with torch.no_grad():
        enc.freq_weight.zero_()  # f = theta_1 for every token
    rope = relpos.create("rope", num_heads=2, head_dim=16)
    q, k = randn(2, 2, 4, 16, seed=1), randn(2, 2, 10, 16, seed=2)
    kp = torch.tensor([[5, 6, 7, 9, 12, 13, 14, 20, 21, 30], [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]])
    qp = kp[:, 6:]
    torch.testing.assert_close(
        relpos.scores(q, k, enc, q_pos=qp, k_pos=kp),
        relpos.scores(q, k, rope, q_pos=qp, k_pos=kp),
        rtol=1e-5,
        atol=1e-5,
    )


def test_carope_phase_differences_depend_only_on_tokens_in_between():
    enc = relpos.create("carope", num_heads=2, head_dim=8)
    with torch.no_grad():
        enc.freq_weight.copy_(randn(2, 8, seed=7))
    q, k = randn(1, 2, 8, 8, seed=1), randn(1, 2, 8, 8, seed=2)
    pos = torch.arange(8) + 5
    ref = relpos.scores(q, k, enc, q_pos=pos, k_pos=pos)
    k2 = k.clone()
    k2[:, :, 2] = randn(2, 8, seed=3)  # another token at index 2
    new = relpos.scores(q, k2, enc, q_pos=pos, k_pos=pos)
    i, j = torch.meshgrid(torch.arange(8), torch.arange(8), indexing="ij")
    outside = ((i < 2) & (j < 2)) | ((i > 2) & (j > 2))  # index 2 not in (j, i] or (i, j]
    torch.testing.assert_close(new[..., outside], ref[..., outside], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(new[..., (i >= 2) & (j < 2)], ref[..., (i >= 2) & (j < 2)])


def test_carope_is_not_flagged_relative_but_is_translation_invariant():
    torch.manual_seed(0)  # a frequency projection large enough to show (not hidden by the RNG)
    enc = relpos.create("carope", num_heads=2, head_dim=8, init_std=0.5)
    assert not enc.relative and not enc.cache_rotated_keys
    q, k = randn(1, 2, 6, 8, seed=1), randn(1, 2, 6, 8, seed=2)
    pos = torch.tensor([[1, 2, 4, 5, 9, 10]])
    ref = relpos.scores(q, k, enc, q_pos=pos, k_pos=pos)
    moved = relpos.scores(q, k, enc, q_pos=pos + 1000, k_pos=pos + 1000)
    torch.testing.assert_close(moved, ref, rtol=1e-4, atol=1e-4)
    # ... but the score of query 5 and key 0 (distance 5 in both) depends on the gaps between
    a, b = torch.tensor([[0, 1, 2, 3, 4, 5]]), torch.tensor([[0, 4, 4, 4, 4, 5]])
    s_a = relpos.scores(q, k, enc, q_pos=a, k_pos=a)[..., 5, 0]
    s_b = relpos.scores(q, k, enc, q_pos=b, k_pos=b)[..., 5, 0]
    assert not torch.allclose(s_a, s_b, atol=1e-3)
    rope = relpos.create("rope", num_heads=2, head_dim=8)
    torch.testing.assert_close(
        relpos.scores(q, k, rope, q_pos=a, k_pos=a)[..., 5, 0],
        relpos.scores(q, k, rope, q_pos=b, k_pos=b)[..., 5, 0],
    )


def test_carope_queries_need_their_keys():
    enc = relpos.create("carope", num_heads=2, head_dim=8)
    with pytest.raises(RuntimeError, match="rotate_qk"):
        enc.rotate(randn(1, 2, 3, 8), torch.arange(3)[None], "q")
    with pytest.raises(ValueError, match="length"):
        relpos.scores(randn(1, 2, 5, 8), randn(1, 2, 3, 8), enc, q_pos=torch.arange(5))


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
