"""FIRE (Li et al. 2023, arXiv 2310.04418) against reference values.

Expected values were computed independently of relpos in float64 from the paper appendix's
snippet (as reproduced in mcleish7/arithmetic ``cramming/architectures/embeddings.py``).
"""

from __future__ import annotations

import pytest
import torch

import relpos

# the MLP input psi(i-j) / (psi(max(L, i)) + 1e-6), c = 0.1, L = 512.
FIRE_INPUTS = [
    ((0, 0), 0.0),
    ((10, 0), 0.17525475),
    ((10, 9), 0.02409815),
    ((511, 0), 0.99951492),
    ((512, 0), 0.99999975),
    ((1000, 0), 0.99999978),
    ((1000, 500), 0.85194412),
    ((2048, 2047), 0.01789222),
    ((4096, 0), 0.99999983),
]


@pytest.mark.parametrize(("ij", "expected"), FIRE_INPUTS)
def test_fire_mlp_input_matches_spec_values(ij: tuple[int, int], expected: float) -> None:
    enc = relpos.create("fire", num_heads=2, head_dim=8)
    i, j = ij
    got = enc.mlp_input(torch.tensor(i), torch.tensor(j))
    torch.testing.assert_close(got, torch.tensor(expected), rtol=2e-7, atol=2e-7)


def test_fire_defaults_are_c_0_1_and_threshold_512() -> None:
    enc = relpos.create("fire", num_heads=2, head_dim=8)
    assert enc.c.item() == pytest.approx(0.1)
    assert abs(enc.L_multiplier.item() * enc.init_L.item()) == 512.0
    assert not enc.init_L.requires_grad


def test_fire_mlp_input_lies_in_unit_interval_for_every_past_key() -> None:
    enc = relpos.create("fire", num_heads=2, head_dim=8)
    i = torch.cat([torch.arange(0, 600), torch.arange(600, 5000, 37)])[:, None]
    j = torch.arange(0, 5000, 7)[None, :]
    u = enc.mlp_input(i, j)[(j <= i).expand(i.shape[0], j.shape[1])]
    assert u.min().item() >= 0.0
    assert u.max().item() <= 1.0


def test_fire_bias_through_scores_is_the_mlp_of_the_normalised_distance() -> None:
    # b_h(i, j) = f(u(i, j))_h with f = Linear(1, W) -> ReLU -> Linear(W, H).
    torch.manual_seed(0)
    num_heads, length = 3, 40
    enc = relpos.create("fire", num_heads=num_heads, head_dim=8)
    f = torch.nn.Sequential(enc.mlp_in, torch.nn.ReLU(), enc.mlp_out)
    q_pos = torch.arange(1000, 1000 + length)
    k_pos = torch.arange(980, 980 + length)
    q = torch.zeros(1, num_heads, length, 8)
    with torch.no_grad():
        s = relpos.scores(q, q.clone(), enc, q_pos=q_pos, k_pos=k_pos)
        u = enc.mlp_input(q_pos[:, None], k_pos[None, :])
        expected = f(u[..., None]).permute(2, 0, 1)
    torch.testing.assert_close(s[0], expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("option", "bad", "exc"),
    [
        ("mlp_width", 0, ValueError),
        ("mlp_width", 2.0, TypeError),
        ("init_L", -1.0, ValueError),
        ("init_L", 0.0, ValueError),
        ("init_c", float("nan"), ValueError),
        ("eps", 0.0, ValueError),
        ("eps", "1e-6", TypeError),
    ],
)
def test_fire_refuses_options_outside_the_method_by_name(option, bad, exc) -> None:
    # regression: mlp_width=0, init_L=-1 and eps=0 used to be accepted
    with pytest.raises(exc, match=option):
        relpos.create("fire", num_heads=2, head_dim=8, **{option: bad})
