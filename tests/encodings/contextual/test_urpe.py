"""URPE (Luo et al. 2022) against the official buckets (lsj2408/URPE) and the formula
``softmax(QK^T/sqrt(d) + B) * C``, forward and backward."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from dense_reference import assert_matches_reference, dense_attention, qkv, zero_scores

import relpos
from relpos.encodings.contextual.urpe import urpe_bucket


def official_urpe_bucket(max_seq_len, num_buckets, max_distance):
    """lsj2408/URPE TransformerSentenceEncoder: relative_position_bucket, += 2, -= min."""
    ctx = torch.arange(max_seq_len)[:, None]
    mem = torch.arange(max_seq_len)[None, :]
    rel = mem - ctx
    sign = torch.sign(rel)
    half = num_buckets // 2
    n = rel.abs()
    exact = half // 2
    with torch.no_grad():
        large = exact + (
            torch.log(n.float() / exact) / math.log(max_distance / exact) * (half - exact)
        ).to(torch.long)
    large = torch.min(large, torch.full_like(large, half - 1))
    bucket = torch.where(n < exact, n, large) * sign
    bucket[bucket >= 0] += 2
    return rel, bucket - bucket.min()


def test_urpe_bucket_equals_the_official_construction():
    for num_buckets, max_distance in [(64, 128), (32, 64)]:
        rel, expected = official_urpe_bucket(256, num_buckets, max_distance)
        assert torch.equal(urpe_bucket(rel, num_buckets, max_distance), expected)
        assert int(expected.max()) <= num_buckets


def test_urpe_init_is_plain_rpe_attention():
    torch.manual_seed(0)
    enc = relpos.create("urpe", num_heads=4, head_dim=16, max_length=64)
    assert enc.beta.shape == enc.gamma.shape == (127, 4)
    assert torch.equal(enc.gamma, torch.ones(127, 4))
    assert 0.015 < float(enc.beta.detach().std()) < 0.025


def urpe_reference(enc, causal):
    """Toeplitz B and C from the official unique buckets (j - i - min) and the formula."""

    def reference(q, k, v):
        Lq, Lk = q.shape[2], k.shape[2]
        i = torch.arange(Lq)[:, None] + (Lk - Lq)
        bucket = torch.arange(Lk)[None, :] - i + enc.max_length - 1
        bias = F.embedding(bucket, enc.beta).permute(2, 0, 1)
        mult = F.embedding(bucket, enc.gamma).permute(2, 0, 1)
        return dense_attention(q, k, v, bias, q.shape[-1] ** -0.5, causal, mult)

    return reference


@pytest.mark.parametrize("causal", [True, False])
def test_urpe_attention_matches_the_formula(causal):
    torch.manual_seed(0)
    enc = relpos.create("urpe", num_heads=4, head_dim=16, max_length=40)
    with torch.no_grad():
        enc.gamma.uniform_(0.5, 1.5)
    assert_matches_reference(
        enc, urpe_reference(enc, causal), causal=causal, backends=["eager", "chunked"], lq=20, lk=33
    )


def test_urpe_weights_are_not_renormalised():
    enc = relpos.create("urpe", num_heads=4, head_dim=16, max_length=32)
    q, k, v = qkv()
    plain = relpos.attention(q, k, v, enc, causal=True)
    with torch.no_grad():
        enc.gamma.fill_(2.0)
    torch.testing.assert_close(relpos.attention(q, k, v, enc, causal=True), 2 * plain)


def test_urpe_bucketed_tables_follow_the_official_buckets():
    torch.manual_seed(0)
    enc = relpos.create("urpe", num_heads=2, head_dim=8, num_buckets=64, max_distance=128)
    assert enc.beta.shape == (65, 2)
    rel, bucket = official_urpe_bucket(256, 64, 128)
    s = zero_scores(enc, 256, 256)
    torch.testing.assert_close(s, enc.beta[bucket].permute(2, 0, 1), rtol=0, atol=0)


def test_urpe_checks_distances_not_absolute_positions():
    enc = relpos.create("urpe", num_heads=4, head_dim=16, max_length=16)
    q, k, v = qkv(lq=16, lk=16)
    pos = torch.arange(5000, 5016)
    out = relpos.attention(q, k, v, enc, q_pos=pos, k_pos=pos, causal=True)
    torch.testing.assert_close(out, relpos.attention(q, k, v, enc, causal=True))
    with pytest.raises(ValueError, match="max_length"):
        relpos.attention(q, k, v, enc, q_pos=pos, k_pos=pos + torch.arange(16), causal=True)
