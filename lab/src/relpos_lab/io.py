"""Files written by the lab, the analysis commands and checkpoints: atomic writes and the
check of an output folder.

``atomic_write(path, write)`` calls ``write(tmp_path)`` for a temporary file in the target's
folder, fsyncs it and moves it over ``path`` with ``os.replace``: a crash, an interrupt or an
exception never leaves a partial file, and ``path`` keeps its old content on failure. The
file gets the mode a plain ``open(path, "w")`` would give it (``0o666`` less the umask), so
results in a shared folder are as readable as any other file there.

``check_output_dir(path)`` tells before any work whether a command could create and write
``path`` (``ValueError`` naming the flag otherwise); it creates nothing.

``write_json(path, data)`` (strict JSON: NaN and inf become null) and
``save_figure(fig, path)`` (PNG, the figure closed) write through ``atomic_write``.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["atomic_write", "check_output_dir", "file_mode", "save_figure", "write_json"]


def file_mode() -> int:
    """The mode of a new file under the current umask (``0o666 & ~umask``)."""
    umask = os.umask(0o022)  # reading the umask means setting it; put it back at once
    os.umask(umask)
    return 0o666 & ~umask


def atomic_write(path: str | os.PathLike, write: Callable[[str], None]) -> None:
    """Call ``write(tmp_path)``, then move ``tmp_path`` over ``path`` (same folder, fsynced).

    If ``write`` raises (or is interrupted), the temporary file is removed and ``path`` keeps
    its old content. The new file's mode follows the umask (``file_mode``), not
    ``tempfile.mkstemp``'s private 0600.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, file_mode())
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def check_output_dir(path: str | os.PathLike, flag: str = "--out") -> Path:
    """``path`` if a command can create it (or write into it); ``ValueError`` naming ``flag``
    when it is a file, lies under a file, or the system refuses to write there for any reason
    (permission, a read-only or special file system: the check creates and removes a probe in
    the nearest existing folder, so ``EPERM`` and ``EROFS`` are caught, not only what
    ``os.access`` predicts). Leaves nothing behind."""
    out = Path(path)
    if out.exists():
        if not out.is_dir():
            raise ValueError(f"{flag} {out}: exists and is not a folder")
        _probe(out, f"{flag} {out}: the folder is not writable")
        return out
    parent = out.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"{flag} {out}: cannot be created, {parent} is a file, not a folder")
    _probe(parent, f"{flag} {out}: cannot be created in {parent}")
    return out


def _probe(folder: Path, message: str) -> None:
    """Create and remove a folder in ``folder``; ``ValueError(message + reason)`` if refused."""
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"{message} (permission denied)")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".relpos-probe-", dir=folder))
    except OSError as err:
        raise ValueError(f"{message} ({err.strerror or err})") from None


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
