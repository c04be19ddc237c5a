"""MViTv2 decomposed relative positions (``relpos.encodings.spatial.mvit``): distance matrices
worked out from the official code (facebookresearch/mvit), the official
``cal_rel_pos_spatial`` transcribed (forward and backward), the unscaled query, the 3-D
temporal term, and the former registry names."""

from __future__ import annotations

import math

import pytest
import torch

import relpos
from relpos.encodings.spatial.grid import grid_coordinates
from relpos.encodings.spatial.mvit import (
    MViTv2Decomposed,
    MViTv2Decomposed3D,
    mvit_relative_distance,
)

H, D = 4, 8


def _content(q, k, scale):
    return torch.einsum("bhid,bhjd->bhij", q, k) * scale


def _bias(enc, q, k, q_pos, k_pos):
    """The encoding's additive term: ``relpos.scores`` minus the scaled content term."""
    return relpos.scores(q, k, enc, q_pos=q_pos, k_pos=k_pos) - _content(q, k, D**-0.5)


# ------------------------------------------------------------------------------ MViTv2
@pytest.mark.parametrize(
    "q,k,expected",
    [
        (3, 3, [[2, 1, 0], [3, 2, 1], [4, 3, 2]]),
        (2, 4, [[3, 2, 1, 0], [5, 4, 3, 2]]),
        (4, 2, [[2, 0], [3, 1], [4, 2], [5, 3]]),
    ],
)
def test_mvit_distance_matrices_match_spec(q, k, expected):
    assert mvit_relative_distance(q, k).tolist() == expected


@pytest.mark.parametrize("q,k", [(3, 2), (5, 3), (7, 7), (2, 7)])
def test_mvit_distances_fit_the_table(q, k):
    dist = mvit_relative_distance(q, k)
    assert int(dist.min()) >= 0 and int(dist.max()) < 2 * max(q, k) - 1


def _official_cal_rel_pos_spatial(attn, q, q_shape, k_shape, rel_pos_h, rel_pos_w):
    """facebookresearch/mvit ``cal_rel_pos_spatial`` (no class token), transcribed."""
    q_h, q_w = q_shape
    k_h, k_w = k_shape
    dist_h = mvit_relative_distance(q_h, k_h)
    dist_w = mvit_relative_distance(q_w, k_w)
    rh, rw = rel_pos_h[dist_h], rel_pos_w[dist_w]
    b, n_head, _, dim = q.shape
    r_q = q.reshape(b, n_head, q_h, q_w, dim)
    rel_h = torch.einsum("byhwc,hkc->byhwk", r_q, rh)
    rel_w = torch.einsum("byhwc,wkc->byhwk", r_q, rw)
    attn = attn.view(b, n_head, q_h, q_w, k_h, k_w)
    attn = attn + rel_h[:, :, :, :, :, None] + rel_w[:, :, :, :, None, :]
    return attn.view(b, n_head, q_h * q_w, k_h * k_w)


@pytest.mark.parametrize("q_size,kv_size", [((4, 4), (4, 4)), ((4, 4), (2, 2)), ((3, 5), (6, 2))])
def test_mvitv2_matches_official_on_full_grids_forward_and_backward(q_size, kv_size):
    torch.manual_seed(0)
    enc = relpos.create("mvitv2", num_heads=H, head_dim=D, q_size=q_size, kv_size=kv_size)
    assert enc.relative == (q_size == kv_size)
    gen = torch.Generator().manual_seed(4)
    nq, nk = math.prod(q_size), math.prod(kv_size)
    q = torch.randn(2, H, nq, D, generator=gen, requires_grad=True)
    k = torch.randn(2, H, nk, D, generator=gen)
    q_pos = grid_coordinates(q_size)[None]
    k_pos = grid_coordinates(kv_size)[None]
    got = relpos.scores(q, k, enc, q_pos=q_pos, k_pos=k_pos)
    ref = _official_cal_rel_pos_spatial(
        _content(q, k, D**-0.5), q, q_size, kv_size, enc.rel_pos_h, enc.rel_pos_w
    )
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    weight = torch.randn(got.shape, generator=gen)
    wrt = [q, enc.rel_pos_h, enc.rel_pos_w]
    grads = torch.autograd.grad((got * weight).sum(), wrt)
    refs = torch.autograd.grad((ref * weight).sum(), wrt)
    for g, r in zip(grads, refs, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-5)


def test_mvitv2_term_reads_the_unscaled_query():
    """Official: ``attn = (q * scale) @ k^T`` then ``+ q . R`` with the raw q."""
    torch.manual_seed(0)
    enc = relpos.create("mvitv2", num_heads=H, head_dim=D, q_size=(3, 3))
    q = torch.randn(1, H, 9, D)
    pos = grid_coordinates((3, 3))[None]
    a = relpos.scores(q, q, enc, q_pos=pos, k_pos=pos, scale=0.5) - _content(q, q, 0.5)
    b = relpos.scores(q, q, enc, q_pos=pos, k_pos=pos, scale=0.1) - _content(q, q, 0.1)
    torch.testing.assert_close(a, b)
    one = torch.einsum("d,d->", q[0, 1, 4], enc.rel_pos_h[mvit_relative_distance(3, 3)[1, 2]])
    one = one + torch.einsum("d,d->", q[0, 1, 4], enc.rel_pos_w[mvit_relative_distance(3, 3)[1, 0]])
    torch.testing.assert_close(a[0, 1, 4, 6], one)  # query (1, 1), key (2, 0)


def test_mvitv2_3d_adds_a_temporal_term_of_the_same_form():
    torch.manual_seed(0)
    enc = relpos.create("mvitv2-3d", num_heads=H, head_dim=D, q_size=(2, 3, 3), kv_size=(1, 3, 3))
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(1, H, 18, D, generator=gen)
    k = torch.randn(1, H, 9, D, generator=gen)
    qp = grid_coordinates((2, 3, 3))[None]
    kp = grid_coordinates((1, 3, 3))[None]
    got = _bias(enc, q, k, qp, kp)
    expected = torch.zeros(1, H, 18, 9)
    tables = (enc.rel_pos_t, enc.rel_pos_h, enc.rel_pos_w)
    dists = [mvit_relative_distance(a, b) for a, b in zip((2, 3, 3), (1, 3, 3), strict=True)]
    for i in range(18):
        for j in range(9):
            for a in range(3):
                row = tables[a][dists[a][qp[0, i, a], kp[0, j, a]]]
                expected[0, :, i, j] += q[0, :, i] @ row
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "old,new,cls",
    [("mvit2", "mvitv2", MViTv2Decomposed), ("mvit2-3d", "mvitv2-3d", MViTv2Decomposed3D)],
)
def test_former_mvit_names_create_the_same_encoding(old, new, cls):
    assert old not in relpos.available() and new in relpos.available()
    torch.manual_seed(0)
    a = relpos.create(old, num_heads=H, head_dim=D)
    torch.manual_seed(0)
    b = relpos.create(new, num_heads=H, head_dim=D)
    assert type(a) is type(b) is cls and a.name == new
    assert {k: v.shape for k, v in a.state_dict().items()} == {
        k: v.shape for k, v in b.state_dict().items()
    }
    b.load_state_dict(a.state_dict())  # checkpoints saved under the old name load


def test_parameter_names_are_the_official_ones():
    enc = relpos.create("mvitv2", num_heads=H, head_dim=D, kv_size=7)
    assert {k: tuple(v.shape) for k, v in enc.state_dict().items()} == {
        "rel_pos_h": (27, D),
        "rel_pos_w": (27, D),
    }
    enc3 = relpos.create("mvitv2-3d", num_heads=H, head_dim=D)
    assert set(enc3.state_dict()) == {"rel_pos_t", "rel_pos_h", "rel_pos_w"}
    assert enc.family == enc3.family == "spatial"
