"""Efficient (sub-quadratic) attention with relative positions: kernelized / linear attention
(the ``linear`` backend of ``relpos.attention``) and its building blocks."""

from .feature_maps import (
    EluPlusOne,
    FeatureMap,
    PositiveRandomFeatures,
    ReLUFeatures,
    create_feature_map,
)
from .kernelized import kernelized_attention, kernelized_reference, toeplitz_matvec
from .linear_rope import rotate_features
from .state import LinearState

__all__ = [
    "FeatureMap",
    "PositiveRandomFeatures",
    "EluPlusOne",
    "ReLUFeatures",
    "create_feature_map",
    "kernelized_attention",
    "kernelized_reference",
    "toeplitz_matvec",
    "rotate_features",
    "LinearState",
]
