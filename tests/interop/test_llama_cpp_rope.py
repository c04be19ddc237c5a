"""llama.cpp's rope types (NORMAL, NEOX, MROPE, IMROPE, VISION) as relpos encodings.

The reference is ggml's CPU rope (ggml-org/llama.cpp ``ggml/src/ggml-cpu/ops.cpp``:
``ggml_rope_cache_init``, ``ggml_mrope_cache_init``, ``rotate_pairs``) restated here in numpy
float64: pair ``j``'s angle is ``p_axis * theta_scale^k`` with ``theta_scale =
base^(-2/n_dims)``, ``k = j`` (or ``j - section start`` in VISION), and the pair's channels
are ``(2j, 2j+1)`` (NORMAL), ``(j, j + n_dims/2)`` (NEOX, MROPE, IMROPE) or
``(j, j + n_dims)`` (VISION). relpos rotates in float32 with float64 angles.
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


def test_imrope_of_qwen3_vl_sections_is_refused_by_name() -> None:
    # [24, 20, 20] over 64 pairs: pairs 61 and 62 take llama.cpp's fourth position
    assert imrope_pair_axes([24, 20, 20, 0], 64)[61:63] == [3, 3]
    with pytest.raises(ValueError, match="IMROPE.*fourth position"):
        rope_encoding(IMROPE, head_dim=128, base=5e6, sections=[24, 20, 20, 0])


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
