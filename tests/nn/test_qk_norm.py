"""``qk_norm="rms"`` (TRA's layer, the authors' notebook: RMSNorm of q and k per head, eps
1e-6, no affine weight): what it computes, that it is off by default, that it has no
parameters (same state dict), that decoding with a cache equals the full forward, and that a
bad value is refused by name."""

from __future__ import annotations

import math

import pytest
import torch

import relpos
from relpos.nn import MultiHeadAttention, TransformerLM
from relpos.nn.attention import rms_normalize


def test_queries_and_keys_are_rms_normalised_per_head_before_the_encoding():
    torch.manual_seed(0)
    layer = MultiHeadAttention(16, 2, "tra", qk_norm="rms")
    x = torch.randn(2, 5, 16)
    q, k, v = layer.project(x)
    raw = MultiHeadAttention(16, 2, "tra")
    raw.load_state_dict(layer.state_dict())
    q0, k0, v0 = raw.project(x)
    torch.testing.assert_close(q, q0 / torch.sqrt(q0.pow(2).mean(-1, keepdim=True) + 1e-6))
    torch.testing.assert_close(k, k0 / torch.sqrt(k0.pow(2).mean(-1, keepdim=True) + 1e-6))
    torch.testing.assert_close(v, v0)  # values are not normalised
    assert torch.allclose(q.pow(2).mean(-1), torch.ones(2, 2, 5), atol=1e-4)
    # the forward attends with the normalised q and k
    out = relpos.attention(q, k, v, layer.encoding, causal=True,
                           inputs={"layer_input": x})  # fmt: skip
    expected = layer.out_proj(out.transpose(1, 2).reshape(2, 5, 16))
    torch.testing.assert_close(layer(x), expected)


def test_off_by_default_and_the_state_dict_is_the_same_either_way():
    torch.manual_seed(0)
    off = TransformerLM(256, 16, 2, 2, encoding="rope")
    torch.manual_seed(0)
    on = TransformerLM(256, 16, 2, 2, encoding="rope", qk_norm="rms")
    assert off.blocks[0].attn.qk_norm is None and on.blocks[0].attn.qk_norm == "rms"
    assert off.state_dict().keys() == on.state_dict().keys()
    on.load_state_dict(off.state_dict())
    tokens = torch.randint(0, 256, (1, 9))
    assert not torch.allclose(on(tokens), off(tokens))


def test_decoding_with_a_cache_equals_the_full_forward():
    torch.manual_seed(1)
    model = TransformerLM(256, 16, 2, 2, encoding="rope", qk_norm="rms").eval()
    tokens = torch.randint(0, 256, (2, 10))
    with torch.no_grad():
        full = model(tokens)
        cache = model.new_cache()
        steps = [model(tokens[:, :6], cache=cache)]
        steps += [model(tokens[:, t : t + 1], cache=cache) for t in range(6, 10)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)


def test_half_precision_is_normalised_in_float32_and_float64_stays_float64():
    x = torch.randn(3, 8, dtype=torch.float64) * 1e3
    y = rms_normalize(x)
    assert y.dtype == torch.float64
    torch.testing.assert_close(y.pow(2).mean(-1), torch.ones(3, dtype=torch.float64))
    h = rms_normalize(torch.full((2, 4), 300.0, dtype=torch.float16))  # 300^2 overflows fp16
    assert h.dtype == torch.float16 and torch.allclose(h.float(), torch.ones(2, 4), atol=1e-3)
    assert math.isfinite(float(h.float().sum()))


def test_an_unknown_norm_is_refused_by_name():
    with pytest.raises(ValueError, match="qk_norm must be None or 'rms'"):
        MultiHeadAttention(16, 2, "rope", qk_norm="layer")
    with pytest.raises(ValueError, match="qk_norm"):
        TransformerLM(256, 16, 1, 2, qk_norm=True)
