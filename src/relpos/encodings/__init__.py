"""Encoding families; importing this package registers every encoding."""

from . import (  # noqa: F401  (registration side effects)
    absolute,
    bias,
    bias_extra,
    bipe,
    disentangled,
    document,
    graph,
    huang2020,
    irpe,
    music_transformer,
    rotary,
    rotary_lie,
    rotary_nd,
    rotary_schedules,
    rotary_variants,
    shaw,
    spatial,
)
from .base import BiasContext, Encoding

__all__ = ["Encoding", "BiasContext"]
