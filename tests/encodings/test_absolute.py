"""Absolute encodings (``sinusoidal``, ``learned``) against the paper's formula."""

from __future__ import annotations

import math

import pytest
import torch

import relpos


def test_sinusoidal_embedding_is_vaswanis_table_times_the_scale():
    # PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(...), here d = 4: frequencies 1, 1/100
    enc = relpos.create("sinusoidal", num_heads=1, head_dim=4)
    pos = torch.tensor([[0, 1, 50]])
    pe = enc.embed(pos, 4)
    assert pe.shape == (1, 3, 4)
    expected = [
        [math.sin(p), math.cos(p), math.sin(p / 100), math.cos(p / 100)] for p in (0, 1, 50)
    ]
    expected = torch.tensor(expected, dtype=torch.float64) * 4**-0.5
    torch.testing.assert_close(pe[0].double(), expected, atol=1e-6, rtol=0)
    scaled = relpos.create("sinusoidal", num_heads=1, head_dim=4, scale=1.0, base=100.0)
    # base 100: frequencies 1, 1/10
    torch.testing.assert_close(
        scaled.embed(pos, 4)[0, 2].double(),
        torch.tensor([math.sin(50), math.cos(50), math.sin(5), math.cos(5)], dtype=torch.float64),
        atol=1e-6,
        rtol=0,
    )


def test_sinusoidal_refuses_a_base_that_gives_no_wavelengths_by_name():
    for bad in (1.0, 0.5, -2.0):
        with pytest.raises(ValueError, match="base"):
            relpos.create("sinusoidal", num_heads=1, head_dim=4, base=bad)
    with pytest.raises(ValueError, match="scale"):
        relpos.create("sinusoidal", num_heads=1, head_dim=4, scale=0.0)


def test_learned_table_reads_its_rows_and_refuses_positions_past_it():
    enc = relpos.create("learned", num_heads=2, head_dim=4, max_positions=16)
    assert enc.table.shape == (16, 8)
    pos = torch.tensor([[0, 5, 15]])
    assert torch.equal(enc.embed(pos, 8), enc.table[pos])
    with pytest.raises(ValueError, match="max_positions"):
        enc.embed(torch.tensor([[16]]), 8)
    with pytest.raises(ValueError, match="dim"):
        enc.embed(pos, 4)
    with pytest.raises(ValueError, match="max_positions"):
        relpos.create("learned", num_heads=2, head_dim=4, max_positions=0)
