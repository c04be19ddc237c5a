"""Length-dependent RoPE scalings (dynamic NTK, LongRoPE) with a KV cache.

Their frequencies follow the largest position of a call. relpos re-rotates the cached keys
each step, so in one layer decoding step t equals a full forward over the first t + 1 tokens
(never a mix of two bases, which HF's cache gives).

Scope: one layer. From layer 2 on, the cached keys and values of earlier tokens come from
layer-1 outputs computed under the frequencies of *their* step, and a full forward at the new
length recomputes those too; no cache can follow that short of recomputing the prefix. The
second test pins that this is a real difference (so the scope is not a tolerance).
"""

import pytest
import torch

import relpos

SCALINGS = {
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "longrope": {
        "rope_type": "longrope",
        "short_factor": [1.0] * 4,
        "long_factor": [1.0, 2.0, 4.0, 8.0],
        "original_max_position_embeddings": 16,
    },
}


def decode_and_prefix(kind: str, depth: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(cached decoding after a prefill of 8, a fresh forward of every prefix), float64."""
    torch.manual_seed(0)
    model = relpos.nn.TransformerLM(
        64,
        32,
        depth,
        4,
        "rope",
        encoding_options={"scaling": SCALINGS[kind], "max_position_embeddings": 16},
    )
    model = model.eval().double()
    assert model.blocks[0].attn.encoding.cache_rotated_keys is False
    tokens = torch.randint(0, 64, (2, 30))
    cache = model.new_cache()
    with torch.no_grad():
        steps = [model(tokens[:, :8], cache=cache)]
        steps += [model(tokens[:, t : t + 1], cache=cache) for t in range(8, 30)]
        decoded = torch.cat(steps, dim=1)
        prefix = torch.stack([model(tokens[:, : t + 1])[:, t] for t in range(30)], dim=1)
    return decoded, prefix


@pytest.mark.parametrize("kind", sorted(SCALINGS))
def test_decoding_step_equals_forward_of_the_prefix(kind: str) -> None:
    decoded, prefix = decode_and_prefix(kind, depth=1)
    torch.testing.assert_close(decoded, prefix, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", sorted(SCALINGS))
def test_deeper_layers_differ_past_the_switch(kind: str) -> None:
    """Two layers: equal up to the switch (position 15), then not."""
    decoded, prefix = decode_and_prefix(kind, depth=2)
    torch.testing.assert_close(decoded[:, :16], prefix[:, :16], rtol=1e-12, atol=1e-12)
    assert float((decoded[:, 16:] - prefix[:, 16:]).abs().max()) > 1e-6


def test_static_scaling_keeps_caching_rotated_keys() -> None:
    enc = relpos.create(
        "rope",
        num_heads=2,
        head_dim=8,
        scaling={"rope_type": "linear", "factor": 4.0},
    )
    assert enc.cache_rotated_keys is True
    torch.testing.assert_close(enc.inv_freq, relpos.functional.rope_frequencies(8)[0] / 4)
