"""RoPE in linear attention (RoFormer eq. 19, arXiv 2104.09864): rotate after the feature map,
keep the denominator unrotated; causal by prefix sums / the recurrent state."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import relpos
from relpos.attention.linear.feature_maps import PositiveRandomFeatures
from relpos.attention.linear.kernelized import kernelized_reference
from relpos.attention.linear.state import LinearState


def spec_inputs():
    rng = np.random.default_rng(0)
    q = torch.tensor(rng.standard_normal((6, 4)))[None, None]
    k = torch.tensor(rng.standard_normal((6, 4)))[None, None]
    v = torch.tensor(rng.standard_normal((6, 2)))[None, None]
    return q, k, v


def rope(heads: int = 1, dim: int = 4) -> relpos.Encoding:
    return relpos.create("rope", num_heads=heads, head_dim=dim, base=10000.0, layout="half")


@pytest.mark.parametrize(
    "causal,rows",
    [
        (True, [[1.801635, 1.315104], [0.175367, -0.604699], [-0.070395, -0.053309]]),
        (False, [[0.087346, 0.026981], [-0.0952, 0.025155], [-0.271019, 0.038149]]),
    ],
)
def test_linear_rope_matches_the_spec_values(causal, rows):
    q, k, v = spec_inputs()
    out = relpos.attention(q, k, v, rope(), causal=causal, feature_map="elu1")
    torch.testing.assert_close(
        out[0, 0, :3], torch.tensor(rows, dtype=torch.float64), atol=1e-6, rtol=0
    )


@pytest.mark.parametrize("causal", [True, False])
def test_linear_rope_is_the_dense_rotated_numerator_over_the_unrotated_denominator(causal):
    q, k, v = spec_inputs()
    enc = rope()
    out = relpos.attention(q, k, v, enc, causal=causal, feature_map="elu1")
    pq, pk = F.elu(q) + 1, F.elu(k) + 1
    pos = torch.arange(6)[None]  # (B|1, L): the form the engine passes to rotate
    rq, rk = enc.rotate_qk(pq, pk, pos, pos)
    ref = kernelized_reference(pq, pk, v, causal=causal, rotated=(rq, rk))
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-10)
    # the weights are not a distribution: some rotated numerator weights are negative
    assert bool(((rq @ rk.transpose(-1, -2)) < 0).any())


def test_shift_invariance_and_the_wrong_order_that_breaks_it():
    q, k, v = spec_inputs()
    enc = rope()
    pos = torch.arange(6)
    out = relpos.attention(q, k, v, enc, causal=True, feature_map="elu1")
    shifted = relpos.attention(
        q, k, v, enc, causal=True, feature_map="elu1", q_pos=pos + 37, k_pos=pos + 37
    )
    torch.testing.assert_close(shifted, out, atol=1e-6, rtol=0)  # cos/sin are float32 (RoPE)

    def wrong(p):  # phi(R q): rotation before the feature map
        rq, rk = enc.rotate_qk(q, k, p[None], p[None])
        return kernelized_reference(F.elu(rq) + 1, F.elu(rk) + 1, v, causal=True)

    assert float((wrong(pos + 37) - wrong(pos)).abs().max()) > 0.05


@pytest.mark.parametrize("name", ["rope", "p-rope"])
def test_state_decoding_equals_the_full_causal_forward(name):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 12, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    enc = relpos.create(name, num_heads=2, head_dim=8).double()
    full = relpos.attention(q, k, v, enc, causal=True, feature_map="elu1")
    state = LinearState()
    parts = [
        relpos.attention(
            q[:, :, :5], k[:, :, :5], v[:, :, :5], enc, causal=True, feature_map="elu1", cache=state
        )
    ]
    for t in range(5, 12):
        s = slice(t, t + 1)
        parts.append(
            relpos.attention(
                q[:, :, s],
                k[:, :, s],
                v[:, :, s],
                enc,
                causal=True,
                feature_map="elu1",
                cache=state,
            )
        )
    assert state.length == 12 and state.S.shape == (2, 2, 8, 8)
    torch.testing.assert_close(torch.cat(parts, 2), full, atol=1e-6, rtol=1e-6)


def test_random_features_need_as_many_features_as_the_rotation_has_channels():
    q, k, v = spec_inputs()
    with pytest.raises(ValueError, match="num_features=4"):
        relpos.attention(q, k, v, rope(), feature_map=PositiveRandomFeatures(4, 8))
    out = relpos.attention(q, k, v, rope(), feature_map=PositiveRandomFeatures(4, 4))
    assert torch.isfinite(out).all()


def test_a_state_refuses_rotations_that_change_from_call_to_call():
    """xPos centres its scales on each call's keys: rotated key features cannot be summed."""
    q, k, v = spec_inputs()
    enc = relpos.create("xpos", num_heads=1, head_dim=4)
    with pytest.raises(ValueError, match="cache_rotated_keys=False"):
        relpos.attention(q, k, v, enc, causal=True, feature_map="elu1", cache=LinearState())
    cache = relpos.nn.LayerCache()
    full = relpos.attention(q, k, v, enc, causal=True, feature_map="elu1")
    parts = [
        relpos.attention(
            q[:, :, t : t + 1],
            k[:, :, t : t + 1],
            v[:, :, t : t + 1],
            enc,
            causal=True,
            feature_map="elu1",
            cache=cache,
        )
        for t in range(6)
    ]
    torch.testing.assert_close(torch.cat(parts, 2), full, atol=1e-6, rtol=1e-6)
