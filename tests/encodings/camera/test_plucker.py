"""The Plücker-ray embedding (the absolute baseline)."""

from __future__ import annotations

import pytest
import torch

from relpos import cameras
from relpos.encodings.camera.plucker import PluckerEmbedding

from .scene import K_PIX, camera_a, camera_b


def _rays():
    views = torch.stack((camera_a(), camera_b()))[None].float()
    return cameras.plucker(views, K_PIX.float().expand(1, 2, 3, 3), (2, 2), (32, 32))


@pytest.mark.parametrize("fourier", [0, 3])
def test_plucker_embedding_starts_at_zero_and_trains(fourier):
    torch.manual_seed(0)
    emb = PluckerEmbedding(24, fourier=fourier)
    rays = _rays()
    out = emb(rays)
    assert out.shape == (1, 8, 24) and torch.equal(out, torch.zeros_like(out))
    (out * torch.randn_like(out)).sum().backward()
    assert emb.out.weight.grad is not None and float(emb.out.weight.grad.abs().max()) > 0
    if fourier:
        assert emb.features(rays).shape == (1, 8, 36)


def test_plucker_embedding_refuses_other_shapes():
    with pytest.raises(ValueError, match="rays"):
        PluckerEmbedding(8)(torch.zeros(1, 4, 5))
    with pytest.raises(ValueError, match="dim"):
        PluckerEmbedding(0)
