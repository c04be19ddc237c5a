"""The site's guides stay true: every ```python block of docs/guide/*.md runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from markdown_examples import python_blocks, run_python_block

GUIDES = sorted((Path(__file__).resolve().parents[2] / "docs" / "guide").glob("*.md"))
EXAMPLES = [(guide, index) for guide in GUIDES for index in range(len(python_blocks(guide)))]


def test_every_guide_has_runnable_examples():
    assert {g.stem for g in GUIDES} >= {"attention", "nn", "hf", "lab"}
    for guide in GUIDES:
        assert python_blocks(guide), f"{guide.name} has no ```python block"


@pytest.mark.parametrize(("guide", "index"), EXAMPLES, ids=[f"{g.stem}-{i}" for g, i in EXAMPLES])
def test_guide_example_runs(guide, index):
    run_python_block(guide, index)
