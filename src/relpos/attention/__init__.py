"""Attention backends behind ``relpos.attention``."""

from .api import (
    BACKENDS,
    DENSE_BIAS_LIMIT,
    attention,
    choose_backend,
    plan,
    scores,
    supported_backends,
)

__all__ = [
    "attention",
    "scores",
    "plan",
    "choose_backend",
    "supported_backends",
    "BACKENDS",
    "DENSE_BIAS_LIMIT",
]
