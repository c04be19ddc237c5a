"""The generated pages (``relpos_lab.docsite.pages``) hold what the issue asks of an encoding
page, and link only to files the build generates."""

from __future__ import annotations

import re

import pytest

from relpos.registry import encoding_class
from relpos_lab.docsite import mkdocs_hooks, pages

NAMES = ["alibi", "swin-2d"]


@pytest.fixture(scope="module")
def generated() -> dict[str, str | bytes]:
    return pages.generate(NAMES)


def test_one_page_and_its_figures_per_encoding(generated):
    assert set(generated) == {
        "encodings/index.md",
        "atlas.md",
        "encodings/alibi.md",
        "atlas/alibi-profile.png",
        "atlas/alibi-patterns.png",
        "encodings/swin-2d.md",
        "atlas/swin-2d-grid.png",
        "atlas/swin-2d-patterns.png",
    }
    for path, content in generated.items():
        if path.endswith(".png"):
            assert content[:8] == b"\x89PNG\r\n\x1a\n", path


def test_encoding_page_sections(generated):
    page = generated["encodings/alibi.md"]
    for heading in ("## Paper", "## Options", "## Capabilities", "## Backends", "## Atlas"):
        assert f"\n{heading}\n" in page
    assert "[2108.12409](https://arxiv.org/abs/2108.12409)" in page
    for option in encoding_class("alibi").option_specs:
        assert re.search(rf"^\| `{option}` \|", page, flags=re.M), option
    assert "| `has_bias` | `True` |" in page
    assert "`fold`" in page  # among the backends that run ALiBi
    assert "::: relpos.encodings.bias.alibi.ALiBi" in page


def test_pages_say_what_a_window_table_cannot_show(generated):
    page = generated["encodings/swin-2d.md"]
    assert "7 positions per axis" in page


def test_every_image_and_page_link_resolves_inside_the_generated_files(generated):
    for path, content in generated.items():
        if not path.endswith(".md"):
            continue
        folder = path.rsplit("/", 1)[0] if "/" in path else ""
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", content):
            if target.startswith("https://"):
                continue
            parts = [p for p in f"{folder}/{target}".split("/") if p]
            resolved: list[str] = []
            for part in parts:
                if part == "..":
                    resolved.pop()
                else:
                    resolved.append(part)
            assert "/".join(resolved) in generated, (path, target)


def test_atlas_page_shows_every_encoding_by_family(generated):
    atlas_md = generated["atlas.md"]
    assert "## bias" in atlas_md and "## spatial" in atlas_md
    assert "atlas/alibi-profile.png" in atlas_md and "atlas/swin-2d-grid.png" in atlas_md


def test_nav_lists_a_page_per_encoding_by_family(monkeypatch):
    monkeypatch.setenv(mkdocs_hooks.ENV_ENCODINGS, "alibi,rope,swin-2d")
    nav = [{"Encodings": "encodings/index.md"}]
    mkdocs_hooks.on_config({"nav": nav})
    assert nav == [
        {
            "Encodings": [
                "encodings/index.md",
                {"bias": [{"alibi": "encodings/alibi.md"}]},
                {"rotary": [{"rope": "encodings/rope.md"}]},
                {"spatial": [{"swin-2d": "encodings/swin-2d.md"}]},
            ]
        }
    ]


def test_an_unknown_encoding_name_is_refused_by_name(monkeypatch):
    monkeypatch.setenv(mkdocs_hooks.ENV_ENCODINGS, "alibi,not-an-encoding")
    with pytest.raises(ValueError, match="not-an-encoding"):
        mkdocs_hooks.selected_encodings()
