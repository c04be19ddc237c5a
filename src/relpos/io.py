"""Atomic file writes shared by the lab, the analysis commands and checkpoints.

``atomic_write(path, write)`` calls ``write(tmp_path)`` for a temporary file in the target's
folder, fsyncs it and moves it over ``path`` with ``os.replace``: a crash, an interrupt or an
exception never leaves a partial file, and ``path`` keeps its old content on failure.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def atomic_write(path: str | os.PathLike, write: Callable[[str], None]) -> None:
    """Call ``write(tmp_path)``, then move ``tmp_path`` over ``path`` (same folder, fsynced).

    If ``write`` raises (or is interrupted), the temporary file is removed and ``path`` keeps
    its old content.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
