"""Running the examples of a markdown file: every ```python block, in order, each in a fresh
namespace (README.md in ``test_readme.py``, the site's guides in ``docs/test_guides.py``)."""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["python_blocks", "run_python_block"]

_BLOCK = re.compile(r"^```python\n(.*?)^```", flags=re.M | re.S)


def python_blocks(path: Path) -> list[str]:
    """The code of each ```python block of the markdown file ``path``, in order."""
    return _BLOCK.findall(path.read_text(encoding="utf-8"))


def run_python_block(path: Path, index: int) -> None:
    """Execute block ``index`` of ``path`` as a script (exceptions propagate; tracebacks name
    the file and block)."""
    code = python_blocks(path)[index]
    exec(compile(code, f"{path.name}[python block {index}]", "exec"), {"__name__": "__example__"})
