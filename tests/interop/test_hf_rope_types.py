"""RoPE conventions keyed by layer type: layer types configured without RoPE (Beam, Ergo:
``rope_parameters[type] = None``; LFM-3's convolution layers: no entry) and p-RoPE (HF
``"proportional"``, Gemma-4 and LFM-3's global layers: the trailing frequency pairs of the
whole head are 0) are read by the probe from the model's own code and reproduced exactly,
or refused by name."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

import hf_families  # noqa: E402

from relpos.interop.hf import inspect_model, patch  # noqa: E402


def _family(model_type: str) -> tuple[str, str]:
    for family in hf_families.families():
        if family[0] == model_type:
            return family
    pytest.skip(f"transformers has no {model_type} causal LM")


def _tiny(model_type: str):
    return hf_families.build(*_family(model_type))


@pytest.mark.slow  # each family: build, probe, three patched forwards with decoding
@pytest.mark.parametrize("model_type", ["beam", "ergo", "gemma4_text", "gemma4_unified_text"])
def test_layer_typed_rope_families_are_exact(model_type):
    outcome = hf_families.check_family(*_family(model_type))
    assert outcome.status == "exact", outcome


@pytest.mark.parametrize(
    ("model_type", "layout"),
    [("beam", "half"), ("ergo", "interleaved")],  # Ergo's rotate_half pairs (2i, 2i + 1)
)
def test_a_layer_type_configured_without_rope_is_a_nope_layer(model_type, layout):
    hf = _tiny(model_type)
    assert hf.config.rope_parameters["full_attention"] is None
    facts = inspect_model(hf, probe=True)
    assert facts.per_layer_type and set(facts.rope) == {"sliding_attention"}
    for layer_type, layer in zip(facts.layer_types, facts.layers, strict=True):
        if layer_type == "full_attention":
            assert layer is None
        else:
            assert (layer.layout, layer.rotary_dim, layer.permutation) == (layout, 16, None)
    assert "full_attention" in facts.layer_types


def test_proportional_rope_is_relpos_rope_with_zero_trailing_frequencies():
    """Gemma-4's global layers: ``partial_rotary_factor=0.25`` of a 16-channel head, the
    frequencies ``1e6^(-2i/16)`` of pairs ``(i, i + 8)`` for ``i < 2`` and 0 for the rest:
    relpos's ``half`` layout over the whole head, no channel permutation."""
    hf = _tiny("gemma4_text")
    facts = inspect_model(hf, probe=True)
    assert facts.rope["full_attention"].scaling == {"rope_type": "proportional"}
    full = [
        layer
        for t, layer in zip(facts.layer_types, facts.layers, strict=True)
        if t == "full_attention"
    ]
    assert full and all(
        (layer.layout, layer.rotary_dim, layer.head_dim, layer.permutation) == ("half", 4, 16, None)
        for layer in full
    )
    with patch(hf, "rope", backend="eager") as handle:
        enc = handle.encoding(facts.layer_types.index("full_attention"))
        expected = 1.0 / 1e6 ** (torch.arange(0, 4, 2, dtype=torch.float64) / 16)
        torch.testing.assert_close(enc.inv_freq[:2].double(), expected, rtol=1e-6, atol=0)
        assert torch.count_nonzero(enc.inv_freq[2:]) == 0
        assert enc.inv_freq.numel() == 8


def test_lfm3_convolution_layers_have_no_rope_and_its_proportional_layers_are_exact():
    hf = _tiny("lfm3")
    facts = inspect_model(hf, probe=True)
    by_type = dict(zip(facts.layer_types, facts.layers, strict=True))
    assert by_type["conv"] is None  # no attention: nothing to rotate
    assert (by_type["full_attention"].rotary_dim, by_type["full_attention"].layout) == (8, "half")
    assert by_type["sliding_attention"].rotary_dim == 16
    batch, mask, pos = hf_families._inputs()
    with torch.no_grad():
        ref = hf(batch, attention_mask=mask, position_ids=pos, use_cache=False).logits
        with patch(hf, "rope", backend="eager"):
            out = hf(batch, attention_mask=mask, position_ids=pos, use_cache=False).logits
    assert hf_families._relative(out, ref) <= hf_families.RTOL


def test_a_rotating_layer_whose_type_the_config_gives_no_rope_is_refused():
    """The config says the global layers have no RoPE but the model rotates them: the probe
    names the layer and its type instead of guessing a base."""
    hf = _tiny("gemma4_text")
    hf.config.rope_parameters = dict(hf.config.rope_parameters, full_attention=None)
    with pytest.raises(ValueError, match=r"layer 2: rotates q and k .*'full_attention' no RoPE"):
        inspect_model(hf, probe=True)
