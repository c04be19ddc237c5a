"""``from_hf`` / ``to_hf``: weights both ways between transformers' Llama and ``LlamaLM``,
identical logits; what LlamaLM cannot represent is refused by name."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from hf_tiny import model, tokens  # noqa: E402

from relpos.interop.hf import from_hf, to_hf  # noqa: E402
from relpos.nn import LlamaConfig, LlamaLM  # noqa: E402


def hf_logits(m, ids):
    with torch.no_grad():
        return m(ids).logits


@pytest.mark.parametrize("tied", [False, True])
def test_hf_weights_in_llamalm_give_the_same_logits(tied):
    hf = model("llama", tie_word_embeddings=tied)
    ids = tokens(40, batch=2)
    lm = from_hf(hf)
    assert lm.config.tie_embeddings is tied and lm.config.rope_layout == "half"
    assert (lm.config.num_heads, lm.config.num_kv_heads, lm.config.rms_norm_eps) == (4, 2, 1e-5)
    with torch.no_grad():
        torch.testing.assert_close(lm(ids), hf_logits(hf, ids), atol=1e-6, rtol=0)
    back = to_hf(lm)
    torch.testing.assert_close(hf_logits(back, ids), hf_logits(hf, ids), atol=1e-6, rtol=0)


def test_an_interleaved_llamalm_exports_to_the_same_function():
    """LlamaLM with GGUF's interleaved q/k rows: to_hf permutes them into transformers' half
    layout; from_hf(layout="interleaved") permutes them back."""
    config = LlamaConfig(
        vocab_size=97,
        dim=32,
        depth=2,
        num_heads=4,
        num_kv_heads=2,
        hidden_dim=48,
        rope_base=500.0,
        rope_layout="interleaved",
        max_position_embeddings=64,
        tie_embeddings=False,
    )
    torch.manual_seed(0)
    lm = LlamaLM(config).eval()
    ids = torch.randint(0, 97, (1, 30), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = lm(ids)
    hf = to_hf(lm).eval()
    assert hf.config.rope_parameters["rope_theta"] == 500.0
    torch.testing.assert_close(hf_logits(hf, ids), expected, atol=2e-6, rtol=0)
    again = from_hf(hf, layout="interleaved").eval()
    for key, value in lm.state_dict().items():
        assert torch.equal(again.state_dict()[key], value), key


def test_the_rope_scaling_travels_both_ways():
    scaling = {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 16}
    hf = model("llama", rope_scaling=scaling)
    lm = from_hf(hf)
    assert lm.encoding.scaling["rope_type"] == "yarn" and lm.encoding.scaling["factor"] == 2.0
    ids = tokens(40)
    with torch.no_grad():
        torch.testing.assert_close(lm(ids), hf_logits(hf, ids), atol=1e-5, rtol=0)
    back = to_hf(lm)
    assert back.config.rope_parameters["rope_type"] == "yarn"
    torch.testing.assert_close(hf_logits(back, ids), hf_logits(hf, ids), atol=1e-6, rtol=0)


def test_refuses_what_llamalm_cannot_represent():
    with pytest.raises(ValueError, match="attention_bias|bias"):
        from_hf(model("qwen2"))
    with pytest.raises(ValueError, match="sliding_window=16"):
        from_hf(model("mistral", sliding_window=16))
    with pytest.raises(ValueError, match="partial_rotary_factor"):
        from_hf(model("phi3"))
    with pytest.raises(ValueError, match="head_dim"):
        from_hf(model("llama", head_dim=8))
    lm = from_hf(model("llama"))
    lm.set_encoding("alibi")
    with pytest.raises(ValueError, match="'rope' encoding, got 'alibi'"):
        to_hf(lm)
    with pytest.raises(TypeError, match="LlamaLM"):
        to_hf(model("llama"))
