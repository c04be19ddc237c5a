"""Swin (2-D, 3-D), Swin-V2 and MViTv2 relative positions, CoordConv channels: the reference
values of ``../shared/spec/formulas-bias.md`` sections 15-16 and dense references written
from the formulas (loops over token pairs), forward and backward."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import relpos
from relpos.encodings.spatial.windows import (
    add_coord_channels,
    mvit_relative_distance,
    resize_relative_position_table,
    swin_relative_position_index,
    swin_v2_coordinates_table,
    swin_window_coordinates,
)

H, D = 4, 8


def _content(q, k, scale):
    return torch.einsum("bhid,bhjd->bhij", q, k) * scale


def _bias(enc, q, k, q_pos, k_pos):
    """The encoding's additive term: ``relpos.scores`` minus the scaled content term."""
    return relpos.scores(q, k, enc, q_pos=q_pos, k_pos=k_pos) - _content(q, k, D**-0.5)


def _official_swin_index(window):
    """microsoft/Swin-Transformer ``WindowAttention.__init__`` (2-D) and its Video Swin form,
    transcribed: coords -> relative coords + (W - 1) -> per-axis multipliers -> sum."""
    coords = torch.stack(torch.meshgrid(*[torch.arange(w) for w in window], indexing="ij"))
    flat = torch.flatten(coords, 1)
    rel = (flat[:, :, None] - flat[:, None, :]).permute(1, 2, 0).contiguous()
    for a, w in enumerate(window):
        rel[:, :, a] += w - 1
    if len(window) == 2:
        rel[:, :, 0] *= 2 * window[1] - 1
    else:
        rel[:, :, 0] *= (2 * window[1] - 1) * (2 * window[2] - 1)
        rel[:, :, 1] *= 2 * window[2] - 1
    return rel.sum(-1)


# ------------------------------------------------------------------------------ Swin index
def test_swin_index_for_window_2x2_matches_spec():
    expected = torch.tensor([[4, 3, 1, 0], [5, 4, 2, 1], [7, 6, 4, 3], [8, 7, 5, 4]])
    assert torch.equal(swin_relative_position_index((2, 2)), expected)


def test_swin_index_for_window_7x7_matches_spec():
    index = swin_relative_position_index((7, 7))
    assert index.shape == (49, 49)
    assert (int(index[0, 0]), int(index[0, 48]), int(index[48, 0])) == (84, 0, 168)
    assert index.unique().numel() == 169  # every row of the (13 * 13)-row table is used


def test_swin_3d_index_for_window_2x2x2_matches_spec():
    index = swin_relative_position_index((2, 2, 2))
    assert index[0].tolist() == [13, 12, 10, 9, 4, 3, 1, 0]
    assert index[7].tolist() == [26, 25, 23, 22, 17, 16, 14, 13]


@pytest.mark.parametrize("window", [(3, 5), (7, 7), (4, 2), (2, 3, 4), (3, 3, 3)])
def test_swin_index_matches_official_construction(window):
    assert torch.equal(swin_relative_position_index(window), _official_swin_index(window))


def test_window_coordinates_are_row_major():
    coords = swin_window_coordinates((2, 3))
    assert coords.tolist() == [[0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2]]


# ------------------------------------------------------------------------------ Swin bias
@pytest.mark.parametrize("name,window", [("swin-2d", (3, 4)), ("swin-3d", (2, 3, 2))])
def test_swin_bias_on_a_full_window_is_table_at_official_index(name, window):
    torch.manual_seed(0)
    enc = relpos.create(name, num_heads=H, head_dim=D, window_size=window)
    n = math.prod(window)
    pos = swin_window_coordinates(window)[None]
    gen = torch.Generator().manual_seed(1)
    q, k = torch.randn(2, H, n, D, generator=gen), torch.randn(2, H, n, D, generator=gen)
    table = enc.relative_position_bias_table
    expected = table[_official_swin_index(window).reshape(-1)].reshape(n, n, H).permute(2, 0, 1)
    torch.testing.assert_close(_bias(enc, q, k, pos, pos), expected.expand(2, H, n, n))


@pytest.mark.parametrize("name,window", [("swin-2d", (3, 5)), ("swin-3d", (2, 3, 4))])
def test_swin_bias_for_scattered_coordinates_matches_pair_loop(name, window):
    """Per-batch coordinates in any order, with repeats, Lq != Lk; forward and backward."""
    torch.manual_seed(0)
    enc = relpos.create(name, num_heads=H, head_dim=D, window_size=window)
    gen = torch.Generator().manual_seed(2)
    hi = torch.tensor(window)
    qp = (torch.rand(2, 5, len(window), generator=gen) * hi).long()
    kp = (torch.rand(2, 7, len(window), generator=gen) * hi).long()
    q, k = torch.randn(2, H, 5, D, generator=gen), torch.randn(2, H, 7, D, generator=gen)
    table = enc.relative_position_bias_table
    rows = torch.empty(2, 5, 7, dtype=torch.long)
    for b in range(2):
        for i in range(5):
            for j in range(7):
                row = 0
                for a, w in enumerate(window):  # Horner over the axes, time first
                    row = row * (2 * w - 1) + int(qp[b, i, a] - kp[b, j, a]) + w - 1
                rows[b, i, j] = row
    expected = table[rows].permute(0, 3, 1, 2)
    got = _bias(enc, q, k, qp, kp)
    torch.testing.assert_close(got, expected)
    weight = torch.randn(got.shape, generator=gen)
    (grad,) = torch.autograd.grad((got * weight).sum(), table)
    (ref,) = torch.autograd.grad((expected * weight).sum(), table)
    torch.testing.assert_close(grad, ref)


def test_swin_is_relative_inside_the_window():
    torch.manual_seed(0)
    enc = relpos.create("swin-2d", num_heads=H, head_dim=D, window_size=(6, 6))
    pos = swin_window_coordinates((3, 4))[None]
    q = torch.randn(1, H, 12, D)
    ref = relpos.scores(q, q, enc, q_pos=pos, k_pos=pos)
    moved = relpos.scores(
        q, q, enc, q_pos=pos + torch.tensor([2, 1]), k_pos=pos + torch.tensor([2, 1])
    )
    torch.testing.assert_close(moved, ref)


@pytest.mark.parametrize("name", ["swin-2d", "swin-v2", "mvit2"])
def test_coordinates_outside_the_window_raise_per_axis(name):
    enc = relpos.create(
        name,
        num_heads=H,
        head_dim=D,
        **{
            "swin-2d": {"window_size": (3, 5)},
            "swin-v2": {"window_size": (3, 5)},
            "mvit2": {"q_size": (3, 5)},
        }[name],
    )
    q = torch.randn(1, H, 2, D)
    ok = torch.tensor([[[2, 4], [0, 0]]])  # axis 1 reaches 4 < 5
    relpos.scores(q, q, enc, q_pos=ok, k_pos=ok)
    for bad in (
        torch.tensor([[[3, 0], [0, 0]]]),
        torch.tensor([[[0, 5], [0, 0]]]),
        torch.tensor([[[0, -1], [0, 0]]]),
    ):
        with pytest.raises(ValueError, match="max_positions"):
            relpos.scores(q, q, enc, q_pos=bad, k_pos=ok)


def test_bad_window_sizes_name_the_argument():
    for bad in (0, (7,), (7, 7, 7), (7, 2.5), "7", True):
        with pytest.raises(ValueError, match="window_size"):
            relpos.create("swin-2d", num_heads=H, head_dim=D, window_size=bad)
    with pytest.raises(ValueError, match="window_size"):
        relpos.create("swin-v2", num_heads=H, head_dim=D, window_size=1)  # W - 1 = 0
    with pytest.raises(ValueError, match="kv_size"):
        relpos.create("mvit2", num_heads=H, head_dim=D, kv_size=(4, 0))


# ------------------------------------------------------------------------------ resize
def _official_resize(table, old, new):
    """Swin ``load_pretrained`` (square windows), transcribed."""
    heads = table.shape[1]
    s1, s2 = 2 * old - 1, 2 * new - 1
    grid = table.permute(1, 0).view(1, heads, s1, s1)
    out = F.interpolate(grid, size=(s2, s2), mode="bicubic")
    return out.view(heads, s2 * s2).permute(1, 0)


def test_resize_to_the_same_window_keeps_the_table():
    table = torch.randn(13 * 13, H)
    torch.testing.assert_close(resize_relative_position_table(table, (7, 7), (7, 7)), table)
    table3 = torch.randn(3 * 5 * 5, H)
    out = resize_relative_position_table(table3, (2, 3, 3), (2, 3, 3))
    torch.testing.assert_close(out, table3)


@pytest.mark.parametrize("old,new", [(7, 12), (12, 7), (8, 16)])
def test_resize_matches_the_official_bicubic_recipe(old, new):
    table = torch.randn((2 * old - 1) ** 2, H, generator=torch.Generator().manual_seed(0))
    out = resize_relative_position_table(table, (old, old), (new, new))
    assert out.shape == ((2 * new - 1) ** 2, H)
    torch.testing.assert_close(out, _official_resize(table, old, new))


def test_resize_keeps_constant_heads_constant_and_loads_into_a_new_window():
    table = torch.arange(H, dtype=torch.float32).expand(13 * 13, H).contiguous()
    out = resize_relative_position_table(table, (7, 7), (4, 10))
    assert out.shape == (7 * 19, H)
    torch.testing.assert_close(out, torch.arange(H, dtype=torch.float32).expand(7 * 19, H))
    enc = relpos.create("swin-2d", num_heads=H, head_dim=D, window_size=(4, 10))
    enc.relative_position_bias_table.data.copy_(out)  # the shape a (4, 10) window needs
    with pytest.raises(ValueError, match="old_window"):
        resize_relative_position_table(table, (6, 6), (7, 7))


def test_resize_3d_uses_trilinear_interpolation():
    table = torch.randn(3 * 5 * 5, H)
    out = resize_relative_position_table(table, (2, 3, 3), (3, 4, 4))
    grid = table.t().reshape(1, H, 3, 5, 5)
    ref = F.interpolate(grid, size=(5, 7, 7), mode="trilinear", align_corners=False)
    torch.testing.assert_close(out, ref.reshape(H, -1).t())


# ------------------------------------------------------------------------------ Swin-V2
def _log_coordinate(delta: int, ref_window: int) -> float:
    x = delta / (ref_window - 1) * 8
    return math.copysign(math.log2(abs(x) + 1) / 3, x) if x else 0.0


def test_swin_v2_coordinates_are_log_spaced_as_in_spec():
    table = swin_v2_coordinates_table((8, 8))
    assert table.shape == (15, 15, 2)
    # row = dh + 7, column = dw + 7; channel 0 is dh, channel 1 is dw
    assert table[7, 7].tolist() == [0.0, 0.0]
    assert table[14, 0, 0].item() == pytest.approx(math.log2(9) / 3)  # dh = 7 -> 8 -> 1.0566
    assert table[14, 0, 1].item() == pytest.approx(-math.log2(9) / 3)
    assert table[6, 7, 0].item() == pytest.approx(_log_coordinate(-1, 8))
    pre = swin_v2_coordinates_table((8, 8), pretrained_window_size=(4, 4))
    assert pre[14, 7, 0].item() == pytest.approx(_log_coordinate(7, 4))  # beyond [-1, 1]


def test_swin_v2_bias_matches_pair_loop_forward_and_backward():
    torch.manual_seed(0)
    enc = relpos.create(
        "swin-v2",
        num_heads=H,
        head_dim=D,
        window_size=(4, 5),
        pretrained_window_size=(3, 3),
        mlp_width=16,
    )
    gen = torch.Generator().manual_seed(3)
    qp = torch.stack(
        [torch.randint(0, 4, (2, 6), generator=gen), torch.randint(0, 5, (2, 6), generator=gen)],
        dim=-1,
    )
    q = torch.randn(2, H, 6, D, generator=gen)
    got = _bias(enc, q, q, qp, qp)
    mlp = enc.cpb_mlp
    expected = torch.empty(2, H, 6, 6)
    for b in range(2):
        for i in range(6):
            for j in range(6):
                c = torch.tensor(
                    [
                        _log_coordinate(int(qp[b, i, 0] - qp[b, j, 0]), 3),
                        _log_coordinate(int(qp[b, i, 1] - qp[b, j, 1]), 3),
                    ]
                )
                expected[b, :, i, j] = 16 * torch.sigmoid(mlp(c))
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    weight = torch.randn(got.shape, generator=gen)
    params = list(mlp.parameters())
    grads = torch.autograd.grad((got * weight).sum(), params)
    refs = torch.autograd.grad((expected * weight).sum(), params)
    for g, r in zip(grads, refs, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-6)


def test_swin_v2_bias_lies_in_0_16():
    torch.manual_seed(0)
    enc = relpos.create("swin-v2", num_heads=H, head_dim=D)
    table = enc.bias_table().detach()
    assert table.shape == (15 * 15, H)
    assert float(table.min()) > 0 and float(table.max()) < 16


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
def test_mvit2_matches_official_on_full_grids_forward_and_backward(q_size, kv_size):
    torch.manual_seed(0)
    enc = relpos.create("mvit2", num_heads=H, head_dim=D, q_size=q_size, kv_size=kv_size)
    assert enc.relative == (q_size == kv_size)
    gen = torch.Generator().manual_seed(4)
    nq, nk = math.prod(q_size), math.prod(kv_size)
    q = torch.randn(2, H, nq, D, generator=gen, requires_grad=True)
    k = torch.randn(2, H, nk, D, generator=gen)
    q_pos = swin_window_coordinates(q_size)[None]
    k_pos = swin_window_coordinates(kv_size)[None]
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


def test_mvit2_term_reads_the_unscaled_query():
    """Official: ``attn = (q * scale) @ k^T`` then ``+ q . R`` with the raw q."""
    torch.manual_seed(0)
    enc = relpos.create("mvit2", num_heads=H, head_dim=D, q_size=(3, 3))
    q = torch.randn(1, H, 9, D)
    pos = swin_window_coordinates((3, 3))[None]
    a = relpos.scores(q, q, enc, q_pos=pos, k_pos=pos, scale=0.5) - _content(q, q, 0.5)
    b = relpos.scores(q, q, enc, q_pos=pos, k_pos=pos, scale=0.1) - _content(q, q, 0.1)
    torch.testing.assert_close(a, b)
    one = torch.einsum("d,d->", q[0, 1, 4], enc.rel_pos_h[mvit_relative_distance(3, 3)[1, 2]])
    one = one + torch.einsum("d,d->", q[0, 1, 4], enc.rel_pos_w[mvit_relative_distance(3, 3)[1, 0]])
    torch.testing.assert_close(a[0, 1, 4, 6], one)  # query (1, 1), key (2, 0)


def test_mvit2_3d_adds_a_temporal_term_of_the_same_form():
    torch.manual_seed(0)
    enc = relpos.create("mvit2-3d", num_heads=H, head_dim=D, q_size=(2, 3, 3), kv_size=(1, 3, 3))
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(1, H, 18, D, generator=gen)
    k = torch.randn(1, H, 9, D, generator=gen)
    qp = swin_window_coordinates((2, 3, 3))[None]
    kp = swin_window_coordinates((1, 3, 3))[None]
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


# ------------------------------------------------------------------------------ CoordConv
def test_coord_channels_values():
    x = torch.randn(2, 3, 4, 5)
    out = add_coord_channels(x)
    assert out.shape == (2, 5, 4, 5)
    torch.testing.assert_close(out[:, :3], x)
    xs = torch.tensor([-1.0, -0.5, 0.0, 0.5, 1.0])
    ys = torch.tensor([-1.0, -1 / 3, 1 / 3, 1.0])
    torch.testing.assert_close(out[1, 3], xs.expand(4, 5))  # columns
    torch.testing.assert_close(out[1, 4], ys[:, None].expand(4, 5))  # rows


def test_coord_channels_radius_and_official_centre():
    x = torch.zeros(1, 1, 3, 3, dtype=torch.float64)
    r = add_coord_channels(x, with_r=True)[0, 3]
    assert r.dtype == torch.float64
    assert r[1, 1].item() == 0.0 and r[0, 0].item() == pytest.approx(math.sqrt(2))
    official = add_coord_channels(x, with_r=True, r_center=(0.5, 0.5))[0, 3]
    assert official[0, 0].item() == pytest.approx(math.sqrt(2 * 1.5**2))


def test_coord_channels_single_pixel_axis_and_errors():
    out = add_coord_channels(torch.ones(1, 2, 1, 4))
    assert out[0, 3].eq(0).all()  # y of a one-row map
    with pytest.raises(ValueError, match="x"):
        add_coord_channels(torch.ones(2, 3, 4))
    with pytest.raises(TypeError, match="floating"):
        add_coord_channels(torch.ones(1, 1, 2, 2, dtype=torch.long))
