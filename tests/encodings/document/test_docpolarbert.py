"""DocPolarBERT (``relpos.encodings.document.docpolarbert``): angle and distance buckets on
hand-checked boxes, quantile edges, and a dense transcription of DocPolarBERT's official
pipeline (buthaya/docpolarbert ``DocPolarBERTEncoder`` + ``SelfAttention``)."""

from __future__ import annotations

import math

import pytest
import torch

import relpos
from relpos.encodings.document.boxes import example_boxes
from relpos.encodings.document.docpolarbert import (
    distance_bucket,
    distance_quantile_edges,
    page_distance_edges,
    polar_angle_bucket,
    quantile_edges,
)
from relpos.functional import t5_bucket

H, D = 4, 8


def _bias(enc, q, k, boxes, q_pos=None, k_pos=None, **extra):
    """The encoding's additive term: ``relpos.scores`` minus the scaled content term."""
    content = torch.einsum("bhid,bhjd->bhij", q, k) * D**-0.5
    inputs = {"boxes": boxes, **extra}
    return relpos.scores(q, k, enc, q_pos=q_pos, k_pos=k_pos, inputs=inputs) - content


def test_angle_buckets_on_hand_checked_directions():
    """Query centre at the origin; y grows downwards, angles are counter-clockwise on the
    page. Same line (vertical overlap): right 1, left 3; same column: above 2, below 4;
    otherwise the 45-degree sector + 5."""
    t, f = torch.tensor(True), torch.tensor(False)
    cases = [
        ((10.0, 0.0), (f, t), 1),  # right, same line
        ((-10.0, 2.0), (f, t), 3),  # left, same line
        ((0.0, -10.0), (t, f), 2),  # above, same column
        ((1.0, 10.0), (t, f), 4),  # below, same column
        ((10.0, -10.0), (f, f), 6),  # up-right at exactly 45 degrees: sector 1
        ((10.0, -5.0), (f, f), 5),  # up-right at 26.6 degrees: sector 0
        ((-10.0, -1.0), (f, f), 8),  # left and a little up: 174 degrees, sector 3
        ((-10.0, 1.0), (f, f), 9),  # left and a little down: 186 degrees, sector 4
        ((10.0, 1.0), (f, f), 12),  # right and a little down: 354 degrees, sector 7
        ((10.0, 0.0), (t, t), 2),  # overlapping both ways: the column rule wins (a = 0 < 180)
        ((0.0, -10.0), (f, t), 7),  # a = 90 exactly on one line: no special bucket, sector 2
    ]
    for (dx, dy), (ox, oy), expected in cases:
        got = polar_angle_bucket(torch.tensor(dx), torch.tensor(dy), ox, oy, 8)
        assert int(got) == expected, (dx, dy, ox, oy)


def test_distance_buckets_count_edges_below():
    edges = torch.tensor([0.0, 10.0, 20.0, 30.0, 40.0])
    dist = torch.tensor([0.0, 5.0, 10.0, 10.5, 40.0, 100.0])
    assert distance_bucket(dist, edges).tolist() == [0, 1, 1, 2, 4, 4]
    assert torch.equal(
        distance_bucket(dist[:5], edges), torch.bucketize(dist[:5], edges, right=False)
    )


def test_quantile_edges_equal_torch_quantile():
    gen = torch.Generator().manual_seed(0)
    for values in (torch.rand(1001, generator=gen), torch.randint(0, 7, (500,)).float()):
        for n in (1, 4, 7):
            expected = torch.quantile(values, torch.linspace(0, 1, n + 1))
            torch.testing.assert_close(quantile_edges(values, n), expected)


def test_page_edges_are_quantiles_of_uniform_points():
    edges = page_distance_edges(4, 1000.0)
    assert edges[0].item() == 0.0 and edges[-1].item() == pytest.approx(1000 * math.sqrt(2))
    gen = torch.Generator().manual_seed(0)
    pts = torch.rand(400_000, 2, 2, generator=gen, dtype=torch.float64) * 1000
    dist = (pts[:, 0] - pts[:, 1]).norm(dim=-1)
    sample = torch.quantile(dist.float(), torch.tensor([0.25, 0.5, 0.75]))
    torch.testing.assert_close(edges[1:4], sample, rtol=5e-3, atol=0)


def _official_docpolarbert_terms(enc, q, boxes, pos, scale):
    """The official DocPolarBERT pipeline for one self-attention call (``_cal_1d_pos_emb``,
    ``_cal_2D_pos_emb`` + ``group_distances``, ``_cal_2D_angle_emb`` + ``group_angles``, the
    einsums of ``DocPolarBERTSelfAttention``), transcribed with ``edges`` computed by
    ``torch.quantile`` over the batch and padding decided from the boxes."""
    b, n = boxes.shape[:2]
    n_d, n_a = enc.rel_2d_pos_bins, enc.rel_2d_angle_bins
    rel = pos[:, None, :] - pos[:, :, None]  # p_j - p_i
    bucket_1d = t5_bucket(rel, num_buckets=enc.rel_pos_bins, max_distance=enc.max_rel_pos)
    rel_1d = enc.rel_pos_bias.weight.t()[bucket_1d]  # (B, N, N, D)

    centers = (boxes[..., :2] + boxes[..., 2:]) / 2
    diffs = centers[:, :, None, :] - centers[:, None, :, :]
    dist = torch.sqrt(diffs.pow(2).sum(-1))
    point = (boxes[..., 0] == boxes[..., 2]) & (boxes[..., 1] == boxes[..., 3])
    pad = point[:, :, None] | point[:, None, :]
    edges = torch.quantile(dist[~pad], torch.linspace(0, 1, n_d + 1))
    dist_bucket = torch.bucketize(dist, edges, right=False)
    dist_bucket[pad] = n_d + 1
    rel_2d = enc.rel_pos_2D_embedding(dist_bucket)

    angles = (
        360
        - torch.atan2(
            centers[:, :, 1].unsqueeze(1) - centers[:, :, 1].unsqueeze(2),
            centers[:, :, 0].unsqueeze(1) - centers[:, :, 0].unsqueeze(2),
        )
        * 180
        / torch.pi
    ) % 360
    ix = (boxes[:, :, 2, None] >= boxes[:, None, :, 0]) & (
        boxes[:, None, :, 2] >= boxes[:, :, 0, None]
    )
    iy = (boxes[:, :, 3, None] >= boxes[:, None, :, 1]) & (
        boxes[:, None, :, 3] >= boxes[:, :, 1, None]
    )
    binned = (angles // (360 / n_a)).long() + 5
    binned[iy & ((angles < 90) | (angles > 270))] = 1
    binned[iy & (angles > 90) & (angles < 270)] = 3
    binned[ix & (angles < 180)] = 2
    binned[ix & (angles > 180)] = 4
    binned[pad] = n_a + 5
    binned[:, torch.eye(n, dtype=torch.bool)] = 0
    rel_angle = enc.rel_pos_angle_embedding(binned)

    qs = q * scale
    return sum(torch.einsum("bnsh,bskh->bnsk", qs, r) for r in (rel_1d, rel_2d, rel_angle))


def test_docpolarbert_matches_the_official_pipeline_forward_and_backward():
    torch.manual_seed(0)
    enc = relpos.create("docpolarbert", num_heads=H, head_dim=D, distance_edges="call")
    gen = torch.Generator().manual_seed(4)
    boxes = example_boxes(2, 24, gen)
    boxes[1, 5] = torch.tensor([400, 400, 400, 400])  # a second token without a box
    boxes[0, 7:10] = torch.tensor([100, 500, 180, 520])  # three words on one box: d = 0
    boxes[1, 2:4] = torch.tensor([[100, 300, 200, 320], [250, 305, 300, 325]])  # same line
    pos = torch.stack([torch.arange(24), torch.arange(24) * 9])
    q = torch.randn(2, H, 24, D, generator=gen, requires_grad=True)
    got = _bias(enc, q, q, boxes, pos, pos)
    expected = _official_docpolarbert_terms(enc, q, boxes, pos, D**-0.5)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    weight = torch.randn(got.shape, generator=gen)
    wrt = [q, *enc.parameters()]
    grads = torch.autograd.grad((got * weight).sum(), wrt)
    refs = torch.autograd.grad((expected * weight).sum(), wrt)
    for g, r in zip(grads, refs, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-6)
    assert enc.rel_pos_2D_embedding.weight.grad is None  # (autograd.grad, not .backward)
    assert grads[2][-1].abs().max() == 0  # the padding row of E2 gets no gradient


def test_docpolarbert_fixed_edges_make_decoding_rows_equal_the_full_rows():
    torch.manual_seed(0)
    enc = relpos.create("docpolarbert", num_heads=H, head_dim=D)  # "page" edges
    torch.testing.assert_close(enc.distance_edges, page_distance_edges(4, 1000.0))
    boxes = example_boxes(1, 16, torch.Generator().manual_seed(5))
    q = torch.randn(1, H, 16, D)
    full = _bias(enc, q, q, boxes)
    for t in (0, 7, 15):
        one = _bias(enc, q[:, :, t : t + 1], q[:, :, : t + 1], boxes[:, : t + 1])
        torch.testing.assert_close(one, full[:, :, t : t + 1, : t + 1])


def test_docpolarbert_user_edges_and_the_call_mode():
    boxes = example_boxes(2, 20, torch.Generator().manual_seed(6))
    edges = distance_quantile_edges(boxes, num_buckets=4)
    torch.manual_seed(0)
    fitted = relpos.create("docpolarbert", num_heads=H, head_dim=D, distance_edges=edges)
    torch.manual_seed(0)
    call = relpos.create("docpolarbert", num_heads=H, head_dim=D, distance_edges="call")
    q = torch.randn(2, H, 20, D)
    torch.testing.assert_close(_bias(fitted, q, q, boxes), _bias(call, q, q, boxes))
    for bad in ("median", [0.0, 1.0], [0.0, 3.0, 2.0, 4.0, 5.0]):
        with pytest.raises(ValueError, match="distance_edges"):
            relpos.create("docpolarbert", num_heads=H, head_dim=D, distance_edges=bad)


def test_docpolarbert_pairs_without_boxes_get_only_the_1d_term():
    torch.manual_seed(0)
    enc = relpos.create("docpolarbert", num_heads=H, head_dim=D)
    boxes = example_boxes(1, 6, torch.Generator().manual_seed(7))  # token 0: [0, 0, 0, 0]
    q = torch.randn(1, H, 6, D)
    got = _bias(enc, q, q, boxes)
    one_d = enc.rel_pos_bias.weight.t()
    buckets = t5_bucket(torch.arange(6) - torch.arange(6)[:, None])
    only_1d = torch.einsum("hid,ijd->hij", q[0] * D**-0.5, one_d[buckets])
    torch.testing.assert_close(got[0, :, 0, 1:], only_1d[:, 0, 1:])
    torch.testing.assert_close(got[0, :, 1:, 0], only_1d[:, 1:, 0])
    itself = only_1d[:, 0, 0] + (q[0, :, 0] * D**-0.5) @ enc.rel_pos_angle_embedding.weight[0]
    torch.testing.assert_close(got[0, :, 0, 0], itself)  # the token itself: angle bucket 0


def test_docpolarbert_switches():
    enc = relpos.create(
        "docpolarbert",
        num_heads=H,
        head_dim=D,
        has_angle_attention_bias=False,
        has_relative_attention_bias=False,
    )
    assert [n for n, _ in enc.named_parameters()] == ["rel_pos_2D_embedding.weight"]
    boxes = example_boxes(1, 5, torch.Generator().manual_seed(8))
    q = torch.randn(1, H, 5, D)
    got = _bias(enc, q, q, boxes)
    assert torch.isfinite(got).all()
    with pytest.raises(ValueError, match="switched off"):
        relpos.create(
            "docpolarbert",
            num_heads=H,
            head_dim=D,
            has_angle_attention_bias=False,
            has_relative_attention_bias=False,
            has_spatial_attention_bias=False,
        )


def test_docpolarbert_edge_tensors_are_checked_by_name():
    edges = torch.tensor([0.0, 10.0, 20.0, 30.0, 40.0])
    enc = relpos.create("docpolarbert", num_heads=H, head_dim=D, distance_edges=edges)
    torch.testing.assert_close(enc.distance_edges, edges)
    with pytest.raises(ValueError, match="distance_edges"):
        relpos.create(
            "docpolarbert", num_heads=H, head_dim=D, distance_edges=edges.clone().fill_(math.nan)
        )
    with pytest.raises(TypeError, match="distance_edges"):
        relpos.create("docpolarbert", num_heads=H, head_dim=D, distance_edges=edges.long())
    with pytest.raises(TypeError, match="distance_edges"):
        relpos.create("docpolarbert", num_heads=H, head_dim=D, distance_edges=3)
    with pytest.raises(ValueError, match="page_size"):
        relpos.create("docpolarbert", num_heads=H, head_dim=D, page_size=math.inf)


def test_docpolarbert_keeps_the_official_parameter_names_and_family():
    enc = relpos.create("docpolarbert", num_heads=H, head_dim=D)
    assert {k: tuple(v.shape) for k, v in enc.state_dict().items()} == {
        "rel_pos_bias.weight": (D, 32),
        "rel_pos_2D_embedding.weight": (6, D),
        "rel_pos_angle_embedding.weight": (14, D),
        "distance_edges": (5,),
    }
    assert enc.family == "document"
