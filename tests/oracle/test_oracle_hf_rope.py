"""relpos RoPE against Hugging Face ``transformers`` (Llama and GPT-NeoX) as an oracle.

The HF functions are imported, never copied: ``LlamaRotaryEmbedding`` builds cos/sin as
``emb = cat(freqs, freqs)``, ``apply_rotary_pos_emb`` rotates with ``rotate_half``.
"""

from __future__ import annotations

import math

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers import GPTNeoXConfig, LlamaConfig  # noqa: E402
from transformers.models.gpt_neox.modeling_gpt_neox import (  # noqa: E402
    GPTNeoXRotaryEmbedding,
)
from transformers.models.gpt_neox.modeling_gpt_neox import (  # noqa: E402
    apply_rotary_pos_emb as neox_apply_rotary_pos_emb,
)
from transformers.models.llama.modeling_llama import (  # noqa: E402
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
    rotate_half,
)

import relpos  # noqa: E402
from relpos.functional import rope_frequencies  # noqa: E402


def _llama_rope(num_heads: int, head_dim: int, base: float) -> LlamaRotaryEmbedding:
    config = LlamaConfig(
        hidden_size=num_heads * head_dim,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        head_dim=head_dim,
        rope_theta=base,
        max_position_embeddings=4096,
    )
    return LlamaRotaryEmbedding(config)


def _hf_rotate(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, base: float = 10000.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """HF Llama: q, k (B, H, L, D), positions (B, L) -> rotated q, k."""
    rope = _llama_rope(q.shape[1], q.shape[-1], base)
    cos, sin = rope(q, positions)  # (B, L, D) with emb = cat(freqs, freqs)
    return apply_rotary_pos_emb(q, k, cos, sin)


def test_hf_rotate_half_is_the_half_layout_pairing() -> None:
    # Sanity of the oracle itself: rotate_half(x) = cat(-x[d/2:], x[:d/2]).
    x = torch.arange(8.0)
    assert rotate_half(x).tolist() == [-4.0, -5.0, -6.0, -7.0, 0.0, 1.0, 2.0, 3.0]


@pytest.mark.parametrize("head_dim", [8, 64, 128])
@pytest.mark.parametrize("base", [10000.0, 500000.0])
def test_rope_frequencies_are_bit_identical_to_hf_default(head_dim: int, base: float) -> None:
    hf = _llama_rope(2, head_dim, base)
    inv_freq, factor = rope_frequencies(head_dim, base)
    assert torch.equal(inv_freq, hf.inv_freq)
    assert factor == hf.attention_scaling == 1.0


@pytest.mark.parametrize("head_dim", [8, 32, 64, 128])
@pytest.mark.parametrize("offset", [0, 37, 4000])
def test_rope_half_layout_rotation_matches_hf_llama(head_dim: int, offset: int) -> None:
    torch.manual_seed(head_dim + offset)
    B, H, L = 2, 3, 11
    q = torch.randn(B, H, L, head_dim)
    k = torch.randn(B, H, L, head_dim)
    positions = torch.arange(offset, offset + L)[None].expand(B, L)
    q_hf, k_hf = _hf_rotate(q, k, positions)
    enc = relpos.create("rope", num_heads=H, head_dim=head_dim, layout="half")
    torch.testing.assert_close(enc.rotate(q, positions, "q"), q_hf, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(enc.rotate(k, positions, "k"), k_hf, rtol=1e-5, atol=1e-6)


def test_rope_rotation_matches_hf_with_per_batch_positions() -> None:
    torch.manual_seed(0)
    B, H, L, D = 3, 2, 7, 16
    q = torch.randn(B, H, L, D)
    k = torch.randn(B, H, L, D)
    positions = torch.stack([torch.arange(L), torch.arange(100, 100 + L), torch.arange(L) * 3])
    q_hf, k_hf = _hf_rotate(q, k, positions)
    enc = relpos.create("rope", num_heads=H, head_dim=D)
    torch.testing.assert_close(enc.rotate(q, positions, "q"), q_hf, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(enc.rotate(k, positions, "k"), k_hf, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rope_rotation_in_low_precision_matches_hf_which_casts_cos_sin_to_x_dtype(
    dtype: torch.dtype,
) -> None:
    torch.manual_seed(0)
    B, H, L, D = 1, 2, 9, 64
    q = torch.randn(B, H, L, D).to(dtype)
    k = torch.randn(B, H, L, D).to(dtype)
    positions = torch.arange(1000, 1000 + L)[None]
    q_hf, k_hf = _hf_rotate(q, k, positions)
    enc = relpos.create("rope", num_heads=H, head_dim=D)
    got = enc.rotate(q, positions, "q")
    assert got.dtype == dtype
    torch.testing.assert_close(got, q_hf)
    torch.testing.assert_close(enc.rotate(k, positions, "k"), k_hf)


@pytest.mark.parametrize(("q_len", "past"), [(1, 0), (1, 63), (5, 40), (12, 0)])
def test_rope_scores_with_kv_cache_offset_match_hf_logits(q_len: int, past: int) -> None:
    # HF decodes with cache_position = arange(past, past + q_len); relpos.scores defaults query
    # positions to the last q_len key positions, and must agree with both forms.
    torch.manual_seed(q_len + past)
    H, D = 4, 32
    k_len = past + q_len
    q = torch.randn(1, H, q_len, D)
    k = torch.randn(1, H, k_len, D)
    rope = _llama_rope(H, D, 10000.0)
    cos_q, sin_q = rope(q, torch.arange(past, k_len)[None])
    cos_k, sin_k = rope(k, torch.arange(k_len)[None])
    q_hf, _ = apply_rotary_pos_emb(q, q, cos_q, sin_q)
    _, k_hf = apply_rotary_pos_emb(k, k, cos_k, sin_k)
    expected = q_hf @ k_hf.transpose(-1, -2) / math.sqrt(D)
    enc = relpos.create("rope", num_heads=H, head_dim=D)
    by_default = relpos.scores(q, k, enc)
    explicit = relpos.scores(q, k, enc, q_pos=torch.arange(past, k_len), k_pos=torch.arange(k_len))
    torch.testing.assert_close(by_default, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(explicit, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("hidden", "heads", "rotary_pct"), [(256, 4, 0.25), (512, 8, 0.5), (320, 4, 0.25)]
)
@pytest.mark.parametrize("offset", [0, 250])
def test_partial_rotary_matches_hf_gpt_neox(
    hidden: int, heads: int, rotary_pct: float, offset: int
) -> None:
    torch.manual_seed(offset + heads)
    head_dim = hidden // heads
    config = GPTNeoXConfig(hidden_size=hidden, num_attention_heads=heads, rotary_pct=rotary_pct)
    hf_rope = GPTNeoXRotaryEmbedding(config)
    B, L = 2, 10
    q = torch.randn(B, heads, L, head_dim)
    k = torch.randn(B, heads, L, head_dim)
    positions = torch.arange(offset, offset + L)[None].expand(B, L)
    cos, sin = hf_rope(q, positions)  # (B, L, rotary_dim)
    q_hf, k_hf = neox_apply_rotary_pos_emb(q, k, cos, sin)
    enc = relpos.create(
        "rope", num_heads=heads, head_dim=head_dim, partial_rotary_factor=rotary_pct
    )
    assert enc.rotary_dim == cos.shape[-1]
    assert torch.equal(enc.inv_freq, hf_rope.inv_freq)
    torch.testing.assert_close(enc.rotate(q, positions, "q"), q_hf, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(enc.rotate(k, positions, "k"), k_hf, rtol=1e-5, atol=1e-6)
