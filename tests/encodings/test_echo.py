"""ECHO's band embedding (official code yucongzh/ECHO): the band centres at three sampling rates
and the frequency code, against reference values worked out from the official code."""

from __future__ import annotations

import math

import pytest
import torch

import relpos
from relpos.encodings.echo import band_centres


@pytest.mark.parametrize(
    "rate, expected",
    [
        (16000, [0.0775, 0.2375, 0.3975, 0.5575, 0.7175, 0.8775, 0.98]),
        (8000, [0.155, 0.475, 0.795, 0.98]),
    ],
)
def test_spec_band_centres(rate, expected):
    torch.testing.assert_close(band_centres(rate), torch.tensor(expected, dtype=torch.float64))


def test_spec_band_centres_at_44100():
    f = band_centres(44100)  # n_fft 1102: 18 bands
    assert f.numel() == 18
    assert math.isclose(float(f[0]), 0.028131, abs_tol=1e-6)
    assert math.isclose(float(f[-1]), 0.993648, abs_tol=1e-6)


def test_spec_frequency_code_is_interleaved_and_scaled_by_25():
    enc = relpos.create("echo", num_heads=4, head_dim=96)
    pos = torch.tensor([[[0.0, 0.0775]]], dtype=torch.float64)
    code = enc.embed(pos, 384)[0, 0] - enc.time_code(torch.zeros(1), 384)[0]
    expected = [0.933514, -0.35854, 0.962165, -0.272466, 0.982107, -0.188325]
    torch.testing.assert_close(
        code[:6], torch.tensor(expected, dtype=torch.float64), atol=1e-6, rtol=0
    )


def test_time_code_is_the_concatenated_mae_table_and_1d_positions_give_it_alone():
    enc = relpos.create("echo", num_heads=2, head_dim=4)
    t = torch.arange(5)[None]
    omega = 10000 ** (-torch.arange(0, 8, 2, dtype=torch.float64) / 8)
    ang = torch.arange(5, dtype=torch.float64)[:, None] * omega
    expected = torch.cat([ang.sin(), ang.cos()], -1).float()
    torch.testing.assert_close(enc.embed(t, 8)[0], expected)
    both = enc.embed(torch.stack([t.float(), torch.full((1, 5), 0.3)], -1), 8)
    torch.testing.assert_close(
        both[0] - expected, enc.frequency_code(torch.full((5,), 0.3), 8).float()
    )


def test_the_same_hertz_at_two_sampling_rates_gets_two_codes():
    f16, f8 = band_centres(16000), band_centres(8000)
    assert not math.isclose(float(f16[0]), float(f8[0]))  # bins 0..31: 0..620 Hz vs 0..310 Hz


@pytest.mark.parametrize(
    "args, message",
    [(((1, 4, 3), 8), "pos must be"), (((1, 4), 7), "even")],
)
def test_bad_calls_are_refused_by_name(args, message):
    shape, dim = args
    with pytest.raises(ValueError, match=message):
        relpos.create("echo", num_heads=2, head_dim=4).embed(torch.zeros(shape), dim)
