"""The README's atlas figures are files of docs/img drawn by the site's atlas code
(``make atlas-figures``)."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import numpy as np
import pytest
from matplotlib import image

from relpos_lab.docsite import readme_figures

ROOT = Path(__file__).resolve().parents[2]


def _png_size(png: bytes) -> tuple[int, int]:
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR"
    return struct.unpack(">II", png[16:24])


def test_readme_shows_the_committed_atlas_figures():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "## The atlas" in readme
    for name in ("atlas_profiles.png", "atlas_patterns.png"):
        assert f"](docs/img/{name})" in readme
        _png_size((ROOT / "docs" / "img" / name).read_bytes())


@pytest.mark.slow
def test_the_committed_figures_are_what_the_atlas_draws():
    drawn = readme_figures.draw()
    assert set(drawn) == {"atlas_profiles.png", "atlas_patterns.png"}
    for name, png in drawn.items():
        committed = (ROOT / "docs" / "img" / name).read_bytes()
        assert _png_size(png) == _png_size(committed), f"{name}: run `make atlas-figures`"
        # pixels, not bytes: another matplotlib may antialias edges a little differently, but
        # one changed panel of six moves about 2% of the pixels by more than 0.2
        new, old = (image.imread(io.BytesIO(data), format="png") for data in (png, committed))
        moved = (np.abs(new - old).max(axis=-1) > 0.2).mean()
        assert moved < 0.005, f"{name} is stale ({moved:.1%} of pixels): make atlas-figures"
