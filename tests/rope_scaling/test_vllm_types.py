"""vLLM's RoPE types (``vllm/model_executor/layers/rotary_embedding/``) stated in relpos.

Each reference below is a float64 numpy restatement, written here, of what the named vLLM
module computes (vLLM 0.34.0, ``get_rope`` in ``__init__.py``), never relpos's code; relpos's
float32 frequencies must agree to float32 rounding and its rotations to float32 angles.

* ``base.py`` / ``common.py``: ``rotary_dim = int(head_size * partial_rotary_factor)``
  channels rotate, NeoX halves (``is_neox_style=True``) or GPT-J pairs (``False``);
* ``gemma4_rope.py``: ``"proportional"`` (exponents over ``head_size``, zero frequencies);
* ``llama4_vision_rope.py``: ``"mllama4"``, the Llama-4 vision 2-D RoPE;
* ``dynamic_ntk_scaling_rope.py``: ``"dynamic"`` with ``factor`` and ``max_trained_positions``;
* ``yarn_scaling_rope.py``: ``"yarn"`` (``attention_factor``, ``mscale``, ``truncate``), and
  ``telechat3-yarn`` as ``transformers_utils/config.py`` rewrites it; the earlier
  ``YaRNScalingRotaryEmbedding`` (vllm-project/vllm, same path, and the single
  ``vllm/model_executor/layers/rotary_embedding.py`` before it), whose ``get_rope`` passed
  ``extrapolation_factor``, ``attn_factor`` and later ``apply_yarn_scaling``;
* ``mrope.py``: M-RoPE with GPT-J pairs and partial rotary, and M-RoPE with YaRN;
* ``phi3_long_rope_scaled_rope.py``: ``"longrope"`` (factors and magnitude fixed at init);
* ``grok1_scaling_rope.py`` (an earlier vLLM; not in 0.34.0): Grok-1's four methods;
* ``fope.py``: ``"default"`` with ``use_fope`` (FoPE, ``FourierRotaryEmbedding``), the
  per-KV-head cos / sin cache read through vLLM's ``(T * Hkv, H / Hkv, D)`` view; 0.34.0 pads
  the clipped pairs' sin with 1, vLLM's main branch (read in vllm-project/vllm) with 0.
* ``deepseek_scaling_rope.py``: ``DeepseekV4ScalingRotaryEmbedding`` (``"deepseek_yarn"``
  with ``is_deepseek_v4``, as ``models/deepseek_v4``'s ``build_deepseek_v4_rope`` asks for
  it): GPT-J pairs over the *last* ``rotary_dim`` channels, and ``forward(..., inverse=True)``,
  the rotation by minus the angle.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import relpos
from relpos.functional import rope_frequencies

RTOL = 2e-7  # float32 rounding of a float64 reference
# YaRN's blend weight is formed in float32 (by vLLM too); its rounding, times up to the
# factor, reaches the blended frequencies
YARN_RTOL = 2e-6
ATOL_ROT = 2e-5  # rotated unit-scale vectors: float32 frequencies at positions < 300


def _plain(dim: int, base: float) -> np.ndarray:
    return base ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)


def _close(actual: torch.Tensor, expected: np.ndarray, rtol: float = RTOL) -> None:
    np.testing.assert_allclose(actual.double().numpy(), expected, rtol=rtol, atol=0)


def _vllm_rotate(x: np.ndarray, angles: np.ndarray, neox: bool, scale: float = 1.0):
    """vLLM's ``ApplyRotaryEmb`` on the first ``2 * angles.shape[-1]`` channels of ``x``
    (``x (..., L, D)``, ``angles (L, r/2)``), the rest passed through; cos / sin times
    ``scale`` (the cache's mscale)."""
    half = angles.shape[-1]
    rot, rest = x[..., : 2 * half], x[..., 2 * half :]
    cos, sin = np.cos(angles) * scale, np.sin(angles) * scale
    if neox:
        x1, x2 = rot[..., :half], rot[..., half:]
    else:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
    o1, o2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    out = np.concatenate((o1, o2), -1) if neox else np.stack((o1, o2), -1).reshape(rot.shape)
    return np.concatenate((out, rest), -1)


def _qk(head_dim: int, length: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, 2, length, head_dim, generator=g, dtype=torch.float64).float()


POSITIONS = torch.tensor([[0, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233]])


# ------------------------------------------------------------------------------ default


@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize(("head_dim", "partial"), [(64, 1.0), (64, 0.5), (48, 0.25)])
def test_default_partial_rotary_and_gptj_pairs_are_rope(neox: bool, head_dim: int, partial):
    rotary_dim = int(head_dim * partial)
    x = _qk(head_dim, POSITIONS.shape[1])
    angles = POSITIONS[0].double().numpy()[:, None] * _plain(rotary_dim, 1e4)[None]
    expected = _vllm_rotate(x.double().numpy(), angles, neox)
    enc = relpos.create(
        "rope",
        num_heads=2,
        head_dim=head_dim,
        partial_rotary_factor=partial,
        layout="half" if neox else "interleaved",
    )
    out = enc.rotate(x, POSITIONS, "q").double().numpy()
    np.testing.assert_allclose(out, expected, rtol=0, atol=ATOL_ROT)
    # the other pairing is a different model
    other = relpos.create(
        "rope",
        num_heads=2,
        head_dim=head_dim,
        partial_rotary_factor=partial,
        layout="interleaved" if neox else "half",
    )
    assert not np.allclose(other.rotate(x, POSITIONS, "q").double().numpy(), expected, atol=1e-3)


# ------------------------------------------------------------------------------ proportional


@pytest.mark.parametrize(("head_dim", "partial"), [(64, 0.25), (64, 1.0), (48, 0.5)])
def test_proportional_is_gemma4_rotary_embedding(head_dim: int, partial: float) -> None:
    """``Gemma4RotaryEmbedding``: ``int(head * p) // 2`` frequencies ``b^(-2i/head)``, then
    zeros up to ``head // 2``; the whole head rotates in NeoX halves."""
    kept = int(head_dim * partial) // 2
    theta = np.concatenate(
        (1e6 ** (-np.arange(0, 2 * kept, 2) / head_dim), np.zeros(head_dim // 2 - kept))
    )
    x = _qk(head_dim, POSITIONS.shape[1], seed=1)
    angles = POSITIONS[0].double().numpy()[:, None] * theta[None]
    expected = _vllm_rotate(x.double().numpy(), angles, neox=True)
    enc = relpos.create(
        "rope",
        num_heads=2,
        head_dim=head_dim,
        base=1e6,
        scaling={"rope_type": "proportional"},
        partial_rotary_factor=partial,
    )
    np.testing.assert_allclose(
        enc.rotate(x, POSITIONS, "q").double().numpy(), expected, rtol=0, atol=ATOL_ROT
    )


# ------------------------------------------------------------------------------ mllama4


def _llama4_vision_reference(x: np.ndarray, side: int, base: float) -> np.ndarray:
    """``Llama4VisionRotaryEmbedding`` with ``partial_rotary_factor=0.5``: ``r = head / 2``
    frequencies ``b^(-2j/r)``, ``j < r/2``; complex pair ``j`` (adjacent channels) turns by
    ``(x + 1) theta_j`` for ``j < r/2`` and ``(y + 1) theta_(j - r/2)`` after, for patch
    ``p = y * side + x``; the class token (appended last) does not turn."""
    head = x.shape[-1]
    r = head // 2
    theta = _plain(r, base)  # r / 2 frequencies
    patches = np.arange(side * side)
    px, py = patches % side + 1, patches // side + 1
    angles = np.concatenate((px[:, None] * theta, py[:, None] * theta), -1)
    angles = np.concatenate((angles, np.zeros((1, r))), 0)  # the class token
    z = (x[..., 0::2] + 1j * x[..., 1::2]) * np.exp(1j * angles)
    return np.stack((z.real, z.imag), -1).reshape(x.shape)


@pytest.mark.parametrize(("head_dim", "side"), [(88, 4), (32, 3)])
def test_mllama4_is_rope_axial_with_interleaved_pairs(head_dim: int, side: int) -> None:
    base = 1e4
    x = _qk(head_dim, side * side + 1, seed=2)
    expected = _llama4_vision_reference(x.double().numpy(), side, base)
    patches = torch.arange(side * side)
    pos = torch.stack((patches % side + 1, patches // side + 1), -1)
    pos = torch.cat((pos, torch.zeros(1, 2, dtype=pos.dtype)))[None]  # class token: (0, 0)
    enc = relpos.create(
        "rope-axial",
        num_heads=2,
        head_dim=head_dim,
        dims=2,
        sections=[head_dim // 4, head_dim // 4],
        base=base,
        layout="interleaved",
    )
    np.testing.assert_allclose(
        enc.rotate(x, pos, "q").double().numpy(), expected, rtol=0, atol=ATOL_ROT
    )


# ------------------------------------------------------------------------------ dynamic


@pytest.mark.parametrize(
    ("dim", "factor", "max_position", "trained"),
    [(64, 2.0, 8192, 4096), (128, 4.0, 32768, 2048), (64, 8.0, 4096, 4096)],
)
def test_vllm_dynamic_with_a_factor_is_static_ntk_alpha(dim, factor, max_position, trained):
    """``DynamicNTKScalingRotaryEmbedding`` fixes the base once:
    ``b (f L / L_t - (f - 1))^(d/(d-2))`` with ``L = max_position`` and
    ``L_t = max_trained_positions`` (default ``L``: no change)."""
    alpha = factor * max_position / trained - (factor - 1)
    expected = _plain(dim, 1e4 * alpha ** (dim / (dim - 2)))
    ours, af = rope_frequencies(dim, 1e4, {"rope_type": "ntk_alpha", "alpha": alpha})
    _close(ours, expected)
    assert af == 1.0
    # the same numbers as transformers' dynamic NTK evaluated at length L, but fixed
    hf = rope_frequencies(
        dim,
        1e4,
        {"rope_type": "dynamic", "factor": factor},
        seq_len=max_position,
        max_position_embeddings=trained,
    )[0]
    _close(hf, expected)


# ------------------------------------------------------------------------------ yarn


def _yarn_keep(dim, base, ramp_length, *, beta_fast=32, beta_slow=1, truncate=True):
    """The weight of the original frequency per pair, ``1 - yarn_linear_ramp_mask`` over
    ``yarn_find_correction_range`` (``common.py``)."""

    def pair(rotations: float) -> float:
        return dim * math.log(ramp_length / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = pair(beta_fast), pair(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    return 1 - np.clip((np.arange(dim // 2) - low) / (high - low), 0, 1)


def _vllm_yarn(dim, base, factor, ramp_length, **betas):
    """``YaRNScalingRotaryEmbedding._compute_inv_freq``: a linear blend of ``theta / s`` and
    ``theta`` with the kept weight."""
    keep = _yarn_keep(dim, base, ramp_length, **betas)
    plain = _plain(dim, base)
    return plain / factor * (1 - keep) + plain * keep


def _mscale(s: float, m: float = 1.0) -> float:
    return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0


@pytest.mark.parametrize(
    ("extra", "expected_factor"),
    [
        ({}, _mscale(16.0)),
        ({"attention_factor": 1.25}, 1.25),
        ({"mscale": 0.707, "mscale_all_dim": 1.0}, _mscale(16.0, 0.707) / _mscale(16.0)),
        ({"mscale": 0.707}, _mscale(16.0)),  # one of the two alone is ignored
        ({"truncate": False, "beta_fast": 16, "beta_slow": 2}, _mscale(16.0)),
    ],
)
def test_vllm_yarn_keys_are_relpos_yarn(extra: dict, expected_factor: float) -> None:
    scaling = {"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 4096}
    ours, af = rope_frequencies(64, 1e6, {**scaling, **extra})
    betas = {k: extra[k] for k in ("beta_fast", "beta_slow", "truncate") if k in extra}
    _close(ours, _vllm_yarn(64, 1e6, 16.0, 4096, **betas), YARN_RTOL)
    assert af == pytest.approx(expected_factor, rel=1e-12)


def test_telechat3_yarn_is_yarn_with_attention_factor() -> None:
    """``patch_legacy_rope_type`` rewrites ``"telechat3-yarn"`` to ``"yarn"`` with
    ``attention_factor = 0.07 ln s + 1`` (the earlier ``TeleChat3RoPEScaledRotaryEmbedding``
    computed the same magnitude)."""
    factor = 8.0
    scaling = {
        "rope_type": "yarn",
        "factor": factor,
        "original_max_position_embeddings": 8192,
        "attention_factor": 0.07 * math.log(factor) + 1.0,
    }
    ours, af = rope_frequencies(128, 1e6, scaling)
    _close(ours, _vllm_yarn(128, 1e6, factor, 8192), YARN_RTOL)
    assert af == pytest.approx(1.1455609, rel=1e-7)  # 0.07 * ln 8 + 1


def _earlier_vllm_yarn(dim, base, factor, original, *, ext=1.0, attn=1.0, apply=True, **betas):
    """Earlier vLLM's ``YaRNScalingRotaryEmbedding``: ``inv_freq_mask = (1 -
    yarn_linear_ramp_mask(...)) * extrapolation_factor`` blends ``theta / s`` and ``theta``;
    the cache is multiplied by ``mscale = yarn_get_mscale(s) * attn_factor``, or by
    ``attn_factor`` alone when ``apply_yarn_scaling`` is False."""
    keep = _yarn_keep(dim, base, original, **betas) * ext
    plain = _plain(dim, base)
    return plain / factor * (1 - keep) + plain * keep, (_mscale(factor) if apply else 1.0) * attn


@pytest.mark.parametrize(
    "keys",
    [
        {"extrapolation_factor": 0.5},
        {"extrapolation_factor": 0.0},  # e = 0: position interpolation of every pair
        {"attn_factor": 0.8},
        {"apply_yarn_scaling": False},
        {"apply_yarn_scaling": False, "attn_factor": 1.3, "extrapolation_factor": 2.0},
        {"attn_factor": 0.9, "beta_fast": 16, "beta_slow": 2, "truncate": False},
    ],
)
def test_earlier_vllm_yarn_keys_are_relpos_yarn(keys: dict) -> None:
    scaling = {"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 4096}
    ours, af = rope_frequencies(64, 1e6, {**scaling, **keys})
    names = {"extrapolation_factor": "ext", "attn_factor": "attn", "apply_yarn_scaling": "apply"}
    expected, mscale = _earlier_vllm_yarn(
        64, 1e6, 16.0, 4096, **{names.get(k, k): v for k, v in keys.items()}
    )
    _close(ours, expected, YARN_RTOL)
    assert af == pytest.approx(mscale, rel=1e-12)
    # the keys matter: the same dict without them is another rotation
    plain, plain_af = rope_frequencies(64, 1e6, scaling)
    same = np.allclose(plain.numpy(), expected, rtol=1e-4) and plain_af == pytest.approx(mscale)
    assert not same


def test_earlier_vllm_yarn_pinned_values() -> None:
    """``e = 0.5``, ``a = 0.8``: pair 12 of 32 (``low = floor(6.98) = 6``, ``high =
    ceil(15.01) = 16`` for base 1e6, 4096 positions) keeps ``(1 - 6/10) * 0.5`` of
    ``theta_12 = 1e6^(-24/64)``; magnitude ``(0.1 ln 16 + 1) * 0.8``."""
    scaling = {
        "rope_type": "yarn",
        "factor": 16.0,
        "original_max_position_embeddings": 4096,
        "extrapolation_factor": 0.5,
        "attn_factor": 0.8,
    }
    ours, af = rope_frequencies(64, 1e6, scaling)
    w = (1 - 6 / 10) * 0.5
    theta = 1e6 ** (-24 / 64)
    assert float(ours[12]) == pytest.approx(theta / 16 * (1 - w) + theta * w, rel=2e-6)
    assert float(ours[12]) == pytest.approx(0.0014058533, rel=1e-6)
    assert af == pytest.approx(1.0218071, rel=1e-7)


def test_earlier_vllm_and_transformers_magnitude_keys_are_not_mixed() -> None:
    scaling = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}
    for theirs in ({"attention_factor": 1.1}, {"mscale": 1.0, "mscale_all_dim": 1.0}):
        for ours in ({"attn_factor": 0.9}, {"apply_yarn_scaling": False}):
            with pytest.raises(ValueError, match="no stack reads both"):
                relpos.create(
                    "rope", num_heads=1, head_dim=16, scaling={**scaling, **theirs, **ours}
                )
    with pytest.raises(ValueError, match="'apply_yarn_scaling' must be True or False"):
        rope_frequencies(16, 1e4, {**scaling, "apply_yarn_scaling": 0})
    # extrapolation_factor only shapes the frequencies: it goes with either family
    both = {**scaling, "extrapolation_factor": 0.5, "attention_factor": 1.25}
    assert rope_frequencies(16, 1e4, both)[1] == 1.25


# ------------------------------------------------------------------------------ mrope


def _mrope_axes(sections: list[int], interleaved: bool) -> np.ndarray:
    if not interleaved:
        return np.repeat(np.arange(3), sections)
    i = np.arange(sum(sections))
    axes = np.zeros(len(i), dtype=int)
    axes[(i % 3 == 1) & (i < 3 * sections[1])] = 1
    axes[(i % 3 == 2) & (i < 3 * sections[2])] = 2
    return axes


@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize(
    ("head_dim", "partial", "sections"), [(64, 1.0, [8, 12, 12]), (64, 0.5, [4, 6, 6])]
)
def test_mrope_gptj_pairs_and_partial_rotary_are_m_rope(
    neox, interleaved, head_dim, partial, sections
):
    """``MRotaryEmbedding.forward_native``: pair ``j`` (frequency ``b^(-2j/r)``) takes the
    position of its section's axis; ``mrope_interleaved`` is Qwen3-VL's ``i mod 3``."""
    rotary_dim = int(head_dim * partial)
    g = torch.Generator().manual_seed(3)
    pos = torch.randint(0, 200, (1, 9, 3), generator=g)
    x = _qk(head_dim, 9, seed=4)
    axes = _mrope_axes(sections, interleaved)
    p = pos[0].double().numpy()[:, axes]  # (L, r/2) the position each pair sees
    expected = _vllm_rotate(x.double().numpy(), p * _plain(rotary_dim, 1e6)[None], neox)
    enc = relpos.create(
        "m-rope",
        num_heads=2,
        head_dim=head_dim,
        base=1e6,
        mrope_section=sections,
        interleaved_sections=interleaved,
        partial_rotary_factor=partial,
        layout="half" if neox else "interleaved",
    )
    np.testing.assert_allclose(
        enc.rotate(x, pos, "q").double().numpy(), expected, rtol=0, atol=ATOL_ROT
    )


@pytest.mark.parametrize("positions_factor", [4, 1])
def test_mrope_with_yarn_ramps_over_positions_factor_times_the_original_length(positions_factor):
    """``get_rope`` builds M-RoPE + YaRN with ``max_position = original_max_position``;
    ``MRotaryEmbedding`` passes ``original * positions_factor`` (default 4) to the base class,
    and YaRN's correction range reads that length: relpos states it with
    ``original_max_position_embeddings = positions_factor * original``."""
    original, factor = 32768, 4.0
    expected = _vllm_yarn(128, 5e6, factor, positions_factor * original)
    scaling = {
        "rope_type": "yarn",
        "factor": factor,
        "original_max_position_embeddings": positions_factor * original,
    }
    ours, af = rope_frequencies(128, 5e6, scaling)
    _close(ours, expected, YARN_RTOL)
    assert af == pytest.approx(_mscale(factor), rel=1e-12)
    if positions_factor != 1:  # the dict's own original length would be a different model
        plain = {**scaling, "original_max_position_embeddings": original}
        assert not np.allclose(rope_frequencies(128, 5e6, plain)[0].double().numpy(), expected)


# ------------------------------------------------------------------------------ longrope


@pytest.mark.parametrize("max_model_len", [16384, 2048])
@pytest.mark.parametrize("mscales", [{}, {"short_mscale": 1.0, "long_mscale": 1.3}])
def test_vllm_longrope_is_freq_factors_fixed_at_init(max_model_len: int, mscales: dict) -> None:
    """``Phi3LongRoPEScaledRotaryEmbedding``: long factors for every position when
    ``max_model_len > original``, else short; cos / sin times ``long_mscale`` /
    ``short_mscale``, default ``sqrt(1 + ln(L / L0) / ln L0)`` with ``L = max_position``."""
    dim, base, original, max_position = 16, 1e4, 4096, 131072
    short = [1.0, 1.0, 1.1, 1.2, 1.5, 2.0, 2.5, 3.0]
    long = [1.0, 1.2, 1.8, 3.0, 6.0, 12.0, 24.0, 40.0]
    use_long = max_model_len > original
    lam = np.array(long if use_long else short)
    default = math.sqrt(1 + math.log(max_position / original) / math.log(original))
    mscale = mscales.get("long_mscale" if use_long else "short_mscale", default)
    factors = {
        "rope_type": "freq_factors",
        "freq_factors": long if use_long else short,
        "attention_factor": mscale,
    }
    ours, af = rope_frequencies(dim, base, factors)
    _close(ours, _plain(dim, base) / lam)
    assert af == pytest.approx(mscale, rel=1e-12)
    if not mscales:  # relpos's longrope gives the same on calls on max_model_len's side
        lr = {"rope_type": "longrope", "short_factor": short, "long_factor": long}
        seq_len = original + 1 if use_long else original
        hf, hf_af = rope_frequencies(
            dim,
            base,
            {**lr, "original_max_position_embeddings": original},
            seq_len=seq_len,
            max_position_embeddings=max_position,
        )
        assert torch.equal(hf, ours) and hf_af == pytest.approx(mscale, rel=1e-12)


# ------------------------------------------------------------------------------ grok-1


def test_grok1_yarn_log_is_per_pair_factors() -> None:
    """``extra_method="yarn_log"``: ``exp(ln theta * m + ln(theta / s) (1 - m))`` =
    ``theta / s^(1 - m)``, a fixed divisor per pair; the cache is not multiplied by the
    mscale (commented out in ``_compute_cos_sin_cache``)."""
    dim, base, original, s = 128, 1e4, 8192, 4.0
    keep = _yarn_keep(dim, base, original)
    expected = np.exp(np.log(_plain(dim, base)) * keep + np.log(_plain(dim, base) / s) * (1 - keep))
    factors = (s ** (1 - keep)).tolist()
    ours, af = rope_frequencies(dim, base, {"rope_type": "freq_factors", "freq_factors": factors})
    _close(ours, expected, YARN_RTOL)
    assert af == 1.0


def test_grok1_yarn_linear_is_yarn_without_magnitude() -> None:
    dim, base, original, s = 128, 1e4, 8192, 4.0
    scaling = {
        "rope_type": "yarn",
        "factor": s,
        "original_max_position_embeddings": original,
        "attention_factor": 1.0,
    }
    ours, af = rope_frequencies(dim, base, scaling)
    _close(ours, _vllm_yarn(dim, base, s, original), YARN_RTOL)
    assert af == 1.0


# ------------------------------------------------------------------------------ fope


def _vllm_fope_inv_freq(rotary_dim: int, base: float, max_position: int, num_inv_freq):
    """``FourierRotaryEmbedding._compute_inv_freq``: RoPE's float32 frequencies, then the
    first ``num_inv_freq`` or those above ``2 pi / max_position``."""
    inv = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float) / rotary_dim))
    if num_inv_freq is not None:
        return inv[:num_inv_freq].double().numpy()
    return inv[inv > 2.0 * math.pi / max_position].double().numpy()


def _vllm_fope(query, key, positions, cos_coef, sin_coef, inv_freq, sep_head, sin_pad):
    """``FourierRotaryEmbedding._compute_cos_sin_cache`` + ``forward_native`` in float64.

    ``query (T, Hq, D)``, ``key (T, Hkv, D)``, coefficients ``(Hkv, F, F)``: the cache row of
    a position is ``(Hkv, D)`` (mixtures padded to ``D/2`` with cos 1 / sin ``sin_pad``, then
    doubled);
    queries are viewed as ``(T * Hkv, Hq / Hkv, D)`` against the ``(T * Hkv, D)`` rows, keys
    as ``(T * Hkv, 1, D)``; ``x cos + rotate_neox(x) sin``."""
    t, hq, d = query.shape
    hkv = key.shape[1]
    freqs = positions[:, None] * inv_freq[None]
    if sep_head:
        cos = np.einsum("tD,hDd->thd", np.cos(freqs), cos_coef)
        sin = np.einsum("tD,hDd->thd", np.sin(freqs), sin_coef)
    else:
        cos = np.cos(freqs) @ cos_coef[0]
        sin = np.sin(freqs) @ sin_coef[0]
    pad = [(0, 0)] * (cos.ndim - 1) + [(0, d // 2 - cos.shape[-1])]
    cos = np.pad(cos, pad, constant_values=1.0)
    sin = np.pad(sin, pad, constant_values=sin_pad)
    cos, sin = np.concatenate((cos, cos), -1), np.concatenate((sin, sin), -1)
    if sep_head:
        cos, sin = cos.reshape(t * hkv, d), sin.reshape(t * hkv, d)
        query = query.reshape(t * hkv, hq // hkv, d)
        key = key.reshape(t * hkv, 1, d)
    cos, sin = cos[:, None], sin[:, None]

    def rotate_neox(x):
        return np.concatenate((-x[..., d // 2 :], x[..., : d // 2]), -1)

    q_out = query * cos + rotate_neox(query) * sin
    k_out = key * cos + rotate_neox(key) * sin
    return q_out.reshape(t, hq, d), k_out.reshape(t, hkv, d)


@pytest.mark.parametrize(
    ("heads", "kv_heads", "rotary_dim", "max_position", "num_inv_freq", "sep_head", "vllm"),
    [
        (4, 2, 16, 64, None, True, "0.34.0"),  # 3 of 8 frequencies above 2 pi / 64
        (4, 4, 16, 64, 5, True, "0.34.0"),  # num_inv_freq wins over the floor
        (6, 2, 8, 32, None, True, "0.34.0"),  # partial rotary: pairs split the whole head
        (4, 2, 16, 10**6, None, True, "0.34.0"),  # nothing clipped: the pad plays no part
        (6, 2, 8, 32, None, True, "main"),  # sin padded with 0
        (4, 2, 16, 64, None, False, "main"),  # one set for every head (0.34.0 raises)
    ],
)
def test_fope_is_vllms_fourier_rotary_embedding(
    heads, kv_heads, rotary_dim, max_position, num_inv_freq, sep_head, vllm
) -> None:
    """``get_rope`` with ``rope_parameters = {"rope_type": "default", "use_fope": True,
    "num_key_value_heads": Hkv, "fope_sep_head": ..., "num_inv_freq": ...}`` and
    ``max_position`` is ``fope`` with ``kv_heads``, ``separate_heads``, ``num_inv_freq``,
    ``max_position_embeddings = max_position``, ``partial_rotary_factor = rotary_dim / D`` and
    ``clipped_pairs="constant-phase"`` (0.34.0: sin padded with 1) or ``"identity"`` (main:
    0); the checkpoint's ``cos_coef`` / ``sin_coef`` load as they are (``[:1]`` without
    ``fope_sep_head``)."""
    head_dim, base = 16, 1e4
    inv_freq = _vllm_fope_inv_freq(rotary_dim, base, max_position, num_inv_freq)
    count = inv_freq.size
    g = torch.Generator().manual_seed(7)
    cos_coef, sin_coef = (
        torch.randn(kv_heads, count, count, generator=g, dtype=torch.float64) for _ in "cs"
    )
    q = torch.randn(1, heads, POSITIONS.shape[1], head_dim, generator=g, dtype=torch.float64)
    k = torch.randn(1, kv_heads, POSITIONS.shape[1], head_dim, generator=g, dtype=torch.float64)
    enc = relpos.create(
        "fope",
        num_heads=heads,
        head_dim=head_dim,
        base=base,
        partial_rotary_factor=rotary_dim / head_dim,
        max_position_embeddings=max_position,
        kv_heads=kv_heads,
        num_inv_freq=num_inv_freq,
        separate_heads=sep_head,
        clipped_pairs="constant-phase" if vllm == "0.34.0" else "identity",
    ).double()
    np.testing.assert_array_equal(enc.inv_freq.double().numpy(), inv_freq)
    with torch.no_grad():
        enc.cos_coef.copy_(cos_coef if sep_head else cos_coef[:1])
        enc.sin_coef.copy_(sin_coef if sep_head else sin_coef[:1])
    with torch.no_grad():
        q_out, k_out = enc.rotate_qk(q, k, POSITIONS, POSITIONS)
    q_ref, k_ref = _vllm_fope(
        q[0].transpose(0, 1).numpy(),
        k[0].transpose(0, 1).numpy(),
        POSITIONS[0].double().numpy(),
        cos_coef.numpy(),
        sin_coef.numpy(),
        inv_freq,
        sep_head,
        sin_pad=1.0 if vllm == "0.34.0" else 0.0,
    )
    np.testing.assert_allclose(q_out[0].transpose(0, 1).numpy(), q_ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(k_out[0].transpose(0, 1).numpy(), k_ref, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------------------ deepseek-v4


def _vllm_deepseek_yarn(dim, base, factor, ramp_length, *, beta_fast=32, beta_slow=1):
    """``DeepseekScalingRotaryEmbedding._compute_inv_freq`` (extrapolation factor 1): YaRN's
    blend over ``rotary_dim``, the ramp from the ``original_max_position_embeddings``."""
    return _vllm_yarn(dim, base, factor, ramp_length, beta_fast=beta_fast, beta_slow=beta_slow)


def _vllm_v4_rotate(x: np.ndarray, angles: np.ndarray, scale: float, inverse: bool):
    """``DeepseekV4ScalingRotaryEmbedding.forward_native``: GPT-J pairs ``(2i, 2i+1)`` of the
    last ``r = 2 * angles.shape[-1]`` channels of ``x`` (``rope_dim_offset = head_size -
    rotary_dim``) rotated by the cache's ``cos * mscale``, ``sin * mscale``; ``inverse``
    negates sin; the leading channels pass through."""
    r = 2 * angles.shape[-1]
    keep, rot = x[..., : x.shape[-1] - r], x[..., x.shape[-1] - r :]
    cos, sin = np.cos(angles) * scale, np.sin(angles) * scale
    if inverse:
        sin = -sin
    x1, x2 = rot[..., 0::2], rot[..., 1::2]
    out = np.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), -1).reshape(rot.shape)
    return np.concatenate((keep, out), -1)


#: DeepSeek-V4's compressed-attention RoPE, shrunk: ``compress_rope_theta`` 160000, YaRN
#: factor 16 over a ramp of 256 positions, 16 of 64 channels (the model: 64 of 512);
#: ``build_deepseek_v4_rope`` sets ``mscale = mscale_all_dim = 0`` (cos/sin unscaled)
V4_HEAD, V4_ROPE, V4_BASE, V4_FACTOR, V4_RAMP = 64, 16, 160000.0, 16.0, 256


def _v4_scaling(mscale: float) -> dict:
    return {
        "rope_type": "deepseek_yarn",
        "factor": V4_FACTOR,
        "original_max_position_embeddings": V4_RAMP,
        "mscale": mscale,
        "mscale_all_dim": 0.0,
    }


def _v4(name: str, mscale: float) -> relpos.Encoding:
    return relpos.create(
        name,
        num_heads=2,
        head_dim=V4_HEAD,
        base=V4_BASE,
        layout="interleaved",
        partial_rotary_factor=V4_ROPE / V4_HEAD,
        rotary_channels="last",
        scaling=_v4_scaling(mscale),
    )


@pytest.mark.parametrize("mscale", [0.0, 1.0])
def test_deepseek_v4_rotates_the_last_channels_in_gptj_pairs(mscale: float) -> None:
    """q and k: relpos's ``rope`` with ``rotary_channels="last"``, ``layout="interleaved"``
    and the ``deepseek_yarn`` dict is vLLM's ``forward(positions, q, k)``."""
    expected_freq = _vllm_deepseek_yarn(V4_ROPE, V4_BASE, V4_FACTOR, V4_RAMP)
    enc = _v4("rope", mscale)
    _close(enc.inv_freq, expected_freq, YARN_RTOL)
    scale = _mscale(V4_FACTOR, mscale)  # / yarn_get_mscale(s, mscale_all_dim = 0) = 1
    assert enc.attention_factor == pytest.approx(scale, rel=1e-12)
    q, k = _qk(V4_HEAD, POSITIONS.shape[1]), _qk(V4_HEAD, POSITIONS.shape[1], seed=1)
    angles = POSITIONS[0].double().numpy()[:, None] * expected_freq[None]
    q_rot, k_rot = enc.rotate_qk(q, k, POSITIONS, POSITIONS)
    for mine, raw in ((q_rot, q), (k_rot, k)):
        expected = _vllm_v4_rotate(raw.double().numpy(), angles, scale, inverse=False)
        np.testing.assert_allclose(mine.double().numpy(), expected, rtol=0, atol=ATOL_ROT)
        assert torch.equal(mine[..., : V4_HEAD - V4_ROPE], raw[..., : V4_HEAD - V4_ROPE])


def test_deepseek_v4_inverse_is_rove_output_rotation() -> None:
    """``forward(positions, x, inverse=True)`` (the model's output, whose values are its
    rotated keys) is RoVE's output rotation ``rotate(x, pos, "o")`` = ``R(pos)^T x``, and
    RoVE's value rotation is the forward one; without mscale (the model's) the two undo
    each other."""
    expected_freq = _vllm_deepseek_yarn(V4_ROPE, V4_BASE, V4_FACTOR, V4_RAMP)
    enc = _v4("rove", 0.0)
    x = _qk(V4_HEAD, POSITIONS.shape[1], seed=2)
    angles = POSITIONS[0].double().numpy()[:, None] * expected_freq[None]
    for role, inverse in (("v", False), ("o", True)):
        expected = _vllm_v4_rotate(x.double().numpy(), angles, 1.0, inverse=inverse)
        mine = enc.rotate(x, POSITIONS, role)
        np.testing.assert_allclose(mine.double().numpy(), expected, rtol=0, atol=ATOL_ROT)
    back = enc.rotate(enc.rotate(x, POSITIONS, "v"), POSITIONS, "o")
    torch.testing.assert_close(back, x, rtol=0, atol=1e-6)


def test_deepseek_v4_pinned_values() -> None:
    """The first rotated pair (channels 48, 49 of 64) turns at frequency 1 (YaRN keeps the
    fastest pairs): the unit vector on channel 48 at position 3 becomes (cos 3, sin 3), and
    (cos 3, -sin 3) rotated back; the slowest pair is interpolated, 160000^(-14/16) / 16."""
    enc = _v4("rove", 0.0)
    assert float(enc.inv_freq[-1]) == pytest.approx(1.7469281074217108e-06, rel=RTOL)
    x = torch.zeros(1, 1, 1, V4_HEAD)
    x[..., V4_HEAD - V4_ROPE] = 1.0
    pos = torch.tensor([[3]])
    forward = enc.rotate(x, pos, "v")[0, 0, 0]
    inverse = enc.rotate(x, pos, "o")[0, 0, 0]
    first = V4_HEAD - V4_ROPE
    assert forward[first].item() == pytest.approx(-0.9899924966004454, abs=1e-6)
    assert forward[first + 1].item() == pytest.approx(0.1411200080598672, abs=1e-6)
    assert inverse[first + 1].item() == pytest.approx(-0.1411200080598672, abs=1e-6)
    others = torch.ones(V4_HEAD, dtype=torch.bool)
    others[first : first + 2] = False
    assert not forward[others].any() and not inverse[others].any()
