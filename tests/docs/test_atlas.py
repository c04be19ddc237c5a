"""The atlas's numbers are what the encodings compute (``relpos_lab.docsite.atlas``)."""

from __future__ import annotations

import math

import pytest
import torch

import relpos
from relpos.functional import alibi_slopes
from relpos_lab.docsite import atlas, figures, pages


def test_views_follow_the_capability_flags():
    views = {
        name: atlas.views(atlas.atlas_encoding(name).encoding)
        for name in ("alibi", "rope", "sinusoidal", "rope-axial", "swin-3d", "nope")
    }
    assert views["alibi"] == views["rope"] == views["nope"] == ["profile", "patterns"]
    assert views["sinusoidal"] == ["embedding", "patterns"]
    assert views["rope-axial"] == views["swin-3d"] == ["grid", "patterns"]


def test_alibi_profile_is_its_bias():
    profile = atlas.distance_profile(atlas.atlas_encoding("alibi"))
    d = profile.distances.double()
    assert d[0] == atlas.PROFILE_DISTANCE and d[-1] == -atlas.PROFILE_DISTANCE
    expected = -alibi_slopes(atlas.ATLAS_HEADS).double()[:, None] * d[None]
    torch.testing.assert_close(profile.values, expected, atol=1e-4, rtol=0)


def test_nope_adds_nothing():
    profile = atlas.distance_profile(atlas.atlas_encoding("nope"))
    assert profile.values.abs().max() < 1e-5


def test_rope_profile_is_an_even_decaying_rotary_score():
    profile = atlas.distance_profile(atlas.atlas_encoding("rope"))
    values = profile.values  # (H, 2N + 1), distances N..-N
    n = atlas.PROFILE_DISTANCE
    assert values[:, n].abs().max() < 1e-4  # d = 0: no rotation
    assert values.max() < 1e-4  # <R u, R' u> <= |u|^2: a rotation only lowers it
    torch.testing.assert_close(values, values.flip(-1), atol=1e-4, rtol=0)  # even in d
    assert (values[:, n + 1 :].mean(-1) < values[:, n + 1 : n + 5].mean(-1)).all()


def test_embedding_profile_is_a_cosine_similarity():
    profile = atlas.embedding_profile(atlas.atlas_encoding("sinusoidal"))
    n = atlas.PROFILE_DISTANCE
    assert profile.values.shape == (1, 2 * n + 1)
    assert profile.values[0, n] == pytest.approx(1.0)
    assert profile.values.abs().max() <= 1.0 + 1e-9
    torch.testing.assert_close(profile.values, profile.values.flip(-1))


def test_grid_map_of_axial_rope_peaks_at_the_query_and_is_point_symmetric():
    grid = atlas.grid_map(atlas.atlas_encoding("rope-axial"))
    values = grid.values[:, 0]  # (H, side, side)
    r, c = grid.centre
    assert values[:, r, c].abs().max() < 1e-4
    assert values.max() < 1e-4
    torch.testing.assert_close(values, values.flip(-1, -2), atol=1e-4, rtol=0)


def test_grid_of_a_windowed_table_fits_the_window_and_says_so():
    item = atlas.atlas_encoding("swin-2d")
    grid = atlas.grid_map(item)
    patterns = atlas.attention_patterns(item)
    assert grid.values.shape[-1] == 7
    assert patterns.shapes == ((4, 4), (7, 7))
    assert any("7 positions per axis" in note for note in item.notes)


def test_patterns_are_attention_weights_under_a_causal_mask():
    item = atlas.atlas_encoding("kerple-log")
    patterns = atlas.attention_patterns(item)
    assert patterns.lengths == atlas.PATTERN_LENGTHS and patterns.causal
    for w in (*patterns.shared, *patterns.random):
        torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[0]))
        assert w.triu(1).abs().max() == 0


def test_patterns_through_the_engine_equal_the_softmax_of_the_scores():
    """The identity-values path (``relpos.attention``) against ``relpos.scores``."""
    item = atlas.atlas_encoding("t5")
    enc = item.encoding
    length = 16
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 8, length, 64, generator=gen) for _ in range(2))
    pos = torch.arange(length)
    weights = atlas._weights(enc, q, k, pos, causal=True, inputs={})
    with torch.no_grad():
        logits = relpos.scores(q, k, enc)
    future = torch.ones(length, length, dtype=torch.bool).triu(1)
    expected = torch.softmax(logits.masked_fill(future, -math.inf), dim=-1)
    torch.testing.assert_close(weights, expected, atol=1e-6, rtol=1e-5)


def test_a_small_learned_table_leaves_out_lengths_it_cannot_hold():
    item = atlas.atlas_encoding("sipe")  # example options: a 64-node table
    patterns = atlas.attention_patterns(item)
    assert patterns.lengths == (16, 64)
    assert any("L = 256" in note for note in item.notes)


def test_zero_initialised_parameters_are_drawn_and_named():
    item = atlas.atlas_encoding("irpe")
    assert item.filled and all(
        dict(item.encoding.named_parameters())[p].abs().sum() > 0 for p in item.filled
    )


def test_figures_are_png_images():
    item = atlas.atlas_encoding("alibi")
    png = figures.profile_png("alibi", atlas.distance_profile(item))
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    again = figures.profile_png("alibi", atlas.distance_profile(atlas.atlas_encoding("alibi")))
    assert png == again  # no time stamp: the same numbers give the same bytes


def test_generate_names_the_encoding_it_cannot_draw(monkeypatch):
    def broken(item, *args, **kwargs):
        raise ValueError("no curve")

    monkeypatch.setattr(atlas, "distance_profile", broken)
    with pytest.raises(RuntimeError, match="cannot draw encoding 'alibi': no curve"):
        pages.generate(["alibi"])
