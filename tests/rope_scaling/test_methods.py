"""RoPE frequency scaling against reference values, and its validation.

Expected values are the float32 outputs of HF ``transformers`` 5.24.0's ``modeling_rope_utils``
(``_compute_*_parameters``), computed independently of relpos; the static NTK-aware bases are
re-derived here in float64 from the formula (jquesnelle/yarn), never from relpos. Tolerance:
rtol 1e-6.
"""

from __future__ import annotations

import math

import pytest
import torch

from relpos.functional import rope_frequencies
from relpos.rope_scaling import (
    LENGTH_DEPENDENT,
    ROPE_SCALING,
    is_length_dependent,
    ntk_scaled_base,
    validate_scaling,
)

# default, b = 1e4, d = 64.
R1 = [
    1, 0.749894202, 0.562341332, 0.421696514, 0.316227764, 0.237137362, 0.177827939, 0.133352146,
    0.100000001, 0.0749894157, 0.0562341288, 0.0421696492, 0.0316227786, 0.0237137359,
    0.0177827943, 0.0133352149, 0.00999999978, 0.00749894232, 0.00562341325, 0.00421696482,
    0.00316227786, 0.00237137382, 0.00177827943, 0.00133352145, 0.00100000005, 0.000749894185,
    0.000562341302, 0.000421696488, 0.000316227786, 0.000237137385, 0.00017782794, 0.00013335215,
]  # fmt: skip

# linear, factor 4 (same config as R1).
R2 = [
    0.25, 0.18747355, 0.140585333, 0.105424128, 0.079056941, 0.0592843406, 0.0444569848,
    0.0333380364, 0.0250000004, 0.0187473539, 0.0140585322, 0.0105424123, 0.00790569466,
    0.00592843397, 0.00444569858, 0.00333380373, 0.00249999994, 0.00187473558, 0.00140585331,
    0.00105424121, 0.000790569466, 0.000592843455, 0.000444569858, 0.000333380362,
    0.000250000012, 0.000187473546, 0.000140585325, 0.000105424122, 7.90569466e-05,
    5.92843462e-05, 4.44569851e-05, 3.33380376e-05,
]  # fmt: skip

# dynamic, b = 1e4, d = 64, max_position_embeddings 2048, seq_len 8192.
R3_FACTOR2 = [
    1, 0.70426929, 0.495995313, 0.349314272, 0.246011317, 0.173258215, 0.122020461, 0.0859352648,
    0.0605215691, 0.0426234864, 0.0300184153, 0.0211410467, 0.0148889907, 0.0104858596,
    0.00738486974, 0.00520093692, 0.00366286025, 0.00257964036, 0.00181676145, 0.00127948937,
    0.000901105115, 0.000634620723, 0.000446943915, 0.000314768899, 0.000221682058,
    0.00015612389, 0.00010995326, 7.74367072e-05, 5.45362964e-05, 3.84082414e-05,
    2.70497476e-05, 1.90503069e-05,
]  # fmt: skip
R3_FACTOR4 = [
    1, 0.690345228, 0.476576537, 0.32900238, 0.227125242, 0.156794831, 0.108242564, 0.0747247338,
    0.0515858717, 0.0356120579, 0.0245846175, 0.0169718731, 0.0117164524, 0.00808839686,
    0.00558378687, 0.00385474041, 0.00266110199, 0.00183707895, 0.00126821885, 0.000875508878,
    0.00060440338, 0.000417247007, 0.000288044481, 0.000198850146, 0.000137275245,
    9.47673179e-05, 6.54221731e-05, 4.51638844e-05, 3.11786753e-05, 2.15240489e-05,
    1.48590252e-05, 1.02578579e-05,
]  # fmt: skip

# YaRN, factor 8, original 4096, b = 1e4 (v5: max_position_embeddings 32768).
R4_ATTENTION_FACTOR = 1.2079441541679836
R4A_D64 = [
    1, 0.749894202, 0.562341332, 0.421696514, 0.316227764, 0.237137362, 0.177827939, 0.133352146,
    0.100000001, 0.0749894157, 0.0562341288, 0.0393313095, 0.0273658652, 0.0189253855,
    0.0129951192, 0.00884740148, 0.00596153876, 0.00396578666, 0.00259542139, 0.00166245725,
    0.00103382161, 0.000615645084, 0.000341976818, 0.000166690181, 0.000125000006,
    9.37367731e-05, 7.02926627e-05, 5.2712061e-05, 3.95284733e-05, 2.96421731e-05,
    2.22284925e-05, 1.66690188e-05,
]  # fmt: skip
R4B_D128 = [
    1, 0.865964353, 0.749894202, 0.649381638, 0.562341332, 0.486967534, 0.421696514, 0.365174145,
    0.316227764, 0.273841977, 0.237137362, 0.2053525, 0.177827939, 0.153992653, 0.133352146,
    0.115478203, 0.100000001, 0.0865964293, 0.0749894157, 0.0649381652, 0.0562341288,
    0.0470579192, 0.0393313095, 0.032830555, 0.0273658652, 0.0227762777, 0.0189253855,
    0.0156976189, 0.0129951192, 0.0107350647, 0.00884740148, 0.00727290567, 0.00596153876,
    0.00487104943, 0.00396578666, 0.00321568805, 0.00259542139, 0.00208365917, 0.00166245725,
    0.00131673366, 0.00103382161, 0.000803094241, 0.000615645084, 0.000464017736,
    0.000341976818, 0.000244315306, 0.000166690181, 0.000144347752, 0.000125000006,
    0.000108245542, 9.37367731e-05, 8.11727077e-05, 7.02926627e-05, 6.08709379e-05,
    5.2712061e-05, 4.56467642e-05, 3.95284733e-05, 3.42302446e-05, 2.96421731e-05,
    2.56690619e-05, 2.22284925e-05, 1.92490807e-05, 1.66690188e-05, 1.44347741e-05,
]  # fmt: skip
# YaRN, d = 128, truncate=False: differs from R4B_D128 only at i = 21..45.
R4C_BAND = [
    0.0485985205, 0.0405524112, 0.0337901302, 0.0281120818, 0.0233490914, 0.0193578731,
    0.016017111, 0.0132241333, 0.0108921174, 0.0089476686, 0.00732878828, 0.00598313287,
    0.00486654369, 0.00394178974, 0.00317750615, 0.00254728785, 0.00202892767, 0.00160376146,
    0.00125611934, 0.000972857641, 0.000742963457, 0.000557219319, 0.000407920103,
    0.00028863296, 0.000193994769,
]  # fmt: skip

# Llama 3, factor 8, low 1, high 4, original 8192, b = 5e5, d = 128.
R5 = [
    1, 0.814617217, 0.663601279, 0.540580988, 0.440366626, 0.358730227, 0.292227834, 0.238053814,
    0.193922758, 0.157972813, 0.128687382, 0.10483095, 0.0853971019, 0.0695659518, 0.0566696189,
    0.0461640507, 0.0376060307, 0.0306345206, 0.0249554086, 0.0203291047, 0.0165604409,
    0.0134904198, 0.0109895291, 0.00895225909, 0.00729266508, 0.00594073068, 0.00483942125,
    0.00394227589, 0.00321144611, 0.00216657063, 0.00137189368, 0.00085675146, 0.000524846022,
    0.00031269365, 0.000178507791, 9.55621217e-05, 7.78465546e-05, 6.34151438e-05,
    5.16590699e-05, 4.20823671e-05, 3.42810235e-05, 2.79259093e-05, 2.2748929e-05,
    1.85316694e-05, 1.50962178e-05, 1.22976389e-05, 1.00178686e-05, 8.1607277e-06,
    6.64786967e-06, 5.41546933e-06, 4.41153452e-06, 3.59371188e-06, 2.92749974e-06,
    2.38479174e-06, 1.94269251e-06, 1.58255079e-06, 1.28917316e-06, 1.05018262e-06,
    8.55496921e-07, 6.96902532e-07, 5.6770881e-07, 4.6246538e-07, 3.7673226e-07, 3.06892588e-07,
]  # fmt: skip

# LongRoPE (synthetic), d = 64, b = 1e4, original 4096, max 131072.
R6_ATTENTION_FACTOR = 1.1902380714238083
R6_LONG = [
    1, 0.611755788, 0.387390673, 0.251396, 0.166153565, 0.111382708, 0.075515978, 0.0516739562,
    0.0356321856, 0.0247305539, 0.0172599815, 0.0121042514, 0.00852440111, 0.00602562167,
    0.00427338481, 0.00303964457, 0.00216783211, 0.0015497813, 0.00111035549, 0.000797109213,
    0.000573278463, 0.000412992027, 0.000297981984, 0.000215308159, 0.000155778893,
    0.00011284816, 8.18430999e-05, 5.94208723e-05, 4.31852895e-05, 3.1415635e-05,
    2.28741337e-05, 1.66690188e-05,
]  # fmt: skip

# proportional (p-RoPE as in Gemma 4), head_dim 16, p = 0.25, b = 1e6.
R9 = [1, 0.177827939, 0, 0, 0, 0, 0, 0]


def _t(values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def _close(actual: torch.Tensor, expected: list[float]) -> None:
    assert actual.dtype == torch.float32
    assert actual.shape == (len(expected),)
    torch.testing.assert_close(actual, _t(expected), rtol=1e-6, atol=0.0)


YARN_R4 = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 4096}
LLAMA3_R5 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


def _longrope_r6() -> dict:
    return {
        "rope_type": "longrope",
        "short_factor": [1.0] * 32,
        "long_factor": torch.linspace(1, 8, 32, dtype=torch.float64).tolist(),
        "original_max_position_embeddings": 4096,
    }


# ---------------------------------------------------------------------------- linear (PI)


def test_linear_factor_4_divides_every_frequency_by_4_as_r2() -> None:
    inv_freq, attention_factor = rope_frequencies(64, scaling={"rope_type": "linear", "factor": 4})
    _close(inv_freq, R2)
    assert attention_factor == 1.0


def test_linear_accepts_the_legacy_type_key_verbatim() -> None:
    inv_freq, _ = rope_frequencies(64, scaling={"type": "linear", "factor": 4.0})
    _close(inv_freq, R2)


# ---------------------------------------------------------------------------- NTK-aware


@pytest.mark.parametrize(
    ("alpha", "dim", "expected_base"),
    [(4, 64, 41829.366), (8, 128, 82684.623), (2, 128, 20221.262)],
)
def test_ntk_aware_base_matches_section_4(alpha: float, dim: int, expected_base: float) -> None:
    assert ntk_scaled_base(1e4, alpha, dim) == pytest.approx(expected_base, rel=1e-6)
    inv_freq, attention_factor = rope_frequencies(
        dim, scaling={"rope_type": "ntk", "factor": alpha}
    )
    i = torch.arange(dim // 2, dtype=torch.float64)
    expected = expected_base ** (-2 * i / dim)
    torch.testing.assert_close(inv_freq.double(), expected, rtol=1e-6, atol=0.0)
    assert attention_factor == 1.0


def test_ntk_keeps_the_highest_frequency_and_divides_the_lowest_by_alpha() -> None:
    inv_freq, _ = rope_frequencies(64, scaling={"rope_type": "ntk", "factor": 4})
    assert inv_freq[0].item() == 1.0
    assert inv_freq[-1].item() == pytest.approx(R1[-1] / 4, rel=1e-6)


def test_ntk_equals_dynamic_at_the_length_where_their_bases_agree() -> None:
    # dynamic factor 2 at seq_len = 2 * L_max has alpha = 2 * 2 - (2 - 1) = 3.
    static, _ = rope_frequencies(64, scaling={"rope_type": "ntk", "factor": 3.0})
    dyn, _ = rope_frequencies(
        64,
        scaling={"rope_type": "dynamic", "factor": 2.0},
        seq_len=4096,
        max_position_embeddings=2048,
    )
    assert torch.equal(static, dyn)


# ---------------------------------------------------------------------------- dynamic NTK


@pytest.mark.parametrize(("factor", "expected"), [(2.0, R3_FACTOR2), (4.0, R3_FACTOR4)])
def test_dynamic_at_seq_len_8192_matches_r3(factor: float, expected: list[float]) -> None:
    inv_freq, attention_factor = rope_frequencies(
        64,
        scaling={"rope_type": "dynamic", "factor": factor},
        seq_len=8192,
        max_position_embeddings=2048,
    )
    _close(inv_freq, expected)
    assert attention_factor == 1.0


@pytest.mark.parametrize("seq_len", [None, 1, 100, 2048])
@pytest.mark.parametrize("factor", [2.0, 4.0])
def test_dynamic_within_the_original_length_is_the_default_rope(
    seq_len: int | None, factor: float
) -> None:
    inv_freq, _ = rope_frequencies(
        64,
        scaling={"rope_type": "dynamic", "factor": factor},
        seq_len=seq_len,
        max_position_embeddings=2048,
    )
    assert torch.equal(inv_freq, rope_frequencies(64)[0])
    _close(inv_freq, R1)


def test_dynamic_without_max_position_embeddings_names_it() -> None:
    with pytest.raises(ValueError, match="max_position_embeddings"):
        rope_frequencies(64, scaling={"rope_type": "dynamic", "factor": 2.0}, seq_len=8192)


# ---------------------------------------------------------------------------- YaRN


def test_yarn_head_dim_64_matches_r4a() -> None:
    inv_freq, attention_factor = rope_frequencies(
        64, scaling=dict(YARN_R4), max_position_embeddings=32768
    )
    _close(inv_freq, R4A_D64)
    assert attention_factor == pytest.approx(R4_ATTENTION_FACTOR, rel=1e-12)
    # logits carry the square: (0.1 ln 8 + 1)^2 = 1.45913 (HF scales cos and sin).
    assert attention_factor**2 == pytest.approx(1.45913, abs=1e-5)


def test_yarn_head_dim_128_matches_r4b() -> None:
    inv_freq, attention_factor = rope_frequencies(
        128, scaling=dict(YARN_R4), max_position_embeddings=32768
    )
    _close(inv_freq, R4B_D128)
    assert attention_factor == pytest.approx(R4_ATTENTION_FACTOR, rel=1e-12)


def test_yarn_without_truncate_changes_only_the_blended_band_r4c() -> None:
    inv_freq, _ = rope_frequencies(
        128, scaling={**YARN_R4, "truncate": False}, max_position_embeddings=32768
    )
    expected = list(R4B_D128)
    expected[21:46] = R4C_BAND
    _close(inv_freq, expected)


def test_yarn_factor_none_is_max_position_embeddings_over_original() -> None:
    implicit, af = rope_frequencies(
        64,
        scaling={"rope_type": "yarn", "factor": None, "original_max_position_embeddings": 4096},
        max_position_embeddings=32768,
    )
    _close(implicit, R4A_D64)
    assert af == pytest.approx(R4_ATTENTION_FACTOR, rel=1e-12)


@pytest.mark.parametrize(
    ("mscale", "mscale_all_dim", "expected"),
    [(1.0, 1.0, 1.0), (0.707, 1.0, 0.92104236), (0.707, 0.707, 1.0)],
)
def test_yarn_deepseek_mscale_attention_factor(
    mscale: float, mscale_all_dim: float, expected: float
) -> None:
    # DeepSeek-style, s = 40:
    # attention_factor = (0.1 mscale ln s + 1) / (0.1 mscale_all_dim ln s + 1)
    scaling = {
        "rope_type": "yarn",
        "factor": 40,
        "mscale": mscale,
        "mscale_all_dim": mscale_all_dim,
        "original_max_position_embeddings": 4096,
    }
    _, attention_factor = rope_frequencies(64, scaling=scaling, max_position_embeddings=163840)
    assert attention_factor == pytest.approx(expected, rel=1e-6)
    ln40 = math.log(40)
    assert attention_factor == pytest.approx(
        (0.1 * mscale * ln40 + 1) / (0.1 * mscale_all_dim * ln40 + 1), rel=1e-12
    )


def test_yarn_explicit_attention_factor_wins() -> None:
    _, af = rope_frequencies(64, scaling={**YARN_R4, "attention_factor": 1.5, "mscale": 0.707})
    assert af == 1.5


# ---------------------------------------------------------------------------- Llama 3


def test_llama3_matches_r5_and_meta_band_counts() -> None:
    inv_freq, attention_factor = rope_frequencies(128, 500000.0, scaling=dict(LLAMA3_R5))
    _close(inv_freq, R5)
    assert attention_factor == 1.0
    default, _ = rope_frequencies(128, 500000.0)
    # 29 unchanged (i = 0..28), 6 smoothed (29..34), 29 divided by 8 (35..63).
    assert torch.equal(inv_freq[:29], default[:29])
    assert torch.equal(inv_freq[35:], default[35:] / 8)
    assert bool(((inv_freq[29:35] < default[29:35]) & (inv_freq[29:35] > default[29:35] / 8)).all())


def test_llama3_rope_theta_inside_the_dict_overrides_base() -> None:
    inv_freq, _ = rope_frequencies(128, scaling={**LLAMA3_R5, "rope_theta": 500000.0})
    _close(inv_freq, R5)


# ---------------------------------------------------------------------------- LongRoPE


def test_longrope_short_factors_of_one_are_r1_and_attention_factor_is_phi3s() -> None:
    for seq_len in (None, 10, 4096):
        inv_freq, af = rope_frequencies(
            64, scaling=_longrope_r6(), seq_len=seq_len, max_position_embeddings=131072
        )
        _close(inv_freq, R1)
        assert af == pytest.approx(R6_ATTENTION_FACTOR, rel=1e-12)
    assert R6_ATTENTION_FACTOR == pytest.approx(math.sqrt(1 + math.log(32) / math.log(4096)))


def test_longrope_switches_to_long_factors_past_the_original_length_r6() -> None:
    inv_freq, af = rope_frequencies(
        64, scaling=_longrope_r6(), seq_len=4097, max_position_embeddings=131072
    )
    _close(inv_freq, R6_LONG)
    assert af == pytest.approx(R6_ATTENTION_FACTOR, rel=1e-12)


def test_longrope_factor_in_the_dict_sets_the_attention_factor() -> None:
    _, af = rope_frequencies(64, scaling={**_longrope_r6(), "factor": 32.0})
    assert af == pytest.approx(R6_ATTENTION_FACTOR, rel=1e-12)
    _, af = rope_frequencies(64, scaling={**_longrope_r6(), "attention_factor": 1.25})
    assert af == 1.25


# ---------------------------------------------------------------------------- proportional


def test_proportional_keeps_head_dim_frequencies_and_zeroes_the_rest_r9() -> None:
    scaling = {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6}
    inv_freq, af = rope_frequencies(16, scaling=scaling)
    _close(inv_freq, R9)
    assert af == 1.0


def test_proportional_differs_from_partial_rotary() -> None:
    # Partial rotary (GPT-NeoX's convention) spreads the whole range over the rotated channels: 2
    # frequencies with exponent over 4 channels; p-RoPE (HF proportional) keeps head_dim-based ones
    # and spans the head.
    partial, _ = rope_frequencies(16, 1e6, partial_rotary_factor=0.25)
    prop, _ = rope_frequencies(16, 1e6, {"rope_type": "proportional"}, partial_rotary_factor=0.25)
    assert partial.shape == (2,) and prop.shape == (8,)
    assert partial[1].item() == pytest.approx(1e-3, rel=1e-6)
    assert prop[1].item() == pytest.approx(0.177827939, rel=1e-6)


# ---------------------------------------------------------------------------- registry


def test_registry_has_every_type_and_default_is_bit_identical() -> None:
    assert set(ROPE_SCALING) == {
        "default",
        "linear",
        "ntk",
        "dynamic",
        "yarn",
        "llama3",
        "longrope",
        "proportional",
        # defined by inference engines (tests/rope_scaling/test_engine_types.py)
        "ntk_alpha",
        "xdrope",
        "ntk_mixed",
        "deepseek_yarn",
        "deepseek_llama_scaling",
        "freq_factors",
    }
    inv_freq, af = rope_frequencies(64, scaling={"rope_type": "default", "rope_theta": 10000.0})
    assert torch.equal(inv_freq, rope_frequencies(64)[0]) and af == 1.0


def test_length_dependent_types_are_dynamic_and_longrope() -> None:
    assert LENGTH_DEPENDENT == {"dynamic", "longrope"}
    assert is_length_dependent({"type": "dynamic", "factor": 2.0})
    assert is_length_dependent(_longrope_r6())
    assert not is_length_dependent(None)
    for scaling in ({"rope_type": "linear", "factor": 2.0}, YARN_R4, LLAMA3_R5):
        assert not is_length_dependent(scaling)


def test_partial_rotary_factor_inside_the_dict_overrides_the_argument() -> None:
    inside, _ = rope_frequencies(
        80, scaling={"rope_type": "linear", "factor": 2.0, "partial_rotary_factor": 0.5}
    )
    argument, _ = rope_frequencies(
        80, scaling={"rope_type": "linear", "factor": 2.0}, partial_rotary_factor=0.5
    )
    assert inside.shape == (20,) and torch.equal(inside, argument)


def test_the_callers_dict_is_not_modified() -> None:
    scaling = {"type": "yarn", "factor": 8.0}
    rope_frequencies(64, scaling=scaling, max_position_embeddings=4096)
    assert scaling == {"type": "yarn", "factor": 8.0}


# ---------------------------------------------------------------------------- validation


def test_unknown_key_is_named_with_the_type_and_the_expected_keys() -> None:
    with pytest.raises(ValueError, match=r"'linear'.*unknown keys \['low_freq_factor'\]") as err:
        rope_frequencies(64, scaling={"rope_type": "linear", "factor": 2, "low_freq_factor": 1})
    assert "expected keys" in str(err.value) and "'factor'" in str(err.value)


def test_missing_key_is_named_with_the_type_and_the_expected_keys() -> None:
    with pytest.raises(ValueError, match=r"'llama3'.*missing required keys \['high_freq_factor'\]"):
        rope_frequencies(
            128, scaling={k: v for k, v in LLAMA3_R5.items() if k != "high_freq_factor"}
        )
    with pytest.raises(ValueError, match=r"'longrope'.*missing.*'long_factor'") as err:
        validate_scaling({"rope_type": "longrope", "short_factor": [1.0] * 32})
    assert "expected keys" in str(err.value)


@pytest.mark.parametrize("key", ["rope_type", "type"])
def test_unknown_type_lists_the_known_types(key: str) -> None:
    with pytest.raises(ValueError, match=r"unknown rope scaling type 'su'.*'yarn'"):
        rope_frequencies(64, scaling={key: "su", "factor": 2.0})


def test_legacy_type_key_is_accepted_and_normalized() -> None:
    params = validate_scaling({"type": "dynamic", "factor": 2.0})
    assert params == {"rope_type": "dynamic", "factor": 2.0}
    with pytest.raises(ValueError, match="rope_type.*type"):
        validate_scaling({"type": "dynamic", "rope_type": "linear", "factor": 2.0})


@pytest.mark.parametrize("rope_type", ["yarn", "llama3", "longrope"])
def test_missing_original_length_is_filled_from_max_position_embeddings(rope_type: str) -> None:
    base = {"yarn": YARN_R4, "llama3": LLAMA3_R5, "longrope": _longrope_r6()}[rope_type]
    scaling = {k: v for k, v in base.items() if k != "original_max_position_embeddings"}
    params = validate_scaling(scaling, head_dim=64, max_position_embeddings=4096)
    assert params["original_max_position_embeddings"] == 4096
    with pytest.raises(
        ValueError, match="original_max_position_embeddings.*max_position_embeddings"
    ):
        rope_frequencies(64, scaling=scaling)


@pytest.mark.parametrize(
    ("scaling", "key"),
    [
        ({"rope_type": "linear", "factor": 0.5}, "factor"),
        ({"rope_type": "dynamic", "factor": "2"}, "factor"),
        ({"rope_type": "llama3", **LLAMA3_R5, "factor": 0.9}, "factor"),
        ({**YARN_R4, "beta_fast": 0}, "beta_fast"),
        ({**YARN_R4, "beta_fast": 1, "beta_slow": 32}, "beta_fast"),
        ({**YARN_R4, "truncate": None}, "truncate"),
        ({**YARN_R4, "attention_factor": -1.0}, "attention_factor"),
        ({**YARN_R4, "original_max_position_embeddings": 4096.5}, "original_max_position"),
        ({**LLAMA3_R5, "high_freq_factor": 1.0}, "high_freq_factor"),
        ({**_longrope_r6(), "short_factor": [1.0] * 31}, "short_factor"),
        ({**_longrope_r6(), "long_factor": 2.0}, "long_factor"),
        ({**_longrope_r6(), "long_factor": [0.0] * 32}, "long_factor"),
        ({"rope_type": "linear", "factor": 2.0, "rope_theta": 1.0}, "rope_theta"),
        ({"rope_type": "linear", "factor": 2, "partial_rotary_factor": 1.5}, "partial_rotary"),
    ],
)  # fmt: skip
def test_out_of_range_values_raise_naming_the_key(scaling: dict, key: str) -> None:
    with pytest.raises(ValueError, match=key):
        rope_frequencies(64, scaling=scaling, max_position_embeddings=32768)


def test_non_dict_scaling_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="scaling"):
        rope_frequencies(64, scaling=[("rope_type", "linear")])  # type: ignore[arg-type]


def test_ntk_types_need_more_than_two_rotated_channels() -> None:
    with pytest.raises(ValueError, match="rotated channels"):
        rope_frequencies(2, scaling={"rope_type": "ntk", "factor": 2.0})


def test_bad_seq_len_is_named() -> None:
    with pytest.raises(ValueError, match="seq_len"):
        rope_frequencies(64, scaling={"rope_type": "dynamic", "factor": 2.0}, seq_len=0)
