"""Optional dependencies, checked before any work.

The library needs torch and numpy only; ``relpos.interop.hf`` needs transformers (the ``hf``
extra, ``pip install 'relpos[hf]'``) and ``relpos.interop.gguf`` the gguf reader (``gguf``);
the lab (``pip install relpos-lab``) brings the rest. Every caller asks first:

* ``require(command, needs)``: ``needs`` maps a module to what it is needed for; a missing one
  is one ``OptionalDependencyError`` (an ``ImportError``) naming the command, the modules and
  the exact install line (the command then writes nothing);
* ``installed(module)``: for what a command can do without (matplotlib: everything but the
  PNG, said so; rich: plain-text tables and no progress bar).

Which command needs what: ``relpos extrapolate`` needs safetensors (checkpoints) and, for
``--tokenizer bpe``, tokenizers; ``relpos longctx`` needs gguf and tokenizers for a GGUF model
(not for ``random-tiny``) and transformers for ``--model hf:...`` (as does
``relpos.interop.hf``); matplotlib and rich are optional everywhere.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping

__all__ = ["OptionalDependencyError", "installed", "require", "missing_plot_note", "INSTALL"]

#: what installs each optional module: the library's extras; the lab's own dependencies
#: (matplotlib, rich, safetensors, tokenizers) by their pip names
INSTALL = {"transformers": "relpos[hf]", "gguf": "relpos[gguf]"}


class OptionalDependencyError(ImportError):
    """A feature needs a module that is not installed. ``missing`` holds the module names,
    ``install`` the pip requirement(s) that bring them (``relpos[hf]``, ``safetensors``)."""

    def __init__(self, message: str, missing: tuple[str, ...], install: tuple[str, ...]):
        super().__init__(message, name=missing[0] if missing else None)
        self.missing = missing
        self.install = install


def installed(module: str) -> bool:
    """Whether ``import module`` works."""
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def require(command: str, needs: Mapping[str, str]) -> None:
    """``OptionalDependencyError`` (one line) when a module of ``needs`` (``{module: what
    for}``) is missing, naming the exact install line."""
    missing = {m: why for m, why in needs.items() if not installed(m)}
    if not missing:
        return
    what = ", ".join(f"{m} ({why})" for m, why in missing.items())
    install = tuple(dict.fromkeys(INSTALL.get(m, m) for m in missing))
    pip = " ".join(f"'{r}'" if "[" in r else r for r in install)
    raise OptionalDependencyError(
        f"{command} needs {what}, not installed; install: pip install {pip}",
        tuple(missing),
        install,
    )


def missing_plot_note(files: str) -> str | None:
    """None when matplotlib is installed; else the line that says what is not drawn."""
    if installed("matplotlib"):
        return None
    return f"note: matplotlib is not installed, so no {files} (pip install matplotlib)"
