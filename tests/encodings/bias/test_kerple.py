"""KERPLE (Chi et al. 2022, arXiv 2205.09921) against reference values.

Expected values were computed independently of relpos in float64 from the official formulas
(chijames/KERPLE ``megatron/mpu/layers.py``).
"""

from __future__ import annotations

import pytest
import torch

import relpos

DISTANCES = torch.tensor([0, 1, 10, 100])

# reference values b(n) for n = 0, 1, 10, 100
KERPLE_LOG = [
    (1.0, 1.0, [0.0, -0.69314718, -2.3978953, -4.6151205]),
    (2.0, 0.5, [0.0, -0.81093022, -3.5835189, -7.8636513]),
    (0.5, 0.1, [0.0, -0.04765509, -0.34657359, -1.1989476]),
]
KERPLE_POWER = [
    (1.0, 0.5, [0.0, -1.0, -3.1622777, -10.0]),
    (0.5, 1.5, [0.0, -0.5, -15.811388, -500.0]),
    (1.0, 2.0, [0.0, -1.0, -100.0, -10000.0]),
]


@pytest.mark.parametrize(("r1", "r2", "expected"), KERPLE_LOG)
def test_kerple_log_bias_matches_spec_values(r1: float, r2: float, expected: list[float]) -> None:
    enc = relpos.create("kerple-log", num_heads=1, head_dim=8, r1=r1, r2=r2)
    got = enc.bias_at_distance(torch.tensor(0), DISTANCES)
    torch.testing.assert_close(got, torch.tensor(expected), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(("r1", "power", "expected"), KERPLE_POWER)
def test_kerple_power_bias_matches_spec_values(
    r1: float, power: float, expected: list[float]
) -> None:
    # p = 2 is the closed upper end of (0, 2]. relpos stores p = 2 * sigmoid(raw) and clamps the
    # initial p / 2 to 1 - 1e-6, so p = 2 - 2.1e-6 and b(100) is off by (2 - p) ln(100) = 9.9e-6
    # relative (measured): inside rtol 1e-5, but only just.
    enc = relpos.create("kerple-power", num_heads=1, head_dim=8, r1=r1, power=power)
    got = enc.bias_at_distance(torch.tensor(0), DISTANCES)
    torch.testing.assert_close(got, torch.tensor(expected), rtol=1e-5, atol=1e-7)


def test_kerple_per_head_parameters_give_each_head_its_own_curve() -> None:
    r1 = [case[0] for case in KERPLE_LOG]
    r2 = [case[1] for case in KERPLE_LOG]
    enc = relpos.create("kerple-log", num_heads=3, head_dim=8, r1=r1, r2=r2)
    got = enc.bias_at_distance(torch.arange(3)[:, None], DISTANCES[None, :])
    expected = torch.tensor([case[2] for case in KERPLE_LOG])
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name", ["kerple-log", "kerple-power"])
def test_kerple_bias_is_zero_at_distance_zero_and_uses_absolute_distance(name: str) -> None:
    enc = relpos.create(name, num_heads=4, head_dim=8)
    h = torch.arange(4)[:, None]
    n = torch.arange(0, 50)[None, :]
    assert (enc.bias_at_distance(h, torch.zeros_like(n)) == 0).all()
    torch.testing.assert_close(enc.bias_at_distance(h, n), enc.bias_at_distance(h, -n))


def test_kerple_log_bias_through_scores_is_added_after_scaling() -> None:
    torch.manual_seed(0)
    enc = relpos.create("kerple-log", num_heads=1, head_dim=8, r1=2.0, r2=0.5)
    q = torch.randn(1, 1, 101, 8)
    k = torch.randn(1, 1, 101, 8)
    pos = torch.arange(101)
    s = relpos.scores(q, k, enc, q_pos=pos, k_pos=pos)
    qk = q @ k.transpose(-1, -2) / 8**0.5
    # Query 100 against keys 100, 99, 90, 0: distances 0, 1, 10, 100.
    keys = torch.tensor([100, 99, 90, 0])
    got = (s - qk)[0, 0, 100, keys]
    torch.testing.assert_close(got, torch.tensor(KERPLE_LOG[1][2]), rtol=1e-5, atol=1e-5)


def _huge_step(enc: torch.nn.Module, sign: float) -> None:
    opt = torch.optim.SGD(enc.parameters(), lr=1e3)
    h = torch.arange(enc.num_heads)[:, None]
    bias = enc.bias_at_distance(h, torch.arange(64)[None, :])
    (sign * 1e8 * bias.sum()).backward()
    opt.step()


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_kerple_log_parameters_stay_positive_after_a_huge_gradient_step(sign: float) -> None:
    enc = relpos.create("kerple-log", num_heads=2, head_dim=8, r1=1.0, r2=1.0)
    _huge_step(enc, sign)
    assert torch.isfinite(enc.r1).all() and torch.isfinite(enc.r2).all()
    assert (enc.r1 > 0).all(), enc.r1
    assert (enc.r2 > 0).all(), enc.r2


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_kerple_power_parameters_stay_in_range_after_a_huge_gradient_step(sign: float) -> None:
    # KERPLE: r1 > 0 and 0 < p <= 2 (the official code clamps p to [1e-2, 2] every forward).
    enc = relpos.create("kerple-power", num_heads=2, head_dim=8, r1=1.0, power=1.0)
    _huge_step(enc, sign)
    assert torch.isfinite(enc.r1).all() and (enc.r1 > 0).all(), enc.r1
    assert ((enc.power > 0) & (enc.power <= 2)).all(), enc.power


@pytest.mark.parametrize("name", ["kerple-log", "kerple-power"])
@pytest.mark.parametrize("bad", [float("nan"), -1.0, 0.0, [1.0, float("nan")], [0.5, -0.5]])
def test_kerple_initial_r1_must_be_finite_and_at_least_the_official_floor(name, bad) -> None:
    # regression: r1=nan or a negative r1 used to give NaN (or silently clamped) biases
    with pytest.raises(ValueError, match="r1"):
        relpos.create(name, num_heads=2, head_dim=8, r1=bad)


def test_kerple_options_refuse_wrong_types_and_counts_by_name() -> None:
    with pytest.raises(TypeError, match="r2"):
        relpos.create("kerple-log", num_heads=2, head_dim=8, r2="0.5")
    with pytest.raises(ValueError, match="power"):
        relpos.create("kerple-power", num_heads=2, head_dim=8, power=2.5)
    with pytest.raises(ValueError, match="r1"):
        relpos.create("kerple-log", num_heads=3, head_dim=8, r1=[1.0, 2.0])


def test_kerple_initial_values_at_the_floor_are_kept() -> None:
    # r = 1e-2 lies in the official range; the parametrisation must not move it by 1 %
    enc = relpos.create("kerple-log", num_heads=2, head_dim=8, r1=0.01, r2=torch.tensor(0.5))
    torch.testing.assert_close(enc.r1, torch.full((2,), 0.01), rtol=1e-3, atol=0)
    torch.testing.assert_close(enc.r2, torch.full((2,), 0.5))
