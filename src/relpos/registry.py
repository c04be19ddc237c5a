"""``relpos.registry``: the encoding registry's public path (it lives in
``relpos.encodings.registry``, beside the encodings it names)."""

from .encodings.registry import (
    aliases,
    available,
    create,
    describe,
    encoding_class,
    option_defaults,
    register,
    suggestion,
)

__all__ = [
    "aliases",
    "available",
    "create",
    "describe",
    "encoding_class",
    "option_defaults",
    "register",
    "suggestion",
]
