"""Theoretical receptive field (Qin et al. 2024, arXiv 2307.10156): worked reference values."""

from __future__ import annotations

import math

import pytest
import torch

import relpos
from relpos_lab.analysis.receptive_field import (
    cumulative_mass,
    distance_bias,
    effective_receptive_field,
    receptive_field,
    theoretical_receptive_field,
)


def test_alibi_trf_is_ceil_ln_inverse_epsilon_over_slope_minus_one():
    enc = relpos.create("alibi", num_heads=8, head_dim=16)  # slopes 1/2, 1/4, ..., 1/256
    result = theoretical_receptive_field(enc, [16384])
    expected = [math.ceil(math.log(100) / 2.0 ** -(h + 1)) - 1 for h in range(8)]
    assert result.trf[0] == expected
    assert [expected[0], expected[3], expected[7]] == [9, 73, 1178]
    assert all(result.converges)


def test_log_decay_diverges_and_twice_log_converges():
    n = torch.arange(2048, dtype=torch.float64)
    one = [
        int(receptive_field(cumulative_mass(-torch.log1p(n[:N])[None]))) for N in (512, 1024, 2048)
    ]
    two = [
        int(receptive_field(cumulative_mass(-2 * torch.log1p(n[:N])[None])))
        for N in (512, 1024, 2048)
    ]
    assert one == [478, 949, 1886]
    assert two == [53, 56, 58]


def test_nope_has_a_uniform_field_that_grows_with_n():
    result = theoretical_receptive_field(relpos.create("nope", num_heads=1, head_dim=8), [100, 200])
    assert result.trf == [[98], [197]] and result.converges == [False]


def test_huge_biases_do_not_overflow():
    mass = cumulative_mass(torch.tensor([[1000.0, 0.0, -1000.0]]))
    assert torch.allclose(mass, torch.tensor([[1.0, 1.0, 1.0]], dtype=torch.float64))


def test_non_bias_encodings_are_refused_by_name():
    with pytest.raises(ValueError, match="'rope' is not one"):
        distance_bias(relpos.create("rope", num_heads=1, head_dim=8), 8)
    with pytest.raises(ValueError, match="epsilon"):
        receptive_field(torch.ones(1, 3), epsilon=1.5)


def test_effective_receptive_field_of_a_model_reads_gradients():
    from relpos.nn import TransformerLM

    torch.manual_seed(0)
    model = TransformerLM(256, 16, 1, 2, encoding="alibi")
    tokens = torch.randint(0, 256, (2, 17))
    mass, erf = effective_receptive_field(model, tokens)
    assert len(mass) == 16 and mass[-1] == pytest.approx(1.0)
    assert all(b >= a - 1e-12 for a, b in zip(mass, mass[1:], strict=False))
    assert 0 <= erf < 16


def test_a_models_erf_sits_beside_the_trf_of_its_own_encoding():
    from relpos.nn import TransformerLM
    from relpos_lab.analysis.receptive_field import model_receptive_field

    torch.manual_seed(0)
    model = TransformerLM(256, 16, 2, 2, encoding="kerple-log", share_encoding=False)
    with torch.no_grad():  # the second layer's bias differs from the first's
        for p in model.blocks[1].attn.encoding.parameters():
            p.mul_(3.0)
    tokens = torch.randint(0, 256, (2, 33))
    field = model_receptive_field(model, tokens, "kerple model")
    expected = [
        theoretical_receptive_field(block.attn.encoding, [32]).trf[0] for block in model.blocks
    ]
    assert field.trf == expected and field.trf[0] != field.trf[1]
    flat = [v for row in expected for v in row]
    assert (field.trf_max, field.trf_min) == (max(flat), min(flat))
    assert field.length == 32 and field.texts == 2 and 0 <= field.erf < 32
    assert field.encoding == "kerple-log" and field.note == ""
    assert 0 <= field.half <= field.ninety <= field.erf
    assert field.mass[field.half] >= 0.5 and (field.half == 0 or field.mass[field.half - 1] < 0.5)


def test_absolute_and_rotary_models_get_a_uniform_trf_or_none():
    from relpos.nn import TransformerLM
    from relpos_lab.analysis.receptive_field import model_receptive_field

    tokens = torch.randint(0, 256, (1, 17))
    sinusoidal = model_receptive_field(TransformerLM(256, 16, 1, 2, encoding="sinusoidal"),
                                       tokens, "abs")  # fmt: skip
    assert sinusoidal.trf == [[15]]  # no attention bias: uniform over 16 keys
    rope = model_receptive_field(TransformerLM(256, 16, 1, 2, encoding="rope"), tokens, "rope")
    assert rope.trf is None and rope.trf_max is None and "'rope' is not one" in rope.note
