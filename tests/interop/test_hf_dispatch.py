"""The patch runs a model exactly when its RoPE reaches attention only through transformers'
attention interface, read from what the model's layers do (``relpos.interop.hf.dispatch``),
not from transformers' ``_supports_attention_backend`` flag; it refuses, naming the layer,
where a layer computes attention itself."""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("transformers")

import hf_families  # noqa: E402
from hf_tiny import model, tokens  # noqa: E402

from relpos.interop.hf import inspect_model, patch  # noqa: E402


def _tiny(model_type: str):
    import transformers

    class_name = dict(hf_families.families())[model_type]
    torch.manual_seed(0)
    hf = getattr(transformers, class_name)(hf_families.tiny_config(model_type)).float().eval()
    hf.generation_config.pad_token_id = 0
    return hf


def _rope_and_self_extend(hf) -> None:
    """``rope`` equals the unpatched model (full forward and cached decoding) and
    ``self-extend`` decoding equals its own full forward, on a left-padded batch."""
    batch, mask, pos = hf_families._inputs()
    ref, ref_steps = hf_families._forward_and_decode(hf, batch, mask, pos)
    with patch(hf, "rope", backend="eager"):
        out, steps = hf_families._forward_and_decode(hf, batch, mask, pos)
    err = max(hf_families._relative(out, ref), hf_families._relative(steps, ref_steps))
    assert err <= hf_families.RTOL, err
    with patch(hf, "self-extend", **hf_families.SELF_EXTEND):
        full, steps = hf_families._forward_and_decode(hf, batch, mask, pos)
    tail = full[:, hf_families.LENGTH - hf_families.STEPS :]
    assert hf_families._relative(steps, tail) <= hf_families.RTOL


def test_stablelm_dispatches_through_the_interface_although_its_flag_says_not():
    """StableLM's ``_supports_attention_backend`` is False, yet its attention calls the
    interface: the patch runs it exactly (partial rotary, a quarter of each head)."""
    hf = _tiny("stablelm")
    assert type(hf)._supports_attention_backend is False
    _rope_and_self_extend(hf)


@pytest.mark.slow  # the reference (PyTorch) gated-delta-rule kernels
def test_a_hybrid_with_linear_attention_layers_is_exact_with_its_kv_cache():
    """Qwen3-Next: gated-DeltaNet layers beside full-attention layers, whose attention calls
    the interface (its flag is False too). The linear layers' cache layers (convolution and
    recurrent state, no keys) do not make the patch refuse."""
    from transformers import DynamicCache
    from transformers.cache_utils import LinearAttentionLayer

    hf = _tiny("qwen3_next")
    assert type(hf)._supports_attention_backend is False
    kinds = {type(layer) for layer in DynamicCache(config=hf.config).layers}
    assert LinearAttentionLayer in kinds and len(kinds) == 2  # and the attention layers' own
    _rope_and_self_extend(hf)


def test_gpt_neox_japanese_computes_attention_itself_and_is_refused_by_layer():
    hf = _tiny("gpt_neox_japanese")
    reason = (
        r"gpt_neox_japanese\.layers\.0\.attention \(GPTNeoXJapaneseAttention\) .* uses its "
        r"RoPE outside transformers' attention interface"
    )
    for method in ("baseline", "rope"):
        with pytest.raises(ValueError, match=reason):
            patch(hf, method)


def test_a_layer_that_leaves_the_interface_is_named_although_the_flag_says_it_dispatches():
    """Llama declares the interface; its layer 1 given a config of its own that says
    ``eager`` calls transformers' eager function directly, past any registered function:
    the check names that layer, and an untouched Llama passes it."""
    hf = model("llama")
    inspect_model(hf)  # passes
    attention = hf.model.layers[1].self_attn
    attention.config = copy.copy(attention.config)
    attention.config._attn_implementation = "eager"
    with torch.no_grad():
        ref = hf(tokens(8)).logits
    with pytest.raises(ValueError, match=r"model\.layers\.1\.self_attn \(LlamaAttention\)"):
        patch(hf, "rope")
    with torch.no_grad():  # the refusal left the model as it was
        torch.testing.assert_close(hf(tokens(8)).logits, ref, rtol=0, atol=0)
