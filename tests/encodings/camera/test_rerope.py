"""ReRoPE (a reconstruction from the abstract, assumed form): camera blocks in the low-frequency
temporal pairs."""

from __future__ import annotations

import pytest
import torch

import relpos
from relpos import cameras
from relpos.functional import apply_rotary

from .scene import IMAGE, tokens, world_G


def _setup():
    t = tokens()
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 2, 8, 64, generator=gen, dtype=torch.float64) for _ in range(2))
    thw = torch.cat((torch.arange(8.0)[:, None] % 3, t["xy"][0].flip(-1).double()), -1)[None]
    return t, q, k, thw


def test_band_is_the_even_count_of_slow_temporal_pairs():
    enc = relpos.create("rerope", num_heads=2, head_dim=64)
    assert enc.sections == [12, 10, 10]
    theta = 10000.0 ** (-torch.arange(12, dtype=torch.float64) / 12)
    slow = int((theta * 15 < 0.5).sum())
    assert slow == 7 and enc.band_pairs == 6 and enc.band_start == 12
    with pytest.raises(ValueError, match="epsilon"):
        relpos.create("rerope", num_heads=1, head_dim=16, epsilon=0.01)


def test_one_camera_for_every_frame_is_3d_rope_with_the_band_at_identity():
    t, q, k, thw = _setup()
    enc = relpos.create("rerope", num_heads=2, head_dim=64, image_size=IMAGE).double()
    same = {"k_viewmats": t["viewmats"][:, :1].expand(1, 8, 4, 4), "k_Ks": t["Ks"]}
    s = relpos.scores(q, k, enc, q_pos=thw, k_pos=thw, scale=1.0, inputs=same)
    # oracle: Wan-style 3-D RoPE (interleaved pairs, sections 12/10/10, per-axis spectra)
    theta = torch.cat(
        [10000.0 ** (-torch.arange(n, dtype=torch.float64) / n) for n in (12, 10, 10)]
    )
    axis = torch.tensor([0] * 12 + [1] * 10 + [2] * 10)
    ang = thw[..., axis] * theta
    ang[..., 6:12] = 0.0  # the six slowest temporal pairs: identity under one camera
    qr = apply_rotary(q, ang.cos()[:, None], ang.sin()[:, None], "interleaved")
    kr = apply_rotary(k, ang.cos()[:, None], ang.sin()[:, None], "interleaved")
    torch.testing.assert_close(s, qr @ kr.transpose(-1, -2), atol=1e-12, rtol=0)


def test_rerope_is_invariant_and_sees_relative_cameras():
    t, q, k, thw = _setup()
    enc = relpos.create("rerope", num_heads=2, head_dim=64, image_size=IMAGE).double()
    inputs = {"k_viewmats": t["viewmats"], "k_Ks": t["Ks"]}
    s = relpos.scores(q, k, enc, q_pos=thw, k_pos=thw, inputs=inputs)
    moved = {**inputs, "k_viewmats": cameras.apply_world_transform(t["viewmats"], world_G())}
    torch.testing.assert_close(
        relpos.scores(q, k, enc, q_pos=thw, k_pos=thw, inputs=moved), s, atol=1e-12, rtol=0
    )
    same = {**inputs, "k_viewmats": t["viewmats"][:, :1].expand(1, 8, 4, 4)}
    assert (
        float((relpos.scores(q, k, enc, q_pos=thw, k_pos=thw, inputs=same) - s).abs().max()) > 1e-3
    )
