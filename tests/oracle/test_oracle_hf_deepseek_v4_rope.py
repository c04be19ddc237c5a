"""transformers' DeepSeek-V4 RoPE (``models/deepseek_v4/modeling_deepseek_v4.py``) as oracle.

The model rotates the *last* ``int(head_dim * partial_rotary_factor)`` channels of each head
in interleaved pairs (``apply_rotary_pos_emb``: ``[nope | rope]``), with the ``"main"`` RoPE
(``rope_theta``) on sliding-window layers and the YaRN-scaled ``"compress"`` one
(``compress_rope_theta``) on compressed layers. Its single key-value head is read as both key
and value, and ``DeepseekV4Attention.forward`` rotates the attention output back by the
query's angle (``apply_rotary_pos_emb(out, cos, -sin)``): relpos's ``rove`` (values rotated
with their keys, outputs rotated back) with ``rotary_channels="last"`` and
``layout="interleaved"``.
"""

from __future__ import annotations

import pytest
import torch

import relpos

dsv4 = pytest.importorskip("transformers.models.deepseek_v4.modeling_deepseek_v4")

HEAD, ROPE, HEADS, L = 32, 8, 4, 24


def _config(rope_type: str):
    from transformers import DeepseekV4Config

    scaling = {}
    if rope_type == "yarn":
        scaling = {
            "rope_type": "yarn",
            "factor": 16.0,
            "original_max_position_embeddings": 16,
            "beta_fast": 32,
            "beta_slow": 1,
        }
    return DeepseekV4Config(
        head_dim=HEAD,
        partial_rotary_factor=ROPE / HEAD,
        num_attention_heads=HEADS,
        hidden_size=64,
        max_position_embeddings=256,
        rope_parameters=scaling or None,
    )


def _relpos(name: str, config, layer_type: str) -> relpos.Encoding:
    params = dict(config.rope_parameters[layer_type])
    scaling = None
    if params["rope_type"] != "default":
        scaling = {
            k: v for k, v in params.items() if k not in ("rope_theta", "partial_rotary_factor")
        }
    return relpos.create(
        name,
        num_heads=HEADS,
        head_dim=HEAD,
        base=params["rope_theta"],
        layout="interleaved",
        partial_rotary_factor=params["partial_rotary_factor"],
        rotary_channels="last",
        scaling=scaling,
        max_position_embeddings=config.max_position_embeddings,
    )


def _cos_sin(config, layer_type: str, pos: torch.Tensor):
    rotary = dsv4.DeepseekV4RotaryEmbedding(config)
    x = torch.zeros(1, dtype=torch.float32)
    return rotary(x, pos, layer_type=layer_type)


@pytest.mark.parametrize(("rope_type", "layer_type"), [("default", "main"), ("yarn", "compress")])
def test_query_and_key_rotation_is_transformers(rope_type: str, layer_type: str) -> None:
    config = _config(rope_type)
    pos = torch.tensor([[0, 1, 2, 5, 8, 13, 21, 34, 55, 89, 144, 233]])
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, HEADS, pos.shape[1], HEAD, generator=gen)
    cos, sin = _cos_sin(config, layer_type, pos)
    expected = dsv4.apply_rotary_pos_emb(x, cos, sin)
    enc = _relpos("rope", config, layer_type)
    torch.testing.assert_close(enc.rotate(x, pos, "q"), expected, rtol=0, atol=2e-6)
    torch.testing.assert_close(enc.rotate(x, pos, "k"), expected, rtol=0, atol=2e-6)
    assert torch.equal(expected[..., : HEAD - ROPE], x[..., : HEAD - ROPE])
    # the inverse, on the output: RoVE's "o" rotation
    back = dsv4.apply_rotary_pos_emb(x, cos, -sin)
    rove = _relpos("rove", config, layer_type)
    torch.testing.assert_close(rove.rotate(x, pos, "o"), back, rtol=0, atol=2e-6)


def test_shared_key_value_attention_is_rove() -> None:
    """The attention of ``DeepseekV4Attention`` (sinks and compression aside): q and the
    shared kv rotated, softmax over the rotated keys, the output rotated back at the query
    position; relpos's ``attention`` with ``rove`` on the raw q and kv computes it."""
    config = _config("default")
    pos = torch.arange(L)[None]
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(1, HEADS, L, HEAD, generator=gen)
    kv = torch.randn(1, 1, L, HEAD, generator=gen)
    cos, sin = _cos_sin(config, "main", pos)
    q_rot, kv_rot = dsv4.apply_rotary_pos_emb(q, cos, sin), dsv4.apply_rotary_pos_emb(kv, cos, sin)
    scores = q_rot @ kv_rot.transpose(-1, -2) * HEAD**-0.5
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    weights = scores.masked_fill(~causal, float("-inf")).softmax(-1)
    expected = dsv4.apply_rotary_pos_emb(weights @ kv_rot, cos, -sin)
    enc = _relpos("rove", config, "main")
    ours = relpos.attention(q, kv, kv, enc, q_pos=pos, k_pos=pos, causal=True, backend="eager")
    torch.testing.assert_close(ours, expected, rtol=0, atol=5e-6)
    plain = relpos.attention(q, kv, kv, _relpos("rope", config, "main"), causal=True)
    assert not torch.allclose(plain, expected, atol=1e-3)  # the value rotation matters
