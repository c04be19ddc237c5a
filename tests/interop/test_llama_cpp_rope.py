"""llama.cpp's rope types (NORMAL, NEOX, MROPE, IMROPE, VISION) as relpos encodings.

The reference is ggml's CPU rope (ggml-org/llama.cpp ``ggml/src/ggml-cpu/ops.cpp``:
``ggml_rope_cache_init``, ``ggml_mrope_cache_init``, ``rotate_pairs``) restated here in numpy
float64: pair ``j``'s angle is ``p_axis * theta_scale^k`` with ``theta_scale =
base^(-2/n_dims)``, ``k = j`` (or ``j - section start`` in VISION), and the pair's channels
are ``(2j, 2j+1)`` (NORMAL), ``(j, j + n_dims/2)`` (NEOX, MROPE, IMROPE) or
``(j, j + n_dims)`` (VISION). relpos rotates in float32 with float64 angles.

The position rows of MROPE / IMROPE are the four llama.cpp gives its language model's
tokens (``src/llama-graph.cpp`` ``llm_graph_input_pos::set_input`` for text,
``tools/mtmd/mtmd-helper.cpp`` ``decode_embd_batch`` for images): ``(p, p, p, 0)`` for text,
``(p0, p0 + y, p0 + x, 0)`` for an image's tokens; arbitrary rows check the rest.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import relpos
from relpos.interop.llama_cpp_rope import (
    IMROPE,
    MROPE,
    NEOX,
    NORMAL,
    VISION,
    imrope_pair_axes,
    llama_cpp_positions,
    mrope_pair_axes,
    rope_encoding,
    rope_type_of,
)


def ggml_rope(x: np.ndarray, pos: np.ndarray, mode: int, base: float, n_dims: int, sections):
    """ggml's rope of ``x (L, D)`` at positions ``pos (L, 4)`` (``(L,)`` for NORMAL / NEOX)."""
    L, D = x.shape
    out = x.copy()
    theta_scale = base ** (-2.0 / n_dims)
    ne0 = D
    for t in range(L):
        cache = []
        if mode in (NORMAL, NEOX):
            theta = float(pos[t])
            for _ in range(0, ne0, 2):
                cache.append(theta)
                theta *= theta_scale
        else:
            s = list(sections) + [0] * (4 - len(sections))
            sect_dims = sum(s)
            sec_w, sec_e = s[0] + s[1], s[0] + s[1] + s[2]
            th = [float(pos[t, a]) for a in range(4)]
            for i0 in range(0, ne0, 2):
                sector = (i0 // 2) % sect_dims
                if mode == VISION:  # indep_sects: restart each section's theta
                    if sector == 0:
                        th[0] = float(pos[t, 0])
                    elif sector == s[0]:
                        th[1] = float(pos[t, 1])
                    elif sector == sec_w:
                        th[2] = float(pos[t, 2])
                    elif sector == sec_e:
                        th[3] = float(pos[t, 3])
                if mode == IMROPE:
                    if sector % 3 == 1 and sector < 3 * s[1]:
                        theta = th[1]
                    elif sector % 3 == 2 and sector < 3 * s[2]:
                        theta = th[2]
                    elif sector % 3 == 0 and sector < 3 * s[0]:
                        theta = th[0]
                    else:
                        theta = th[3]
                else:
                    theta = th[0]
                    if s[0] <= sector < sec_w:
                        theta = th[1]
                    elif sec_w <= sector < sec_w + s[2]:
                        theta = th[2]
                    elif sector >= sec_w + s[2]:
                        theta = th[3]
                cache.append(theta)
                th = [v * theta_scale for v in th]
        if mode == NORMAL:
            pairs = [(2 * j, 2 * j + 1) for j in range(n_dims // 2)]
        elif mode == VISION:
            pairs = [(j, j + n_dims) for j in range(ne0 // 2)]
        else:
            pairs = [(j, j + n_dims // 2) for j in range(n_dims // 2)]
        for j, (a, b) in enumerate(pairs):
            c, sn = np.cos(cache[j]), np.sin(cache[j])
            out[t, a] = x[t, a] * c - x[t, b] * sn
            out[t, b] = x[t, a] * sn + x[t, b] * c
    return out


def relpos_rope(name: str, options: dict, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
    enc = relpos.create(name, num_heads=1, head_dim=x.shape[1], **options)
    xt = torch.tensor(x, dtype=torch.float32)[None, None]
    p = torch.tensor(pos)[None]
    return enc.rotate(xt, p, "q")[0, 0].double().numpy()


def _inputs(L: int, D: int, axes: int | None, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((L, D))
    if axes is None:
        return x, rng.integers(0, 500, L)
    return x, rng.integers(0, 60, (L, axes))


@pytest.mark.parametrize(("mode", "rotary_dim"), [(NORMAL, 32), (NEOX, 32), (NEOX, 16)])
def test_normal_and_neox_are_rope_with_their_pairing(mode: int, rotary_dim: int) -> None:
    x, pos = _inputs(7, 32, None)
    name, options = rope_encoding(mode, head_dim=32, base=1e4, rotary_dim=rotary_dim)
    assert name == "rope"
    expected = ggml_rope(x, pos, mode, 1e4, rotary_dim, None)
    np.testing.assert_allclose(relpos_rope(name, options, x, pos), expected, atol=2e-5)


@pytest.mark.parametrize("sections", [[4, 2, 2, 0], [2, 2, 2, 2]])
def test_mrope_is_m_rope_or_four_contiguous_sections(sections: list[int]) -> None:
    x, pos = _inputs(6, 16, 4)
    name, options = rope_encoding(MROPE, head_dim=16, base=1e4, sections=sections)
    assert name == ("m-rope" if sections[3] == 0 else "rope-hierarchical")
    relpos_pos = pos[:, :3] if name == "m-rope" else pos
    expected = ggml_rope(x, pos, MROPE, 1e4, 16, sections)
    np.testing.assert_allclose(relpos_rope(name, options, x, relpos_pos), expected, atol=2e-5)


def test_imrope_is_interleaved_m_rope_when_no_pair_falls_to_the_fourth_axis() -> None:
    sections = [4, 4, 4, 0]  # 12 pairs: h takes 1, 4, 7, 10; w takes 2, 5, 8, 11
    assert 3 not in imrope_pair_axes(sections, 12)
    x, pos = _inputs(6, 24, 4)
    name, options = rope_encoding(IMROPE, head_dim=24, base=1e4, sections=sections)
    assert options["interleaved_sections"] is True
    expected = ggml_rope(x, pos, IMROPE, 1e4, 24, sections)
    np.testing.assert_allclose(relpos_rope(name, options, x, pos[:, :3]), expected, atol=2e-5)


def _qwen3_vl_rows(start: int = 0) -> np.ndarray:
    """llama.cpp's four rows for 5 text tokens from ``start``, a 3 x 4 image after them, then
    3 text tokens (the image takes ``max(nx, ny) = 4`` positions; mtmd's ``n_pos``)."""
    text = [(p, p, p, 0) for p in range(start, start + 5)]
    p0 = start + 5
    image = [(p0, p0 + y, p0 + x, 0) for y in range(3) for x in range(4)]
    after = [(p, p, p, 0) for p in range(p0 + 4, p0 + 7)]
    return np.array(text + image + after)


QWEN3_VL = {"head_dim": 128, "base": 5e6, "sections": [24, 20, 20, 0]}


def test_imrope_of_qwen3_vl_sections_is_m_rope_with_the_fourth_axis() -> None:
    # [24, 20, 20] over 64 pairs: pairs 61 and 62 take llama.cpp's fourth position e
    axes = imrope_pair_axes(QWEN3_VL["sections"], 64)
    assert axes[61:63] == [3, 3] and axes.count(0) == 22 and 3 not in axes[:61] + axes[63:]
    name, options = rope_encoding(IMROPE, **QWEN3_VL)
    assert name == "m-rope" and options["mrope_section"] == [24, 20, 20, 0]
    enc = relpos.create(name, num_heads=1, head_dim=128, **options)
    assert enc.dims == 4 and enc.pair_axes().tolist() == axes
    rng = np.random.default_rng(3)
    x = rng.standard_normal((20, 128))
    same = np.repeat(np.arange(100_000, 100_020)[:, None], 4, 1)  # e = t too
    rows = (_qwen3_vl_rows(), _qwen3_vl_rows(250_000), same, rng.integers(0, 300, (20, 4)))
    for pos in rows:  # as llama.cpp fills them, one position on all four, any four rows
        expected = ggml_rope(x, pos, IMROPE, 5e6, 128, QWEN3_VL["sections"])
        np.testing.assert_allclose(relpos_rope(name, options, x, pos), expected, atol=2e-5)


def test_llama_cpps_qwen3_vl_leaves_the_pairs_on_e_unturned_where_transformers_turns_them():
    """With llama.cpp's rows (e = 0 for every token) pairs 61 and 62 keep their channels;
    transformers' Qwen3-VL (three sections, same ids on t, h, w) turns them by t, at
    frequencies 4.1e-7 and 3.2e-7 (0.1 rad at position 250000). Every other pair agrees."""
    rows = _qwen3_vl_rows(start=250_000)
    x = np.random.default_rng(4).standard_normal((len(rows), 128))
    llama_cpp = ggml_rope(x, rows, IMROPE, 5e6, 128, QWEN3_VL["sections"])
    hf_options = {"base": 5e6, "mrope_section": [24, 20, 20], "interleaved_sections": True}
    hf_style = relpos_rope("m-rope", hf_options, x, rows[:, :3])
    on_e = np.array([61, 62, 61 + 64, 62 + 64])
    np.testing.assert_allclose(llama_cpp[:, on_e], x[:, on_e], atol=1e-12)  # unturned
    assert np.abs(hf_style[:, on_e] - x[:, on_e]).max() > 1e-2
    rest = np.setdiff1d(np.arange(128), on_e)
    np.testing.assert_allclose(hf_style[:, rest], llama_cpp[:, rest], atol=2e-5)


def test_llama_cpp_positions_append_a_zero_fourth_row() -> None:
    ids = torch.tensor(_qwen3_vl_rows()[:, :3])
    assert torch.equal(llama_cpp_positions(ids), torch.tensor(_qwen3_vl_rows()))
    text = llama_cpp_positions(torch.arange(4)[None])
    assert text.shape == (1, 4, 4) and text[0, 2].tolist() == [2, 2, 2, 0]
    with pytest.raises(TypeError, match="integer tensor"):
        llama_cpp_positions(torch.zeros(3, 3))


def test_mrope_with_four_contiguous_sections_is_m_rope_on_four_axes() -> None:
    sections = [2, 2, 2, 2]
    x, pos = _inputs(6, 16, 4)
    expected = ggml_rope(x, pos, MROPE, 1e4, 16, sections)
    options = {"base": 1e4, "mrope_section": sections}
    assert mrope_pair_axes(sections, 8) == [0, 0, 1, 1, 2, 2, 3, 3]
    np.testing.assert_allclose(relpos_rope("m-rope", options, x, pos), expected, atol=2e-5)


def test_m_rope_names_positions_without_its_axes() -> None:
    enc = relpos.create("m-rope", num_heads=1, head_dim=128, mrope_section=[24, 20, 20, 0],
                        interleaved_sections=True)  # fmt: skip
    with pytest.raises(ValueError, match=r"\(B, L, 4\) on the axes \(t, h, w, e\)"):
        enc.rotate(torch.zeros(1, 1, 3, 128), torch.zeros(1, 3, 3, dtype=torch.long), "q")
    with pytest.raises(ValueError, match="3 pair counts .* or 4"):
        relpos.create("m-rope", num_heads=1, head_dim=16, mrope_section=[2, 2, 2, 1, 1])


@pytest.mark.parametrize("sections", [[4, 4, 4, 4], [6, 2, 0, 0]])
def test_vision_is_rope_axial_with_restarting_spectra(sections: list[int]) -> None:
    x, pos = _inputs(5, 16, 4)
    name, options = rope_encoding(VISION, head_dim=16, base=1e4, sections=sections)
    assert name == "rope-axial" and options["layout"] == "half"
    expected = ggml_rope(x, pos, VISION, 1e4, 8, sections)
    used = options["dims"]
    np.testing.assert_allclose(relpos_rope(name, options, x, pos[:, :used]), expected, atol=2e-5)


def test_unknown_architecture_and_uncovered_sections_are_refused() -> None:
    assert rope_type_of("llama") == NORMAL and rope_type_of("qwen2") == NEOX
    assert rope_type_of("qwen2vl") == MROPE and rope_type_of("qwen3vl") == IMROPE
    with pytest.raises(ValueError, match="'mamba'"):
        rope_type_of("mamba")
    with pytest.raises(ValueError, match="cover the 8 rotary pairs"):
        rope_encoding(MROPE, head_dim=16, base=1e4, sections=[2, 2, 2, 0])
