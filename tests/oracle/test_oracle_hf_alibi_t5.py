"""relpos ALiBi and T5 buckets against Hugging Face ``transformers`` (Bloom, T5) as oracles.

* Bloom stores the ALiBi bias as ``m_h * j`` (key index only), which equals ``-m_h (i - j)`` up to a
  per-row constant, so the two agree through softmax under a causal mask.
* T5: ``T5Attention._relative_position_bucket`` and ``compute_bias`` (an ``nn.Embedding(
  num_buckets, H)`` table, the same layout as relpos' ``table``).
"""

from __future__ import annotations

import math

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers import T5Config  # noqa: E402
from transformers.models.bloom.modeling_bloom import build_alibi_tensor  # noqa: E402
from transformers.models.t5.modeling_t5 import T5Attention  # noqa: E402

import relpos  # noqa: E402
from relpos.functional import alibi_slopes, t5_bucket  # noqa: E402

ALIBI_HEADS = [1, 2, 3, 4, 6, 8, 12, 16, 20, 32]


def _bloom_alibi(attention_mask: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Bloom's bias as (B, H, 1, L)."""
    B, L = attention_mask.shape
    return build_alibi_tensor(attention_mask, num_heads, torch.float32).reshape(B, num_heads, 1, L)


@pytest.mark.parametrize("num_heads", ALIBI_HEADS)
def test_alibi_slopes_equal_the_slopes_inside_bloom_alibi_tensor(num_heads: int) -> None:
    # Bloom's bias at key index j = 1 is the slope itself.
    bloom = _bloom_alibi(torch.ones(1, 4, dtype=torch.long), num_heads)
    torch.testing.assert_close(alibi_slopes(num_heads), bloom[0, :, 0, 1], rtol=1e-6, atol=0.0)


@pytest.mark.parametrize("num_heads", ALIBI_HEADS)
def test_alibi_causal_softmax_equals_bloom_key_index_form(num_heads: int) -> None:
    torch.manual_seed(num_heads)
    B, L, D = 2, 33, 16
    q = torch.randn(B, num_heads, L, D)
    k = torch.randn(B, num_heads, L, D)
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    bloom = _bloom_alibi(torch.ones(B, L, dtype=torch.long), num_heads)
    hf_logits = q @ k.transpose(-1, -2) / math.sqrt(D) + bloom
    hf_probs = hf_logits.masked_fill(~causal, float("-inf")).softmax(-1)
    enc = relpos.create("alibi", num_heads=num_heads, head_dim=D)
    logits = relpos.scores(q, k, enc)
    probs = logits.masked_fill(~causal, float("-inf")).softmax(-1)
    torch.testing.assert_close(probs, hf_probs, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("num_heads", [3, 8])
def test_alibi_attention_output_equals_bloom_style_attention(num_heads: int) -> None:
    torch.manual_seed(0)
    B, L, D = 1, 20, 8
    q, k, v = (torch.randn(B, num_heads, L, D) for _ in range(3))
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    bloom = _bloom_alibi(torch.ones(B, L, dtype=torch.long), num_heads)
    logits = (q @ k.transpose(-1, -2) / math.sqrt(D) + bloom).masked_fill(~causal, float("-inf"))
    expected = logits.softmax(-1) @ v
    enc = relpos.create("alibi", num_heads=num_heads, head_dim=D)
    got = relpos.attention(q, k, v, enc, causal=True, backend="eager")
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_alibi_with_left_padding_matches_bloom_through_position_ids() -> None:
    # Bloom's key index is (cumsum(mask) - 1) * mask; relpos takes it as positions.
    torch.manual_seed(0)
    H, L, D = 4, 12, 8
    attention_mask = torch.ones(2, L, dtype=torch.long)
    attention_mask[1, :5] = 0
    pos = (attention_mask.cumsum(-1) - 1) * attention_mask
    q = torch.randn(2, H, L, D)
    k = torch.randn(2, H, L, D)
    allowed = (
        torch.ones(L, L, dtype=torch.bool).tril()[None, None]
        & attention_mask.bool()[:, None, None, :]
    )
    bloom = _bloom_alibi(attention_mask, H)
    hf = (q @ k.transpose(-1, -2) / math.sqrt(D) + bloom).masked_fill(~allowed, float("-inf"))
    enc = relpos.create("alibi", num_heads=H, head_dim=D)
    ours = relpos.scores(q, k, enc, q_pos=pos, k_pos=pos).masked_fill(~allowed, float("-inf"))
    real_rows = attention_mask.bool()  # padded query rows are fully masked in both
    for b in range(2):
        torch.testing.assert_close(
            ours[b][:, real_rows[b]].softmax(-1),
            hf[b][:, real_rows[b]].softmax(-1),
            rtol=1e-5,
            atol=1e-6,
        )


# ---------------------------------------------------------------------------- T5

RP = torch.arange(-2000, 2001)
T5_CONFIGS = [(nb, md) for nb in (16, 32, 64) for md in (64, 128, 256)]


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize(("num_buckets", "max_distance"), T5_CONFIGS)
def test_t5_bucket_equals_hf_relative_position_bucket(
    bidirectional: bool, num_buckets: int, max_distance: int
) -> None:
    expected = T5Attention._relative_position_bucket(
        RP, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
    )
    got = t5_bucket(
        RP, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
    )
    assert got.dtype == expected.dtype
    mismatch = (got != expected).nonzero().flatten()
    assert mismatch.numel() == 0, [
        (RP[i].item(), got[i].item(), expected[i].item()) for i in mismatch[:10]
    ]


def _hf_t5_attention(
    num_heads: int, d_kv: int, num_buckets: int, max_distance: int, is_decoder: bool
) -> T5Attention:
    config = T5Config(
        d_model=num_heads * d_kv,
        d_kv=d_kv,
        num_heads=num_heads,
        relative_attention_num_buckets=num_buckets,
        relative_attention_max_distance=max_distance,
        is_decoder=is_decoder,
    )
    attn = T5Attention(config, has_relative_attention_bias=True, layer_idx=0)
    torch.nn.init.normal_(attn.relative_attention_bias.weight)
    return attn


@pytest.mark.parametrize("is_decoder", [False, True])
@pytest.mark.parametrize(("num_buckets", "max_distance"), [(32, 128), (16, 64)])
@pytest.mark.parametrize(
    ("q_len", "k_len", "past"), [(7, 7, 0), (40, 300, 0), (1, 300, 299), (3, 200, 197)]
)
def test_t5_bias_equals_hf_compute_bias_with_the_same_table(
    is_decoder: bool, num_buckets: int, max_distance: int, q_len: int, k_len: int, past: int
) -> None:
    torch.manual_seed(0)
    H, D = 4, 8
    attn = _hf_t5_attention(H, D, num_buckets, max_distance, is_decoder)
    with torch.no_grad():
        expected = attn.compute_bias(q_len, k_len, past_seen_tokens=past)  # (1, H, q, k)
    enc = relpos.create(
        "t5",
        num_heads=H,
        head_dim=D,
        bidirectional=not is_decoder,
        num_buckets=num_buckets,
        max_distance=max_distance,
    )
    assert enc.table.shape == attn.relative_attention_bias.weight.shape
    with torch.no_grad():
        enc.table.copy_(attn.relative_attention_bias.weight)
        q = torch.zeros(1, H, q_len, D)
        k = torch.zeros(1, H, k_len, D)
        got = relpos.scores(
            q, k, enc, q_pos=torch.arange(past, past + q_len), k_pos=torch.arange(k_len)
        )
    torch.testing.assert_close(got, expected, rtol=0.0, atol=0.0)
