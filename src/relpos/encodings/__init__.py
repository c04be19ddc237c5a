"""Encoding families; importing this package registers every encoding.

Every module under ``relpos/encodings`` (and its family subpackages) is imported here, so a
new encoding needs no import list: write the module, decorate the class with ``@register``.
"""

from __future__ import annotations

import importlib
import pkgutil

from .base import BiasContext, Encoding

for _module in pkgutil.walk_packages(__path__, prefix=__name__ + "."):
    importlib.import_module(_module.name)

__all__ = ["Encoding", "BiasContext"]
