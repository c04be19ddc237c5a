"""Encoding families; importing this package registers every encoding."""

from . import (  # noqa: F401  (registration side effects)
    absolute,
    bias,
    bias_extra,
    contextual,
    disentangled,
    document,
    graph,
    irpe,
    rotary,
    rotary_lie,
    rotary_nd,
    rotary_schedules,
    rotary_variants,
    spatial,
)
from .base import BiasContext, Encoding

__all__ = ["Encoding", "BiasContext"]
