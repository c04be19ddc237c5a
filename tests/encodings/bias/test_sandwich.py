"""Sandwich (Chi et al. 2023) against reference values computed from NVIDIA/NeMo's formula and a
dense reference written from the formula (the NeMo construction), forward and backward, on the
eager, sdpa and chunked backends."""

from __future__ import annotations

import pytest
import torch
from dense_reference import assert_matches_reference, dense_attention, zero_scores

import relpos

# reference values (H=8; n = 0, 1, 2, 10, 100, 1000), from NeMo's formula in float64
SANDWICH_N = [0, 1, 2, 10, 100, 1000]
SANDWICH_PUBLISHED = {
    (64, 0): [0, -0.62347065, -2.2799912, -9.1093001, -13.9877, -22.641408],
    (64, 7): [0, -0.077933831, -0.2849989, -1.1386625, -1.7484625, -2.830176],
    (128, 0): [0, -1.4466185, -5.2019926, -19.340906, -33.318914, -53.389647],
}


def sandwich_reference(lq, lk, num_heads, d, base=10000.0):
    """The NeMo construction: |i - j| (bottom-right aligned), k = 1 .. d/2, float64."""
    i = torch.arange(lq, dtype=torch.float64)[:, None] + (lk - lq)
    n = (i - torch.arange(lk, dtype=torch.float64)[None, :]).abs()
    inv_freq = 1.0 / base ** (2 * torch.arange(1, d // 2 + 1, dtype=torch.float64) / d)
    inner = torch.cos(n[..., None] * inv_freq).sum(-1)
    scales = torch.arange(1, num_heads + 1, dtype=torch.float64)[:, None, None] * 8 / num_heads
    return ((inner - d / 2) / scales).float()


@pytest.mark.parametrize(("dim", "head"), sorted(SANDWICH_PUBLISHED))
def test_sandwich_matches_published_values(dim, head):
    enc = relpos.create("sandwich", num_heads=8, head_dim=dim)
    s = zero_scores(enc, 1, 6, q_pos=torch.tensor([1000]), k_pos=1000 - torch.tensor(SANDWICH_N))
    expected = torch.tensor(SANDWICH_PUBLISHED[(dim, head)])
    torch.testing.assert_close(s[head, 0], expected, rtol=1e-6, atol=1e-6)
    # the per-distance table (Toeplitz path, dense SDPA bias) holds the same numbers
    table = enc.distance_table(0, 1000, torch.device("cpu"))
    torch.testing.assert_close(table[head, SANDWICH_N], expected, rtol=1e-6, atol=1e-6)


def test_sandwich_dim_option_is_the_d_of_the_formula():
    # head_dim 32 with d = 64 (the OpenNLPLab reproduction's d = 2 * head_dim) = published d=64
    enc = relpos.create("sandwich", num_heads=8, head_dim=32, dim=64)
    s = zero_scores(enc, 1, 6, q_pos=torch.tensor([1000]), k_pos=1000 - torch.tensor(SANDWICH_N))
    torch.testing.assert_close(
        s[0, 0], torch.tensor(SANDWICH_PUBLISHED[(64, 0)]), rtol=1e-6, atol=1e-6
    )
    with pytest.raises(ValueError, match="dim"):
        relpos.create("sandwich", num_heads=8, head_dim=32, dim=63)


def test_sandwich_is_symmetric_non_positive_and_zero_on_the_diagonal():
    enc = relpos.create("sandwich", num_heads=4, head_dim=16)
    s = zero_scores(enc, 30, 30)
    torch.testing.assert_close(s, s.transpose(-1, -2), rtol=0, atol=0)
    assert (s <= 1e-6).all()
    assert s.diagonal(dim1=-2, dim2=-1).abs().max() < 1e-6
    torch.testing.assert_close(s, sandwich_reference(30, 30, 4, 16), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("causal", [True, False])
def test_sandwich_attention_matches_dense_reference(causal):
    enc = relpos.create("sandwich", num_heads=4, head_dim=16)

    def reference(q, k, v):
        bias = sandwich_reference(q.shape[2], k.shape[2], 4, 16)
        return dense_attention(q, k, v, bias, 16**-0.5, causal)

    assert_matches_reference(
        enc, reference, causal=causal, backends=["eager", "sdpa", "chunked"], lq=20, lk=33
    )
