"""LayoutLMv2 spatial-aware biases (``relpos.encodings.document.layoutlmv2``): T5 buckets
and the whole bias against transformers' LayoutLMv2 encoder as an oracle, hand-checked
boxes, query boxes, switches, option ranges."""

from __future__ import annotations

import pytest
import torch

import relpos
from relpos.encodings.document.boxes import example_boxes
from relpos.functional import t5_bucket

H, D = 4, 8


def _bias(enc, q, k, boxes, q_pos=None, k_pos=None, **extra):
    """The encoding's additive term: ``relpos.scores`` minus the scaled content term."""
    content = torch.einsum("bhid,bhjd->bhij", q, k) * D**-0.5
    inputs = {"boxes": boxes, **extra}
    return relpos.scores(q, k, enc, q_pos=q_pos, k_pos=k_pos, inputs=inputs) - content


def _hf_layoutlmv2():
    return pytest.importorskip("transformers.models.layoutlmv2.modeling_layoutlmv2")


@pytest.mark.parametrize("bins,max_distance", [(32, 128), (64, 256), (16, 50)])
def test_t5_bucket_is_layoutlmv2_relative_position_bucket(bins, max_distance):
    hf = _hf_layoutlmv2()
    rel = torch.arange(-3000, 3001)
    expected = hf.relative_position_bucket(rel, num_buckets=bins, max_distance=max_distance)
    got = t5_bucket(rel, bidirectional=True, num_buckets=bins, max_distance=max_distance)
    assert torch.equal(got, expected)


def test_layoutlmv2_bias_on_hand_checked_boxes():
    """Token 0 at (10, 20, 50, 40), token 1 at (300, 25, 340, 45), positions 0 and 1.
    From 0 to 1: x0 moves +290 (>= max 256: last bucket of the positive half, 32 + 31 = 63),
    y1 moves +5 (32 + 5 = 37), the position +1 (16 + 1 = 17); back: 31, 5 and 1."""
    torch.manual_seed(0)
    enc = relpos.create("layoutlmv2", num_heads=H, head_dim=D)
    boxes = torch.tensor([[[10, 20, 50, 40], [300, 25, 340, 45]]])
    q = torch.randn(1, H, 2, D)
    got = _bias(enc, q, q, boxes)
    w1, wx, wy = enc.rel_pos_bias.weight, enc.rel_pos_x_bias.weight, enc.rel_pos_y_bias.weight
    torch.testing.assert_close(got[0, :, 0, 1], w1[:, 17] + wx[:, 63] + wy[:, 37])
    torch.testing.assert_close(got[0, :, 1, 0], w1[:, 1] + wx[:, 31] + wy[:, 5])
    torch.testing.assert_close(got[0, :, 0, 0], w1[:, 0] + wx[:, 0] + wy[:, 0])


def test_layoutlmv2_matches_the_transformers_encoder():
    hf = _hf_layoutlmv2()
    from transformers import LayoutLMv2Config

    config = LayoutLMv2Config(
        hidden_size=H * D, num_attention_heads=H, num_hidden_layers=1, intermediate_size=16
    )
    torch.manual_seed(0)
    encoder = hf.LayoutLMv2Encoder(config)
    for p in encoder.parameters():
        torch.nn.init.normal_(p, std=0.5)
    enc = relpos.create("layoutlmv2", num_heads=H, head_dim=D)
    own = {n: t for n, t in encoder.state_dict().items() if n.startswith("rel_pos")}
    enc.load_state_dict(own)  # the same parameter names: encoder weights load directly
    gen = torch.Generator().manual_seed(1)
    boxes = example_boxes(2, 40, gen) * 2  # spread past max_rel_2d_pos
    pos = torch.stack([torch.arange(40), torch.arange(40) * 7])  # 1-D distances past 128
    expected = encoder._calculate_1d_position_embeddings(
        pos
    ) + encoder._calculate_2d_position_embeddings(boxes)
    q = torch.randn(2, H, 40, D, generator=gen)
    torch.testing.assert_close(_bias(enc, q, q, boxes, pos, pos), expected)


def test_layoutlmv2_queries_use_the_last_key_boxes_or_their_own():
    torch.manual_seed(0)
    enc = relpos.create("layoutlmv2", num_heads=H, head_dim=D)
    boxes = example_boxes(1, 12, torch.Generator().manual_seed(2))
    q = torch.randn(1, H, 12, D)
    full = _bias(enc, q, q, boxes)
    tail = _bias(enc, q[:, :, -3:], q, boxes)
    torch.testing.assert_close(tail, full[:, :, -3:])
    own = _bias(enc, q[:, :, :3], q, boxes, q_pos=torch.arange(3), query_boxes=boxes[:, :3])
    torch.testing.assert_close(own, full[:, :, :3])


def test_layoutlmv2_switches_and_gradients():
    torch.manual_seed(0)
    enc = relpos.create("layoutlmv2", num_heads=H, head_dim=D, has_spatial_attention_bias=False)
    assert not hasattr(enc, "rel_pos_x_bias")
    with pytest.raises(ValueError, match="both False"):
        relpos.create(
            "layoutlmv2",
            num_heads=H,
            head_dim=D,
            has_relative_attention_bias=False,
            has_spatial_attention_bias=False,
        )
    full = relpos.create("layoutlmv2", num_heads=H, head_dim=D)
    boxes = example_boxes(2, 10, torch.Generator().manual_seed(3))
    q = torch.randn(2, H, 10, D)
    out = relpos.attention(q, q, q, full, inputs={"boxes": boxes}, backend="chunked")
    out.square().sum().backward()
    for name, p in full.named_parameters():
        assert p.grad is not None and p.grad.abs().max() > 0, name  # the tables train


def test_t5_bucket_options_refuse_ranges_that_give_garbage_buckets():
    """Bidirectional T5 buckets need >= 4 buckets and ``max_distance > bins // 4`` (the exact
    range): below that, ``t5_bucket`` divides by ``log(1)`` or a negative log and returns
    negative ids, which would silently index the tables from their end."""
    for options, name in (
        ({"rel_pos_bins": 2}, "rel_pos_bins"),
        ({"rel_pos_bins": 32, "max_rel_pos": 8}, "max_rel_pos"),
        ({"rel_2d_pos_bins": 3}, "rel_2d_pos_bins"),
        ({"rel_2d_pos_bins": 64, "max_rel_2d_pos": 16}, "max_rel_2d_pos"),
    ):
        with pytest.raises(ValueError, match=name):
            relpos.create("layoutlmv2", num_heads=H, head_dim=D, **options)
    with pytest.raises(ValueError, match="max_rel_pos"):
        relpos.create("docpolarbert", num_heads=H, head_dim=D, rel_pos_bins=32, max_rel_pos=6)
    # the smallest accepted range gives valid, monotone buckets on each side
    enc = relpos.create(
        "layoutlmv2", num_heads=H, head_dim=D, rel_pos_bins=32, max_rel_pos=9, rel_2d_pos_bins=4
    )
    ids = enc.bucket_1d(torch.arange(0, 200))
    assert int(ids.min()) >= 0 and int(ids.max()) < 32 and bool((ids.diff() >= 0).all())
    ids = enc.bucket_2d(torch.arange(-300, 0))
    assert int(ids.min()) >= 0 and int(ids.max()) < 4


def test_layoutlmv2_keeps_the_official_parameter_names_and_family():
    enc = relpos.create("layoutlmv2", num_heads=H, head_dim=D)
    assert {k: tuple(v.shape) for k, v in enc.state_dict().items()} == {
        "rel_pos_bias.weight": (H, 32),
        "rel_pos_x_bias.weight": (H, 64),
        "rel_pos_y_bias.weight": (H, 64),
    }
    assert enc.family == "document"
    assert not enc.capabilities()["needs_probabilities"] and enc.required_inputs == {
        "boxes": enc.required_inputs["boxes"]
    }
