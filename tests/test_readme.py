"""README.md stays true: its python examples run, and its encoding table matches the registry."""

from __future__ import annotations

from pathlib import Path

import pytest

from markdown_examples import python_blocks, run_python_block
from relpos_lab.cli import main, markdown_table

README = Path(__file__).resolve().parents[1] / "README.md"
START, END = "<!-- encodings:start -->", "<!-- encodings:end -->"


def test_readme_has_python_examples():
    assert python_blocks(README), "README.md has no ```python block"


@pytest.mark.parametrize("index", range(len(python_blocks(README))))
def test_readme_python_block_runs(index):
    run_python_block(README, index)


def test_readme_encoding_table_is_current(capsys):
    text = README.read_text()
    assert text.count(START) == 1 and text.count(END) == 1
    block = text.split(START, 1)[1].split(END, 1)[0].strip()
    assert block == markdown_table(), "README table is stale: run `make docs`"
    assert main(["list", "--markdown"]) == 0
    assert capsys.readouterr().out.strip() == block
