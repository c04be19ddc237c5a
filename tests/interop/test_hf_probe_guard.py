"""A layer the probe takes for NoPE (its q/k do not change when the rotary modules it found
return the identity rotation) must not depend on the position ids through a module it did not
find: such a layer is refused by name, while real NoPE layers stay exact."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

import hf_families  # noqa: E402
from hf_tiny import model, tokens  # noqa: E402

from relpos.interop.hf import inspect_model, patch  # noqa: E402
from relpos.interop.hf import model as hf_model  # noqa: E402


def test_a_rotary_module_hidden_from_discovery_is_refused_by_name(monkeypatch):
    """Discovery "finds" only a decoy rotary module the forward never calls: switching it off
    changes nothing, so every layer looks NoPE, yet its raw q/k still turn with the position
    ids through the real (missed) rotary module."""
    hf = model("llama")
    decoy = type(hf.model.rotary_emb)(hf.config)
    monkeypatch.setattr(hf_model, "rotary_modules", lambda decoder, hidden_size=None: [decoy])
    message = (
        r"llama layer 0's queries/keys depend on position ids through a module the probe "
        r"did not find"
    )
    with pytest.raises(ValueError, match=message):
        inspect_model(hf, probe=True)
    with pytest.raises(ValueError, match=message):
        patch(hf, "alibi")


def test_without_the_decoy_the_same_model_is_probed_as_rope():
    layers = inspect_model(model("llama"), probe=True).layers
    assert all(layer is not None and layer.layout == "half" for layer in layers)


@pytest.mark.slow
def test_real_nope_layers_pass_the_guard_and_stay_exact():
    cfg = hf_families.tiny_config("llama4_text")  # chunked RoPE layers 0-2, NoPE layer 3
    import transformers

    torch.manual_seed(0)
    hf = transformers.Llama4ForCausalLM(cfg).eval()
    assert inspect_model(hf, probe=True).layers[3] is None
    ids = tokens(20)
    with torch.no_grad():
        ref = hf(ids).logits
    with patch(hf, "rope", backend="eager"), torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, ref, atol=1e-5, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["smollm3", "beam"])
def test_nope_families_pass_the_guard_and_are_exact(model_type):
    """SmolLM3's NoPE layers; Beam's NoPE layers scale their queries by a position-dependent
    temperature (a multiple of the same query, which the guard lets through)."""
    family = next((f for f in hf_families.families() if f[0] == model_type), None)
    if family is None:
        pytest.skip(f"transformers has no {model_type} causal LM")
    outcome = hf_families.check_family(*family)
    assert outcome.status == "exact", outcome


def two_layers_on_one_layer_idx(shift_second: bool):
    """A two-layer llama whose second layer also says ``layer_idx`` 0 (as modules that number
    their layers alike do); with ``shift_second`` that layer is handed the cos / sin of twice
    its positions, a rotation the first call of ``layer_idx`` 0 does not show."""
    hf = model("llama", num_hidden_layers=2)
    second = hf.model.layers[1]
    second.self_attn.layer_idx = 0
    if shift_second:
        forward = second.forward

        def doubled(*args, **kwargs):
            ids = kwargs["position_ids"] * 2
            kwargs["position_embeddings"] = hf.model.rotary_emb(args[0], ids)
            return forward(*args, **kwargs)

        second.forward = doubled
    return hf


def test_calls_that_share_a_layer_idx_but_rotate_otherwise_are_refused_by_name():
    hf = two_layers_on_one_layer_idx(shift_second=True)
    message = r"llama layer 0: 2 attention calls share layer_idx 0 .*call 2"
    with pytest.raises(ValueError, match=message):
        inspect_model(hf, probe=True)
    with pytest.raises(ValueError, match=message):
        patch(hf, "alibi")


def test_calls_that_share_a_layer_idx_and_its_rotation_are_probed_as_one_layer():
    layers = inspect_model(two_layers_on_one_layer_idx(shift_second=False), probe=True).layers
    assert layers[0] is not None and layers[0].layout == "half"
