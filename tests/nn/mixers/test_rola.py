"""RoLA's low-rank branch (a reconstruction from the abstract): RoPE outside the feature map, on a
frequency subset of the model's (N-D) rotary schedule."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import relpos
from relpos.attention.linear.feature_maps import EluPlusOne, LowRankFeatures
from relpos.attention.linear.kernelized import kernelized_reference
from relpos.attention.linear.state import LinearState
from relpos.nn.mixers.rola import rola_attention, rotary_schedule, select_frequencies


def spec_inputs():
    rng = np.random.default_rng(0)
    q = torch.tensor(rng.standard_normal((6, 4)))[None, None]
    k = torch.tensor(rng.standard_normal((6, 4)))[None, None]
    v = torch.tensor(rng.standard_normal((6, 2)))[None, None]
    return q, k, v


@pytest.mark.parametrize(
    "causal,rows",
    [
        (True, [[1.801635, 1.315104], [0.175367, -0.604699], [-0.070395, -0.053309]]),
        (False, [[0.087346, 0.026981], [-0.0952, 0.025155], [-0.271019, 0.038149]]),
    ],
)
def test_full_rank_with_the_whole_schedule_is_roformers_linear_form(causal, rows):
    """Reference rows of RoFormer's linear form (elu+1, RoPE base 10000, half layout, positions
    0..5)."""
    q, k, v = spec_inputs()
    rope = relpos.create("rope", num_heads=1, head_dim=4, base=10000.0, layout="half")
    out = rola_attention(q, k, v, rope, EluPlusOne(4), causal=causal)
    want = torch.tensor(rows, dtype=torch.float64)
    torch.testing.assert_close(out[0, 0, :3], want, atol=1e-6, rtol=0)
    engine = relpos.attention(q, k, v, rope, causal=causal, feature_map="elu1")
    torch.testing.assert_close(out, engine, atol=1e-6, rtol=0)


def test_frequency_subsets_pick_the_lowest_highest_or_given_pairs():
    rope = relpos.create("rope", num_heads=1, head_dim=16)
    sched = rotary_schedule(rope)  # (1, 8, 1), descending: pair 0 is the fastest
    theta = rope.inv_freq.double()
    torch.testing.assert_close(sched[0, :, 0], theta)
    torch.testing.assert_close(select_frequencies(sched, 6, "lowest")[0, :, 0], theta[5:])
    torch.testing.assert_close(select_frequencies(sched, 6, "highest")[0, :, 0], theta[:3])
    torch.testing.assert_close(select_frequencies(sched, 6, [7, 0, 3])[0, :, 0], theta[[7, 0, 3]])
    # an N-D schedule: the subset is ranked by |F_p| across the axes
    axial = relpos.create("rope-axial", num_heads=1, head_dim=24, dims=3)
    F = rotary_schedule(axial)  # (1, 12, 3), one non-zero per pair
    low = select_frequencies(F, 6, "lowest")
    assert low.shape == (1, 3, 3)
    smallest = F.norm(dim=-1).sort().values[0, :3]
    torch.testing.assert_close(low.norm(dim=-1).sort().values[0], smallest)
    assert set(low[0].abs().argmax(-1).tolist()) == {0, 1, 2}  # one per axis (ties)


def test_bad_ranks_subsets_and_encodings_are_refused_by_name():
    sched = rotary_schedule(relpos.create("rope", num_heads=1, head_dim=8))
    with pytest.raises(ValueError, match="rank must be even"):
        select_frequencies(sched, 3)
    with pytest.raises(ValueError, match=r"rank <= 8"):
        select_frequencies(sched, 10)
    with pytest.raises(ValueError, match="distinct pair indices"):
        select_frequencies(sched, 4, [1, 1])
    with pytest.raises(ValueError, match="frequency_subset\\[1\\]"):
        select_frequencies(sched, 4, [0, 9])
    with pytest.raises(ValueError, match="frequency_subset"):
        select_frequencies(sched, 4, "middle")
    for name in ("alibi", "xpos"):
        with pytest.raises(ValueError, match="RoLA takes the rotary schedule"):
            rotary_schedule(relpos.create(name, num_heads=1, head_dim=8))
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
    with pytest.raises(ValueError, match="attention factor"):
        rotary_schedule(relpos.create("rope", num_heads=1, head_dim=8, scaling=yarn))


def _case_3d(seed: int = 0, L: int = 10):
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(2, 2, L, 24, generator=gen, dtype=torch.float64) for _ in range(2))
    v = torch.randn(2, 2, L, 3, generator=gen, dtype=torch.float64)
    pos = torch.randint(0, 8, (2, L, 3), generator=gen)
    enc = relpos.create("rope-axial", num_heads=2, head_dim=24, dims=3)
    fmap = LowRankFeatures(24, 8, seed=0).double()
    return q, k, v, pos, enc, fmap


@pytest.mark.parametrize("causal", [True, False])
def test_shift_invariance_on_every_axis_and_the_wrong_order_that_breaks_it(causal):
    q, k, v, pos, enc, fmap = _case_3d()
    kw = dict(causal=causal, q_pos=pos, k_pos=pos)
    out = rola_attention(q, k, v, enc, fmap, **kw)
    shift = torch.tensor([37, -5, 1000])
    moved = rola_attention(q, k, v, enc, fmap, **{**kw, "q_pos": pos + shift, "k_pos": pos + shift})
    torch.testing.assert_close(moved, out, atol=1e-12, rtol=0)

    @torch.no_grad()
    def wrong(p):  # phi(R q): the rotation inside the feature map is not relative
        rq, rk = enc.rotate_qk(q, k, p, p)
        return kernelized_reference(fmap(rq, "q", 1.0)[0], fmap(rk, "k", 1.0)[0], v, causal=causal)

    assert float((wrong(pos + shift) - wrong(pos)).abs().max()) > 1e-3


def test_it_is_the_dense_rotated_numerator_over_the_unrotated_denominator():
    q, k, v, pos, enc, fmap = _case_3d(1)
    out = rola_attention(q, k, v, enc, fmap, q_pos=pos, k_pos=pos, frequency_subset="highest")
    freq = select_frequencies(rotary_schedule(enc), 8, "highest")
    ang = torch.einsum("blm,gpm->bglp", pos.double(), freq)
    pq, pk = fmap(q, "q", 1.0)[0], fmap(k, "k", 1.0)[0]
    rot = lambda x: relpos.functional.apply_rotary(x, ang.cos(), ang.sin(), enc.layout)  # noqa: E731
    ref = kernelized_reference(pq, pk, v, rotated=(rot(pq), rot(pk)))
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-10)


def test_state_decoding_equals_the_full_causal_forward_and_padding_is_ignored():
    q, k, v, pos, enc, fmap = _case_3d(2)
    full = rola_attention(q, k, v, enc, fmap, causal=True, q_pos=pos, k_pos=pos)
    state = LinearState()
    parts = [
        rola_attention(
            q[:, :, :4],
            k[:, :, :4],
            v[:, :, :4],
            enc,
            fmap,
            causal=True,
            q_pos=pos[:, :4],
            k_pos=pos[:, :4],
            state=state,
        )
    ]
    for t in range(4, 10):
        s = slice(t, t + 1)
        parts.append(
            rola_attention(
                q[:, :, s],
                k[:, :, s],
                v[:, :, s],
                enc,
                fmap,
                causal=True,
                q_pos=pos[:, s],
                k_pos=pos[:, s],
                state=state,
            )
        )
    assert state.length == 10 and state.S.shape == (2, 2, 8, 3)
    torch.testing.assert_close(torch.cat(parts, 2), full, atol=1e-12, rtol=1e-10)
    valid = torch.ones(2, 10, dtype=torch.bool)
    valid[:, 6:] = False
    padded = rola_attention(
        q[:, :, :6], k, v, enc, fmap, q_pos=pos[:, :6], k_pos=pos, key_valid=valid
    )
    short = rola_attention(
        q[:, :, :6], k[:, :, :6], v[:, :, :6], enc, fmap, q_pos=pos[:, :6], k_pos=pos[:, :6]
    )
    torch.testing.assert_close(padded, short, atol=1e-12, rtol=0)


def test_gradients_reach_the_feature_map_and_a_learned_schedule():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 7, 8, generator=gen) for _ in range(3))
    enc = relpos.create("rope-mixed", num_heads=2, head_dim=8)
    fmap = LowRankFeatures(8, 4, seed=1)
    pos = torch.randint(0, 5, (1, 7, 2), generator=gen)
    out = rola_attention(q, k, v, enc, fmap, causal=True, q_pos=pos, k_pos=pos)
    assert out.dtype == torch.float32 and out.shape == (1, 2, 7, 8)
    out.square().sum().backward()
    assert fmap.weight.grad is not None and bool(fmap.weight.grad.abs().sum() > 0)
    learned = [p for p in enc.parameters() if p.requires_grad]
    assert learned and all(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in learned)
