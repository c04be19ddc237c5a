"""A generation that crosses a length-dependent scaling's switch keeps exact logits.

Dynamic NTK recomputes its base from the length and LongRoPE swaps ``short_factor`` for
``long_factor`` past ``original_max_position_embeddings``. A cache of *rotated* keys then
holds keys rotated with the frequencies of the step that cached them (transformers; llama.cpp
picks LongRoPE's factors once, from the context size; vLLM from ``max_model_len``). relpos
caches raw keys and rotates the whole cache with the current length's frequencies (float64
angle products), so every decoding step equals a fresh forward over the prefix at its new
length, on either side of the switch.

Scope: one decoder layer. With more layers the cached values of layer 2 and up were computed
from layer-1 outputs under the old frequencies in every stack; only a full recompute avoids
that.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from hf_tiny import model, tokens  # noqa: E402
from transformers import DynamicCache  # noqa: E402

from relpos.interop.hf import patch  # noqa: E402
from relpos.nn.llama import LlamaConfig, LlamaLM  # noqa: E402
from relpos.rope_scaling import LENGTH_DEPENDENT  # noqa: E402

ORIGINAL = 16  # the trained length: the switch lies between positions 15 and 16
HEAD_DIM = 16

#: one dict per length-dependent type (the test below fails when a type is added without one)
EXAMPLES = {
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "longrope": {
        "rope_type": "longrope",
        "short_factor": [1.0, 1.0, 1.1, 1.2, 1.5, 2.0, 2.5, 3.0],
        "long_factor": [1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0],
        "original_max_position_embeddings": ORIGINAL,
    },
}


def test_every_length_dependent_type_has_an_example() -> None:
    assert set(EXAMPLES) == LENGTH_DEPENDENT


def hf_decode_gap(hf, ids: torch.Tensor, start: int) -> float:
    """Largest gap between cached decoding and a fresh forward over each prefix."""
    gap = 0.0
    with torch.no_grad():
        cache = DynamicCache(config=hf.config)
        hf(ids[:, :start], cache=cache, use_cache=True)
        for t in range(start, ids.shape[1]):
            step = hf(ids[:, t : t + 1], cache=cache, use_cache=True).logits[:, -1]
            fresh = hf(ids[:, : t + 1]).logits[:, -1]
            gap = max(gap, float((step - fresh).abs().max()))
    return gap


@pytest.mark.parametrize("rope_type", sorted(EXAMPLES))
def test_patched_transformers_model_decodes_across_the_switch_exactly(rope_type: str) -> None:
    scaling = EXAMPLES[rope_type]
    hf = model("llama", max_position_embeddings=ORIGINAL, num_hidden_layers=1)
    ids = tokens(28)
    with patch(hf, "rope", scaling=scaling) as handle:
        assert handle.encoding(0).cache_rotated_keys is False
        assert hf_decode_gap(hf, ids, 10) < 2e-6  # prefill of 10, decode 10 .. 27


@pytest.mark.parametrize("rope_type", sorted(EXAMPLES))
def test_transformers_own_scaling_does_not(rope_type: str) -> None:
    """The same model with the scaling in its config and transformers' own rotary: keys
    cached before the switch keep the old frequencies."""
    hf = model(
        "llama",
        max_position_embeddings=ORIGINAL,
        num_hidden_layers=1,
        rope_scaling=EXAMPLES[rope_type],
    )
    assert hf_decode_gap(hf, tokens(28), 10) > 1e-4


def llama(rope_type: str) -> LlamaLM:
    config = LlamaConfig(
        vocab_size=64,
        dim=2 * HEAD_DIM,
        depth=1,
        num_heads=2,
        num_kv_heads=1,
        hidden_dim=64,
        max_position_embeddings=ORIGINAL,
    )
    torch.manual_seed(0)
    return LlamaLM(config, "rope", encoding_options={"scaling": EXAMPLES[rope_type]}).eval()


def llama_decode_gap(lm: LlamaLM, ids: torch.Tensor, start: int) -> float:
    gap = 0.0
    with torch.no_grad():
        cache = lm.new_cache()
        lm(ids[:, :start], cache=cache)
        for t in range(start, ids.shape[1]):
            step = lm(ids[:, t : t + 1], cache=cache)[:, -1]
            fresh = lm(ids[:, : t + 1])[:, -1]
            gap = max(gap, float((step - fresh).abs().max()))
    return gap


@pytest.mark.parametrize("rope_type", sorted(EXAMPLES))
def test_relpos_llama_decodes_across_the_switch_exactly(rope_type: str) -> None:
    lm = llama(rope_type)
    ids = torch.randint(0, 64, (2, 28), generator=torch.Generator().manual_seed(3))
    assert lm.blocks[0].attn.encoding.cache_rotated_keys is False
    assert llama_decode_gap(lm, ids, 10) < 2e-6


@pytest.mark.parametrize("rope_type", sorted(EXAMPLES))
def test_a_cache_of_rotated_keys_would_not(rope_type: str) -> None:
    """The control: the same model caching rotated keys (what the other stacks do)."""
    lm = llama(rope_type)
    lm.blocks[0].attn.encoding.cache_rotated_keys = True
    ids = torch.randint(0, 64, (2, 28), generator=torch.Generator().manual_seed(3))
    assert llama_decode_gap(lm, ids, 10) > 2e-5  # ten times the bound above
