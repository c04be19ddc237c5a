"""Optional dependencies of the commands (the ``lab`` extra), checked before any work.

The ``relpos`` script installs without the ``lab`` extra, so every command asks first:

* ``require(command, needs)``: ``needs`` maps a module to what it is needed for; a missing one
  is one ``ValueError`` line naming the command, the modules and what to install (the command
  then writes nothing);
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

__all__ = ["installed", "require", "missing_plot_note"]

#: the pip name of each module (all in the ``lab`` extra)
PACKAGES = {
    "matplotlib": "matplotlib",
    "rich": "rich",
    "safetensors": "safetensors",
    "tokenizers": "tokenizers",
    "gguf": "gguf",
    "transformers": "transformers",
}


def installed(module: str) -> bool:
    """Whether ``import module`` works."""
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def require(command: str, needs: Mapping[str, str]) -> None:
    """``ValueError`` (one line) when a module of ``needs`` (``{module: what for}``) is missing."""
    missing = {m: why for m, why in needs.items() if not installed(m)}
    if not missing:
        return
    what = ", ".join(f"{m} ({why})" for m, why in missing.items())
    pip = " ".join(PACKAGES.get(m, m) for m in missing)
    raise ValueError(
        f"{command} needs {what}, not installed; install: pip install {pip} "
        "(or pip install 'relpos[lab]')"
    )


def missing_plot_note(files: str) -> str | None:
    """None when matplotlib is installed; else the line that says what is not drawn."""
    if installed("matplotlib"):
        return None
    return f"note: matplotlib is not installed, so no {files} (pip install matplotlib)"
