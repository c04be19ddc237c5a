"""DK-VLM's dual-kernel attention (a reconstruction from the abstract): a semantic kernel with
native RoPE and a geometric kernel (3-D point distances or camera frames), gated."""

from __future__ import annotations

import pytest
import torch

import relpos
from relpos import cameras
from relpos.encodings.camera.frames import CameraFrames
from relpos.nn import DualKernelAttention, LayerCache

F64 = torch.float64
B, L, DIM = 2, 6, 16


def _data(seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(B, L, DIM, generator=gen, dtype=F64)
    points = torch.randn(B, L, 3, generator=gen, dtype=F64)
    return x, points


def _module(**kw):
    torch.manual_seed(0)
    return DualKernelAttention(DIM, 2, **kw).double()


def _set_gate(m, logit: float):
    with torch.no_grad():
        m.gate.weight.zero_()
        m.gate.bias.fill_(logit)


def test_gate_one_is_the_semantic_kernel_and_gate_zero_the_geometric_one():
    m = _module()
    x, points = _data()
    sem = m.semantic(x)
    geo = m.geometric(x, points)
    assert float((sem - geo).detach().abs().max()) > 1e-3
    _set_gate(m, 50.0)
    torch.testing.assert_close(m(x, geo_pos=points), sem, atol=1e-12, rtol=0)
    _set_gate(m, -50.0)
    torch.testing.assert_close(m(x, geo_pos=points), geo, atol=1e-12, rtol=0)
    fresh = _module(gate_init=0.5)
    torch.testing.assert_close(
        fresh(x, geo_pos=points),
        0.5 * (fresh.semantic(x) + fresh.geometric(x, points)),
        atol=1e-12,
        rtol=0,
    )


def test_distance_kernel_is_attention_with_minus_squared_distance_over_tau():
    m = _module(temperature=0.7)
    x, X = _data(1)
    geo = m.geometric
    q = geo.q_proj(x).view(B, L, 2, 8).transpose(1, 2)
    k, v = (t.view(B, L, 2, 8).transpose(1, 2) for t in geo.kv_proj(x).chunk(2, -1))
    alpha = geo.encoding.log_alpha.exp()  # 1 / tau per head (stored as a float32 log)
    torch.testing.assert_close(alpha, torch.full((2,), 1 / 0.7, dtype=F64), rtol=1e-7, atol=0)
    sq = ((X[:, :, None] - X[:, None]) ** 2).sum(-1)
    logits = q @ k.mT / 8**0.5 - alpha[:, None, None] * sq[:, None]
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    p = logits.masked_fill(~causal, float("-inf")).softmax(-1)
    ref = geo.out_proj((p @ v).transpose(1, 2).reshape(B, L, DIM))
    torch.testing.assert_close(geo(x, X), ref, atol=1e-12, rtol=0)


def test_every_parameter_gets_a_gradient():
    m = _module()
    x, points = _data(2)
    m(x, geo_pos=points).square().sum().backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and bool(torch.isfinite(p.grad).all()), name
        assert float(p.grad.abs().max()) > 0, name


def test_geometric_kernels_are_invariant_to_a_rigid_change_of_the_scene():
    x, points = _data(3)
    G = cameras.random_se3(1, translation_std=3.0, generator=torch.Generator().manual_seed(4))
    m = _module()
    moved = points @ G[0, :3, :3].T + G[0, :3, 3]
    torch.testing.assert_close(m(x, geo_pos=moved), m(x, geo_pos=points), atol=1e-10, rtol=0)
    cams = _module(geometric="prope", geometric_options={"image_size": (32.0, 32.0)})
    assert isinstance(cams.geometric.encoding, CameraFrames)
    inputs = CameraFrames.example_inputs(B, L, L, torch.Generator().manual_seed(5))
    inputs["k_Ks"] = torch.tensor([[20.0, 0, 16], [0, 20, 16], [0, 0, 1]], dtype=F64).expand(
        B, L, 3, 3
    )
    patches = torch.stack((torch.arange(L) % 3, torch.arange(L) // 3), -1)[None].double()
    out = cams(x, geo_pos=patches, inputs=inputs)
    shifted = {**inputs, "k_viewmats": cameras.apply_world_transform(inputs["k_viewmats"], G[0])}
    torch.testing.assert_close(cams(x, geo_pos=patches, inputs=shifted), out, atol=1e-10, rtol=0)


def test_decoding_with_two_caches_equals_the_full_call():
    m = _module()
    x, points = _data(4)
    full = m(x, geo_pos=points)
    caches = (LayerCache(), LayerCache())
    cuts = ((0, 3), (3, 4), (4, 6))
    steps = [m(x[:, s:e], geo_pos=points[:, s:e], cache=caches) for s, e in cuts]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-12, rtol=0)


def test_dual_kernel_refuses_bad_arguments_by_name():
    m = _module()
    x, points = _data()
    with pytest.raises(ValueError, match="geo_pos"):
        m(x)
    with pytest.raises(TypeError, match="cache"):
        m(x, geo_pos=points, cache=LayerCache())
    with pytest.raises(ValueError, match="gate_init"):
        DualKernelAttention(DIM, 2, gate_init=1.0)
    with pytest.raises(ValueError, match="temperature"):
        DualKernelAttention(DIM, 2, temperature=0.0)
    with pytest.raises(ValueError, match="geometric_heads"):
        DualKernelAttention(DIM, 2, geometric_heads=3)
    with pytest.raises(ValueError, match="k_viewmats"):
        DualKernelAttention(DIM, 2, geometric="prope").double()(x, geo_pos=points[..., :2])
    assert relpos.nn.DualKernelAttention is DualKernelAttention


def _both(**kw):
    """A geometric kernel with camera frames (PRoPE) and point displacements together."""
    torch.manual_seed(0)
    options = {"image_size": (32.0, 32.0)}
    return DualKernelAttention(
        DIM, 2, geometric="prope", geometric_options=options, displacements=True, **kw
    ).double()


def _cameras_and_points(seed=6):
    gen = torch.Generator().manual_seed(seed)
    inputs = CameraFrames.example_inputs(B, L, L, gen)
    inputs["k_Ks"] = torch.tensor([[20.0, 0, 16], [0, 20, 16], [0, 0, 1]], dtype=F64).expand(
        B, L, 3, 3
    )
    patches = torch.stack((torch.arange(L) % 3, torch.arange(L) // 3), -1)[None].double()
    points = torch.randn(B, L, 3, generator=gen, dtype=F64)
    return inputs, patches, points


def test_camera_and_point_kernel_together_is_prope_attention_plus_the_distance_bias():
    m = _both(temperature=0.6)
    x, _ = _data(7)
    inputs, patches, X = _cameras_and_points()
    geo = m.geometric
    enc = geo.encoding
    q = geo.q_proj(x).view(B, L, 2, 8).transpose(1, 2)
    k, v = (t.view(B, L, 2, 8).transpose(1, 2) for t in geo.kv_proj(x).chunk(2, -1))
    # oracle: the camera encoding's logits (relpos.scores) plus -||X_i - X_j||^2 / tau, the
    # values re-framed by T_j^-1 and the output by T_i (PRoPE's frames)
    alpha = m.point_bias.log_alpha.exp()  # 1 / tau per head (stored as a float32 log)
    torch.testing.assert_close(alpha, torch.full((2,), 1 / 0.6, dtype=F64), rtol=1e-7, atol=0)
    sq = ((X[:, :, None] - X[:, None]) ** 2).sum(-1)
    logits = relpos.scores(q, k, enc, q_pos=patches, k_pos=patches, inputs=inputs)
    logits = logits - alpha[:, None, None] * sq[:, None]
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    p = logits.masked_fill(~causal, float("-inf")).softmax(-1)
    state = enc.prepare_rotary(patches, patches, inputs)
    o = enc.rotate(p @ enc.rotate(v, patches, "v", state), patches, "o", state)
    ref = geo.out_proj(o.transpose(1, 2).reshape(B, L, DIM))
    with torch.no_grad():
        out = geo(x, patches, inputs=inputs, mask=m.displacement_bias(X))
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=0)
    # gate 0: exactly that kernel; gate 1: exactly the semantic one
    _set_gate(m, -50.0)
    torch.testing.assert_close(m(x, geo_pos=patches, inputs=inputs, points=X), ref, atol=1e-12,
                               rtol=0)  # fmt: skip
    _set_gate(m, 50.0)
    torch.testing.assert_close(m(x, geo_pos=patches, inputs=inputs, points=X), m.semantic(x),
                               atol=1e-12, rtol=0)  # fmt: skip
    # the points matter, and the camera kernel alone is the same module without them
    alone = _module(geometric="prope", geometric_options={"image_size": (32.0, 32.0)})
    alone.geometric.load_state_dict(geo.state_dict())
    same = torch.zeros_like(X)  # identical points: no displacement term
    torch.testing.assert_close(
        geo(x, patches, inputs=inputs, mask=m.displacement_bias(same)),
        alone.geometric(x, patches, inputs=inputs), atol=1e-12, rtol=0,
    )  # fmt: skip
    with torch.no_grad():
        assert float((out - alone.geometric(x, patches, inputs=inputs)).abs().max()) > 1e-3


def test_camera_and_point_kernel_is_invariant_and_trains_both_terms():
    m = _both()
    x, _ = _data(8)
    inputs, patches, X = _cameras_and_points(9)
    out = m(x, geo_pos=patches, inputs=inputs, points=X)
    G = cameras.random_se3(1, translation_std=3.0, generator=torch.Generator().manual_seed(4))
    moved = {**inputs, "k_viewmats": cameras.apply_world_transform(inputs["k_viewmats"], G[0])}
    X_moved = X @ G[0, :3, :3].T + G[0, :3, 3]
    torch.testing.assert_close(m(x, geo_pos=patches, inputs=moved, points=X_moved), out,
                               atol=1e-10, rtol=0)  # fmt: skip
    out.square().sum().backward()
    for name in ("point_bias.log_alpha", "point_bias.shift", "gate.weight"):
        grad = dict(m.named_parameters())[name].grad
        assert grad is not None and float(grad.abs().max()) > 0, name


def test_camera_and_point_kernel_refuses_bad_arguments_by_name():
    m = _both()
    x, _ = _data()
    inputs, patches, X = _cameras_and_points()
    with pytest.raises(ValueError, match="points is needed"):
        m(x, geo_pos=patches, inputs=inputs)
    with pytest.raises(ValueError, match="points must have shape"):
        m(x, geo_pos=patches, inputs=inputs, points=X[..., :2])
    with pytest.raises(ValueError, match="cache"):
        m(x, geo_pos=patches, inputs=inputs, points=X, cache=(LayerCache(), LayerCache()))
    with pytest.raises(ValueError, match="displacements"):
        DualKernelAttention(DIM, 2, displacements=True)  # the distance kernel already is one
    with pytest.raises(ValueError, match="displacements=True"):
        _module(geometric="prope", geometric_options={"image_size": (32.0, 32.0)})(
            x, geo_pos=patches, inputs=inputs, points=X
        )
    with pytest.raises(TypeError, match="displacements must be a bool"):
        DualKernelAttention(DIM, 2, geometric="prope", displacements=1)
