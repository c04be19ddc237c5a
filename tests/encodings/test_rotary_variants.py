"""Defining properties of the rotary variants (beyond the conformance suite).

HoPE has no low frequencies and no long-term decay; p-RoPE is HF's "proportional"; LieRE with a
zero generator is the identity and with 2x2 blocks is RoPE; HARoPE with the identity map is
RoPE; RoVE rotates values and outputs as written by hand; CARoPE with a constant frequency is
RoPE and its phase differences depend only on the tokens in between; hyperbolic-rope decays
monotonically; MinkowskiPE boosts along time and rotates along space. Grouped-query calls
equal the call with keys repeated when the shared parameters agree within each group.
"""

from __future__ import annotations

import math

import pytest
import torch

import relpos


def randn(*shape, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def ones_scores(enc, length: int, head_dim: int) -> torch.Tensor:
    """Score of an all-ones query at distance ``0 .. length-1`` from an all-ones key at 0."""
    q = torch.ones(1, 1, length, head_dim)
    k = torch.ones(1, 1, 1, head_dim)
    out = relpos.scores(q, k, enc, q_pos=torch.arange(length), k_pos=torch.tensor([0]), scale=1.0)
    return out[0, 0, :, 0].double()


# ----------------------------------------------------------------------- HoPE


def test_hope_has_no_low_frequencies():
    enc = relpos.create("hope", num_heads=1, head_dim=64, train_length=4096)
    r = enc.rotated_pairs
    wavelengths = 2 * math.pi / enc.inv_freq[:r].double()
    assert bool((wavelengths <= 4096).all())  # every kept pair turns at least once in L_train
    assert bool((enc.inv_freq[r:] == 0).all())  # the rest do not turn at all
    rope = relpos.create("rope", num_heads=1, head_dim=64)
    assert float(2 * math.pi / rope.inv_freq[r]) > 4096  # and those were RoPE's low ones


def test_hope_has_no_long_term_decay_unlike_rope():
    length, d = 4096, 64
    quarter = length // 4
    hope = ones_scores(relpos.create("hope", num_heads=1, head_dim=d), length, d)
    rope = ones_scores(relpos.create("rope", num_heads=1, head_dim=d), length, d)
    assert float(rope[:quarter].mean() - rope[-quarter:].mean()) > 10  # RoPE decays
    means = hope.reshape(4, quarter).mean(1)
    assert float((means[0] - means[-1]).abs()) < 1
    nope_pairs = d // 2 - relpos.create("hope", num_heads=1, head_dim=d).rotated_pairs
    assert float((means - 2 * nope_pairs).abs().max()) < 3  # oscillates around the NoPE part


def test_hope_bad_options_name_the_argument():
    with pytest.raises(ValueError, match="train_length or rotated_pairs"):
        relpos.create("hope", num_heads=1, head_dim=16, train_length=10, rotated_pairs=2)
    with pytest.raises(ValueError, match="rotated_pairs"):
        relpos.create("hope", num_heads=1, head_dim=16, rotated_pairs=9)
    with pytest.raises(ValueError, match="train_length"):
        relpos.create("hope", num_heads=1, head_dim=16, train_length=-1)


# ----------------------------------------------------------------------- p-RoPE


@pytest.mark.parametrize("head_dim", [16, 80, 256])
@pytest.mark.parametrize("p", [0.0, 0.25, 0.5, 1.0])
@pytest.mark.parametrize("base", [1e4, 1e6])
def test_p_rope_equals_hf_proportional_frequencies(head_dim, p, base):
    pytest.importorskip("transformers")
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = LlamaConfig(
        hidden_size=2 * head_dim,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=head_dim,
        max_position_embeddings=8192,
        rope_parameters={
            "rope_type": "proportional",
            "rope_theta": base,
            "partial_rotary_factor": p,
        },
    )
    hf_inv_freq, hf_factor = ROPE_INIT_FUNCTIONS["proportional"](config, device=None)
    enc = relpos.create("p-rope", num_heads=2, head_dim=head_dim, p=p, base=base)
    assert torch.equal(enc.inv_freq, hf_inv_freq.float())
    assert enc.attention_factor == hf_factor


def test_p_rope_extremes_are_rope_and_nope():
    q, k = randn(1, 2, 6, 16, seed=1), randn(1, 2, 6, 16, seed=2)
    pos = torch.arange(20, 26)
    full = relpos.create("p-rope", num_heads=2, head_dim=16, p=1.0)
    rope = relpos.create("rope", num_heads=2, head_dim=16)
    torch.testing.assert_close(
        relpos.scores(q, k, full, q_pos=pos, k_pos=pos),
        relpos.scores(q, k, rope, q_pos=pos, k_pos=pos),
    )
    none = relpos.create("p-rope", num_heads=2, head_dim=16, p=0.0)
    torch.testing.assert_close(relpos.scores(q, k, none, q_pos=pos, k_pos=pos), q @ k.mT / 4)
    with pytest.raises(ValueError, match=r"\bp\b"):
        relpos.create("p-rope", num_heads=2, head_dim=16, p=1.5)


# ----------------------------------------------------------------------- LeRoPE


def test_lerope_learns_its_frequencies():
    enc = relpos.create("lerope", num_heads=2, head_dim=16)
    q, k = randn(1, 2, 8, 16, seed=1), randn(1, 2, 8, 16, seed=2)
    relpos.scores(q, k, enc).sum().backward()
    assert enc.log_scale.grad is not None and float(enc.log_scale.grad.abs().max()) > 0
    rope = relpos.create("rope", num_heads=2, head_dim=16)
    with torch.no_grad():
        torch.testing.assert_close(relpos.scores(q, k, enc), relpos.scores(q, k, rope))


# ----------------------------------------------------------------------- LieRE


def test_liere_with_zero_generator_is_the_identity():
    enc = relpos.create("liere", num_heads=2, head_dim=8, dims=2)
    with torch.no_grad():
        enc.generator.zero_()
    x = randn(1, 2, 5, 8, seed=1)
    pos = randn(1, 5, 2, seed=2) * 100
    torch.testing.assert_close(enc.rotate(x, pos, "q"), x)


def test_liere_1d_is_relative_with_dense_generators():
    enc = relpos.create("liere", num_heads=2, head_dim=8, expected_steps=8.0)
    assert enc.relative
    q, k = randn(1, 2, 6, 8, seed=1), randn(1, 2, 6, 8, seed=2)
    pos = torch.tensor([0, 3, 4, 9, 10, 15])
    ref = relpos.scores(q, k, enc, q_pos=pos, k_pos=pos)
    torch.testing.assert_close(relpos.scores(q, k, enc, q_pos=pos + 999, k_pos=pos + 999), ref)


def test_liere_2d_dense_generators_are_not_relative_but_2x2_blocks_are():
    q, k = randn(1, 2, 6, 8, seed=1), randn(1, 2, 6, 8, seed=2)
    pos = randn(1, 6, 2, seed=3) * 4
    dense = relpos.create("liere", num_heads=2, head_dim=8, dims=2, expected_steps=4.0)
    assert not dense.relative
    moved = relpos.scores(q, k, dense, q_pos=pos + 3, k_pos=pos + 3)
    assert not torch.allclose(moved, relpos.scores(q, k, dense, q_pos=pos, k_pos=pos), atol=1e-3)
    blocks = relpos.create("liere", num_heads=2, head_dim=8, dims=2, generator_dim=2)
    assert blocks.relative
    torch.testing.assert_close(
        relpos.scores(q, k, blocks, q_pos=pos + 3, k_pos=pos + 3),
        relpos.scores(q, k, blocks, q_pos=pos, k_pos=pos),
        rtol=1e-4,
        atol=1e-4,
    )


def test_liere_bad_generator_dim():
    with pytest.raises(ValueError, match="generator_dim"):
        relpos.create("liere", num_heads=1, head_dim=8, generator_dim=3)
    with pytest.raises(ValueError, match="expected_steps"):
        relpos.create("liere", num_heads=1, head_dim=8, expected_steps=0)


# ----------------------------------------------------------------------- HARoPE / ComplexFormer


def test_harope_with_identity_map_is_interleaved_rope():
    enc = relpos.create("harope", num_heads=2, head_dim=8)
    with torch.no_grad():
        enc.sigma.fill_(math.log(math.expm1(1.0 - 1e-6)))  # s = 1 exactly: M = I
    rope = relpos.create("rope", num_heads=2, head_dim=8, layout="interleaved")
    q, k, v = randn(2, 2, 7, 8, seed=1), randn(2, 2, 7, 8, seed=2), randn(2, 2, 7, 8, seed=3)
    pos = torch.tensor([[1, 2, 4, 8, 16, 32, 64], [0, 1, 2, 3, 4, 5, 6]])
    kw = dict(q_pos=pos, k_pos=pos, causal=True)
    torch.testing.assert_close(
        relpos.attention(q, k, v, enc, **kw),
        relpos.attention(q, k, v, rope, **kw),
        atol=1e-6,
        rtol=1e-5,
    )


@pytest.mark.parametrize("name", ["harope", "complexformer", "carope"])
def test_grouped_query_call_equals_repeated_keys_when_groups_share_parameters(name):
    torch.manual_seed(0)
    enc = relpos.create(name, num_heads=4, head_dim=8)
    with torch.no_grad():
        for p in enc.parameters():
            p.add_(torch.randn_like(p) * 0.3)
            if p.shape[0] == 4:  # per-head: make the two heads of each group agree
                p.copy_(
                    p.reshape(2, 2, *p.shape[1:])[:, :1].expand(2, 2, *p.shape[1:]).reshape(p.shape)
                )
        if name == "complexformer":
            enc.beta.copy_(randn(4, 4, seed=9))  # beta is per query head: may differ
    q, k, v = randn(1, 4, 6, 8, seed=1), randn(1, 2, 6, 8, seed=2), randn(1, 2, 6, 8, seed=3)
    gqa = relpos.attention(q, k, v, enc, causal=True)
    full = relpos.attention(
        q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), enc, causal=True
    )
    torch.testing.assert_close(gqa, full, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------- RoVE


def test_rove_equals_rope_with_values_and_outputs_rotated_by_hand():
    rove = relpos.create("rove", num_heads=2, head_dim=8)
    rope = relpos.create("rope", num_heads=2, head_dim=8)
    q, k, v = randn(2, 2, 5, 8, seed=1), randn(2, 2, 9, 8, seed=2), randn(2, 2, 9, 8, seed=3)
    kp = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7, 8], [3, 5, 6, 9, 12, 13, 20, 21, 22]])
    qp = kp[:, 4:]
    v_rot = rope.rotate(v, kp, "q")  # R(n) v_n
    out = relpos.attention(q, k, v_rot, rope, q_pos=qp, k_pos=kp, causal=True)
    back = rope.rotate(out, -qp, "q")  # R(-m) = R(m)^T
    got = relpos.attention(q, k, v, rove, q_pos=qp, k_pos=kp, causal=True)
    torch.testing.assert_close(got, back)
    with pytest.raises(ValueError, match="value head_dim"):
        relpos.attention(q, k, v[..., :6], rove, q_pos=qp, k_pos=kp, causal=True)


# ----------------------------------------------------------------------- CARoPE


def test_carope_with_constant_frequency_is_rope():
    enc = relpos.create("carope", num_heads=2, head_dim=16)
    with torch.no_grad():
        enc.freq_weight.zero_()  # f = theta_1 for every token
    rope = relpos.create("rope", num_heads=2, head_dim=16)
    q, k = randn(2, 2, 4, 16, seed=1), randn(2, 2, 10, 16, seed=2)
    kp = torch.tensor([[5, 6, 7, 9, 12, 13, 14, 20, 21, 30], [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]])
    qp = kp[:, 6:]
    torch.testing.assert_close(
        relpos.scores(q, k, enc, q_pos=qp, k_pos=kp),
        relpos.scores(q, k, rope, q_pos=qp, k_pos=kp),
        rtol=1e-5,
        atol=1e-5,
    )


def test_carope_phase_differences_depend_only_on_tokens_in_between():
    enc = relpos.create("carope", num_heads=2, head_dim=8)
    with torch.no_grad():
        enc.freq_weight.copy_(randn(2, 8, seed=7))
    q, k = randn(1, 2, 8, 8, seed=1), randn(1, 2, 8, 8, seed=2)
    pos = torch.arange(8) + 5
    ref = relpos.scores(q, k, enc, q_pos=pos, k_pos=pos)
    k2 = k.clone()
    k2[:, :, 2] = randn(2, 8, seed=3)  # another token at index 2
    new = relpos.scores(q, k2, enc, q_pos=pos, k_pos=pos)
    i, j = torch.meshgrid(torch.arange(8), torch.arange(8), indexing="ij")
    outside = ((i < 2) & (j < 2)) | ((i > 2) & (j > 2))  # index 2 not in (j, i] or (i, j]
    torch.testing.assert_close(new[..., outside], ref[..., outside], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(new[..., (i >= 2) & (j < 2)], ref[..., (i >= 2) & (j < 2)])


def test_carope_is_not_flagged_relative_but_is_translation_invariant():
    enc = relpos.create("carope", num_heads=2, head_dim=8)
    assert not enc.relative and not enc.cache_rotated_keys
    q, k = randn(1, 2, 6, 8, seed=1), randn(1, 2, 6, 8, seed=2)
    pos = torch.tensor([[1, 2, 4, 5, 9, 10]])
    ref = relpos.scores(q, k, enc, q_pos=pos, k_pos=pos)
    moved = relpos.scores(q, k, enc, q_pos=pos + 1000, k_pos=pos + 1000)
    torch.testing.assert_close(moved, ref, rtol=1e-4, atol=1e-4)
    # ... but the score of query 5 and key 0 (distance 5 in both) depends on the gaps between
    a, b = torch.tensor([[0, 1, 2, 3, 4, 5]]), torch.tensor([[0, 4, 4, 4, 4, 5]])
    s_a = relpos.scores(q, k, enc, q_pos=a, k_pos=a)[..., 5, 0]
    s_b = relpos.scores(q, k, enc, q_pos=b, k_pos=b)[..., 5, 0]
    assert not torch.allclose(s_a, s_b, atol=1e-3)
    rope = relpos.create("rope", num_heads=2, head_dim=8)
    torch.testing.assert_close(
        relpos.scores(q, k, rope, q_pos=a, k_pos=a)[..., 5, 0],
        relpos.scores(q, k, rope, q_pos=b, k_pos=b)[..., 5, 0],
    )


def test_carope_queries_need_their_keys():
    enc = relpos.create("carope", num_heads=2, head_dim=8)
    with pytest.raises(RuntimeError, match="rotate_qk"):
        enc.rotate(randn(1, 2, 3, 8), torch.arange(3)[None], "q")
    with pytest.raises(ValueError, match="length"):
        relpos.scores(randn(1, 2, 5, 8), randn(1, 2, 3, 8), enc, q_pos=torch.arange(5))


# ----------------------------------------------------------------------- hyperbolic


def test_hyperbolic_rope_is_xpos_at_init():
    hyp = relpos.create("hyperbolic-rope", num_heads=2, head_dim=16, layout="interleaved")
    xpos = relpos.create("xpos", num_heads=2, head_dim=16)
    q, k = randn(2, 2, 30, 16, seed=1), randn(2, 2, 30, 16, seed=2)
    torch.testing.assert_close(relpos.scores(q, k, hyp), relpos.scores(q, k, xpos))


def test_hyperbolic_rope_envelope_decays_monotonically():
    d, n = 16, 200
    hyp = relpos.create("hyperbolic-rope", num_heads=1, head_dim=d)
    with torch.no_grad():
        hyp.log_rate.copy_(torch.log(torch.linspace(0.01, 0.1, d // 2)))
    rope = relpos.create("rope", num_heads=1, head_dim=d)
    dist = torch.arange(n)
    kw = dict(q_pos=dist, k_pos=torch.tensor([0]), scale=1.0)
    for i in range(d // 2):  # one pair at a time: score = e^{-kappa_i (m - n)} x RoPE's
        q = torch.zeros(1, 1, n, d)
        q[..., i], q[..., i + d // 2] = 1.0, 0.5
        k = q[:, :, :1].clone()
        got = relpos.scores(q, k, hyp, **kw)[0, 0, :, 0].double()
        envelope = 1.25 * torch.exp(-hyp.rates[i].detach().double() * dist)  # |q_i| |k_i| e^..
        ref = envelope / 1.25 * relpos.scores(q, k, rope, **kw)[0, 0, :, 0].double()
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)
        assert bool((got.abs() <= envelope + 1e-6).all())
        assert bool((envelope[1:] < envelope[:-1]).all())
    with pytest.raises(ValueError, match="causal"):
        relpos.attention(q, q, q, hyp, causal=False)


# ----------------------------------------------------------------------- MinkowskiPE


def test_minkowski_boosts_along_time_and_rotates_along_space():
    enc = relpos.create("minkowski", num_heads=1, head_dim=8, dims=2, max_rapidity=0.01)
    rate = float(enc.rates[0])
    light = torch.zeros(1, 1, 1, 8)
    light[..., 0], light[..., 1] = 1.0, -1.0  # q on the (1, -1) light-cone line of block 0
    key = torch.zeros(1, 1, 1, 8)
    key[..., 0], key[..., 1] = 1.0, 1.0  # k on (1, 1)
    for dt in (0.0, 5.0, 40.0):
        s = relpos.scores(
            light,
            key,
            enc,
            q_pos=torch.tensor([[[0.0, 3.0]]]),
            k_pos=torch.tensor([[[dt, 3.0]]]),
            scale=1.0,
        )
        # q^T eta B(kappa dt) k = (1, 1) . (1, 1) e^{kappa dt}
        torch.testing.assert_close(s.flatten(), torch.tensor([2 * math.exp(rate * dt)]))
    spatial = randn(1, 1, 2, 8, seed=1)
    spatial[..., [0, 1, 4, 5]] = 0  # rotation planes only: plain 1-D RoPE in the space axis
    pos = torch.tensor([[[7.0, 2.0], [7.0, 9.0]]])
    s = relpos.scores(spatial[:, :, :1], spatial[:, :, 1:], enc, q_pos=pos[:, :1], k_pos=pos[:, 1:])
    rope = relpos.create("rope", num_heads=1, head_dim=4, layout="interleaved", base=1e4)
    ref = relpos.scores(
        spatial[:, :, :1][..., [2, 3, 6, 7]],
        spatial[:, :, 1:][..., [2, 3, 6, 7]],
        rope,
        q_pos=torch.tensor([2]),
        k_pos=torch.tensor([9]),
        scale=8**-0.5,
    )
    torch.testing.assert_close(s, ref)


def test_minkowski_rejects_bad_options_and_overflowing_rapidities():
    with pytest.raises(ValueError, match="dims"):
        relpos.create("minkowski", num_heads=1, head_dim=8, dims=1)
    with pytest.raises(ValueError, match="head_dim"):
        relpos.create("minkowski", num_heads=1, head_dim=6)
    enc = relpos.create("minkowski", num_heads=1, head_dim=8, dims=2, max_rapidity=1.0)
    pos = torch.tensor([[[0, 0], [500, 0]]])
    with pytest.raises(ValueError, match="max_rapidity"):
        relpos.scores(randn(1, 1, 2, 8), randn(1, 1, 2, 8), enc, q_pos=pos, k_pos=pos)
