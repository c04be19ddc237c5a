"""The single map from encoding names to classes: ``create`` and ``available``.

Adding an encoding = one class in its family's module + one ``@register`` line; the
conformance suite (tests/conformance) then covers it without new test code.

Naming rule for registry names: ``<method>[-<variant>][-<m>d]``, lower case, words joined by
``-``: the method as its paper names it (``rope``, ``alibi``, ``kerple``, ``mvitv2``), then a
variant when one paper defines several (``kerple-log``, ``irpe-qkv``, ``rope-axial``), then
the number of position axes when it is not 1 (``swin-3d``, ``liere-2d``). Renamed encodings
keep their old names as aliases (``register(name, aliases=(...))``): ``create`` accepts
them, ``available`` lists canonical names only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .base import Encoding

_REGISTRY: dict[str, type[Encoding]] = {}
_ALIASES: dict[str, str] = {}


def register(
    name: str, *, aliases: tuple[str, ...] = ()
) -> Callable[[type[Encoding]], type[Encoding]]:
    """Class decorator: make ``cls`` available as ``relpos.create(name, ...)`` (and under
    each of ``aliases``, its former names)."""

    def deco(cls: type[Encoding]) -> type[Encoding]:
        for key in (name, *aliases):
            if key in _REGISTRY or key in _ALIASES:
                raise ValueError(f"encoding name {key!r} is already registered")
        cls.name = name
        _REGISTRY[name] = cls
        for alias in aliases:
            _ALIASES[alias] = name
        return cls

    return deco


def available() -> list[str]:
    """Registered encoding names (canonical, without aliases), sorted."""
    return sorted(_REGISTRY)


def aliases() -> dict[str, str]:
    """Former names still accepted by ``create``: ``{alias: canonical name}``."""
    return dict(sorted(_ALIASES.items()))


def encoding_class(name: str) -> type[Encoding]:
    """The class registered under ``name``; ``ValueError`` listing the known names otherwise."""
    if not isinstance(name, str):
        raise TypeError(f"encoding name must be a str, got {type(name).__name__}")
    try:
        return _REGISTRY[_ALIASES.get(name, name)]
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
