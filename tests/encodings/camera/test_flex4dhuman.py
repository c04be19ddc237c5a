"""Flex4DHuman (a reconstruction from the abstract, assumed form): Wan's 3-D RoPE + a view-index
RoPE + PRoPE's relative camera section."""

from __future__ import annotations

import pytest
import torch

import relpos
from relpos import cameras
from relpos.encodings.camera.prope import lift

from .scene import IMAGE, K_PIX, tokens, world_G

F64 = torch.float64


def _setup(d=32, views=(0, 0, 0, 0, 0, 0, 0, 0)):
    t = tokens()
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 2, 8, d, generator=gen, dtype=F64) for _ in range(2))
    time_ = torch.arange(8.0, dtype=F64)[:, None] % 3
    hw = t["xy"][0].flip(-1).double()
    pos = torch.cat((time_, hw, torch.tensor(views, dtype=F64)[:, None]), -1)[None]
    return t, q, k, pos


def _flex(d=32, **options):
    return relpos.create("flex4dhuman", num_heads=2, head_dim=d, image_size=IMAGE, **options)


def test_default_layout_follows_wan_for_the_rest_of_the_head():
    enc = _flex(128)  # Wan 2.1 1.3B: head_dim 128
    assert (enc.camera_dim, enc.view_pairs, enc.sections) == (32, 4, [16, 14, 14])
    assert enc.proj_channels + enc.rope_channels == 128 and enc.dims == 4
    small = _flex(16)
    assert (small.camera_dim, small.view_pairs, small.sections) == (4, 1, [3, 1, 1])
    with pytest.raises(ValueError, match="head_dim"):
        _flex(30, camera_dim=6)
    with pytest.raises(ValueError, match="head_dim"):
        _flex(32, sections=[10, 10, 10])


def test_one_camera_and_one_view_index_reduce_to_wans_3d_rope():
    t, q, k, pos = _setup()
    enc = _flex().double()
    same = {"k_viewmats": t["viewmats"][:, 5:6].expand(1, 8, 4, 4), "k_Ks": t["Ks"]}
    s = relpos.scores(q, k, enc, q_pos=pos, k_pos=pos, scale=1.0, inputs=same)
    # oracle: rope-axial as Wan's 3-D RoPE (dims 3, sections 5/3/3, base 1e4, interleaved)
    # on channels [8, 30); the camera channels [0, 8) and the view channels [30, 32) plain
    wan = relpos.create(
        "rope-axial", num_heads=2, head_dim=22, dims=3, sections=[5, 3, 3], layout="interleaved"
    ).double()
    thw = pos[..., :3]
    ref = relpos.scores(q[..., 8:30], k[..., 8:30], wan, q_pos=thw, k_pos=thw, scale=1.0)
    ref = ref + q[..., :8] @ k[..., :8].transpose(-1, -2) + q[..., 30:] @ k[..., 30:].mT
    torch.testing.assert_close(s, ref, atol=1e-5, rtol=1e-5)
    # a second view index or a second camera changes the logits
    _, _, _, two_views = _setup(views=(0,) * 4 + (1,) * 4)
    other = relpos.scores(q, k, enc, q_pos=two_views, k_pos=two_views, scale=1.0, inputs=same)
    assert float((other - s).abs().max()) > 1e-3
    inputs = {"k_viewmats": t["viewmats"], "k_Ks": t["Ks"]}
    cams = relpos.scores(q, k, enc, q_pos=pos, k_pos=pos, scale=1.0, inputs=inputs)
    assert float((cams - s).abs().max()) > 1e-3


def test_the_camera_section_reads_the_relative_projective_camera():
    t, q, k, pos = _setup()
    enc = _flex().double()
    inputs = {"k_viewmats": t["viewmats"], "k_Ks": t["Ks"]}
    s = relpos.scores(q, k, enc, q_pos=pos, k_pos=pos, scale=1.0, inputs=inputs)
    same = {"k_viewmats": t["viewmats"][:, :1].expand(1, 8, 4, 4), "k_Ks": t["Ks"]}
    rest = relpos.scores(q, k, enc, q_pos=pos, k_pos=pos, scale=1.0, inputs=same)
    # oracle: P = lift(K~) w2c (PRoPE's normalised intrinsics), logit += q^T P_i P_j^-1 k
    P = lift(cameras.normalize_K(t["Ks"], IMAGE)) @ t["viewmats"]  # (1, 8, 4, 4)
    rel = P[:, :, None] @ torch.linalg.inv(P)[:, None]  # (1, 8, 8, 4, 4)
    qc = q[..., :8].reshape(1, 2, 8, 2, 4)
    kc = k[..., :8].reshape(1, 2, 8, 2, 4)
    cam = torch.einsum("bhicx,bijxy,bhjcy->bhij", qc, rel, kc)
    plain = q[..., :8] @ k[..., :8].mT
    torch.testing.assert_close(s, rest - plain + cam, atol=1e-10, rtol=0)
    moved = {**inputs, "k_viewmats": cameras.apply_world_transform(t["viewmats"], world_G())}
    again = relpos.scores(q, k, enc, q_pos=pos, k_pos=pos, scale=1.0, inputs=moved)
    torch.testing.assert_close(again, s, atol=1e-10, rtol=0)


def test_values_are_re_framed_only_when_asked():
    t, q, k, pos = _setup()
    inputs = {"k_viewmats": t["viewmats"], "k_Ks": K_PIX.expand(1, 8, 3, 3)}
    v = torch.randn_like(k)
    plain = _flex().double()
    framed = _flex(rotate_values=True).double()
    assert not plain.rotates_values and framed.rotates_values
    a = relpos.attention(q, k, v, plain, q_pos=pos, k_pos=pos, inputs=inputs)
    b = relpos.attention(q, k, v, framed, q_pos=pos, k_pos=pos, inputs=inputs)
    assert float((a - b).abs().max()) > 1e-3
    state = framed.prepare_rotary(pos, pos, inputs)
    back = framed.rotate(framed.rotate(v, pos, "v", state), pos, "o", state)
    torch.testing.assert_close(back, v, atol=1e-12, rtol=0)
