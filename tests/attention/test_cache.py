"""KV-cache decoding through the engine: ``relpos.attention(..., cache=...)`` rotates and
appends in one place (``prepare_call``); keys are stored rotated only when the encoding's key
rotation never depends on the rest of the call (``cache_rotated_keys``)."""

from __future__ import annotations

import pytest
import torch

import relpos
from relpos.nn import LayerCache

H, D = 4, 16


@pytest.mark.parametrize(
    ("name", "options", "stored_rotated"),
    [
        ("rope", {}, True),
        ("xpos", {}, False),  # the key scale is centred on the call's positions
        ("alibi", {}, False),  # nothing to rotate
        ("dca", {"pretraining_length": 16}, False),  # piecewise: rotations per pair
    ],
)
def test_decoding_with_a_cache_equals_the_full_call(name, options, stored_rotated):
    enc = relpos.create(name, num_heads=H, head_dim=D, **options)
    g = torch.Generator().manual_seed(0)
    L = 30
    q, k, v = (torch.randn(2, H, L, D, generator=g) for _ in range(3))
    full = relpos.attention(q, k, v, enc, causal=True)
    cache = LayerCache()
    steps = [(0, 17), *((t, t + 1) for t in range(17, L))]
    outs = [
        relpos.attention(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], enc, causal=True, cache=cache)
        for a, b in steps
    ]
    torch.testing.assert_close(torch.cat(outs, dim=2), full, rtol=1e-5, atol=1e-5)
    assert cache.length == L and cache.rotated is stored_rotated
    if stored_rotated:
        rotated = enc.rotate(k, torch.arange(L)[None], "k")
        torch.testing.assert_close(cache.k, rotated)
    else:
        assert torch.equal(cache.k, k)


def test_cached_positions_continue_and_explicit_ones_are_kept():
    enc = relpos.create("rope", num_heads=H, head_dim=D)
    q = torch.randn(1, H, 5, D)
    cache = LayerCache()
    relpos.attention(q, q, q, enc, causal=True, cache=cache)
    relpos.attention(q[:, :, :2], q[:, :, :2], q[:, :, :2], enc, causal=True, cache=cache)
    assert cache.k_pos.tolist() == [[0, 1, 2, 3, 4, 5, 6]]
    pos = torch.tensor([10, 11])
    relpos.attention(
        q[:, :, :2], q[:, :, :2], q[:, :, :2], enc, q_pos=pos, k_pos=pos, causal=True, cache=cache
    )
    assert cache.k_pos.tolist() == [[0, 1, 2, 3, 4, 5, 6, 10, 11]]


def test_the_private_rotated_keyword_is_gone():
    q = torch.randn(1, H, 4, D)
    with pytest.raises(TypeError):
        relpos.attention(q, q, q, None, _rotated=True)
