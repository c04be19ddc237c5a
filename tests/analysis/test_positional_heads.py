"""Positional heads (seed 113; spec remaining.md D2 reference centroid)."""

from __future__ import annotations

import pytest
import torch

import relpos
from relpos.analysis.positional_heads import (
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
