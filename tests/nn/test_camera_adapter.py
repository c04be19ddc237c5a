"""The zero-initialised camera branch of UCPE and StereoWorld (their official code)."""

from __future__ import annotations

import pytest
import torch

from relpos import cameras
from relpos.encodings.camera.ucpe import orientation_map
from relpos.nn import CameraAdapter

F64 = torch.float64
IMAGE = (32.0, 32.0)


def _scene(B=1):
    """Two cameras x 2x2 patches, camera-major: per-token viewmats, Ks and (x, y)."""
    gen = torch.Generator().manual_seed(0)
    views = cameras.random_se3(2, generator=gen)[None].expand(B, 2, 4, 4)
    K = cameras.intrinsics(30.0, 30.0, 16.0, 16.0).expand(B, 2, 3, 3)
    index = torch.tensor([[0] * 4 + [1] * 4]).expand(B, 8)
    inputs = {
        "k_viewmats": cameras.expand_cameras(views, index),
        "k_Ks": cameras.expand_cameras(K, index),
    }
    pos = torch.tensor([[0, 0], [1, 0], [0, 1], [1, 1]] * 2, dtype=F64)[None]
    return inputs, pos, orientation_map(views, K, (2, 2), IMAGE)


def _ucpe_adapter(**kw):
    torch.manual_seed(0)
    opts = {"grid": (2, 2), "image_size": IMAGE}
    return CameraAdapter(16, 1, "ucpe", attn_dim=8, encoding_options=opts, **kw).double()


def test_the_branch_starts_at_zero_and_learns():
    inputs, pos, orient = _scene()
    m = _ucpe_adapter(orientation=True)
    x = torch.randn(1, 8, 16, dtype=F64)
    y = m(x, pos, inputs, orientation=orient)
    assert y.shape == (1, 8, 16) and float(y.detach().abs().max()) == 0.0  # the host is unchanged
    y.sum().backward()
    assert float(m.out_proj.weight.grad.abs().max()) > 0
    with torch.no_grad():
        m.out_proj.weight.normal_()
    m.zero_grad()
    out = m(x, pos, inputs, orientation=orient)
    out.square().sum().backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and float(p.grad.abs().max()) > 0, name  # incl. orientation


def test_ucpe_branch_is_invariant_to_a_rigid_world_change_but_the_orientation_is_not():
    inputs, pos, orient = _scene()
    m = _ucpe_adapter()
    with torch.no_grad():
        m.out_proj.weight.normal_()
    x = torch.randn(1, 8, 16, dtype=F64)
    G = cameras.random_se3(1, translation_std=3.0, generator=torch.Generator().manual_seed(1))[0]
    moved = {**inputs, "k_viewmats": cameras.apply_world_transform(inputs["k_viewmats"], G)}
    torch.testing.assert_close(m(x, pos, moved), m(x, pos, inputs), atol=1e-10, rtol=0)
    views = inputs["k_viewmats"][:, ::4]
    tilted = orientation_map(
        cameras.apply_world_transform(views, G), inputs["k_Ks"][:, ::4], (2, 2), IMAGE
    )
    assert float((tilted - orient).abs().max()) > 1e-3  # pitch/roll are absolute


def test_stereoworld_branch_with_qk_norm():
    inputs, pos, _ = _scene(B=2)
    torch.manual_seed(0)
    m = CameraAdapter(
        16, 2, "stereoworld", qk_norm=True, encoding_options={"image_size": IMAGE}
    ).double()
    with torch.no_grad():
        m.out_proj.weight.normal_()
        for proj in (m.q_proj, m.k_proj, m.v_proj):
            proj.bias.zero_()
    x = torch.randn(2, 8, 16, dtype=F64)
    out = m(x, None, inputs)  # no RoPE channels: tokens of one camera have no position
    # RMSNorm on q and k (no projection biases): scaling x scales only the values
    b = m.out_proj.bias
    torch.testing.assert_close(m(3 * x, None, inputs) - b, 3 * (out - b), atol=1e-8, rtol=0)
    plain = CameraAdapter(16, 2, "stereoworld", encoding_options={"image_size": IMAGE})
    plain.load_state_dict(m.state_dict(), strict=False)
    plain = plain.double()
    assert (
        float(
            (plain(3 * x, None, inputs) - b - 3 * (plain(x, None, inputs) - b)).detach().abs().max()
        )
        > 1e-3
    )


def test_camera_adapter_refuses_bad_arguments_by_name():
    inputs, pos, orient = _scene()
    m = _ucpe_adapter(orientation=True)
    x = torch.randn(1, 8, 16, dtype=F64)
    with pytest.raises(ValueError, match="orientation"):
        m(x, pos, inputs)
    with pytest.raises(ValueError, match="orientation"):
        _ucpe_adapter()(x, pos, inputs, orientation=orient)
    with pytest.raises(ValueError, match="x"):
        m(x[..., :8], pos, inputs, orientation=orient)
    with pytest.raises(ValueError, match="attn_dim"):
        CameraAdapter(16, 3, "ucpe", attn_dim=8)
    with pytest.raises(ValueError, match="k_viewmats"):
        m(x, pos, {"k_Ks": inputs["k_Ks"]}, orientation=orient)
