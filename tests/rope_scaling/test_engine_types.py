"""Scaling types that inference engines define besides transformers' table.

Each reference is the published formula evaluated here in numpy float64 (never relpos's
code), so relpos's float32 frequencies must agree to float32 rounding:

* ``ntk_alpha``: transformers ``HunYuanDenseV1RotaryEmbedding.compute_ntk_alpha_rope_parameters``
  and vLLM ``dynamic_ntk_alpha_rope.py``;
* ``ntk_mixed``: vLLM ``ntk_scaling_rope.py`` (fixed and mixed NTK);
* ``deepseek_yarn``: vLLM ``deepseek_scaling_rope.py`` + ``common.py`` (YaRN helpers);
* ``freq_factors``: llama.cpp ``ggml/src/ggml-cpu/ops.cpp`` (``theta / freq_factors[i]``).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from relpos.functional import rope_frequencies
from relpos.rope_scaling import LENGTH_DEPENDENT, resolve_type, validate_scaling

RTOL = 2e-7  # float32 rounding of a float64 reference


def _plain(dim: int, base: float) -> np.ndarray:
    return base ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)


def _close(actual: torch.Tensor, expected: np.ndarray) -> None:
    np.testing.assert_allclose(actual.double().numpy(), expected, rtol=RTOL, atol=0)


# ------------------------------------------------------------------------------ ntk_alpha


@pytest.mark.parametrize(("dim", "alpha"), [(64, 1000.0), (128, 4.0), (16, 1.0)])
def test_ntk_alpha_is_the_ntk_base_of_alpha(dim: int, alpha: float) -> None:
    inv_freq, af = rope_frequencies(dim, 1e4, {"rope_type": "ntk_alpha", "alpha": alpha})
    _close(inv_freq, _plain(dim, 1e4 * alpha ** (dim / (dim - 2))))
    assert af == 1.0


def test_hunyuans_dynamic_with_alpha_is_ntk_alpha_and_static() -> None:
    hunyuan = {"rope_type": "dynamic", "alpha": 1000.0}
    assert resolve_type(hunyuan) == "ntk_alpha"
    assert validate_scaling(hunyuan)["rope_type"] == "ntk_alpha"
    short = rope_frequencies(64, 1e4, hunyuan, seq_len=10, max_position_embeddings=32)[0]
    long = rope_frequencies(64, 1e4, hunyuan, seq_len=1000, max_position_embeddings=32)[0]
    assert torch.equal(short, long)
    assert "ntk_alpha" not in LENGTH_DEPENDENT
    # a "dynamic" dict with a factor stays dynamic NTK
    assert resolve_type({"rope_type": "dynamic", "factor": 2.0}) == "dynamic"


def test_ntk_alpha_is_bit_identical_to_transformers_hunyuan() -> None:
    tf = pytest.importorskip("transformers")
    from transformers.models.hunyuan_v1_dense.modeling_hunyuan_v1_dense import (
        HunYuanDenseV1RotaryEmbedding,
    )

    for head_dim, alpha, theta in [(64, 1000.0, 1e4), (128, 50.0, 5e5)]:
        # the keys of Hunyuan-A13B's config (transformers requires "factor" for "dynamic")
        hunyuan = {
            "rope_type": "dynamic",
            "alpha": alpha,
            "factor": 1.0,
            "beta_fast": 32,
            "beta_slow": 1,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        }
        config = tf.HunYuanDenseV1Config(
            hidden_size=2 * head_dim,
            num_attention_heads=2,
            num_key_value_heads=2,
            head_dim=head_dim,
            rope_parameters={**hunyuan, "rope_theta": theta},
        )
        hf_inv, hf_af = HunYuanDenseV1RotaryEmbedding.compute_ntk_alpha_rope_parameters(config)
        ours, af = rope_frequencies(head_dim, theta, hunyuan)
        assert torch.equal(ours, hf_inv) and af == hf_af


def test_xdrope_dict_takes_the_ntk_alpha_frequencies() -> None:
    xd = {"rope_type": "xdrope", "alpha": 1000.0, "xdrope_section": [8, 8, 8, 8]}
    ours = rope_frequencies(64, 1e4, xd)[0]
    assert torch.equal(ours, rope_frequencies(64, 1e4, {"rope_type": "ntk_alpha", "alpha": 1e3})[0])
    with pytest.raises(ValueError, match="xdrope_section"):
        rope_frequencies(64, 1e4, {**xd, "xdrope_section": [8, -1]})
    with pytest.raises(ValueError, match="missing required keys"):
        rope_frequencies(64, 1e4, {"rope_type": "xdrope", "alpha": 2.0})


@pytest.mark.parametrize("alpha", [0.5, math.nan, "2"])
def test_ntk_alpha_refuses_an_alpha_below_one_or_not_a_number(alpha: object) -> None:
    with pytest.raises(ValueError, match="'alpha'"):
        validate_scaling({"rope_type": "ntk_alpha", "alpha": alpha})


# ------------------------------------------------------------------------------ ntk_mixed


@pytest.mark.parametrize(("dim", "factor"), [(64, 4.0), (128, 8.0)])
def test_fixed_ntk_divides_pair_i_by_factor_to_the_2i_plus_2_over_d(dim: int, factor: float):
    inv_freq, af = rope_frequencies(dim, 1e4, {"rope_type": "ntk_mixed", "factor": factor})
    i = np.arange(dim // 2, dtype=np.float64)
    _close(inv_freq, _plain(dim, 1e4) / factor ** ((2 * i + 2) / dim))
    assert af == 1.0
    # the lowest frequency is divided by exactly the factor, the highest by factor^(2/d)
    plain = rope_frequencies(dim, 1e4)[0].double()
    ratio = (plain / inv_freq.double()).numpy()
    assert ratio[-1] == pytest.approx(factor, rel=1e-6)
    assert ratio[0] == pytest.approx(factor ** (2 / dim), rel=1e-6)


@pytest.mark.parametrize(("dim", "factor", "b"), [(64, 4.0, 0.5), (128, 16.0, 2.0)])
def test_mixed_ntk_divides_pair_i_by_exp_a_i_plus_1_to_the_b(dim: int, factor: float, b: float):
    inv_freq = rope_frequencies(
        dim, 1e4, {"rope_type": "ntk_mixed", "factor": factor, "mixed_b": b}
    )[0]
    a = math.log(factor) / (dim / 2) ** b
    lam = np.exp(a * np.arange(1, dim // 2 + 1, dtype=np.float64) ** b)
    _close(inv_freq, _plain(dim, 1e4) / lam)


def test_mixed_ntk_with_b_one_is_fixed_ntk() -> None:
    fixed = rope_frequencies(64, 1e4, {"rope_type": "ntk_mixed", "factor": 4.0})[0]
    mixed = rope_frequencies(64, 1e4, {"rope_type": "ntk_mixed", "factor": 4.0, "mixed_b": 1.0})[0]
    torch.testing.assert_close(mixed, fixed, rtol=1e-6, atol=0)


def test_vllms_ntk_is_not_relpos_ntk() -> None:
    ours = rope_frequencies(64, 1e4, {"rope_type": "ntk", "factor": 4.0})[0]
    vllm = rope_frequencies(64, 1e4, {"rope_type": "ntk_mixed", "factor": 4.0})[0]
    assert ours[0] == 1.0 and vllm[0] < 1.0  # bloc97 keeps the highest frequency


# ------------------------------------------------------------------------------ deepseek_yarn


def _yarn_reference(dim, base, factor, original, *, beta_fast=32, beta_slow=1, ext=1.0):
    def corr(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(corr(beta_fast)), 0)
    high = min(math.ceil(corr(beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2) - low) / (high - low), 0, 1)
    weight = (1 - ramp) * ext
    plain = _plain(dim, base)
    return plain / factor * (1 - weight) + plain * weight


def _mscale(s: float, m: float) -> float:
    return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0


@pytest.mark.parametrize(
    ("options", "expected_factor"),
    [
        ({}, _mscale(40, 1.0)),  # mscale 1, mscale_all_dim 0: 0.1 ln s + 1
        ({"mscale": 1.0, "mscale_all_dim": 1.0}, 1.0),  # DeepSeek-V3's config
        ({"mscale": 0.707}, _mscale(40, 0.707)),  # transformers ignores mscale alone
        (
            {"mscale": 0.707, "mscale_all_dim": 1.0, "attn_factor": 2.0},
            2 * _mscale(40, 0.707) / _mscale(40, 1.0),
        ),
    ],
)
def test_deepseek_yarn_matches_the_vllm_formula(options: dict, expected_factor: float) -> None:
    scaling = {
        "rope_type": "deepseek_yarn",
        "factor": 40.0,
        "original_max_position_embeddings": 4096,
        **options,
    }
    inv_freq, af = rope_frequencies(64, 1e4, scaling)
    _close(inv_freq, _yarn_reference(64, 1e4, 40.0, 4096))
    assert af == pytest.approx(expected_factor, rel=1e-6)


def test_deepseek_yarn_attention_factor_pinned() -> None:
    """(0.1 * 0.707 * ln 40 + 1) / (0.1 * ln 40 + 1) * 2 = 1.260803 / 1.368888 * 2."""
    scaling = {
        "rope_type": "deepseek_yarn",
        "factor": 40.0,
        "original_max_position_embeddings": 4096,
        "mscale": 0.707,
        "mscale_all_dim": 1.0,
        "attn_factor": 2.0,
    }
    assert rope_frequencies(64, 1e4, scaling)[1] == pytest.approx(1.8420847, rel=1e-7)


def test_deepseek_yarn_mscale_alone_differs_from_transformers_yarn() -> None:
    common = {"factor": 40.0, "original_max_position_embeddings": 4096, "mscale": 0.707}
    hf_af = rope_frequencies(64, 1e4, {"rope_type": "yarn", **common})[1]
    vllm_af = rope_frequencies(64, 1e4, {"rope_type": "deepseek_yarn", **common})[1]
    assert hf_af == pytest.approx(_mscale(40, 1.0)) and vllm_af == pytest.approx(_mscale(40, 0.707))


def test_deepseek_yarn_extrapolation_factor_scales_the_kept_weight() -> None:
    scaling = {
        "rope_type": "deepseek_llama_scaling",
        "factor": 8.0,
        "original_max_position_embeddings": 2048,
        "beta_fast": 16,
        "beta_slow": 2,
        "extrapolation_factor": 0.5,
    }
    inv_freq = rope_frequencies(128, 5e5, scaling)[0]
    _close(inv_freq, _yarn_reference(128, 5e5, 8.0, 2048, beta_fast=16, beta_slow=2, ext=0.5))


def test_deepseek_yarn_without_mscale_keys_equals_transformers_yarn() -> None:
    common = {"factor": 16.0, "original_max_position_embeddings": 1024}
    ours = rope_frequencies(64, 1e4, {"rope_type": "deepseek_yarn", **common})
    hf = rope_frequencies(64, 1e4, {"rope_type": "yarn", **common})
    assert torch.equal(ours[0], hf[0]) and ours[1] == pytest.approx(hf[1], rel=1e-12)


# ------------------------------------------------------------------------------ freq_factors


def test_freq_factors_divide_each_pair() -> None:
    factors = [1.0, 1.0, 2.5, 8.0, 8.0, 8.0, 8.0, 8.0]
    inv_freq, af = rope_frequencies(16, 5e5, {"rope_type": "freq_factors", "freq_factors": factors})
    _close(inv_freq, _plain(16, 5e5) / np.array(factors))
    assert af == 1.0


def test_freq_factors_need_one_positive_factor_per_pair() -> None:
    with pytest.raises(ValueError, match="one entry per rotary pair"):
        rope_frequencies(16, scaling={"rope_type": "freq_factors", "freq_factors": [1.0] * 7})
    with pytest.raises(ValueError, match="positive numbers"):
        rope_frequencies(16, scaling={"rope_type": "freq_factors", "freq_factors": [0.0] * 8})
