"""Frequencies and wavelengths under RoPE scalings, against HF ``transformers`` 5.24.0's float32
frequencies (default, linear, YaRN, proportional)."""

from __future__ import annotations

import json
import math

import pytest

from relpos_lab.analysis.frequencies import (
    default_profiles,
    frequency_profile,
    plot_wavelengths,
    scaling_presets,
)

R1_FIRST = [1, 0.749894202, 0.562341332, 0.421696514]
R1_LAST = 0.00013335215
R2_FIRST = [0.25, 0.18747355, 0.140585333, 0.105424128]


def test_default_matches_r1_and_wavelength_is_two_pi_over_theta():
    p = frequency_profile(64)
    assert p.inv_freq[:4] == pytest.approx(R1_FIRST, rel=1e-6)
    assert p.inv_freq[-1] == pytest.approx(R1_LAST, rel=1e-6)
    assert p.wavelength[0] == pytest.approx(2 * math.pi)
    assert p.wavelength[-1] == pytest.approx(2 * math.pi / R1_LAST, rel=1e-6)
    assert p.attention_factor == 1.0 and p.label == "default"


def test_linear_matches_r2_and_stretches_every_wavelength():
    p = frequency_profile(64, scaling={"rope_type": "linear", "factor": 4.0})
    assert p.inv_freq[:4] == pytest.approx(R2_FIRST, rel=1e-6)
    base = frequency_profile(64)
    assert p.wavelength == pytest.approx([4 * w for w in base.wavelength], rel=1e-6)


def test_yarn_attention_factor_matches_r4():
    scaling = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 4096}
    p = frequency_profile(64, scaling=scaling, max_position_embeddings=32768)
    assert p.attention_factor == pytest.approx(1.2079441541679836, rel=1e-12)
    assert p.inv_freq[11] == pytest.approx(0.0393313095, rel=1e-6)


def test_proportional_zero_frequencies_have_infinite_wavelength():
    # HF proportional: head_dim 16, p = 0.25, b = 1e6 -> [1, 0.177827939, 0, 0, 0, 0, 0, 0].
    p = frequency_profile(16, 1e6, {"rope_type": "proportional", "partial_rotary_factor": 0.25})
    assert p.inv_freq == pytest.approx([1, 0.177827939, 0, 0, 0, 0, 0, 0], rel=1e-6)
    assert p.wavelength[2:] == [math.inf] * 6


@pytest.mark.parametrize("head_dim", [64, 128])
def test_every_preset_is_a_valid_scaling(head_dim):
    presets = scaling_presets(head_dim, factor=4.0, original=2048)
    assert set(presets) == {
        "linear", "ntk", "dynamic", "yarn", "llama3", "longrope", "proportional"
    }  # fmt: skip
    profiles = default_profiles(head_dim, factor=4.0, original=2048)
    assert [p.label for p in profiles] == ["default", *presets]
    default = profiles[0]
    for p in profiles[1:]:
        assert len(p.inv_freq) == head_dim // 2
        # Context extension never shortens a wavelength.
        assert all(
            w >= d * (1 - 1e-6) for w, d in zip(p.wavelength, default.wavelength, strict=True)
        )


def test_plot_writes_a_png(tmp_path):
    profiles = default_profiles(32)
    plot_wavelengths(profiles, tmp_path / "w.png", original=2048, target=8192)
    assert (tmp_path / "w.png").read_bytes()[:4] == b"\x89PNG"


def test_profile_serialises():
    p = frequency_profile(16, scaling={"rope_type": "linear", "factor": 2.0})
    assert json.loads(json.dumps(p.to_dict()))["scaling"] == {"rope_type": "linear", "factor": 2.0}


def test_bad_scaling():
    with pytest.raises(ValueError, match="nosuch"):
        frequency_profile(64, scaling={"rope_type": "linear", "factor": 2.0, "nosuch": 1})
    with pytest.raises(TypeError, match="scaling must be a dict"):
        frequency_profile(64, scaling=[("rope_type", "linear")])
    with pytest.raises(ValueError, match="factor must be a finite number >= 1"):
        scaling_presets(64, factor=0.5)
