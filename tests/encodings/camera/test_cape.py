"""EscherNet CaPE 6-DoF: equals EscherNet's row-vector formula (camera spec §2.4, R.5)."""

from __future__ import annotations

import torch

import relpos
from relpos import cameras

from .scene import qk, tokens, world_G


def _eschernet_logits(q, k, view):
    """EscherNet ``cape_embed``: row-vector 4-chunks times the pose; queries ``P^-T``, keys
    ``P`` (written from the paper's formula, with ``torch.linalg.inv`` as the oracle)."""
    B, H, L, D = q.shape
    P = view[:, None, :, None]  # (B, 1, L, 1, 4, 4)
    qr = (q.reshape(B, H, L, D // 4, 1, 4) @ torch.linalg.inv(P).transpose(-1, -2)).reshape(q.shape)
    kr = (k.reshape(B, H, L, D // 4, 1, 4) @ P).reshape(k.shape)
    return qr @ kr.transpose(-1, -2)


def test_cape_equals_the_eschernet_formula():
    enc = relpos.create("cape-6dof", num_heads=1, head_dim=16).double()
    q, k = qk()
    view = tokens()["viewmats"]
    s = relpos.scores(q, k, enc, scale=1.0, inputs={"k_viewmats": view})
    torch.testing.assert_close(s, _eschernet_logits(q, k, view), atol=1e-12, rtol=0)


def test_cape_is_invariant_and_leaves_values_alone():
    enc = relpos.create("cape-6dof", num_heads=1, head_dim=16).double()
    assert not enc.rotates_values and enc.se3_invariant and enc.dims == 1
    q, k = qk()
    view = tokens()["viewmats"]
    moved = cameras.apply_world_transform(view, world_G())
    a = relpos.attention(q, k, k, enc, inputs={"k_viewmats": view})
    b = relpos.attention(q, k, k, enc, inputs={"k_viewmats": moved})
    torch.testing.assert_close(a, b, atol=1e-12, rtol=0)
    # identical cameras: plain attention (NoPE)
    same = {"k_viewmats": view[:, :1].expand_as(view)}
    plain = torch.softmax(q @ k.transpose(-1, -2) / 4, -1) @ k
    torch.testing.assert_close(
        relpos.attention(q, k, k, enc, inputs=same), plain, atol=1e-12, rtol=0
    )
