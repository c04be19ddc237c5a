"""Swin (2-D, 3-D) and Swin-V2 relative position biases (``relpos.encodings.spatial.swin``):
reference values worked out from the official code (microsoft/Swin-Transformer), the official index
construction and resize recipe transcribed, and dense references written from the formulas
(loops over token pairs), forward and backward."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import relpos
from relpos.encodings.spatial.swin import (
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


def test_parameter_names_are_the_official_ones_and_the_family_is_the_folder():
    shapes = {
        "swin-2d": {"relative_position_bias_table": (13 * 13, H)},
        "swin-3d": {"relative_position_bias_table": (15 * 13 * 13, H)},
        "swin-v2": {
            "cpb_mlp.0.weight": (512, 2),
            "cpb_mlp.0.bias": (512,),
            "cpb_mlp.2.weight": (H, 512),
        },
    }
    for name, expected in shapes.items():
        enc = relpos.create(name, num_heads=H, head_dim=D)
        assert {k: tuple(v.shape) for k, v in enc.state_dict().items()} == expected, name
        assert enc.family == "spatial"
