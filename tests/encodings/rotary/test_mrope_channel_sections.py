"""``m-rope`` with ``section_split="channels"``: HunYuanVL's per-channel M-RoPE sections.

transformers' HunYuanVL (``models/hunyuan_vl/modeling_hunyuan_vl.py``) splits the doubled
vector ``cat(freqs, freqs)`` in bands of ``2 * mrope_section[a]`` channels, band ``a`` on
position axis ``a``, so channel ``c`` of the half layout turns by ``pos[a(c)] *
theta_(c mod D/2)``: the two channels of a pair may take different axes. The oracle is
transformers' own ``HunYuanVLRotaryEmbedding`` and ``apply_rotary_pos_emb``; the pinned case is
a float64 restatement of that formula written here.
"""

from __future__ import annotations

import math

import pytest
import torch

import relpos

HEADS = 2


def hunyuan_vl(head_dim: int, sections: list[int], alpha: float | None):
    """transformers' HunYuanVL rotary module of a tiny text config, and its module."""
    tf = pytest.importorskip("transformers")
    from transformers.models.hunyuan_vl import modeling_hunyuan_vl as mod

    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": sections}
    if alpha is not None:  # the checkpoints' "dynamic" with a fixed alpha: ntk_alpha
        rope = {**rope, "rope_type": "dynamic", "alpha": alpha, "factor": 1.0}
    cfg = tf.HunYuanVLTextConfig(hidden_size=HEADS * head_dim, num_attention_heads=HEADS,
                                 head_dim=head_dim, num_hidden_layers=1, vocab_size=16,
                                 rope_parameters=rope)  # fmt: skip
    return mod.HunYuanVLRotaryEmbedding(cfg), mod


def channel_mrope(head_dim: int, sections: list[int], alpha: float | None, **options):
    scaling = None if alpha is None else {"rope_type": "ntk_alpha", "alpha": alpha}
    return relpos.create("m-rope", num_heads=HEADS, head_dim=head_dim, base=10000.0,
                         mrope_section=sections, scaling=scaling, **options)  # fmt: skip


def positions(kind: str, axes: int, length: int, gen: torch.Generator) -> torch.Tensor:
    """``(1, L, axes)``: text repeats one position on every axis; "image" is a text prefix
    then a grid whose axes differ (HunYuanVL's order: the extra axes after the first)."""
    text = torch.arange(length)[:, None].expand(length, axes)
    if kind == "text":
        return text[None].clone()
    out = text.clone()
    out[3:] = torch.randint(0, 40, (length - 3, axes), generator=gen)
    return out[None]


def reference(head_dim, sections, alpha, pos, q, k):
    emb, mod = hunyuan_vl(head_dim, sections, alpha)
    cos, sin = emb(q, pos.permute(2, 0, 1))  # transformers: (axes, B, L)
    return mod.apply_rotary_pos_emb(q, k, cos, sin)


CASES = [  # head_dim, mrope_section (summing to head_dim / 2), ntk alpha
    (16, [2, 3, 3], None),
    (16, [2, 2, 2, 2], 1000.0),
    (32, [4, 4, 4, 4], None),
    (32, [8, 3, 5], 1000.0),
]


@pytest.mark.parametrize("kind", ["text", "image"])
@pytest.mark.parametrize(("head_dim", "sections", "alpha"), CASES)
def test_matches_transformers_hunyuan_vl(head_dim, sections, alpha, kind):
    gen = torch.Generator().manual_seed(head_dim + len(sections))
    L = 12
    pos = positions(kind, len(sections), L, gen)
    q = torch.randn(1, HEADS, L, head_dim, generator=gen)
    k = torch.randn(1, HEADS, L, head_dim, generator=gen)
    ref_q, ref_k = reference(head_dim, sections, alpha, pos, q, k)
    enc = channel_mrope(head_dim, sections, alpha, section_split="channels")
    torch.testing.assert_close(enc.rotate(q, pos, "q"), ref_q, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(enc.rotate(k, pos, "k"), ref_k, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("head_dim", "sections", "alpha"), CASES)
def test_pair_sections_differ_from_transformers_on_image_tokens(head_dim, sections, alpha):
    """The oracle test can fail: Qwen2-VL's contiguous pair sections and Qwen3-VL's
    interleaved ones give other q on the same image positions (and agree on text)."""
    gen = torch.Generator().manual_seed(1)
    L = 12
    q = torch.randn(1, HEADS, L, head_dim, generator=gen)
    image = positions("image", len(sections), L, gen)
    text = positions("text", len(sections), L, gen)
    ref_image, _ = reference(head_dim, sections, alpha, image, q, q)
    ref_text, _ = reference(head_dim, sections, alpha, text, q, q)
    for options in ({}, {"interleaved_sections": True}):
        pairs = channel_mrope(head_dim, sections, alpha, **options)
        assert not torch.allclose(pairs.rotate(q, image, "q"), ref_image, rtol=1e-3, atol=1e-3)
        torch.testing.assert_close(pairs.rotate(q, text, "q"), ref_text, rtol=1e-5, atol=1e-6)


def test_pinned_float64_restatement():
    """head_dim 8, mrope_section [1, 1, 2], base 100, one token at (3, 5, 7): channels 0-1 on
    axis 0, 2-3 on axis 1, 4-7 on axis 2; channel c turns by pos[a(c)] * 100^(-2 (c mod 4)/8),
    ``y = x cos + rotate_half(x) sin``."""
    x = [0.5, -1.0, 1.5, 2.0, -0.25, 0.75, -1.25, 1.0]
    pos, axes = [3, 5, 7], [0, 0, 1, 1, 2, 2, 2, 2]
    restated = []
    for c in range(8):
        angle = pos[axes[c]] * 100.0 ** (-2 * (c % 4) / 8)
        partner = -x[c + 4] if c < 4 else x[c - 4]
        restated.append(x[c] * math.cos(angle) + partner * math.sin(angle))
    pinned = [-0.459716246285, -1.192240283184, 1.915655766091, 1.817596141768,
              0.140017735774, -1.249999691055, 0.010273796751, 1.414712061113]  # fmt: skip
    assert restated == pytest.approx(pinned, abs=1e-11)
    enc = relpos.create("m-rope", num_heads=1, head_dim=8, base=100.0, mrope_section=[1, 1, 2],
                        section_split="channels")  # fmt: skip
    xt = torch.tensor(x, dtype=torch.float64).view(1, 1, 1, 8)
    out = enc.rotate(xt, torch.tensor([[pos]]), "q").flatten().tolist()
    # angles are formed in float64 and rounded to float32 (functional.rope_angles' policy)
    assert out == pytest.approx(pinned, abs=1e-6)


def test_text_tokens_are_plain_rope():
    enc = channel_mrope(32, [8, 3, 5], None, section_split="channels")
    rope = relpos.create("rope", num_heads=HEADS, head_dim=32, base=10000.0)
    x = torch.randn(1, HEADS, 9, 32)
    pos = torch.arange(9)
    text = pos[None, :, None].expand(1, 9, 3)
    torch.testing.assert_close(enc.rotate(x, text, "q"), rope.rotate(x, pos[None], "q"))


def test_not_relative_and_image_scores_see_absolute_positions():
    enc = channel_mrope(16, [2, 3, 3], None, section_split="channels")
    assert enc.relative is False
    assert enc.capabilities()["relative"] is False
    gen = torch.Generator().manual_seed(2)
    q, k = (torch.randn(1, HEADS, 6, 16, generator=gen) for _ in range(2))
    image = torch.randint(0, 30, (1, 6, 3), generator=gen)
    text = torch.arange(6)[None, :, None].expand(1, 6, 3)
    for pos, relative in ((text, True), (image, False)):
        ref = relpos.scores(q, k, enc, q_pos=pos, k_pos=pos)
        moved = relpos.scores(q, k, enc, q_pos=pos + 7, k_pos=pos + 7)
        assert torch.allclose(ref, moved, rtol=1e-5, atol=1e-5) == relative


def test_one_axis_for_both_channels_of_every_pair_is_relative():
    """All bands on one axis: every pair is rotated by one angle (plain RoPE on that axis)."""
    enc = channel_mrope(16, [8, 0, 0], None, section_split="channels")
    assert enc.relative is True
    pairs = channel_mrope(16, [8, 0, 0], None)
    x = torch.randn(1, HEADS, 5, 16)
    pos = torch.randint(0, 50, (1, 5, 3))
    torch.testing.assert_close(enc.rotate(x, pos, "q"), pairs.rotate(x, pos, "q"))


@pytest.mark.parametrize("backend", ["sdpa", "chunked"])
def test_backends_agree_with_eager(backend):
    enc = channel_mrope(16, [2, 2, 2, 2], 1000.0, section_split="channels")
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, HEADS, 10, 16, generator=gen) for _ in range(3))
    pos = torch.randint(0, 30, (2, 10, 4), generator=gen)
    kw = {"q_pos": pos, "k_pos": pos, "causal": True}
    ref = relpos.attention(q, k, v, enc, backend="eager", **kw)
    out = relpos.attention(q, k, v, enc, backend=backend, **kw)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"layout": "interleaved"}, "layout"),
        ({"interleaved_sections": True}, "interleaved_sections"),
        ({"axis_of_pair": [0] * 8, "mrope_section": None}, "axis_of_pair"),
        ({"mrope_section": [2, 2, 2]}, "mrope_section"),
        ({"section_split": "pair"}, "section_split"),
    ],
)
def test_bad_combinations_are_refused_by_name(options, named):
    kw = {"mrope_section": [2, 3, 3], "section_split": "channels", **options}
    with pytest.raises(ValueError, match=named):
        relpos.create("m-rope", num_heads=HEADS, head_dim=16, **kw)


def test_no_pair_frequency_matrix_and_positions_named():
    enc = channel_mrope(16, [2, 3, 3], None, section_split="channels")
    with pytest.raises(ValueError, match="section_split='channels'"):
        enc.frequency_matrix(torch.device("cpu"))  # a rotation schedule (RoLA) does not exist
    with pytest.raises(ValueError, match=r"\(B, L, 3\)"):
        enc.rotate(torch.randn(1, HEADS, 4, 16), torch.arange(4)[None], "q")
