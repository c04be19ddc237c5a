"""``from_hf`` on transformers families beyond Llama (tiny random configs of
``hf_families.tiny_config``): models whose q/k pairs are interleaved (Helium, Ernie 4.5) are
copied exactly into ``LlamaLM`` in either layout; Ministral 3's attention temperature
(``llama_4_scaling_beta``) becomes ``LlamaLM``'s query temperature, exact in a full forward and
in cached decoding at positions across its steps; what ``LlamaLM`` cannot compute (Cohere's
logit scale and parallel block, GLM's biases, Granite's multipliers, anything only a forward
shows) is refused by name."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

import hf_families  # noqa: E402
from hf_tiny import model as tiny_model  # noqa: E402

from relpos.interop.hf import from_hf, inspect_model, to_hf  # noqa: E402


def _tiny(model_type: str):
    for family in hf_families.families():
        if family[0] == model_type:
            return hf_families.build(*family)
    pytest.skip(f"transformers has no {model_type} causal LM")


def _ids() -> torch.Tensor:
    return torch.randint(3, 128, (2, 12), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("model_type", ["helium", "ernie4_5"])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_an_interleaved_model_is_copied_exactly(model_type, layout):
    hf = _tiny(model_type)
    assert {layer.layout for layer in inspect_model(hf, probe=True).layers} == {"interleaved"}
    lm = from_hf(hf, layout=layout).eval()
    ids = _ids()
    with torch.no_grad():
        ref = hf(ids).logits
        out = lm(ids)
    assert float((out - ref).abs().max() / ref.abs().max()) <= 1e-5


def _ministral3_decode(model, ids, pos, start: int, cache) -> torch.Tensor:
    """Logits of a prefill of ``start`` tokens, then of one token at a time with ``cache``."""
    steps = [model(ids[:, :start], pos[:, :start], cache=cache)]
    steps += [model(ids[:, t : t + 1], pos[:, t : t + 1], cache=cache) for t in range(start, 12)]
    return torch.cat(steps, 1)


def test_ministral3s_attention_temperature_is_copied_exactly():
    """Ministral 3 (YaRN, ``llama_4_scaling_beta`` 0.1 over steps of
    ``original_max_position_embeddings`` 16384): rows at positions across the first step and
    the fifth, full forward and cached decoding, against transformers' own."""
    from transformers import DynamicCache

    hf = _tiny("ministral3")
    params = hf.config.rope_parameters
    assert params["llama_4_scaling_beta"] == 0.1
    step = params["original_max_position_embeddings"]
    lm = from_hf(hf).eval()
    assert (lm.config.query_temperature_beta, lm.config.query_temperature_length) == (0.1, step)
    ids = _ids()
    pos = torch.stack([torch.arange(12) + step - 6, torch.arange(12) + 5 * step - 3])
    with torch.no_grad():
        ref = hf(ids, position_ids=pos).logits
        out = lm(ids, pos=pos)
        cache = DynamicCache(config=hf.config)
        ref_steps = torch.cat(
            [hf(ids[:, :5], position_ids=pos[:, :5], cache=cache, use_cache=True).logits]
            + [
                hf(ids[:, t : t + 1], position_ids=pos[:, t : t + 1], cache=cache).logits
                for t in range(5, 12)
            ],
            1,
        )
        steps = _ministral3_decode(lm, ids, pos, 5, lm.new_cache())
        params["llama_4_scaling_beta"] = 0.0  # the model without its temperature
        cold = hf(ids, position_ids=pos).logits
    scale = float(ref.abs().max())
    assert float((cold - ref).abs().max()) / scale > 1e-3  # the temperature shows
    assert float((out - ref).abs().max()) / scale <= 1e-5
    assert float((steps - ref_steps).abs().max()) / scale <= 1e-5
    with pytest.raises(ValueError, match="to_hf: the model has a query temperature"):
        to_hf(lm)  # LlamaForCausalLM has none


def test_a_temperature_key_the_model_does_not_apply_is_refused_by_the_check():
    """Llama ignores ``llama_4_scaling_beta`` in its dict; the copy would apply it, and the
    logits check at positions across the temperature's steps shows the difference."""
    params = {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0,
              "original_max_position_embeddings": 32, "llama_4_scaling_beta": 0.5}  # fmt: skip
    hf = tiny_model("llama", rope_parameters=params)
    with pytest.raises(ValueError, match="logits differ by"):
        from_hf(hf)


@pytest.mark.parametrize(
    ("model_type", "reason"),
    [
        ("cohere", "logit_scale=0.0625"),  # interleaved, parallel block, LayerNorm
        ("glm", "attention_bias=True"),  # interleaved pairs in half the head
        ("granite", "attention_multiplier"),
        ("gemma4_text", "sliding_window"),  # a per-layer head_dim must not raise raw
    ],
)
def test_what_llama_lm_cannot_compute_is_refused_by_name(model_type, reason):
    with pytest.raises(ValueError, match=rf"from_hf: {model_type} .*{reason}"):
        from_hf(_tiny(model_type))


def test_granites_multipliers_are_refused_even_at_the_llama_scale():
    hf = _tiny("granite")
    hf.config.attention_multiplier = hf.config.head_dim**-0.5
    hf.config.embedding_multiplier = 12.0
    with pytest.raises(ValueError, match="embedding_multiplier=12.0"):
        from_hf(hf)


def test_the_logits_check_refuses_what_only_a_forward_shows():
    """A Llama whose embeddings are doubled by a hook has Llama's tensors and config; only
    running it shows the difference."""
    hf = tiny_model("llama")
    hf.model.embed_tokens.register_forward_hook(lambda m, a, out: 2 * out)
    with pytest.raises(ValueError, match="logits differ by"):
        from_hf(hf)
    lm = from_hf(hf, check=False)  # the copy, unchecked, on the caller's word
    assert lm.config.depth == hf.config.num_hidden_layers
