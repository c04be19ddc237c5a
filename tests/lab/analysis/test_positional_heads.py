"""Positional heads (Hong et al. 2024, arXiv 2410.08703): a worked reference centroid."""

from __future__ import annotations

import pytest
import torch

import relpos
from relpos_lab.analysis.positional_heads import (
    dimension_centroid,
    encoding_head_scores,
    head_scores,
    pair_contributions,
)


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_reference_centroid_for_unit_q_and_k(layout):
    enc = relpos.create("rope", num_heads=1, head_dim=16, layout=layout)
    x = torch.ones(1, 1, 1, 16, dtype=torch.float64)
    got = []
    for r in (0, 1, 4, 16, 64, 256, 1024):
        q, k = enc.rotate_qk(x, x, torch.tensor([[r]]), torch.tensor([[0]]))
        got.append(float(dimension_centroid(pair_contributions(q[0, 0], k[0, 0], layout))[0, 0]))
    assert got == pytest.approx([3.5, 3.823, 4.3954, 4.7902, 4.4171, 4.3368, 3.6314], abs=1e-4)


def test_pair_contributions_sum_to_the_dot_product():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(5, 8, generator=g), torch.randn(7, 8, generator=g)
    for layout in ("half", "interleaved"):
        assert torch.allclose(pair_contributions(q, k, layout).sum(-1), q @ k.T, atol=1e-6)


def test_a_head_whose_centroid_follows_distance_scores_high():
    # q = k = 1 rotated by RoPE: the centroid moves with the distance (reference profile)
    enc = relpos.create("rope", num_heads=1, head_dim=16)
    L = 40
    x = torch.ones(1, 1, L, 16)
    pos = torch.arange(L)[None]
    q, k = enc.rotate_qk(x, x, pos, pos)
    flat = torch.ones(1, L, L).tril()
    flat = flat / flat.sum(-1, keepdim=True)
    rho, share = head_scores(q[0], k[0], flat)
    assert rho[0] > 0.5 and 0 <= share[0] <= 1


def test_encoding_scores_and_refusal():
    r = encoding_head_scores(relpos.create("rope", num_heads=2, head_dim=8), 12, samples=1, top_k=1)
    assert len(r.rho) == 1 and len(r.rho[0]) == 2 and len(r.top) == 1
    with pytest.raises(ValueError, match="'alibi' is not one"):
        encoding_head_scores(relpos.create("alibi", num_heads=1, head_dim=8), 8)


def test_scaled_scores_restore_the_model_and_pi_changes_rho():
    from relpos_lab.analysis.positional_heads import (
        model_head_scores,
        ranking_change,
        scaled_head_scores,
    )
    from relpos_lab.longctx.models import random_tiny_model

    model, _ = random_tiny_model()
    own = model.encoding
    tokens = torch.randint(0, 256, (1, 24), generator=torch.Generator().manual_seed(0))
    base = model_head_scores(model, tokens, "tiny", 3)
    assert len(base.rho) == 2 and len(base.rho[0]) == 4
    assert [(p["layer"], p["head"]) for p in base.profiles] == [(a, b) for a, b, _ in base.top]
    same = ranking_change(base, model_head_scores(model, tokens, "tiny again", 3))
    assert same["kept"] == [[a, b] for a, b, _ in base.top] and same["entered"] == []
    assert same["mean_abs_delta"] == 0.0 and same["correlation"] == pytest.approx(1.0)
    pi = scaled_head_scores(model, tokens, "tiny pi", {"rope_type": "linear", "factor": 4.0}, 3)
    assert model.encoding is own  # the model's own RoPE is back
    change = ranking_change(base, pi)
    assert change["mean_abs_delta"] > 0 and len(change["kept"]) + len(change["entered"]) == 3
    assert len(change["entered"]) == len(change["left"])
    # the same call with factor 1 is the model itself
    one = scaled_head_scores(model, tokens, "x1", {"rope_type": "linear", "factor": 1.0}, 3)
    torch.testing.assert_close(torch.tensor(one.rho), torch.tensor(base.rho), atol=1e-9, rtol=0)


def test_scalings_need_a_model_that_swaps_its_rope():
    from relpos.nn import TransformerLM
    from relpos_lab.analysis.positional_heads import scaled_head_scores

    model = TransformerLM(256, 16, 1, 2, encoding="rope")
    with pytest.raises(ValueError, match="Llama-family model"):
        scaled_head_scores(model, torch.zeros(1, 8, dtype=torch.long), "m", {"rope_type": "linear",
                           "factor": 2.0}, 1)  # fmt: skip


def test_pair_profile_of_unit_q_and_k_is_twice_the_cosine_by_distance_bucket():
    from relpos_lab.analysis.positional_heads import pair_profile

    enc = relpos.create("rope", num_heads=1, head_dim=16)
    L = 8
    x = torch.ones(1, 1, L, 16, dtype=torch.float64)
    pos = torch.arange(L)[None]
    q, k = enc.rotate_qk(x, x, pos, pos)
    edges, mean = pair_profile(q[0, 0], k[0, 0], layout=enc.layout)
    assert edges == [[0, 0], [1, 2], [3, 6], [7, 7]]
    theta = 10000.0 ** (-torch.arange(8, dtype=torch.float64) / 8)
    torch.testing.assert_close(mean[0], torch.full((8,), 2.0, dtype=torch.float64))
    torch.testing.assert_close(mean[3], 2 * torch.cos(7 * theta))  # only r = 7 in the last
    torch.testing.assert_close(mean[1], (2 * torch.cos(theta) * 7 + 2 * torch.cos(2 * theta) * 6)
                               / 13)  # fmt: skip
