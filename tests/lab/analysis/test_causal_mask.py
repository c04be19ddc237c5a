"""The causal mask as positional information (Kim et al. 2025, the official simulation, Fig. 1)."""

from __future__ import annotations

import pytest
import torch

import relpos
from relpos_lab.analysis.causal_mask import diagonal_residual, non_relativity, simulate_scores


def test_figure_1_orthonormal_inputs_three_tokens_one_layer():
    maps = simulate_scores(1, inputs=torch.eye(3)[None])
    s = maps[1]
    assert torch.allclose(s[1, 0], torch.tensor(0.1535, dtype=s.dtype), atol=5e-5)
    assert torch.allclose(s[2, 0], torch.tensor(0.1321, dtype=s.dtype), atol=5e-5)
    assert torch.allclose(s[2, 1], torch.tensor(0.1508, dtype=s.dtype), atol=5e-5)
    assert torch.allclose(s.diagonal(), torch.ones(3, dtype=s.dtype))
    d = diagonal_residual(s)
    assert abs(abs(float(d[1, 0])) - 0.00135) < 2e-5
    assert float(d[1, 0]) == pytest.approx(-float(d[2, 1]), abs=1e-15)
    assert non_relativity(s) > 0  # zero parameters, yet not relative
    assert non_relativity(maps[0]) == 0.0  # the identity input is exactly relative


def test_an_exactly_relative_map_has_zero_non_relativity():
    i = torch.arange(6)
    toeplitz = torch.exp(-(i[:, None] - i[None]).abs().double())
    assert non_relativity(toeplitz) < 1e-15


def test_causal_masking_makes_scores_non_relative_and_bidirectional_does_not():
    causal = simulate_scores(2, batch=300, seq=10, dim=16, causal=True)
    both = simulate_scores(2, batch=300, seq=10, dim=16, causal=False)
    assert non_relativity(causal[-1]) > 2 * non_relativity(both[-1])


def test_rope_variant_rotates_the_scores():
    rope = relpos.create("rope", num_heads=1, head_dim=16)
    plain = simulate_scores(1, batch=50, seq=6, dim=16, seed=1)
    rotated = simulate_scores(1, batch=50, seq=6, dim=16, seed=1, encoding=rope)
    assert torch.allclose(plain[0].diagonal(), rotated[0].diagonal())
    assert not torch.allclose(plain[0], rotated[0])
