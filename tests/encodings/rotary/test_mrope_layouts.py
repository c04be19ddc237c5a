"""``m-rope`` with ``axis_of_pair`` states Ernie 4.5 VL's, Bailing's and openPangu's
per-pair axis layouts exactly.

The references below are float64 restatements, written here from reading the vLLM modules
(``vllm/model_executor/layers/rotary_embedding/``): ``ernie45_vl_rope.py`` (its
``forward_native`` picks height cos/sin from the even pairs of position row 1, width from
the odd pairs of row 2, time from the last ``t`` pairs of row 0), ``bailing_mrope.py``
(``select_cos_sin``: the same picks by a mask, ``[t, h, w]`` sections) and
``mrope_interleaved.py`` (``get_mrope_interleaved_id_list`` with ``force_last=True`` and
``_rebuild_pos_emb``); then vLLM's ``ApplyRotaryEmb`` on the first ``rotary_dim`` channels,
GPT-J pairs where the model builds its rotary with ``is_neox_style=False`` (Ernie 4.5 VL,
Bailing-MoE-V3), NeoX halves otherwise (openPangu). transformers' Ernie 4.5 VL text rotary is
the second oracle (transformers has no Bailing or openPangu multimodal model).
"""

from __future__ import annotations

import pytest
import torch

import relpos
from relpos.encodings.rotary.mrope_layouts import bailing_axes, ernie45_vl_axes, openpangu_axes

TOL = 1e-6  # float32 result against the float64 reference (angles reduced in float64)
TOL_INT = 2e-5  # int64 positions < 300: float32 angles, as the models form them


# ----------------------------------------------------------------- float64 references
def _angles(rows: torch.Tensor, rotary_dim: int, base: float) -> torch.Tensor:
    """``(3, N, rotary_dim / 2)`` float64: every position row times every frequency (the
    rows of vLLM's ``cos_sin_cache[positions]``)."""
    inv_freq = base ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    return rows.to(torch.float64)[..., None] * inv_freq


def _ernie_angles(rows: torch.Tensor, section: list[int], rotary_dim: int, base: float):
    """``ernie45_vl_rope.py``: ``section = [h, w, t]``; height from row 1 at pairs
    ``0, 2, ...`` below ``h + w``, width from row 2 at ``1, 3, ...``, stacked back in pair
    order; time from row 0 at the last ``t`` pairs."""
    h, w, t = section
    a = _angles(rows, rotary_dim, base)
    a_h, a_w, a_t = a[1, :, 0 : h + w : 2], a[2, :, 1 : h + w : 2], a[0, :, -t:]
    return torch.cat((torch.stack((a_h, a_w), -1).flatten(-2), a_t), -1)


def _bailing_angles(rows: torch.Tensor, section: list[int], rotary_dim: int, base: float):
    """``bailing_mrope.py``: ``section = [t, h, w]``; below ``spatial = h + w`` an even pair
    takes row 1, an odd pair row 2; from ``spatial`` on, row 0."""
    _, h, w = section
    spatial = h + w
    a = _angles(rows, rotary_dim, base)
    even = (torch.arange(spatial) % 2 == 0)[None]
    return torch.cat(
        (torch.where(even, a[1, :, :spatial], a[2, :, :spatial]), a[0, :, spatial:]), -1
    )


def _pangu_id_list(t: int, h: int, w: int) -> list[int]:
    """``get_mrope_interleaved_id_list(t, h, w, force_last=True)`` as read: hold one ``t``
    back; repeatedly take, among the ids with some left and not equal to the last one taken
    (all ids with some left if none), the one minimising ``(placed / count, id)``; append the
    held-back 0."""
    count = [t - 1, h, w]
    placed, remaining, out, last = [0, 0, 0], list(count), [], None
    for _ in range(sum(count)):
        ids = [i for i in range(3) if remaining[i] > 0 and i != last]
        if not ids:
            ids = [i for i in range(3) if remaining[i] > 0]
        best = sorted(ids, key=lambda i: (placed[i] / count[i], i))[0]
        out.append(best)
        placed[best] += 1
        remaining[best] -= 1
        last = best
    return out + [0]


def _pangu_angles(rows: torch.Tensor, section: list[int], rotary_dim: int, base: float):
    """``mrope_interleaved.py``: pair ``p`` (its cos and its sin alike) from row
    ``id_list[p]``."""
    a = _angles(rows, rotary_dim, base)
    ids = _pangu_id_list(*section)
    return torch.stack([a[row, :, p] for p, row in enumerate(ids)], -1)


def _vllm_rotate(x: torch.Tensor, angles: torch.Tensor, neox: bool) -> torch.Tensor:
    """vLLM's ``ApplyRotaryEmb`` (float64) on the first ``2 * angles.shape[-1]`` channels of
    ``x (B, H, N, D)``; the rest pass through. ``angles (N, r / 2)``."""
    half = angles.shape[-1]
    rot, rest = x[..., : 2 * half].double(), x[..., 2 * half :].double()
    cos, sin = angles.cos(), angles.sin()
    if neox:
        x1, x2 = rot[..., :half], rot[..., half:]
    else:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
    o1, o2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    out = torch.cat((o1, o2), -1) if neox else torch.stack((o1, o2), -1).flatten(-2)
    return torch.cat((out, rest), -1)


# name: (reference angles, relpos axis list, GPT-J pairs in the model)
MODELS = {
    "ernie45_vl": (_ernie_angles, ernie45_vl_axes, True),
    "bailing": (_bailing_angles, bailing_axes, True),
    "openpangu": (_pangu_angles, openpangu_axes, False),
}
# (model, head_dim, partial_rotary_factor, mrope_section in the model's order, base)
CASES = [
    ("ernie45_vl", 24, 1.0, [4, 4, 4], 5e5),
    ("ernie45_vl", 128, 1.0, [22, 22, 20], 5e5),  # Ernie 4.5 VL's default sections
    ("bailing", 24, 1.0, [4, 4, 4], 6e6),
    ("bailing", 64, 1.0, [8, 12, 12], 6e6),  # Bailing-MoE-V3: qk_rope_head_dim 64
    ("bailing", 32, 0.75, [2, 5, 5], 1e4),  # partial rotary: 24 of 32 channels
    ("openpangu", 24, 1.0, [2, 5, 5], 1e4),
    ("openpangu", 128, 1.0, [16, 24, 24], 1e6),
    ("openpangu", 64, 1.0, [3, 5, 24], 1e4),  # uneven sections: the greedy order's ties
]


def _case(model, head_dim, p, section, base, positions, **overrides):
    """(relpos's rotated q, the float64 reference) at ``positions (N, 3)`` = (t, h, w)."""
    angles_of, axes_of, gptj = MODELS[model]
    torch.manual_seed(0)
    x = torch.rand(2, 3, positions.shape[0], head_dim) * 2 - 1  # entries in [-1, 1]
    options = {
        "base": base,
        "partial_rotary_factor": p,
        "layout": "interleaved" if gptj else "half",
        "axis_of_pair": axes_of(section),
        **overrides,
    }
    enc = relpos.create("m-rope", num_heads=3, head_dim=head_dim, **options)
    rotary_dim = int(head_dim * p)
    ref = _vllm_rotate(x, angles_of(positions.T, section, rotary_dim, base), neox=not gptj)
    return enc.rotate(x, positions[None], "q"), ref


def _positions(n: int, high: int, dtype: torch.dtype) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1)
    return torch.randint(0, high, (n, 3), generator=generator).to(dtype)


# ----------------------------------------------------------------- the axis lists
def test_axis_lists_pinned():
    # vLLM's own test of bailing_mrope.py picks rows [1, 2, 1, 2, 0, 0] for [2, 2, 2]
    assert bailing_axes([2, 2, 2]) == [1, 2, 1, 2, 0, 0]
    assert bailing_axes([3, 0, 0]) == [0, 0, 0]
    assert ernie45_vl_axes([2, 2, 2]) == [1, 2, 1, 2, 0, 0]  # [h, w, t]: same model rows
    assert ernie45_vl_axes([1, 1, 3]) == [1, 2, 0, 0, 0]
    # openPangu, traced by hand: [2, 1, 1] holds one t back, places 0 (all tied), 1, 2 (0 is
    # used up), then the held-back 0
    assert openpangu_axes([2, 1, 1]) == [0, 1, 2, 0]
    got = openpangu_axes([16, 24, 24])
    assert got[:11] == [0, 1, 2, 1, 2, 0, 1, 2, 1, 2, 0]  # not Qwen3-VL's 0, 1, 2, 0, 1, 2
    assert [got.count(a) for a in range(3)] == [16, 24, 24] and got[-1] == 0
    assert all(a != b for a, b in zip(got[:-1], got[1:], strict=True))  # no axis twice in a row


@pytest.mark.parametrize("section", [[1, 1, 1], [2, 3, 4], [9, 2, 20], [5, 0, 7], [3, 5, 8]])
def test_openpangu_axes_follow_the_greedy_order_as_read(section):
    assert openpangu_axes(section) == _pangu_id_list(*section)


# ----------------------------------------------------------------- against the references
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-{c[3]}")
def test_rotation_matches_the_vllm_module(case):
    """Integer positions (as float64: reduced modulo 2 pi in float64) up to 4096 per axis."""
    got, ref = _case(*case, _positions(40, 4096, torch.float64))
    torch.testing.assert_close(got.double(), ref, rtol=0, atol=TOL)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-{c[3]}")
def test_rotation_at_int64_positions(case):
    """int64 positions (the models' dtype): float32 angles, as vLLM's cache forms them."""
    got, ref = _case(*case, _positions(40, 300, torch.int64))
    torch.testing.assert_close(got.double(), ref, rtol=0, atol=TOL_INT)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-{c[3]}")
def test_text_tokens_are_plain_rope(case):
    """Equal ids on the three axes (text): every layout is the model's 1-D RoPE, pair ``p``
    turning by ``pos * theta_p``."""
    model, head_dim, p, section, base = case
    ids = torch.arange(0, 3000, 97, dtype=torch.float64)[:, None].expand(-1, 3)
    got, _ = _case(*case, ids)
    torch.manual_seed(0)
    x = torch.rand(2, 3, ids.shape[0], head_dim) * 2 - 1
    one_d = _angles(ids[:, 0], int(head_dim * p), base)
    ref = _vllm_rotate(x, one_d, neox=model == "openpangu")
    torch.testing.assert_close(got.double(), ref, rtol=0, atol=TOL)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-{c[3]}")
def test_other_layouts_fail_the_comparison(case):
    """Qwen3-VL's cycle and Qwen2-VL's bands with the same pair counts, and the other channel
    pairing, are far from the model: the comparison above can fail."""
    model, head_dim, p, section, base = case
    counts = [MODELS[model][1](section).count(a) for a in range(3)]
    pos = _positions(40, 4096, torch.float64)
    wrong = [
        {"axis_of_pair": None, "mrope_section": counts, "interleaved_sections": True},
        {"axis_of_pair": None, "mrope_section": counts},
        {"layout": "half" if MODELS[model][2] else "interleaved"},
    ]
    for overrides in wrong:
        got, ref = _case(*case, pos, **overrides)
        assert (got.double() - ref).abs().max() > 0.1, overrides


def test_matches_transformers_ernie45_vl():
    """transformers' own Ernie 4.5 VL text rotary (its ``inv_freq`` permutation and
    ``recomposition_frequencies``) and ``apply_rotary_pos_emb`` (GPT-J pairs)."""
    pytest.importorskip("transformers")
    from transformers.models.ernie4_5_vl_moe import modeling_ernie4_5_vl_moe as mod
    from transformers.models.ernie4_5_vl_moe.configuration_ernie4_5_vl_moe import (
        Ernie4_5_VLMoeTextConfig,
    )

    head_dim, section, theta = 64, [10, 10, 12], 5e5
    cfg = Ernie4_5_VLMoeTextConfig(hidden_size=2 * head_dim, num_attention_heads=2,
                                   rope_parameters={"rope_type": "default", "rope_theta": theta,
                                                    "mrope_section": section})  # fmt: skip
    emb = mod.Ernie4_5_VLMoeTextRotaryEmbedding(cfg)
    # (N, 3) = (t, h, w), the model's row order; < 64: transformers forms its inverse
    # frequencies and angles in float32 (about 1 ulp each), which TOL_INT covers there
    pos = _positions(30, 64, torch.int64)
    torch.manual_seed(0)
    q, k = torch.randn(1, 2, 30, head_dim), torch.randn(1, 2, 30, head_dim)
    cos, sin = emb(q, pos.T[:, None, :])
    ref_q, ref_k = mod.apply_rotary_pos_emb(q, k, cos, sin)
    enc = relpos.create("m-rope", num_heads=2, head_dim=head_dim, base=theta,
                        layout="interleaved", axis_of_pair=ernie45_vl_axes(section))  # fmt: skip
    torch.testing.assert_close(enc.rotate(q, pos[None], "q"), ref_q, rtol=0, atol=TOL_INT)
    torch.testing.assert_close(enc.rotate(k, pos[None], "k"), ref_k, rtol=0, atol=TOL_INT)
    qwen3 = relpos.create("m-rope", num_heads=2, head_dim=head_dim, base=theta,
                          layout="interleaved", mrope_section=[12, 10, 10],
                          interleaved_sections=True)  # fmt: skip
    assert not torch.allclose(qwen3.rotate(q, pos[None], "q"), ref_q, atol=1e-2)


# ----------------------------------------------------------------- errors
def test_layout_functions_refuse_what_the_models_cannot_compute():
    with pytest.raises(ValueError, match="Ernie 4.5 VL.*height and width sections must be equal"):
        ernie45_vl_axes([4, 6, 2])
    with pytest.raises(ValueError, match="Ernie 4.5 VL.*t >= 1"):
        ernie45_vl_axes([4, 4, 0])
    with pytest.raises(ValueError, match="Bailing.*equal"):
        bailing_axes([2, 4, 6])
    with pytest.raises(ValueError, match="openPangu.*t >= 1"):
        openpangu_axes([0, 4, 4])
    with pytest.raises(ValueError, match="openPangu.*two-section"):
        openpangu_axes([4, 4])
    with pytest.raises(ValueError, match=r"Bailing M-RoPE mrope_section \[t, h, w\]"):
        bailing_axes([1, 2])
    with pytest.raises(ValueError, match="Ernie 4.5 VL mrope_section"):
        ernie45_vl_axes([-2, -2, 4])
    with pytest.raises(TypeError, match="openPangu mrope_section"):
        openpangu_axes("16,24,24")


def test_axis_of_pair_is_checked_by_name():
    def make(**kw):
        return relpos.create("m-rope", num_heads=2, head_dim=12, **kw)

    with pytest.raises(ValueError, match="axis_of_pair must give one axis per rotated pair: 6"):
        make(axis_of_pair=[0, 1, 2, 0, 1])
    with pytest.raises(
        ValueError, match="one axis per rotated pair: 3 .*partial_rotary_factor=0.5"
    ):
        make(axis_of_pair=[0, 1, 2, 0, 1, 2], partial_rotary_factor=0.5)
    with pytest.raises(ValueError, match="axis_of_pair.*interleaved_sections"):
        make(axis_of_pair=[0, 1, 2, 0, 1, 2], interleaved_sections=True)
    with pytest.raises(ValueError, match="axis_of_pair.*without mrope_section"):
        make(axis_of_pair=[0, 1, 2, 0, 1, 2], mrope_section=[2, 2, 2])
    with pytest.raises(ValueError, match=r"axis_of_pair\[2\] must be an int in \[0, 2\]"):
        make(axis_of_pair=[0, 1, 3, 0, 1, 2])
    with pytest.raises(TypeError, match="axis_of_pair"):
        make(axis_of_pair=torch.tensor([0, 1, 2, 0, 1, 2]))
    enc = make(axis_of_pair=[2, 2, 1, 0, 0, 0])
    assert enc.pair_axes().tolist() == [2, 2, 1, 0, 0, 0] and enc.sections == [3, 1, 2]
    assert "axis_of_pair" in relpos.describe("m-rope")
