"""Attention resolution (Sun et al. 2022, arXiv 2212.10554; the formula as recalled)."""

from __future__ import annotations

import math

import pytest
import torch

import relpos
from relpos_lab.analysis.resolution import (
    attention_resolution,
    encoding_resolution,
    plot_resolution,
)


def resolution_by_hand(s: list[float]) -> float:
    """``sum_{i<N} e^{s_i} (e^{s_i} - e^{s_{i+1}}) / (sum_i e^{s_i})^2`` in plain floats."""
    e = [math.exp(v) for v in s]
    total = sum(e)
    return sum(e[i] * (e[i] - e[i + 1]) for i in range(len(e) - 1)) / total**2


def test_small_example_by_hand():
    # p = (1/2, 1/3, 1/6): R = 1/2 * 1/6 + 1/3 * 1/6 = 5/36.
    s = torch.log(torch.tensor([3.0, 2.0, 1.0], dtype=torch.float64))
    assert attention_resolution(s).item() == pytest.approx(5 / 36, rel=1e-12)


def test_matches_the_formula_on_random_scores():
    s = torch.randn(5, 40, dtype=torch.float64).cumsum(-1)
    expected = [resolution_by_hand(row.tolist()) for row in s]
    assert attention_resolution(s).tolist() == pytest.approx(expected, rel=1e-10)


def test_flat_scores_have_zero_and_one_hot_full_resolution():
    assert attention_resolution(torch.zeros(100)).item() == 0.0
    one_hot = torch.full((100,), float("-inf"))
    one_hot[0] = 0.0
    assert attention_resolution(one_hot).item() == 1.0


def test_invariant_to_a_constant_and_float32_gives_float64():
    s = -torch.arange(50, dtype=torch.float64) / 7
    r = attention_resolution(s)
    assert attention_resolution(s + 1000.0).item() == pytest.approx(r.item(), rel=1e-9)
    assert attention_resolution(s.float()).dtype == torch.float64


def test_sharper_decay_has_higher_resolution():
    d = torch.arange(200, dtype=torch.float64)
    assert attention_resolution(-0.5 * d) > attention_resolution(-0.05 * d) > 0


def test_nope_has_zero_resolution_and_rope_positive():
    nope = encoding_resolution(
        relpos.create("nope", num_heads=1, head_dim=32), [64, 256], samples=1
    )
    assert nope.resolution == [0.0, 0.0]
    rope = encoding_resolution(
        relpos.create("rope", num_heads=1, head_dim=32), [64, 256], samples=1
    )
    assert all(r > 0 for r in rope.resolution)
    assert len(rope.expected_logit) == 256 and rope.samples == 32


@pytest.mark.parametrize("head_dim", [64, 128])
def test_xpos_raises_the_resolution_of_rope(head_dim):
    # The design goal of xPos (Sun et al. 2022): with exact expectations (the sampling is
    # exact for linear encodings) xPos has the higher resolution at every length.
    lengths = [256, 1024]
    rope = relpos.create("rope", num_heads=1, head_dim=head_dim)
    xpos = relpos.create("xpos", num_heads=1, head_dim=head_dim)
    rope = encoding_resolution(rope, lengths, samples=1)
    xpos = encoding_resolution(xpos, lengths, samples=1)
    assert all(x > r for x, r in zip(xpos.resolution, rope.resolution, strict=True))


def test_plot_writes_a_png(tmp_path):
    results = [
        encoding_resolution(relpos.create(n, num_heads=1, head_dim=16), [16, 64], samples=1)
        for n in ("rope", "alibi")
    ]
    plot_resolution(results, tmp_path / "r.png")
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"


def test_bad_inputs():
    with pytest.raises(ValueError, match=r"N \+ 1 >= 2"):
        attention_resolution(torch.zeros(1))
    with pytest.raises(ValueError, match="NaN"):
        attention_resolution(torch.tensor([0.0, float("nan")]))
    with pytest.raises(TypeError, match="floating-point"):
        attention_resolution(torch.tensor([1, 2]))
    with pytest.raises(TypeError, match="torch.Tensor"):
        attention_resolution([0.0, 1.0])
    enc = relpos.create("rope", num_heads=1, head_dim=8)
    with pytest.raises(ValueError, match="lengths must be"):
        encoding_resolution(enc, [])
    with pytest.raises(ValueError, match="lengths must be an int >= 2"):
        encoding_resolution(enc, [1])
