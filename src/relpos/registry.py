"""``relpos.registry``: the encoding registry's public path (it lives in
``relpos.encodings.registry``, beside the encodings it names)."""

from .encodings.registry import aliases, available, create, encoding_class, register

__all__ = ["aliases", "available", "create", "encoding_class", "register"]
