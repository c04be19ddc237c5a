"""Conformance: every encoding that reads cameras (``"k_viewmats"`` in ``required_inputs``).

Properties, from flags and the public API only:

* C1 gauge invariance: moving every camera by one rigid transform of the world leaves
  scores and outputs unchanged (``se3_invariant``), to 1e-10 in float64 and to 1e-4 in
  float32 after re-anchoring (``relpos.cameras.anchor``); an encoding without the flag
  changes under it (the documented failure);
* C1 regression: camera-to-world matrices fed as world-to-camera break the invariance;
* C2 identical cameras: the logits and outputs of any shared camera equal the
  identity-camera reduction (``rotate`` without a state);
* C3 round trip: the output rotation undoes the key rotation of the same token;
* C4 explicit query cameras equal to the default (the last Lq key tokens') give the same
  call;
* C5 clear errors for singular, reflected, non-rigid and mis-shaped cameras and intrinsics,
  and for head dims the method cannot take;
* C7 KV-cache decoding with the new tokens' cameras equals the full call;
* float32 far from the origin: drift without anchoring, float32 accuracy with it.
"""

from __future__ import annotations

import pytest
import torch

import relpos
from relpos import cameras
from relpos.encodings.base import QueryGroups
from relpos.nn import LayerCache

from .common import (
    B,
    D,
    H,
    assert_close_rel,
    lift_positions,
    make_encoding,
    merge_groups,
    rotate,
    rotation_groups,
    scores,
)

L = 12


def _camera_encoding(name: str) -> relpos.Encoding:
    enc = make_encoding(name)
    if "k_viewmats" not in enc.required_inputs:
        pytest.skip("does not read cameras")
    return enc


def _call(enc, dtype=torch.float64, seed: int = 0, lq: int = L, lk: int = L):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, lq, D, generator=gen, dtype=torch.float64).to(dtype)
    k = torch.randn(B, H, lk, D, generator=gen, dtype=torch.float64).to(dtype)
    v = torch.randn(B, H, lk, D, generator=gen, dtype=torch.float64).to(dtype)
    kp = lift_positions(enc, torch.arange(lk))
    kp = kp[None] if enc.dims == 1 else kp
    inputs = type(enc).example_inputs(B, lq, lk, torch.Generator().manual_seed(seed + 1))
    return q, k, v, dict(q_pos=kp[:, lk - lq :], k_pos=kp), inputs


def _moved(inputs: dict, G: torch.Tensor) -> dict:
    out = dict(inputs)
    for n in ("k_viewmats", "q_viewmats"):
        if n in out:
            out[n] = cameras.apply_world_transform(out[n], G)
    return out


def _G(seed: int = 5, scale: float = 5.0) -> torch.Tensor:
    return cameras.random_se3(
        1, translation_std=scale, generator=torch.Generator().manual_seed(seed)
    )[0]


def test_rigid_world_transform_leaves_scores_and_outputs_unchanged(name):
    enc = _camera_encoding(name).double()
    q, k, v, pos, inputs = _call(enc)
    moved = _moved(inputs, _G())
    s0 = relpos.scores(q, k, enc, inputs=inputs, **pos)
    s1 = relpos.scores(q, k, enc, inputs=moved, **pos)
    o0 = relpos.attention(q, k, v, enc, inputs=inputs, **pos)
    o1 = relpos.attention(q, k, v, enc, inputs=moved, **pos)
    if enc.se3_invariant:
        torch.testing.assert_close(s1, s0, rtol=0, atol=1e-10)
        torch.testing.assert_close(o1, o0, rtol=0, atol=1e-10)
    else:  # documented non-invariance (RAYNOVA-style fixed-frame coordinates)
        assert float((s1 - s0).detach().abs().max()) > 1e-3


def test_camera_to_world_fed_as_world_to_camera_breaks_the_invariance(name):
    enc = _camera_encoding(name).double()
    if not enc.se3_invariant:
        pytest.skip("not invariant in the first place")
    q, k, _, pos, inputs = _call(enc)

    def as_c2w(cams: dict) -> dict:
        return {n: cameras.invert_se3(t) if n.endswith("viewmats") else t for n, t in cams.items()}

    # the world moves (w2c -> w2c G^-1, so c2w -> G c2w) and c2w goes in where w2c belongs
    s0 = relpos.scores(q, k, enc, inputs=as_c2w(inputs), **pos)
    s1 = relpos.scores(q, k, enc, inputs=as_c2w(_moved(inputs, _G())), **pos)
    assert float((s1 - s0).detach().abs().max()) > 1e-2


def test_identical_cameras_reduce_to_the_identity_camera(name):
    """Relative camera encodings: with one camera for every token the camera blocks cancel
    (``T_i T_j^-1 = I``), so the call equals ``rotate`` without a state (identity blocks).
    Encodings whose frames also read the token's pixel (``relative=False``, UCPE's rays):
    any two shared cameras give the same call (identical per-pixel frames)."""
    enc = _camera_encoding(name).double()
    if not enc.se3_invariant:
        pytest.skip("the call depends on where the shared camera is (fixed-frame coordinates)")
    q, k, v, pos, inputs = _call(enc)
    shared = {n: t[:, :1].expand_as(t).contiguous() for n, t in inputs.items()}
    s = relpos.scores(q, k, enc, inputs=shared, **pos)
    out = relpos.attention(q, k, v, enc, inputs=shared, **pos)
    qp, kp = pos["q_pos"], pos["k_pos"]
    if enc.relative:
        qr, kr = enc.rotate_qk(q, k, qp, kp)  # no state: identity camera blocks
        ref_s = qr @ kr.transpose(-1, -2) * D**-0.5
        ref_o = enc.rotate(torch.softmax(ref_s, -1) @ enc.rotate(v, kp, "v"), qp, "o")
    else:
        # another pose for everyone (the same intrinsics: the rays depend on them)
        views = inputs["k_viewmats"]
        other = {**shared, "k_viewmats": views[:, -1:].expand_as(views).contiguous()}
        assert not torch.equal(other["k_viewmats"], shared["k_viewmats"])
        ref_s = relpos.scores(q, k, enc, inputs=other, **pos)
        ref_o = relpos.attention(q, k, v, enc, inputs=other, **pos)
    torch.testing.assert_close(s, ref_s, rtol=0, atol=1e-10)
    torch.testing.assert_close(out, ref_o, rtol=0, atol=1e-10)


def test_output_rotation_undoes_the_key_rotation(name):
    enc = _camera_encoding(name).double()
    if not enc.rotates_values:
        pytest.skip("values are not re-framed")
    _, k, _, pos, inputs = _call(enc)
    kp = pos["k_pos"]
    state = enc.prepare_rotary(kp, kp, inputs)
    if isinstance(state, QueryGroups):
        pytest.skip("expected rotations under depth doubt attenuate (tested per encoding)")
    back = rotate(enc, rotate(enc, k, kp, "k", state), kp, "o", state)
    torch.testing.assert_close(back, k, rtol=0, atol=1e-12)


def test_explicit_query_cameras_equal_the_default(name):
    enc = _camera_encoding(name).double()
    q, k, v, pos, inputs = _call(enc, lq=5, lk=L)
    explicit = dict(inputs)
    for n in ("viewmats", "Ks"):
        if f"k_{n}" in inputs:
            explicit[f"q_{n}"] = inputs[f"k_{n}"][:, L - 5 :]
    a = relpos.attention(q, k, v, enc, inputs=inputs, **pos)
    b = relpos.attention(q, k, v, enc, inputs=explicit, **pos)
    torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_kv_cache_decoding_with_the_new_cameras_equals_the_full_call(name):
    enc = _camera_encoding(name)
    q, k, v, pos, inputs = _call(enc, dtype=torch.float32)
    full = relpos.attention(q, k, v, enc, causal=True, inputs=inputs, **pos)
    cache = LayerCache()
    if not enc.cache_rotated_keys:  # keys encoded in each query's frame: refused by name
        with pytest.raises(ValueError, match="cache"):
            relpos.attention(q, k, v, enc, causal=True, inputs=inputs, cache=cache, **pos)
        return
    outs = []
    for s, e in ((0, 5), (5, 6), (6, L)):
        step = {n: t[:, s:e] for n, t in inputs.items()}
        p = pos["k_pos"][:, s:e]
        outs.append(
            relpos.attention(
                q[:, :, s:e],
                k[:, :, s:e],
                v[:, :, s:e],
                enc,
                causal=True,
                inputs=step,
                q_pos=p,
                k_pos=p,
                cache=cache,
            )
        )
    assert cache.rotated
    assert_close_rel(torch.cat(outs, 2), full)


def test_float32_far_from_the_origin_needs_anchoring(name):
    enc = _camera_encoding(name)
    if not enc.se3_invariant:
        pytest.skip("not gauge invariant: anchoring would change the encoding")
    q, k, _, pos, inputs = _call(enc)
    far = _moved(inputs, _G(scale=0.0) @ _translation(1e4))
    ref = relpos.scores(q, k, enc.double(), inputs=inputs, **pos)
    enc = enc.float()
    q32, k32 = q.float(), k.float()
    # one gauge for every token (in float64, then cast): the first key token's camera
    anchored = {n: t.float() for n, t in far.items()}
    anchored["k_viewmats"] = cameras.anchor(far["k_viewmats"], 0).float()
    drift = relpos.scores(q32, k32, enc, inputs={n: t.float() for n, t in far.items()}, **pos)
    fixed = relpos.scores(q32, k32, enc, inputs=anchored, **pos)
    assert_close_rel(fixed.double(), ref, rtol=1e-4)
    err_far = float((drift.double() - ref).detach().abs().max())
    err_fixed = float((fixed.double() - ref).detach().abs().max())
    assert err_fixed < err_far, "anchoring in float64 should beat float32 cameras at |t| = 1e4"


def _translation(scale: float) -> torch.Tensor:
    G = torch.eye(4, dtype=torch.float64)
    G[:3, 3] = torch.tensor([scale, -0.5 * scale, 0.3 * scale])
    return G


BAD = {
    "bottom row": lambda m: m.index_put(
        (torch.tensor(3), torch.tensor(0)), torch.tensor(0.5, dtype=m.dtype)
    ),
    "non-rigid": lambda m: m * 1.5,
    "reflection": lambda m: m * torch.tensor([-1.0, 1.0, 1.0, 1.0], dtype=m.dtype)[:, None],
    "nan": lambda m: m * float("nan"),
}


@pytest.mark.parametrize("bad", list(BAD))
def test_bad_camera_matrices_are_refused_by_name(name, bad):
    enc = _camera_encoding(name)
    q, k, v, pos, inputs = _call(enc, dtype=torch.float32)
    m = inputs["k_viewmats"].clone()
    m[0, 3] = BAD[bad](m[0, 3])
    if bad == "non-rigid":
        m[0, 3, 3, 3] = 1.0
    with pytest.raises(ValueError, match="k_viewmats"):
        relpos.attention(q, k, v, enc, inputs={**inputs, "k_viewmats": m}, **pos)


def test_mis_shaped_cameras_are_refused_by_name(name):
    enc = _camera_encoding(name)
    q, k, v, pos, inputs = _call(enc, dtype=torch.float32)
    for bad in (inputs["k_viewmats"][:, :-1], inputs["k_viewmats"][..., :3, :3]):
        with pytest.raises(ValueError, match="k_viewmats"):
            relpos.attention(q, k, v, enc, inputs={**inputs, "k_viewmats": bad}, **pos)
    with pytest.raises(TypeError, match="k_viewmats"):
        relpos.attention(
            q, k, v, enc, inputs={**inputs, "k_viewmats": inputs["k_viewmats"].long()}, **pos
        )
    missing = {n: t for n, t in inputs.items() if n != "k_viewmats"}
    with pytest.raises(ValueError, match="k_viewmats"):
        relpos.attention(q, k, v, enc, inputs=missing, **pos)
    # more queries than keys: the query cameras cannot default to the key side
    q2 = torch.randn(B, H, L + 3, D)
    qp = lift_positions(enc, torch.arange(L + 3))
    qp = qp[None] if enc.dims == 1 else qp
    with pytest.raises(ValueError, match="q_viewmats"):
        relpos.attention(q2, k, v, enc, inputs=inputs, q_pos=qp, k_pos=pos["k_pos"])


@pytest.mark.parametrize("bad", ["fx <= 0", "skew", "row"])
def test_bad_intrinsics_are_refused_by_name(name, bad):
    enc = _camera_encoding(name)
    if "k_Ks" not in {**enc.required_inputs, **enc.optional_inputs}:
        pytest.skip("does not read intrinsics")
    q, k, v, pos, inputs = _call(enc, dtype=torch.float32)
    Ks = inputs["k_Ks"].clone()
    if bad == "fx <= 0":
        Ks[0, 2, 0, 0] = -1.0
    elif bad == "skew":
        Ks[0, 2, 0, 1] = 0.3
    else:
        Ks[0, 2, 2, 0] = 0.1
    with pytest.raises(ValueError, match="k_Ks"):
        relpos.attention(q, k, v, enc, inputs={**inputs, "k_Ks": Ks}, **pos)


def test_head_dims_the_method_cannot_take_are_refused(name):
    _camera_encoding(name)
    with pytest.raises(ValueError, match="head_dim"):
        relpos.create(name, num_heads=H, head_dim=D + 1)


def test_values_of_another_head_dim_are_refused_when_re_framed(name):
    enc = _camera_encoding(name)
    if not enc.rotates_values:
        pytest.skip("values are not re-framed")
    q, k, _, pos, inputs = _call(enc, dtype=torch.float32)
    v = torch.randn(B, H, L, D + 4)
    with pytest.raises(ValueError, match="head_dim"):
        relpos.attention(q, k, v, enc, inputs=inputs, **pos)


def test_rotary_state_matches_the_engine(name):
    """``common.rotary_state`` builds what the engine builds (the conformance helpers rely
    on it)."""
    enc = _camera_encoding(name).double()
    q, k, _, pos, _ = _call(enc)
    parts = []
    for rows, state in rotation_groups(enc, pos["q_pos"], pos["k_pos"], B, L, L):
        qr, kr = enc.rotate_qk(q, k, pos["q_pos"], pos["k_pos"], state)
        parts.append((rows, qr @ kr.transpose(-1, -2) * D**-0.5))
    s = scores(q, k, enc, **pos)
    torch.testing.assert_close(s, merge_groups(parts), rtol=0, atol=1e-12)
