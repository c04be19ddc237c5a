"""Positional influence by rollout (Wu et al. 2025): worked reference values, N = 4."""

from __future__ import annotations

import math

import pytest
import torch

import relpos
from relpos_lab.analysis.influence import (
    encoding_attention,
    influence_profile,
    mask_attention,
    rollout,
)

REFERENCE = {
    ("causal", 2): [0.520833, 0.270833, 0.145833, 0.0625],
    ("causal", 3): [0.720486, 0.199653, 0.064236, 0.015625],
    ("causal", 8): [0.988723, 0.01085, 0.000411, 0.000015],
    ("decay", 1): [0.066667, 0.133333, 0.266667, 0.533333],
    ("decay", 2): [0.184762, 0.23619, 0.294603, 0.284444],
    ("decay", 8): [0.833657, 0.126042, 0.033755, 0.006546],
}


@pytest.mark.parametrize(("mask", "depth"), list(REFERENCE))
def test_spec_reference_profiles(mask, depth):
    psi = rollout(mask_attention(mask, 4, gamma=0.5), depth)[depth - 1]
    assert torch.allclose(psi, torch.tensor(REFERENCE[mask, depth], dtype=torch.float64), atol=1e-6)


def test_residual_rollout_is_u_shaped():
    psi = rollout(mask_attention("causal", 4), 2, residual=True)[1]
    assert torch.allclose(
        psi, torch.tensor([0.255208, 0.192708, 0.161458, 0.390625], dtype=torch.float64), atol=1e-6
    )
    assert psi[1:3].max() < min(psi[0], psi[3])


def test_alibi_at_initialisation_is_the_decay_mask_with_gamma_exp_minus_slope():
    enc = relpos.create("alibi", num_heads=1, head_dim=8)
    slope = -float(enc.distance_table(1, 1, torch.device("cpu"))[0, 0])
    A = encoding_attention(enc, 6)
    assert torch.allclose(A, mask_attention("decay", 6, gamma=math.exp(-slope)), atol=1e-12)


def test_rotary_attention_is_a_monte_carlo_mean_of_causal_rows():
    A = encoding_attention(relpos.create("rope", num_heads=2, head_dim=8), 5, samples=3)
    assert torch.allclose(A.sum(-1), torch.ones(5, dtype=torch.float64))
    assert not A.triu(1).any()


def test_profile_masses_and_per_layer_lists():
    layers = [mask_attention("causal", 8), mask_attention("window", 8, width=2)]
    p = influence_profile("x", layers, 2)
    assert len(p.psi) == 2 and p.first_token[1] == pytest.approx(p.psi[1][0])
    assert p.middle[0] == pytest.approx(sum(p.psi[0][2:6]))
    with pytest.raises(ValueError, match="mask must be"):
        mask_attention("diagonal", 4)
