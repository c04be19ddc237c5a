"""``feature_map=`` in ``relpos.nn`` models: kernelized (linear) attention layers equal the
functional call, and decoding through the recurrent ``LinearState`` equals the full forward."""

from __future__ import annotations

import copy

import pytest
import torch

import relpos
from relpos.attention.linear.feature_maps import PositiveRandomFeatures
from relpos.attention.linear.state import LinearState
from relpos.nn import LayerCache, MultiHeadAttention, TransformerLM


def _mha(encoding, feature_map, **kw) -> MultiHeadAttention:
    torch.manual_seed(0)
    return MultiHeadAttention(16, 4, encoding, feature_map=feature_map, **kw).double()


@pytest.mark.parametrize(
    "encoding,feature_map", [("rope", "elu1"), ("alibi", "relu"), (None, "prf")]
)
def test_layer_forward_equals_the_functional_kernelized_call(encoding, feature_map):
    layer = _mha(encoding, feature_map, num_kv_heads=2)
    x = torch.randn(2, 9, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    out = layer(x)
    q = layer.q_proj(x).view(2, 9, 4, 4).transpose(1, 2)
    k, v = (t.view(2, 9, 2, 4).transpose(1, 2) for t in layer.kv_proj(x).chunk(2, dim=-1))
    ref = relpos.attention(
        q, k, v, layer.encoding, causal=True, feature_map=layer.feature_map, backend="linear"
    )
    want = layer.out_proj(ref.transpose(1, 2).reshape(2, 9, 16))
    torch.testing.assert_close(out, want, atol=1e-12, rtol=1e-12)
    softmax = copy.deepcopy(layer)  # the same weights without the feature map
    softmax.feature_map = None
    assert not torch.allclose(softmax(x), out)


def test_a_named_feature_map_is_owned_by_the_layer_and_saved():
    layer = MultiHeadAttention(16, 4, "rope", feature_map="prf", feature_map_options={"seed": 3})
    assert isinstance(layer.feature_map, PositiveRandomFeatures)
    assert "feature_map.projection" in layer.state_dict()
    with pytest.raises(ValueError, match="feature_map_options"):
        MultiHeadAttention(16, 4, "rope", feature_map_options={"seed": 3})
    with pytest.raises(ValueError, match="feature_map"):
        MultiHeadAttention(16, 4, "rope", feature_map="softmax")


@pytest.mark.parametrize(
    "encoding,state",
    [("rope", LinearState), ("alibi", LinearState), ("nope", LinearState), ("t5", LayerCache)],
)
def test_new_cache_is_the_recurrent_state_where_the_call_has_one(encoding, state):
    layer = MultiHeadAttention(16, 4, encoding, feature_map="elu1")
    assert isinstance(layer.new_cache(), state)
    assert isinstance(MultiHeadAttention(16, 4, encoding).new_cache(), LayerCache)


@pytest.mark.parametrize("encoding", ["rope", "alibi", "t5"])
def test_language_model_decoding_equals_the_full_forward(encoding):
    torch.manual_seed(0)
    model = TransformerLM(50, dim=16, depth=2, num_heads=2, encoding=encoding, feature_map="elu1")
    model = model.double().eval()
    tokens = torch.randint(0, 50, (2, 11), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = model(tokens)
        cache = model.new_cache()
        want = LayerCache if encoding == "t5" else LinearState
        assert all(isinstance(layer, want) for layer in cache.layers)
        parts = [model(tokens[:, :4], cache=cache)]
        parts += [model(tokens[:, t : t + 1], cache=cache) for t in range(4, 11)]
    assert cache.length == 11
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-10, rtol=1e-10)


def test_language_model_with_a_feature_map_instance_gives_each_layer_its_own_copy():
    fmap = PositiveRandomFeatures(8, 8, seed=1)
    model = TransformerLM(50, dim=16, depth=2, num_heads=2, encoding="rope", feature_map=fmap)
    maps = [block.attn.feature_map for block in model.blocks]
    assert maps[0] is fmap and maps[1] is not fmap
    torch.testing.assert_close(maps[1].projection, fmap.projection)
    tokens = torch.randint(0, 50, (1, 6), generator=torch.Generator().manual_seed(0))
    logits = model(tokens)
    logits.sum().backward()
    assert logits.shape == (1, 6, 50) and torch.isfinite(logits).all()
    assert model.blocks[0].attn.q_proj.weight.grad.abs().sum() > 0
    generated = model.generate(tokens, 3)
    assert generated.shape == (1, 9)


def test_a_layer_with_qkv_convolutions_decodes_through_a_layer_cache():
    """The convolution state lives in a LayerCache, so such a layer never gets a LinearState."""
    torch.manual_seed(0)
    model = TransformerLM(
        50, dim=16, depth=1, num_heads=2, encoding="rope", feature_map="elu1", qkv_conv=3
    ).double()
    tokens = torch.randint(0, 50, (1, 7), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = model(tokens)
        cache = model.new_cache()
        assert isinstance(cache.layers[0], LayerCache)
        parts = [model(tokens[:, t : t + 1], cache=cache) for t in range(7)]
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-10, rtol=1e-10)
    with pytest.raises(ValueError, match="qkv_conv"):
        model.blocks[0].attn(torch.zeros(1, 1, 16, dtype=torch.float64), cache=LinearState())
