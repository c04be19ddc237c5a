"""Files of ``relpos analyze``: atomic JSON and PNG writes, and argument checks shared by the
analysis modules.

Every file is written to a temporary file in the destination folder and moved over the target
with ``os.replace``: a crash or an exception never leaves a partial file.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

from ..io import atomic_write

__all__ = ["atomic_write", "write_json", "save_figure", "check_int", "check_float"]


def check_int(value: object, name: str, *, minimum: int = 1) -> int:
    """``value`` as an int ``>= minimum``; ``ValueError`` naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def check_float(
    value: object, name: str, *, low: float = -math.inf, high: float = math.inf
) -> float:
    """``value`` as a finite float in ``[low, high]``; ``ValueError`` naming ``name``."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or not low <= value <= high
    ):
        raise ValueError(f"{name} must be a number in [{low:g}, {high:g}], got {value!r}")
    return float(value)


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
