"""The single map from encoding names to classes: ``create`` and ``available``.

Adding an encoding = one class in its family's module + one ``@register`` line; the
conformance suite (tests/conformance) then covers it without new test code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .encodings.base import Encoding

_REGISTRY: dict[str, type[Encoding]] = {}


def register(name: str) -> Callable[[type[Encoding]], type[Encoding]]:
    """Class decorator: make ``cls`` available as ``relpos.create(name, ...)``."""

    def deco(cls: type[Encoding]) -> type[Encoding]:
        if name in _REGISTRY:
            raise ValueError(f"encoding name {name!r} is already registered")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return deco


def available() -> list[str]:
    """Registered encoding names, sorted."""
    return sorted(_REGISTRY)


def encoding_class(name: str) -> type[Encoding]:
    """The class registered under ``name``; ``ValueError`` listing the known names otherwise."""
    if not isinstance(name, str):
        raise TypeError(f"encoding name must be a str, got {type(name).__name__}")
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"unknown encoding {name!r}; known encodings: {', '.join(available())}"
        ) from None


def create(name: str, *, num_heads: int, head_dim: int, **options: Any) -> Encoding:
    """Instantiate encoding ``name`` for ``num_heads`` heads of ``head_dim`` channels.

    ``options`` are the encoding's own keyword arguments (see its docstring); an unknown
    option raises ``TypeError`` naming it.
    """
    cls = encoding_class(name)
    try:
        return cls(num_heads=num_heads, head_dim=head_dim, **options)
    except TypeError as err:
        if "unexpected keyword argument" in str(err):
            raise TypeError(f"encoding {name!r}: {err}") from None
        raise
