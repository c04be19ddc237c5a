"""RoPE base lower bound (Men et al. 2024, arXiv 2405.14591) against the paper's table. ``B_m(b)``
is re-derived here in float64 for the certificates."""

from __future__ import annotations

import math

import pytest
import torch

from relpos_lab.analysis.base_bound import (
    base_bound_fit,
    is_feasible,
    min_similarity_advantage,
    plot_base_bound,
    rope_base_lower_bound,
    similarity_advantage,
)

# Section 11 table: d = 128, first feasible base on a 1500-point log grid over 0.2..3 x fit.
SPEC_BOUNDS = {
    1000: 4211.5, 1024: 4299.0, 2000: 11595.9, 2048: 11603.7, 4000: 26941.2, 4096: 26959.3,
    8000: 83723.4, 8192: 83779.7, 16000: 234299.6, 16384: 234457.2, 32000: 630137.6,
    32768: 630561.5,
}  # fmt: skip


def advantage(base: float, m: torch.Tensor, d: int = 128) -> torch.Tensor:
    """``B_m(b) = sum_{i < d/2} cos(m b^(-2i/d))`` (the paper's definition), float64."""
    i = torch.arange(d // 2, dtype=torch.float64)
    return torch.cos(m.double()[:, None] * base ** (-2 * i / d)).sum(-1)


def min_advantage(base: float, context: int, d: int = 128) -> float:
    return min(
        advantage(base, torch.arange(s, min(s + 65536, context + 1)), d).min().item()
        for s in range(0, context + 1, 65536)
    )


@pytest.mark.parametrize("context", sorted(SPEC_BOUNDS))
def test_bound_matches_spec_table(context):
    bound = rope_base_lower_bound(context)
    assert bound.base == pytest.approx(SPEC_BOUNDS[context], abs=0.06)
    assert bound.head_dim == 128 and bound.grid_points == 1500
    # Certificates, re-derived here: the bound is feasible, the grid point below is not.
    assert bound.min_advantage >= 0
    assert min_advantage(bound.base, context) >= 0
    assert bound.below is not None and bound.below < bound.base
    assert bound.below / bound.base == pytest.approx(15 ** (-1 / 1499), rel=1e-9)
    assert 0 <= bound.below_witness <= context
    assert advantage(bound.below, torch.tensor([bound.below_witness])).item() < 0


@pytest.mark.parametrize(
    "base,context,expected",
    [
        (4300, 1024, 0.249),
        (5000, 1024, -1.514),
        (27000, 4096, -0.485),
        (40000, 4096, -2.12),
        (1e4, 4096, -8.363),
        (5e5, 8192, 5.972),
    ],
)
def test_min_advantage_matches_spec_values(base, context, expected):
    assert min_similarity_advantage(base, context) == pytest.approx(expected, abs=0.006)


def test_feasibility_is_not_monotonic_in_the_base():
    # Spec section 11: 4300 feasible, 5000 not (L = 1024); 26959.3 feasible, 27000 and 40000
    # not, 50000 again feasible (L = 4096).
    assert is_feasible(4300, 1024) and not is_feasible(5000, 1024)
    assert is_feasible(26959.3, 4096)
    assert not is_feasible(27000, 4096) and not is_feasible(40000, 4096)
    assert is_feasible(50000, 4096)
    assert min_similarity_advantage(50000, 4096) == pytest.approx(1.87, abs=0.006)


def test_similarity_advantage_is_the_formula():
    m = torch.tensor([0, 1, 17, 4096])
    torch.testing.assert_close(similarity_advantage(1e4, m), advantage(1e4, m))
    assert similarity_advantage(1e4, torch.tensor([0]), head_dim=64).item() == 32.0


def test_fit_is_the_papers_power_law():
    assert base_bound_fit(4096) == pytest.approx(0.0424 * 4096**1.628)


@pytest.mark.slow
def test_one_million_tokens():
    # Not in the paper's table: check the definition, not a number (bound ~ 3.3e8 here).
    context = 2**20
    bound = rope_base_lower_bound(context)
    assert min_advantage(bound.base, context) >= 0
    assert advantage(bound.below, torch.tensor([bound.below_witness])).item() < 0
    assert 0.5 < bound.base / base_bound_fit(context) < 2.0


def test_plot_writes_a_png(tmp_path):
    bounds = [rope_base_lower_bound(n, grid_points=300) for n in (1024, 4096)]
    plot_base_bound(bounds, tmp_path / "b.png")
    assert (tmp_path / "b.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["b.png"]


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"context": 0}, ValueError, "context must be a positive int"),
        ({"context": 1024.0}, TypeError, "context must be a positive int"),
        ({"context": 1024, "head_dim": 127}, ValueError, "head_dim must be even"),
        ({"context": 1024, "grid_points": 1}, ValueError, "grid_points must be an int >= 2"),
        ({"context": 1024, "span": (3.0, 0.2)}, ValueError, "span must be"),
        ({"context": 1024, "span": (0.01, 0.02)}, ValueError, "no feasible base"),
    ],
)
def test_bad_arguments_name_themselves(kwargs, error, match):
    """One policy (relpos.validation): TypeError for a wrong type, ValueError for a value."""
    with pytest.raises(error, match=match):
        rope_base_lower_bound(**kwargs)


def test_bad_base():
    for base in (1.0, -3, math.inf, math.nan):
        with pytest.raises(ValueError, match="base must be"):
            is_feasible(base, 1024)
    for base in (True, "1e4"):  # a wrong type (the policy of relpos.validation)
        with pytest.raises(TypeError, match="base must be"):
            is_feasible(base, 1024)
