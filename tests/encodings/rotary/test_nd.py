"""N-D rotary encodings: RoPE-ViT's frequencies (naver-ai/rope-vit), per-axis relativity, the M-RoPE
oracle (transformers Qwen2-VL / Qwen3-VL), position-id helpers on hand-checked examples."""

from __future__ import annotations

import math

import pytest
import torch

import relpos
from relpos.encodings.rotary.nd import nd_angles, section_frequencies, split_pairs
from relpos.positions_nd import (
    grid_positions,
    hierarchical_positions,
    multimodal_position_ids,
    scale_positions,
)

R10_AXIAL = [1, 0.749894202, 0.562341332, 0.421696514, 0.316227764, 0.237137362, 0.177827939,
             0.133352146, 0.100000001, 0.0749894157, 0.0562341288, 0.0421696492, 0.0316227786,
             0.0237137359, 0.0177827943, 0.0133352149]  # fmt: skip
R10_MIXED = [1, 0.865964353, 0.749894202, 0.649381638, 0.562341332, 0.486967534, 0.421696514,
             0.365174145, 0.316227764, 0.273841977, 0.237137362, 0.2053525, 0.177827939,
             0.153992653, 0.133352146, 0.115478203]  # fmt: skip


def test_r10_rope_vit_axial_frequencies():
    enc = relpos.create("rope-axial", num_heads=1, head_dim=64, base=100)
    F = enc.freq[0].float()
    assert enc.sections == [16, 16]
    torch.testing.assert_close(F[:16, 0], torch.tensor(R10_AXIAL), rtol=1e-6, atol=0)
    torch.testing.assert_close(F[16:, 1], torch.tensor(R10_AXIAL), rtol=1e-6, atol=0)
    assert (F[:16, 1] == 0).all() and (F[16:, 0] == 0).all()


def test_r10_rope_mixed_init_magnitudes():
    torch.manual_seed(0)
    enc = relpos.create("rope-mixed", num_heads=3, head_dim=64)
    f = enc.freq.detach().double()  # (H, 32, 2)
    mag = torch.tensor(R10_MIXED, dtype=torch.float64)
    # the two halves are (cos a, sin a) * mag and (cos(pi/2 + a), sin(pi/2 + a)) * mag
    for half in (slice(0, 16), slice(16, 32)):
        torch.testing.assert_close(f[:, half].norm(dim=-1), mag.expand(3, 16), rtol=1e-6, atol=0)
    dot = (f[:, :16] * f[:, 16:]).sum(-1)  # orthogonal directions per pair
    assert dot.abs().max() < 1e-6


def test_wan_and_hunyuan_sections():
    assert split_pairs(64, 3) == [22, 21, 21]  # Wan2.1: time gets the extra pairs
    enc = relpos.create("rope-axial", num_heads=1, head_dim=128, dims=3)
    assert enc.sections == [22, 21, 21]
    F = enc.freq[0].double()
    # every axis restarts its own spectrum 10000^(-2j / dim_axis), dim_axis = 2 * pairs
    torch.testing.assert_close(F[22:43, 1], 1e4 ** (-2 * torch.arange(21.0).double() / 42))
    hun = relpos.create("rope-axial", num_heads=1, head_dim=128, dims=3, sections=[8, 28, 28],
                        base=256)  # fmt: skip
    expected = 256 ** (-torch.arange(8.0).double() / 8)
    torch.testing.assert_close(hun.freq[0, :8, 0].double(), expected, rtol=1e-6, atol=0)


def _scores(enc, qp, kp, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, enc.num_heads, qp.shape[-2], enc.head_dim, generator=gen)
    k = torch.randn(1, enc.num_heads, kp.shape[-2], enc.head_dim, generator=gen)
    return relpos.scores(q, k, enc, q_pos=qp, k_pos=kp)


@pytest.mark.parametrize("name", ["rope-axial", "rope-mixed", "m-rope", "rope-hierarchical"])
@pytest.mark.parametrize("shift", [5, 2.5])
def test_each_axis_is_relative_on_its_own(name, shift):
    torch.manual_seed(0)
    enc = relpos.create(name, num_heads=2, head_dim=32)
    pos = grid_positions(*([4] * enc.dims)).float()[None]
    ref = _scores(enc, pos, pos)
    for axis in range(enc.dims):
        moved = pos.clone()
        moved[..., axis] += shift
        torch.testing.assert_close(_scores(enc, moved, moved), ref, rtol=1e-5, atol=1e-5)
    # and moving one axis for the queries only changes the scores
    q_moved = pos.clone()
    q_moved[..., 0] += 1
    assert not torch.allclose(_scores(enc, q_moved, pos), ref, atol=1e-3)


def test_mrope_with_llama_cpps_fourth_section_takes_four_position_axes():
    """Four sections: positions (B, L, 4). Interleaved (llama.cpp IMROPE): t, h and w keep
    their own slots of the 0-1-2 cycle and every other pair takes the fourth axis, where
    transformers' three sections give it to t; contiguous (MROPE): one band per axis."""
    imrope = relpos.create("m-rope", num_heads=2, head_dim=32, mrope_section=[4, 4, 4, 4],
                           interleaved_sections=True)  # fmt: skip
    assert imrope.dims == 4
    assert imrope.pair_axes().tolist() == [0, 1, 2] * 4 + [3] * 4
    hf = relpos.create("m-rope", num_heads=2, head_dim=32, mrope_section=[6, 5, 5],
                       interleaved_sections=True)  # fmt: skip
    assert hf.pair_axes().tolist() == [0, 1, 2] * 5 + [0]
    fewer_t = relpos.create("m-rope", num_heads=2, head_dim=32, mrope_section=[2, 5, 5, 4],
                            interleaved_sections=True)  # fmt: skip
    assert fewer_t.pair_axes().tolist() == [0, 1, 2, 0, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3]
    mrope = relpos.create("m-rope", num_heads=2, head_dim=32, mrope_section=[4, 4, 4, 4])
    assert mrope.pair_axes().tolist() == [0] * 4 + [1] * 4 + [2] * 4 + [3] * 4
    torch.manual_seed(0)
    pos = grid_positions(3, 3, 2, 2).float()[None]
    for enc in (imrope, mrope):
        ref = _scores(enc, pos, pos)
        moved = pos.clone()
        moved[..., 3] += 7
        torch.testing.assert_close(_scores(enc, moved, moved), ref, rtol=1e-5, atol=1e-5)
        q_moved = pos.clone()
        q_moved[..., 3] += 1  # the fourth axis turns its pairs
        assert not torch.allclose(_scores(enc, q_moved, pos), ref, atol=1e-3)


def test_axial_2d_factorises_into_two_1d_ropes():
    """A 2-D axial rotation is a 1-D RoPE on each section with its own positions."""
    enc = relpos.create("rope-axial", num_heads=1, head_dim=16, base=100, layout="interleaved")
    pos = torch.tensor([[3, 7], [0, 2], [5, 5]])[None]
    x = torch.randn(1, 1, 3, 16)
    out = enc.rotate(x, pos, "q")
    f = 100 ** (-torch.arange(4.0) / 4)
    for sec, axis in ((slice(0, 8), 0), (slice(8, 16), 1)):
        ang = pos[0, :, axis, None].float() * f
        ref = relpos.functional.apply_rotary(x[..., sec], ang.cos(), ang.sin(), "interleaved")
        torch.testing.assert_close(out[..., sec], ref)


def test_mrope_on_text_tokens_is_plain_rope():
    mr = relpos.create("m-rope", num_heads=2, head_dim=32, base=1e4)
    rope = relpos.create("rope", num_heads=2, head_dim=32, base=1e4)
    ids = multimodal_position_ids([("text", 9)])
    x = torch.randn(1, 2, 9, 32)
    torch.testing.assert_close(mr.rotate(x, ids[None], "q"), rope.rotate(x, ids[None, :, 0], "q"))


@pytest.mark.parametrize("version", ["qwen2_vl", "qwen3_vl"])
def test_mrope_matches_transformers(version):
    tf = pytest.importorskip("transformers")
    head_dim, section = 128, ([16, 24, 24] if version == "qwen2_vl" else [24, 20, 20])
    if version == "qwen2_vl":
        from transformers.models.qwen2_vl import modeling_qwen2_vl as mod

        cfg = tf.Qwen2VLTextConfig(hidden_size=256, num_attention_heads=2, head_dim=head_dim,
                                   rope_parameters={"rope_type": "default", "rope_theta": 1e6,
                                                    "mrope_section": section})  # fmt: skip
        emb = mod.Qwen2VLRotaryEmbedding(cfg)
    else:
        from transformers.models.qwen3_vl import modeling_qwen3_vl as mod

        cfg = tf.Qwen3VLTextConfig(hidden_size=256, num_attention_heads=2, head_dim=head_dim,
                                   rope_parameters={"rope_type": "default", "rope_theta": 1e6,
                                                    "mrope_section": section})  # fmt: skip
        emb = mod.Qwen3VLTextRotaryEmbedding(cfg)
    ids = multimodal_position_ids([("text", 5), ("video", (2, 4, 6), 3), ("text", 4)],
                                  spatial_merge=2)  # fmt: skip
    L = ids.shape[0]
    q = torch.randn(1, 2, L, head_dim)
    k = torch.randn(1, 2, L, head_dim)
    cos, sin = emb(q, ids.T[:, None, :])
    ref_q, ref_k = mod.apply_rotary_pos_emb(q, k, cos, sin)
    enc = relpos.create("m-rope", num_heads=2, head_dim=head_dim, base=1e6, mrope_section=section,
                        interleaved_sections=version == "qwen3_vl")  # fmt: skip
    torch.testing.assert_close(enc.rotate(q, ids[None], "q"), ref_q, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(enc.rotate(k, ids[None], "k"), ref_k, rtol=1e-5, atol=1e-5)


def test_multimodal_position_ids_hand_example():
    ids = multimodal_position_ids([("text", 2), ("image", (4, 6)), ("text", 2)], spatial_merge=2)
    # text 0,1; image grid 2 x 3 starting at st = 2; text resumes at max id + 1 = 2 + 2 + 1 = 5
    expected_image = [[2, 2 + h, 2 + w] for h in range(2) for w in range(3)]
    assert ids.tolist() == [[0, 0, 0], [1, 1, 1], *expected_image, [5, 5, 5], [6, 6, 6]]
    video = multimodal_position_ids([("video", (3, 2, 2), 50)])
    assert video[:, 0].unique().tolist() == [0, 50, 100]  # Qwen2.5-VL time-aligned steps
    assert (
        multimodal_position_ids([("video", (3, 2, 2), 50), ("text", 1)])[-1].tolist() == [101] * 3
    )
    hw = multimodal_position_ids([("video", (3, 2, 2), 50), ("text", 1)], text_after="max_hw")
    assert hw[-1].tolist() == [2, 2, 2]
    with pytest.raises(ValueError, match="spatial_merge"):
        multimodal_position_ids([("image", (3, 4))], spatial_merge=2)
    with pytest.raises(ValueError, match="kind"):
        multimodal_position_ids([("audio", 3)])
    # sizes are ints, never truncated or parsed (policy: TypeError for the type)
    with pytest.raises(TypeError, match=r"image grid\[0\]"):
        multimodal_position_ids([("image", (2.5, 4))])
    with pytest.raises(TypeError, match="text segment length"):
        multimodal_position_ids([("text", "3")])
    with pytest.raises(ValueError, match="spatial_merge"):
        multimodal_position_ids([("image", (2, 4))], spatial_merge=0)  # was ZeroDivisionError
    with pytest.raises(ValueError, match="video interval"):
        multimodal_position_ids([("video", (2, 2, 2), -1.0)])
    with pytest.raises(TypeError, match=r"sizes\[1\]"):
        grid_positions(2, 3.0)


def test_grid_and_scale_positions():
    g = grid_positions(2, 3)
    assert g.tolist() == [[0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2]]
    s = scale_positions([(1, 1), (2, 2), (4, 4)])
    assert s.shape == (21, 2) and float(s.max()) == 0.75
    enc = relpos.create("rope-2d-normalized", num_heads=1, head_dim=16, reference_grid=(4, 4))
    # the 2x2 scale's token (1, 1) sits at (2, 2) of the 4x4 frame
    x = torch.randn(1, 1, 1, 16)
    torch.testing.assert_close(
        enc.rotate(x, torch.tensor([[[0.5, 0.5]]]), "q"),
        relpos.create("rope-axial", num_heads=1, head_dim=16).rotate(
            x, torch.tensor([[[2, 2]]]), "q"
        ),
    )
    assert enc.relative is False
    assert relpos.create("rope-2d-normalized", num_heads=1, head_dim=16, rounding=False).relative


def test_hierarchical_positions():
    sent = torch.tensor([0, 0, 1, 1, 1, 2])
    para = torch.tensor([0, 0, 0, 0, 1, 1])
    assert hierarchical_positions(sent, para).tolist() == [
        [0, 0, 0], [1, 0, 0], [2, 1, 0], [3, 1, 0], [4, 1, 1], [5, 2, 1]]  # fmt: skip
    with pytest.raises(ValueError, match="non-decreasing"):
        hierarchical_positions(torch.tensor([1, 0]), torch.tensor([0, 0]))


def test_time_rope_uses_float64_timestamps():
    enc = relpos.create("time-rope", num_heads=1, head_dim=16, time_scale=1000.0)
    tau = torch.tensor([[123456.789, 0.001]], dtype=torch.float64)
    x = torch.randn(1, 1, 2, 16, dtype=torch.float64)
    theta = 1e4 ** (-2 * torch.arange(8, dtype=torch.float64) / 16)
    ang = torch.remainder(tau[0, :, None] * 1000.0 * theta, 2 * math.pi)
    ref = relpos.functional.apply_rotary(x, ang.cos(), ang.sin(), "half")
    # float64 frequencies and timestamps: the rotation is exact to float64 rounding
    torch.testing.assert_close(enc.rotate(x, tau, "q"), ref, rtol=0, atol=1e-6)
    enc.to(torch.bfloat16)  # a dtype cast of the module must not round the frequencies
    torch.testing.assert_close(enc.rotate(x, tau, "q"), ref, rtol=0, atol=1e-6)
    bf16 = enc.rotate(x, tau.to(torch.bfloat16).double(), "q")  # bf16 timestamps: unusable
    assert (bf16 - ref).abs().max() > 0.1


def test_nd_angles_precision_and_errors():
    F = section_frequencies([2, 2], 10000.0, "per_axis", 8)[None]
    pos = torch.tensor([[[2**25 + 1, 3]]])
    ang = nd_angles(pos, F)
    exact = torch.remainder(pos[0, 0, 0].double() * F[0, 0, 0], 2 * math.pi)
    assert abs(float(ang[0, 0, 0, 0]) - float(exact)) < 1e-6
    with pytest.raises(ValueError, match="sections"):
        relpos.create("rope-axial", num_heads=1, head_dim=8, sections=[4, 4])
    with pytest.raises(ValueError, match="head_dim"):
        relpos.create("rope-mixed", num_heads=1, head_dim=10)
    with pytest.raises(ValueError, match=r"\(B, L, 2\)"):
        relpos.scores(torch.randn(1, 1, 3, 8), torch.randn(1, 1, 3, 8),
                      relpos.create("rope-axial", num_heads=1, head_dim=8),
                      q_pos=torch.arange(3), k_pos=torch.arange(3))  # fmt: skip


# ----------------------------------------------------------------------- common RoPE options
# Each N-D encoding rotates by RoPE's spectrum (shared: over the head; per_axis: over each
# axis's channels), so a scaling dict must give exactly what ``rope`` gives with that dict on
# the same channels and positions. ``rope`` itself is checked against transformers in
# tests/oracle/test_oracle_hf_rope_scaling.py.
SCALINGS = {
    "linear": ({"rope_type": "linear", "factor": 4.0}, {}),
    "yarn": ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}, {}),
    "llama3": (
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },  # fmt: skip
        {},
    ),
    "dynamic": ({"rope_type": "dynamic", "factor": 2.0}, {"max_position_embeddings": 16}),
}


def _qk(heads: int, lq: int, lk: int, dim: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(1, heads, lq, dim, generator=gen), torch.randn(
        1, heads, lk, dim, generator=gen
    )


@pytest.mark.parametrize("partial", [1.0, 0.5])
@pytest.mark.parametrize("kind", sorted(SCALINGS))
def test_mrope_with_a_scaling_on_text_tokens_is_rope_with_that_scaling(kind, partial):
    """Text tokens carry one id on all three axes: M-RoPE with YaRN / Llama-3 / dynamic NTK
    / linear (and a partial rotary factor) rotates exactly as ``rope`` with the same options,
    queries shorter than keys included (dynamic NTK reads the largest position of both)."""
    scaling, extra = SCALINGS[kind]
    options = {"base": 1e4, "partial_rotary_factor": partial, **extra}
    mr = relpos.create("m-rope", num_heads=2, head_dim=32, scaling=dict(scaling), **options)
    rope = relpos.create("rope", num_heads=2, head_dim=32, scaling=dict(scaling), **options)
    ids = multimodal_position_ids([("text", 40)])[None]
    q, k = _qk(2, 5, 40, 32)
    got = mr.rotate_qk(q, k, ids[:, -5:], ids)
    ref = rope.rotate_qk(q, k, ids[:, -5:, 0], ids[..., 0])
    for a, b in zip(got, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    plain = relpos.create("m-rope", num_heads=2, head_dim=32, **options)
    assert not torch.allclose(plain.rotate_qk(q, k, ids[:, -5:], ids)[1], got[1], atol=1e-3)
    assert mr.cache_rotated_keys == (kind != "dynamic")  # length-dependent: raw keys cached


@pytest.mark.parametrize("kind", ["linear", "yarn", "llama3"])
def test_axial_rope_with_a_scaling_is_a_scaled_rope_on_each_axis(kind):
    """Each axis of ``rope-axial`` is a RoPE over its section's channels; a scaling dict
    rescales it as ``rope`` with that dict over those channels (interleaved pairs)."""
    scaling, _ = SCALINGS[kind]
    enc = relpos.create("rope-axial", num_heads=1, head_dim=16, base=100, scaling=dict(scaling))
    per_axis = relpos.create("rope", num_heads=1, head_dim=8, base=100, layout="interleaved",
                             scaling=dict(scaling))  # fmt: skip
    pos = torch.tensor([[3, 70], [0, 2], [45, 5], [17, 33]])[None]
    x = torch.randn(1, 1, 4, 16, generator=torch.Generator().manual_seed(1))
    out = enc.rotate(x, pos, "q")
    for sec, axis in ((slice(0, 8), 0), (slice(8, 16), 1)):
        ref = per_axis.rotate(x[..., sec], pos[..., axis], "q")
        torch.testing.assert_close(out[..., sec], ref, rtol=1e-5, atol=1e-5)
    plain = relpos.create("rope-axial", num_heads=1, head_dim=16, base=100)
    assert not torch.allclose(plain.rotate(x, pos, "q"), out, atol=1e-3)


def test_axial_rope_with_a_partial_rotary_factor_rotates_the_first_channels_only():
    enc = relpos.create("rope-axial", num_heads=1, head_dim=16, base=100, partial_rotary_factor=0.5)
    assert enc.sections == [2, 2]
    pos = torch.tensor([[3, 7], [0, 2], [5, 5]])[None]
    x = torch.randn(1, 1, 3, 16, generator=torch.Generator().manual_seed(2))
    out = enc.rotate(x, pos, "q")
    torch.testing.assert_close(out[..., 8:], x[..., 8:], rtol=0, atol=0)
    rope = relpos.create("rope", num_heads=1, head_dim=4, base=100, layout="interleaved")
    for sec, axis in ((slice(0, 4), 0), (slice(4, 8), 1)):
        torch.testing.assert_close(out[..., sec], rope.rotate(x[..., sec], pos[..., axis], "q"))


def test_time_rope_with_linear_scaling_is_time_divided_by_the_factor():
    scaled = relpos.create("time-rope", num_heads=1, head_dim=16, time_scale=10.0,
                           scaling={"rope_type": "linear", "factor": 4.0})  # fmt: skip
    plain = relpos.create("time-rope", num_heads=1, head_dim=16, time_scale=10.0)
    tau = torch.tensor([[0.0, 1.25, 3.5, 9.75]], dtype=torch.float64)
    x = torch.randn(1, 1, 4, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(scaled.rotate(x, tau, "q"), plain.rotate(x, tau / 4, "q"),
                               rtol=1e-5, atol=1e-5)  # fmt: skip


def test_length_dependent_scaling_names_bad_positions():
    enc = relpos.create("m-rope", num_heads=1, head_dim=16, max_position_embeddings=8,
                        scaling={"rope_type": "dynamic", "factor": 2.0})  # fmt: skip
    q, k = _qk(1, 3, 3, 16)
    good = torch.zeros(1, 3, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="k_pos"):
        enc.rotate_qk(q, k, good, good - 1)
    with pytest.raises(ValueError, match="q_pos"):
        enc.rotate_qk(q, k, torch.full((1, 3, 3), math.nan), good.double())


def test_rope_mixed_refuses_a_scaling_by_name_and_rotates_partially():
    """RoPE-Mixed learns its frequencies: a scaling dict (and the length it reads) is a
    ValueError naming the option; a partial rotary factor rotates the first channels."""
    with pytest.raises(ValueError, match="scaling"):
        relpos.create("rope-mixed", num_heads=2, head_dim=16, scaling=dict(SCALINGS["yarn"][0]))
    with pytest.raises(ValueError, match="max_position_embeddings"):
        relpos.create("rope-mixed", num_heads=2, head_dim=16, max_position_embeddings=64)
    enc = relpos.create("rope-mixed", num_heads=2, head_dim=16, partial_rotary_factor=0.5)
    assert enc.freq.shape == (2, 4, 2)
    x = torch.randn(1, 2, 3, 16, generator=torch.Generator().manual_seed(4))
    out = enc.rotate(x, torch.tensor([[[1.0, 2.0], [3.0, -1.0], [0.5, 7.0]]]), "q")
    torch.testing.assert_close(out[..., 8:], x[..., 8:], rtol=0, atol=0)
    assert not torch.allclose(out[..., :8], x[..., :8])


@pytest.mark.parametrize(
    "params",
    [
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
        {"rope_type": "dynamic", "factor": 2.0},
        {"rope_type": "linear", "factor": 3.0},
    ],
    ids=lambda p: p["rope_type"],
)
def test_scaled_mrope_matches_transformers_qwen2_vl(params):
    """Qwen2-VL with a scaling in ``rope_parameters`` (transformers computes the scaled
    frequencies, then assigns the sections): the same rotation, on a video between texts whose
    ids pass the trained length (dynamic NTK engages)."""
    tf = pytest.importorskip("transformers")
    from transformers.models.qwen2_vl import modeling_qwen2_vl as mod

    head_dim, section, trained = 64, [8, 12, 12], 32
    cfg = tf.Qwen2VLTextConfig(hidden_size=128, num_attention_heads=2, head_dim=head_dim,
                               max_position_embeddings=trained,
                               rope_parameters={**params, "rope_theta": 1e4,
                                                "mrope_section": section})  # fmt: skip
    emb = mod.Qwen2VLRotaryEmbedding(cfg)
    ids = multimodal_position_ids([("text", 30), ("video", (2, 4, 6), 3), ("text", 12)],
                                  spatial_merge=2)  # fmt: skip
    assert int(ids.max()) + 1 > trained
    L = ids.shape[0]
    gen = torch.Generator().manual_seed(0)
    q, k = (
        torch.randn(1, 2, L, head_dim, generator=gen),
        torch.randn(1, 2, L, head_dim, generator=gen),
    )
    cos, sin = emb(q, ids.T[:, None, :])
    ref_q, ref_k = mod.apply_rotary_pos_emb(q, k, cos, sin)
    enc = relpos.create("m-rope", num_heads=2, head_dim=head_dim, base=1e4, mrope_section=section,
                        scaling=dict(params), max_position_embeddings=trained)  # fmt: skip
    got_q, got_k = enc.rotate_qk(q, k, ids[None], ids[None])
    torch.testing.assert_close(got_q, ref_q, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_k, ref_k, rtol=1e-5, atol=1e-5)
    plain = relpos.create("m-rope", num_heads=2, head_dim=head_dim, base=1e4, mrope_section=section)
    assert not torch.allclose(plain.rotate(k, ids[None], "k"), ref_k, atol=1e-3)  # it scaled
