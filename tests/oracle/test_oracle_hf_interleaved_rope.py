"""Per-model interleaved RoPE of transformers: GLM (interleaved pairs on the first half of
the head) and Cohere (interleaved pairs over the whole head) equal relpos's ``rope`` with
``layout="interleaved"`` (and ``partial_rotary_factor=0.5`` for GLM). The oracle is each
model's own rotary module and ``apply_rotary_pos_emb`` (``models/glm/modeling_glm.py``,
``models/cohere/modeling_cohere.py``)."""

from __future__ import annotations

import importlib

import pytest
import torch

import relpos

tf = pytest.importorskip("transformers")


@pytest.mark.parametrize(
    ("family", "config_name", "partial"),
    [("glm", "GlmConfig", 0.5), ("cohere", "CohereConfig", 1.0)],
)
def test_interleaved_rope_matches_the_models_own_functions(family, config_name, partial):
    mod = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    head_dim = 32
    kwargs = {"partial_rotary_factor": partial} if family == "glm" else {}
    config = getattr(tf, config_name)(
        hidden_size=2 * head_dim,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=head_dim,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        **kwargs,
    )
    rotary = next(getattr(mod, n) for n in dir(mod) if n.endswith("RotaryEmbedding"))(config)
    torch.manual_seed(0)
    q, k = torch.randn(2, 2, 2, 12, head_dim).unbind(0)
    pos = torch.tensor([[0, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144]])
    cos, sin = rotary(q, pos)
    hf_q, hf_k = mod.apply_rotary_pos_emb(q, k, cos, sin)
    enc = relpos.create(
        "rope", num_heads=2, head_dim=head_dim, layout="interleaved", partial_rotary_factor=partial
    )
    torch.testing.assert_close(enc.rotate(q, pos, "q"), hf_q, atol=2e-6, rtol=0)
    torch.testing.assert_close(enc.rotate(k, pos, "k"), hf_k, atol=2e-6, rtol=0)
    half = relpos.create("rope", num_heads=2, head_dim=head_dim, partial_rotary_factor=partial)
    assert not torch.allclose(half.rotate(q, pos, "q"), hf_q, atol=1e-3)
