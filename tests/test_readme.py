"""README.md stays true: its python examples run, and its encoding table matches the registry."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from relpos_lab.cli import main, markdown_table

README = Path(__file__).resolve().parents[1] / "README.md"
START, END = "<!-- encodings:start -->", "<!-- encodings:end -->"


def python_blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", README.read_text(), flags=re.M | re.S)


def test_readme_has_python_examples():
    assert python_blocks(), "README.md has no ```python block"


@pytest.mark.parametrize("index", range(len(python_blocks())))
def test_readme_python_block_runs(index):
    code = python_blocks()[index]
    exec(compile(code, f"README.md[python block {index}]", "exec"), {"__name__": "__readme__"})


def test_readme_encoding_table_is_current(capsys):
    text = README.read_text()
    assert text.count(START) == 1 and text.count(END) == 1
    block = text.split(START, 1)[1].split(END, 1)[0].strip()
    assert block == markdown_table(), "README table is stale: run `make docs`"
    assert main(["list", "--markdown"]) == 0
    assert capsys.readouterr().out.strip() == block
