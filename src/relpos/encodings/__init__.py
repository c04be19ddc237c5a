"""Encoding families; importing this package registers every encoding."""

from . import absolute, bias, bias_extra, contextual, disentangled, document, rotary, rotary_schedules, spatial  # noqa: F401  (registration side effects)
from .base import BiasContext, Encoding

__all__ = ["Encoding", "BiasContext"]
