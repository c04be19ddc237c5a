"""Long-term decay (RoFormer section 3.4.3): the relative upper bound and expected scores.

References are re-derived here in float64 from the formulas: ``S_j = sum_{i<j} e^{i r
theta_i}``, ``bound = (1/(d/2)) sum_j |S_j|``; ``E <R q, R k> = 2 rho sum_i cos(r theta_i)``.
"""

from __future__ import annotations

import math

import pytest
import torch

import relpos
from relpos_lab.analysis.decay import (
    decay_curves,
    expected_logits,
    expected_scores,
    pair_structure,
    plot_decay,
    sample_count,
)

ROTARY = [n for n in relpos.available() if relpos.registry.encoding_class(n).has_rotary]


def theta(d: int, rotated: int | None = None, base: float = 10000.0) -> torch.Tensor:
    """Frequencies of the d/2 pairs in channel order; pairs past ``rotated`` have theta = 0."""
    r = d if rotated is None else rotated
    t = base ** (-torch.arange(0, r, 2, dtype=torch.float64) / r)
    return torch.cat((t, torch.zeros((d - r) // 2, dtype=torch.float64)))


def roformer_bound(th: torch.Tensor, max_distance: int) -> torch.Tensor:
    r = torch.arange(max_distance + 1, dtype=torch.float64)[:, None]
    partial = torch.cumsum(torch.exp(1j * r * th), dim=-1)
    return partial.abs().mean(-1)


def cos_sum(th: torch.Tensor, max_distance: int) -> torch.Tensor:
    r = torch.arange(max_distance + 1, dtype=torch.float64)[:, None]
    return torch.cos(r * th).sum(-1)


@pytest.mark.parametrize(
    "options,rotated",
    [({}, None), ({"layout": "interleaved"}, None), ({"partial_rotary_factor": 0.5}, 32)],
)
def test_rope_bound_is_the_roformer_formula(options, rotated):
    enc = relpos.create("rope", num_heads=2, head_dim=64, **options)
    curves = decay_curves(enc, 300, samples=0)
    expected = roformer_bound(theta(64, rotated), 300)
    bound = torch.tensor(curves.bound, dtype=torch.float64)
    torch.testing.assert_close(bound, expected, rtol=0, atol=2e-4)
    assert curves.rotated_pairs == (32 if rotated is None else rotated // 2)
    assert curves.bound[0] == pytest.approx((32 + 1) / 2, abs=1e-5)  # S_j = j at r = 0


def test_rope_bound_decreases_on_average():
    curves = decay_curves(relpos.create("rope", num_heads=1, head_dim=128), 4096, samples=0)
    b = curves.bound
    means = [
        sum(b[lo:hi]) / (hi - lo) for lo, hi in ((1, 10), (10, 100), (100, 1000), (1000, 4097))
    ]
    assert all(a > c for a, c in zip(means, means[1:], strict=False)), means
    assert b[0] == max(b)


def test_bound_is_flat_without_rotation():
    curves = decay_curves(relpos.create("nope", num_heads=2, head_dim=32), 200, samples=1)
    assert curves.rotated_pairs == 0
    assert curves.bound == [pytest.approx((16 + 1) / 2)] * 201
    assert curves.ones_score == [32.0] * 201
    assert curves.expected_score == [pytest.approx(32.0, rel=1e-6)] * 201


def test_xpos_decays_faster_than_rope():
    rope = decay_curves(relpos.create("rope", num_heads=1, head_dim=64), 2048, samples=0)
    xpos = decay_curves(relpos.create("xpos", num_heads=1, head_dim=64), 2048, samples=0)
    tail = slice(1024, None)
    assert sum(xpos.bound[tail]) < 0.8 * sum(rope.bound[tail])
    # Its phasors carry zeta_i^(r/B): at r = 512 pair i of the all-ones score is zeta_i times
    # RoPE's (torchscale's xPos: zeta = (2i + 0.4 d) / (1.4 d)).
    zeta = (torch.arange(0, 64, 2, dtype=torch.float64) + 0.4 * 64) / (1.4 * 64)
    th = theta(64)
    expected = 2 * (zeta * torch.cos(512 * th)).sum()
    assert xpos.ones_score[512] == pytest.approx(expected.item(), abs=1e-3)


@pytest.mark.parametrize("rho", [1.0, 0.5, 0.0, -1.0])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_rope_expected_score_is_twice_rho_times_the_cosine_sum(rho, layout):
    enc = relpos.create("rope", num_heads=3, head_dim=32, layout=layout)
    got = expected_scores(enc, 500, samples=1, key_correlation=rho, seed=3)
    torch.testing.assert_close(got, 2 * rho * cos_sum(theta(32), 500), rtol=0, atol=1e-4)


def test_ones_score_of_rope_is_twice_the_cosine_sum():
    curves = decay_curves(relpos.create("rope", num_heads=1, head_dim=64), 100, samples=0)
    assert curves.expected_score is None and curves.samples == 0
    torch.testing.assert_close(
        torch.tensor(curves.ones_score, dtype=torch.float64),
        2 * cos_sum(theta(64), 100),
        rtol=0,
        atol=1e-4,
    )


def test_expected_logits_include_scale_and_bias():
    # ALiBi, 1 head: slope 2^-8, logit = q.k / sqrt(d) - slope * distance; E q.k = d for k = q.
    enc = relpos.create("alibi", num_heads=1, head_dim=16)
    got = expected_logits(enc, 100, samples=1)
    r = torch.arange(101, dtype=torch.float64)
    torch.testing.assert_close(got, 16 / math.sqrt(16) - r / 256, rtol=0, atol=1e-5)


def test_sample_count_rounds_up_to_whole_blocks():
    assert sample_count(1, 64) == 64
    assert sample_count(65, 64) == 128
    assert sample_count(65, 64, 0.5) == 128 and sample_count(129, 64, 0.5) == 256


def test_monte_carlo_is_unbiased_for_a_nonlinear_encoding():
    # CARoPE's frequency depends on the key itself: no closed form, but two seeds agree.
    enc = relpos.create("carope", num_heads=1, head_dim=16, init_std=0.5)
    a = expected_scores(enc, 32, samples=512, seed=0)
    b = expected_scores(enc, 32, samples=512, seed=1)
    assert (a - b).abs().max() < 0.1 * a[0]


def test_pair_structure_finds_the_layout():
    half = pair_structure(relpos.create("rope", num_heads=1, head_dim=8))
    assert half.pairs == [(0, 4), (1, 5), (2, 6), (3, 7)] and all(half.rotated)
    inter = pair_structure(relpos.create("rope", num_heads=1, head_dim=8, layout="interleaved"))
    assert inter.pairs == [(0, 1), (2, 3), (4, 5), (6, 7)]
    partial = pair_structure(
        relpos.create("rope", num_heads=1, head_dim=8, partial_rotary_factor=0.5)
    )
    assert partial.pairs == [(0, 2), (1, 3), (4, 5), (6, 7)]
    assert partial.rotated == [True, True, False, False]
    none = pair_structure(relpos.create("nope", num_heads=1, head_dim=6))
    assert none.pairs == [(0, 1), (2, 3), (4, 5)] and not any(none.rotated)


def test_dense_rotation_has_no_bound():
    torch.manual_seed(0)
    enc = relpos.create("liere", num_heads=1, head_dim=8)
    assert pair_structure(enc).pairs is None
    curves = decay_curves(enc, 16, samples=1)
    assert curves.bound is None and "not a rotation of channel pairs" in curves.note
    assert len(curves.ones_score) == len(curves.expected_score) == 17


@pytest.mark.parametrize("name", ROTARY)
def test_every_rotary_encoding_has_curves(name):
    torch.manual_seed(0)
    try:
        enc = relpos.create(name, num_heads=2, head_dim=16)
    except ValueError as err:  # e.g. RayRoPE: a pair per coordinate needs head_dim >= 24
        if "head_dim" not in str(err):
            raise
        pytest.skip(f"the encoding refuses head_dim=16 by name: {err}")
    if enc.mixes_tokens:  # AW-RoPE: the rotation reads a per-call graph, refused by name
        with pytest.raises(ValueError, match="per-call graphs"):
            decay_curves(enc, 48, samples=1)
        return
    curves = decay_curves(enc, 48, samples=1)
    assert curves.distances == list(range(49))
    for values in (curves.bound, curves.ones_score, curves.expected_score):
        if values is not None:
            assert len(values) == 49 and all(math.isfinite(v) for v in values)


def test_plot_writes_a_png(tmp_path):
    curves = [
        decay_curves(relpos.create(n, num_heads=1, head_dim=16), 64, samples=1)
        for n in ("rope", "xpos", "nope")
    ]
    plot_decay(curves, tmp_path / "decay.png")
    assert (tmp_path / "decay.png").read_bytes()[:4] == b"\x89PNG"
    assert [p.name for p in tmp_path.iterdir()] == ["decay.png"]


def test_bad_arguments():
    enc = relpos.create("rope", num_heads=1, head_dim=8)
    with pytest.raises(ValueError, match="max_distance must be a positive int"):
        decay_curves(enc, 0)
    with pytest.raises(ValueError, match="samples must be an int >= 0"):
        decay_curves(enc, 8, samples=-1)
    with pytest.raises(ValueError, match="samples must be a positive int"):
        expected_scores(enc, 8, samples=0)
    with pytest.raises(ValueError, match="key_correlation must be a finite number >= -1 and <= 1"):
        decay_curves(enc, 8, key_correlation=1.5)
    with pytest.raises(TypeError, match="encoding must be a relpos.Encoding"):
        decay_curves("rope", 8)
