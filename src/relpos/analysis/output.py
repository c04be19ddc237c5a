"""Files of ``relpos analyze``: atomic JSON and PNG writes (arguments are checked with
``relpos.validation``).

Every file is written to a temporary file in the destination folder and moved over the target
with ``os.replace``: a crash or an exception never leaves a partial file.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

from ..io import atomic_write

__all__ = ["atomic_write", "write_json", "save_figure"]


def write_json(path: str | os.PathLike, data: dict[str, Any]) -> None:
    """``data`` as indented JSON (strict: NaN/inf are written as null), atomically."""
    text = json.dumps(_finite(data), indent=2, allow_nan=False) + "\n"

    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)

    atomic_write(path, write)


def save_figure(fig: Any, path: str | os.PathLike) -> None:
    """Save a matplotlib figure as PNG, atomically, and close it."""
    import matplotlib.pyplot as plt

    try:
        atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=100, format="png"))
    finally:
        plt.close(fig)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
